"""Tests of the model zoo: published sizes, exportability, determinism, the FLOP counter."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import zoo_programs
from superopt.errors import SuperoptError, UnknownModelError
from superopt.models import ZOO, build, count_flops

NAMES = [n for n, s in ZOO.items() if not s.large]  # the full-size LLM blocks: their tiny twins run the same code
TOLERANCE = 0.02

# The aten ops (pre-dispatch export IR) the zoo is meant to stay within.
ALLOWED_OPS = {
    "conv2d", "batch_norm", "relu", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "flatten", "dropout", "linear", "matmul", "softmax", "layer_norm", "gelu",
    "reshape", "view", "permute", "transpose", "add", "mul", "div", "cat",
}  # fmt: skip
# Where the architecture itself needs more: NASNet's factorized reduction shifts the grid by
# one pixel (zero pad + slice); ViT broadcasts the class token and reads it back out.
EXTRA_OPS = {"nasnet_a_mobile": {"pad", "slice"}, "vit_b16": {"expand", "select"}}
# The LLM blocks (issue 23) are written as Hugging Face writes them: RMSNorm, rotary, GQA, SwiGLU,
# a static KV cache; GPT-2's Conv1D and fused c_attn.
_LLAMA = {"_assert_tensor_metadata", "to", "pow", "mean", "rsqrt", "slice", "neg", "unsqueeze", "expand",
          "silu", "scaled_dot_product_attention"}
_GPT2 = {"addmm", "getitem", "split", "pow", "tanh", "scaled_dot_product_attention"}
EXTRA_OPS.update({"llama_tiny_prefill": _LLAMA, "llama_tiny_decode": _LLAMA | {"index_copy_", "alias"},
                  "qwen2_tiny_decode": _LLAMA | {"index_copy_", "alias"},       # q/k/v biases: linear
                  "gemma_tiny_decode": _LLAMA | {"index_copy_", "alias", "gelu", "type_as"},
                  "qwen3_tiny_decode": _LLAMA | {"index_copy_", "alias"},      # q/k RMSNorm: the same ops
                  "phi3_tiny_decode": _LLAMA | {"index_copy_", "alias", "chunk", "getitem"},  # fused projections
                  "gpt2_tiny_block": _GPT2, "gpt2_block": _GPT2})


@functools.cache
def _built(name: str):
    """Each model is built once at batch 1 and shared by the tests (keeps the file fast)."""
    return build(name, batch_size=1, seed=0)


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _transformer_macs(layers: int, tokens: int, hidden: int = 768, ffn: int = 3072) -> int:
    """Per layer and token: q, k, v, out projections (4 h^2) and the FFN (2 h f); per layer:
    Q K^T and P V, each tokens^2 x hidden."""
    return layers * (tokens * (4 * hidden * hidden + 2 * hidden * ffn) + 2 * tokens * tokens * hidden)


@pytest.mark.parametrize("name", NAMES)
def test_params_match_published(name):
    model, _ = _built(name)
    assert _num_params(model) == pytest.approx(ZOO[name].published_params, rel=TOLERANCE)


@pytest.mark.parametrize("name", NAMES)
def test_flops_match_published(name):
    model, inputs = _built(name)
    assert count_flops(model, inputs) == pytest.approx(ZOO[name].published_gflops * 1e9, rel=TOLERANCE)


def test_bert_flops_analytic():
    """BERT-base at seq 128: 2 x 12 x (128 x 7,077,888 + 2 x 128^2 x 768) = 22,347,251,712 FLOPs."""
    model, inputs = _built("bert_base")
    assert inputs[0].shape == (1, 128, 768)
    expected = 2 * _transformer_macs(12, 128)
    assert expected == 22_347_251_712
    assert count_flops(model, inputs) == expected


def test_vit_flops_analytic():
    """ViT-B/16: 196 x 768 x 768 patch embedding + encoder on 197 tokens + 768 x 1000 head
    = 17,563,828,224 MACs. torchvision's "17.56 GFLOPS" is this multiply-add count."""
    model, inputs = _built("vit_b16")
    macs = 196 * 768 * (3 * 16 * 16) + _transformer_macs(12, 197) + 768 * 1000
    assert macs == 17_563_828_224
    assert count_flops(model, inputs) == 2 * macs


@pytest.mark.parametrize("name", NAMES)
def test_exports_to_plain_aten_ops(name):
    program = zoo_programs.exported(name)  # BERT at a short sequence; shared with test_codegen.py
    ops = {
        n.target.__name__.split(".")[0]
        for n in program.graph.nodes
        if n.op == "call_function" and hasattr(n.target, "__name__")
    }
    assert ops <= ALLOWED_OPS | EXTRA_OPS.get(name, set())


@pytest.mark.parametrize("name", NAMES)
def test_eval_mode_and_input_shape(name):
    model, inputs = _built(name)
    assert not any(m.training for m in model.modules())
    assert [tuple(x.shape) for x in inputs] == list(ZOO[name].input_shapes(1))


def test_build_is_deterministic():
    rng_before = torch.get_rng_state()
    (a, xa), (b, xb) = build("nasnet_a_mobile", seed=0), build("nasnet_a_mobile", seed=0)
    c, xc = build("nasnet_a_mobile", seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before), "build must not disturb the global RNG"
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(xa[0], xb[0])
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert not torch.equal(xa[0], xc[0])
    # batch norms are non-trivial in eval mode (random statistics, not the identity)
    bn = a.conv0[1]
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))


def test_batch_size_and_seq_len():
    model, inputs = build("squeezenet1_1", batch_size=3)
    assert inputs[0].shape == (3, 3, 224, 224)
    assert count_flops(model, inputs) == 3 * count_flops(*_built("squeezenet1_1"))
    _, inputs = build("bert_base", batch_size=2, seq_len=16, num_layers=1)
    assert inputs[0].shape == (2, 16, 768)
    with pytest.raises(ValueError):
        build("squeezenet1_1", batch_size=0)


def test_unknown_model():
    with pytest.raises(UnknownModelError) as info:
        build("resnet51")
    assert isinstance(info.value, SuperoptError)
    assert "resnet51" in str(info.value)
    assert all(name in str(info.value) for name in NAMES)


def test_count_flops_small_module():
    """Hand-counted MACs per sample: conv 3->8 3x3 on 5x5 (pad 1) = 25 x 8 x 27; grouped
    1x1 conv 8->8 in 4 groups = 25 x 8 x 2; linear 200->10 = 2000 (batch of 2). And a
    batched matmul [2,4,6] @ [2,6,3] = 2 x 4 x 3 x 6."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1, groups=4), nn.Flatten(), nn.Linear(200, 10))
    x = torch.randn(2, 3, 5, 5)
    assert count_flops(net, (x,)) == 2 * 2 * (25 * 8 * 27 + 25 * 8 * 2 + 200 * 10)

    class BatchedMatmul(nn.Module):
        def forward(self, a, b):
            return a @ b

    assert count_flops(BatchedMatmul(), (torch.randn(2, 4, 6), torch.randn(2, 6, 3))) == 2 * (2 * 4 * 3 * 6)
