"""The model registry: what each built-in model is, its published size, and ``build``.

Published compute is kept as the multiply-add count the sources print (``published_gmacs``);
``published_gflops`` is 2 x that, the convention ``count_flops`` uses. Sources:

* torchvision's model docs, "GFLOPS" and "num_params" columns (ResNet-50 4.09 / 25,557,032;
  ResNeXt-50 32x4d 4.23 / 25,028,904; Inception-v3 5.71 / 27,161,264; SqueezeNet 1.1
  0.35 / 1,235,496; ViT-B/16 17.56 / 86,567,656). Despite the column name these are
  multiply-adds (fvcore convention): our counter measures 4.09 G conv+fc MACs for ResNet-50.
  Likewise the "17.6 GFLOPs" of ViT-B/16 in the DeiT paper is 17.6 G multiply-adds.
* NASNet-A Mobile: Zoph et al., "Learning Transferable Architectures", Table 2: 564M
  mult-adds, 5.3M parameters.
* Inception-v3 without its training-only auxiliary head: 27,161,264 - 3,326,696 (aux head:
  1x1 768->128 conv+BN, 5x5 128->768 conv+BN, fc 768->1000) = 23,834,568 parameters.
* BERT-base encoder: there is no published encoder-only figure (BERT-base's "110M" counts
  23.8M of embeddings and a 0.6M pooler), so both numbers are derived from the architecture:
  12 x (4 x (768^2 + 768) + 2 x 768 x 3072 + 3072 + 768 + 4 x 768) = 85,054,464 parameters,
  and at seq 128: 12 x (128 x 12 x 768^2 + 2 x 128^2 x 768) = 11.17 G multiply-adds.
* The LLM blocks (issue 23: :mod:`.llama`, :mod:`.gpt2`, written as Hugging Face writes them):
  derived from the architecture, Llama-3-8B's config (hidden 4096, 32 query / 8 key-value heads,
  FFN 14336) and GPT-2 small's (768, 12 heads, 3072); the same decode step at Llama-3.2-1B's,
  Qwen2-1.5B's (q/k/v biases), Phi-3-mini's (fused projections) and Gemma-2B's (``1 + w``
  RMSNorm, GELU-gated MLP) sizes, each family's layer as its own modeling code writes it. Their multiply-adds are the linear
  layers' (tokens x weights: the "2 x parameters per token" convention); the attention's own
  products run inside SDPA, which ``count_flops`` does not see, and are not counted. Each comes
  at full size (for the GPU) and as a ``tiny`` config of the same code (CPU tests in seconds);
  ``build`` takes ``num_layers``, ``kv_repeat="expand"|"repeat_interleave"``,
  ``rotary="tables"|"positions"`` (cos/sin given, or computed from position ids) (Llama) and
  ``gelu="written"|"tanh"`` (GPT-2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from superopt.errors import UnknownModelError

from .gpt2 import GPT2_SMALL, GPT2_TINY, GPT2Block, GPT2Config, gpt2_params
from .inception import inception_v3
from .llama import (GEMMA_2B, GEMMA_TINY, LLAMA3_8B, LLAMA32_1B, LLAMA_TINY, PHI3_MINI, PHI3_TINY, QWEN2_1P5B, QWEN2_TINY,
                    QWEN3_4B, QWEN3_TINY, CachesInBuffers, LlamaConfig, LlamaDecoder, LlamaWithRotary, MaskFromPositions,
                    example_inputs, linear_params)
from .nasnet import nasnet_a_mobile
from .resnet import resnet50, resnext50_32x4d
from .squeezenet import squeezenet1_1
from .transformers import bert_base, vit_b16

__all__ = ["ModelSpec", "ZOO", "build", "get_spec"]

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model.

    ``builder(**model_kwargs)`` makes the network; ``input_shapes(batch_size, **input_kwargs)``
    gives the shapes of its example inputs; ``input_kwargs`` names the ``build`` keywords
    that go to ``input_shapes`` instead of the builder (e.g. BERT's ``seq_len``).
    ``published_gmacs`` is for batch 1 at the default input shape. ``inputs(batch_size, model,
    generator, **input_kwargs)``, where given, makes the example inputs (a model that takes
    more than standard-normal tensors: rotary tables, masks, integer positions). ``large``: too
    big for CPU tests (the LLM blocks at full size; their ``tiny`` twins run the same code).
    """

    name: str
    description: str
    builder: Callable[..., nn.Module]
    input_shapes: Callable[..., Shapes]
    published_gmacs: float
    published_params: int
    source: str
    input_kwargs: tuple[str, ...] = ()
    inputs: Callable[..., tuple[torch.Tensor, ...]] | None = None
    large: bool = False

    @property
    def published_gflops(self) -> float:
        """Published compute as FLOPs = 2 x multiply-adds (what ``count_flops`` returns)."""
        return 2.0 * self.published_gmacs


def _image(size: int) -> Callable[[int], Shapes]:
    def shapes(batch_size: int) -> Shapes:
        return ((batch_size, 3, size, size),)

    return shapes


def _hidden_states(batch_size: int, seq_len: int = 128) -> Shapes:
    return ((batch_size, seq_len, 768),)


def _llama(cfg: LlamaConfig, mode: str, seq_len: int, cache_len: int, layers: int = 1):
    """builder, input_shapes, inputs, MACs (G) and parameters of a Llama-style entry."""
    def builder(num_layers: int = layers, kv_repeat: str = "expand", rotary: str = "tables",
                cache: str = "inplace", mask: str = "input") -> nn.Module:
        if rotary not in ("tables", "positions"):
            raise ValueError(f"rotary must be 'tables' (cos, sin inputs) or 'positions' (position ids), got {rotary!r}")
        if mask not in ("input", "positions"):
            raise ValueError(f"mask must be 'input' (an additive mask passed in) or 'positions' (built from the "
                             f"cache position), got {mask!r}")
        if (cache == "buffers" or mask == "positions") and mode != "decode":
            raise ValueError("cache='buffers' and mask='positions' are a decode step's options")
        decoder = LlamaDecoder(cfg, num_layers, mode, kv_repeat, "inplace" if cache == "buffers" else cache)
        model = decoder if rotary == "tables" else LlamaWithRotary(decoder)
        model = MaskFromPositions(model) if mask == "positions" else model
        return CachesInBuffers(model) if cache == "buffers" else model

    def inputs(batch_size, model, generator, seq_len=seq_len, cache_len=cache_len):
        held = isinstance(model, CachesInBuffers)
        inner = model.inner if held else model
        built = isinstance(inner, MaskFromPositions)
        inner = inner.inner if built else inner
        x = example_inputs(cfg, mode, batch_size, seq_len, cache_len, len(model.layers), generator,
                           positions=isinstance(inner, LlamaWithRotary))
        if built:  # the mask is built from the cache position (the position after it)
            k = 2 if isinstance(inner, LlamaWithRotary) else 3
            x = x[:k] + x[k + 1:]
        if held:  # the caches go into the model; the step takes the rest
            model.keep(x[-2 * len(model.layers):])
            return x[:-2 * len(model.layers)]
        return x

    def shapes(batch_size: int, seq_len: int = seq_len, cache_len: int = cache_len) -> Shapes:
        hd = cfg.head_size
        if mode == "prefill":
            return ((batch_size, seq_len, cfg.hidden),) + ((batch_size, seq_len, hd),) * 2
        cache = (batch_size, cfg.kv_heads, cache_len, hd)
        return ((batch_size, 1, cfg.hidden),) + ((batch_size, 1, hd),) * 2 + ((batch_size, 1, 1, cache_len), (1,)) \
            + (cache,) * (2 * layers)
    tokens = seq_len if mode == "prefill" else 1
    return dict(builder=builder, input_shapes=shapes, inputs=inputs, input_kwargs=("seq_len", "cache_len"),
                published_gmacs=tokens * linear_params(cfg) * layers / 1e9,
                published_params=(linear_params(cfg) + 2 * cfg.hidden + (2 * cfg.head_size if cfg.qk_norm else 0)) * layers)


def _gpt2(cfg: GPT2Config, seq_len: int):
    def builder(gelu: str = "written") -> nn.Module:
        return GPT2Block(cfg, gelu)

    def shapes(batch_size: int, seq_len: int = seq_len) -> Shapes:
        return ((batch_size, seq_len, cfg.hidden),)
    macs = seq_len * (cfg.hidden * 4 * cfg.hidden + 2 * cfg.hidden * cfg.inner)
    return dict(builder=builder, input_shapes=shapes, input_kwargs=("seq_len",), published_gmacs=macs / 1e9,
                published_params=gpt2_params(cfg))


_ARCH = "derived from the architecture"
_TV = "torchvision model docs"
ZOO: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("resnet50", "ResNet-50 v1.5 (stride on the 3x3), 224x224", resnet50, _image(224),
                  4.09, 25_557_032, _TV),
        ModelSpec("resnext50_32x4d", "ResNeXt-50 32x4d, 224x224", resnext50_32x4d, _image(224),
                  4.23, 25_028_904, _TV),
        ModelSpec("inception_v3", "Inception-v3, 299x299, no aux head", inception_v3, _image(299),
                  5.71, 23_834_568, _TV + " (27,161,264 params less the 3,326,696 of the aux head)"),
        ModelSpec("squeezenet1_1", "SqueezeNet 1.1, 224x224", squeezenet1_1, _image(224),
                  0.35, 1_235_496, _TV),
        ModelSpec("nasnet_a_mobile", "NASNet-A Mobile 4@1056, 224x224", nasnet_a_mobile, _image(224),
                  0.564, 5_300_000, "Zoph et al. 2018, Table 2"),
        ModelSpec("bert_base", "BERT-base encoder, hidden states [batch, seq, 768] in, post-LN",
                  bert_base, _hidden_states, 11.173625856, 85_054_464,
                  "derived from the architecture (no published encoder-only figure)", ("seq_len",)),
        ModelSpec("vit_b16", "ViT-B/16, 224x224, class-token head", vit_b16, _image(224),
                  17.56, 86_567_656, _TV + "; DeiT paper: 17.6 G (multiply-adds)"),
        ModelSpec("llama3_8b_prefill", "Llama-3-8B decoder layer (HF-style), prefill of 512 tokens", large=True,
                  source=_ARCH + " (Llama-3-8B config)", **_llama(LLAMA3_8B, "prefill", 512, 2048)),
        ModelSpec("llama3_8b_decode", "Llama-3-8B decoder layer (HF-style), one decode step, static KV cache "
                  "of 2,048", large=True, source=_ARCH + " (Llama-3-8B config)",
                  **_llama(LLAMA3_8B, "decode", 512, 2048)),
        ModelSpec("llama32_1b_decode", "Llama-3.2-1B decoder layer (HF-style, head dim 64), one decode step, "
                  "static KV cache of 2,048", large=True, source=_ARCH + " (Llama-3.2-1B config)",
                  **_llama(LLAMA32_1B, "decode", 512, 2048)),
        ModelSpec("qwen2_1p5b_decode", "Qwen2-1.5B decoder layer (Llama-style with q/k/v biases, 12 q / 2 kv "
                  "heads), one decode step, static KV cache of 2,048", large=True,
                  source=_ARCH + " (Qwen2-1.5B config)", **_llama(QWEN2_1P5B, "decode", 512, 2048)),
        ModelSpec("phi3_mini_decode", "Phi-3-mini decoder layer (fused qkv_proj and gate_up_proj, 32 heads of 96), "
                  "one decode step, static KV cache of 2,048", large=True,
                  source=_ARCH + " (Phi-3-mini-4k config)", **_llama(PHI3_MINI, "decode", 512, 2048)),
        ModelSpec("gemma_2b_decode", "Gemma-2B decoder layer (float32 1+w RMSNorm, GELU-gated MLP, 8 query heads of "
                  "256 over one key-value head), one decode step, static KV cache of 2,048", large=True,
                  source=_ARCH + " (Gemma-2B config)", **_llama(GEMMA_2B, "decode", 512, 2048)),
        ModelSpec("qwen3_4b_decode", "Qwen3-4B decoder layer (per-head q/k RMSNorm, 32 q / 8 kv heads of 128 over "
                  "hidden 2560), one decode step, static KV cache of 2,048", large=True,
                  source=_ARCH + " (Qwen3-4B config)", **_llama(QWEN3_4B, "decode", 512, 2048)),
        ModelSpec("gpt2_block", "GPT-2 small block (HF-style: Conv1D, fused c_attn, causal SDPA, gelu_new), "
                  "seq 128", source=_ARCH + " (GPT-2 small config)", **_gpt2(GPT2_SMALL, 128)),
        ModelSpec("llama_tiny_prefill", "tiny Llama-style layer (hidden 64, 4 q / 2 kv heads), prefill of 16",
                  source=_ARCH, **_llama(LLAMA_TINY, "prefill", 16, 32)),
        ModelSpec("llama_tiny_decode", "tiny Llama-style layer (hidden 64, 4 q / 2 kv heads), decode over a "
                  "cache of 32", source=_ARCH, **_llama(LLAMA_TINY, "decode", 16, 32)),
        ModelSpec("qwen2_tiny_decode", "tiny Qwen2-style layer (q/k/v biases, 4 q / 2 kv heads), decode over a "
                  "cache of 32", source=_ARCH, **_llama(QWEN2_TINY, "decode", 16, 32)),
        ModelSpec("phi3_tiny_decode", "tiny Phi-3-style layer (fused projections, 4 heads of 24), decode over a "
                  "cache of 32", source=_ARCH, **_llama(PHI3_TINY, "decode", 16, 32)),
        ModelSpec("gemma_tiny_decode", "tiny Gemma-style layer (1+w RMSNorm, GELU-gated MLP, 2 q / 1 kv heads), "
                  "decode over a cache of 32", source=_ARCH, **_llama(GEMMA_TINY, "decode", 16, 32)),
        ModelSpec("qwen3_tiny_decode", "tiny Qwen3-style layer (q/k RMSNorm, 4 q / 2 kv heads of 32 over hidden "
                  "64), decode over a cache of 32", source=_ARCH, **_llama(QWEN3_TINY, "decode", 16, 32)),
        ModelSpec("gpt2_tiny_block", "tiny GPT-2-style block (hidden 64, 4 heads), seq 8", source=_ARCH,
                  **_gpt2(GPT2_TINY, 8)),
    ]
}  # fmt: skip


def get_spec(name: str) -> ModelSpec:
    """The spec of a built-in model; UnknownModelError (listing the known names) otherwise."""
    try:
        return ZOO[name]
    except (KeyError, TypeError):
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(ZOO)}") from None


def _randomize_norms(model: nn.Module) -> None:
    """Give every BatchNorm/LayerNorm non-trivial affine parameters and running statistics.

    Freshly made norms are the identity in eval mode (mean 0, var 1, scale 1, shift 0),
    which would let a wrong rewrite that drops or misfolds them look correct.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def build(name: str, batch_size: int = 1, seed: int = 0, **kwargs) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build a zoo model with weights drawn from ``seed``, in eval mode, and example inputs
    (standard normal, same seed) for ``batch_size``. Extra keywords go to the builder
    (e.g. ``num_classes``) or to the input shapes (``seq_len`` for BERT, default 128).
    The global RNG state is left as it was."""
    spec = get_spec(name)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    input_kwargs = {k: kwargs.pop(k) for k in spec.input_kwargs if k in kwargs}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.builder(**kwargs)
        _randomize_norms(model)
        if spec.inputs is not None:
            inputs = spec.inputs(batch_size, model, None, **input_kwargs)
        else:
            inputs = tuple(torch.randn(shape) for shape in spec.input_shapes(batch_size, **input_kwargs))
    return model.eval(), inputs
