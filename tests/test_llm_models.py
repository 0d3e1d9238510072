"""The LLM blocks of the zoo (issue 23), written as Hugging Face writes them: every variant imports
with no opaque node, in float32 and in bfloat16, and the imported graph computes what the module
computes (float64 reference semantics, and the generated torch code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from superopt.codegen import to_fx
from superopt.frontend import from_exported_program
from superopt.models import ZOO, build
from superopt.models.llama import LLAMA_TINY, LlamaDecoder, example_inputs, repeat_kv
from superopt.semantics import evaluate

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py

VARIANTS = [("llama_tiny_prefill", {"kv_repeat": "expand"}), ("llama_tiny_prefill", {"kv_repeat": "repeat_interleave"}),
            ("llama_tiny_prefill", {"num_layers": 2}),
            ("llama_tiny_decode", {"kv_repeat": "expand"}), ("llama_tiny_decode", {"kv_repeat": "repeat_interleave"}),
            ("llama_tiny_decode", {"num_layers": 2}),
            ("gpt2_tiny_block", {"gelu": "written"}), ("gpt2_tiny_block", {"gelu": "tanh"})]


def _import(model, inputs):
    g, report = from_exported_program(torch.export.export(model, inputs))
    assert report.opaque == {}, report.declined
    return g


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _as64(inputs):
    return tuple(t.double() if t.is_floating_point() else t for t in inputs)


@pytest.mark.parametrize("name,kw", VARIANTS)
def test_imports_without_opaque_nodes_and_matches_the_module(name, kw):
    model, inputs = build(name, batch_size=2, seed=1, **kw)
    g = _import(model, inputs)
    env = {n: t.double().numpy() if t.is_floating_point() else t.numpy() for n, t in zip(g.input_names, inputs)}
    got = evaluate(g, env)
    with torch.no_grad():
        want = _outputs(model.double()(*_as64(inputs)))
        fx = _outputs(to_fx(g)(*inputs))
    assert len(got) == len(want) == len(fx)
    for a, w, f in zip(got, want, fx):
        scale = np.abs(w.numpy()).max()
        assert np.abs(a - w.numpy()).max() <= 1e-5 * scale  # float32 weights and constants
        assert (f.double() - w).abs().max().item() <= 1e-4 * scale


@pytest.mark.parametrize("name,kw", VARIANTS[:1] + VARIANTS[3:4] + VARIANTS[-1:])
def test_bfloat16_imports_without_opaque_nodes_with_the_upcast(name, kw):
    model, inputs = build(name, batch_size=1, seed=0, **kw)
    model = model.to(torch.bfloat16)
    inputs = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
    g = _import(model, inputs)
    ops = [n.op for n in g.nodes]
    if name.startswith("llama"):  # RMSNorm upcasts to float32 and back, twice per layer
        casts = [n.attr["dtype"] for n in g.nodes if n.op == "cast"]
        assert casts.count("float32") == casts.count("bfloat16") == 2
    assert g.type_of(g.outputs[0]).dtype == "bfloat16" and "opaque" not in ops


def test_both_ways_of_repeating_kv_heads_import_to_one_graph():
    from superopt.ir import structural_hash
    graphs = []
    for kv in ("expand", "repeat_interleave"):
        model, inputs = build("llama_tiny_decode", kv_repeat=kv)
        graphs.append(_import(model, inputs))
    assert structural_hash(graphs[0]) == structural_hash(graphs[1])
    assert sum(n.op == "expand" for n in graphs[0].nodes) == 2


def test_hf_repeat_kv_is_repeat_interleave():
    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(repeat_kv(x, 4), x.repeat_interleave(4, dim=1))


def test_decode_writes_the_new_token_at_its_position_only():
    model = LlamaDecoder(LLAMA_TINY, 1, "decode").eval()
    inputs = example_inputs(LLAMA_TINY, "decode", 1, 16, 32, 1)
    p = int(inputs[4])
    with torch.no_grad():
        _, k, v = model(*inputs)
    for new, old in ((k, inputs[5]), (v, inputs[6])):
        changed = (new != old).any(dim=(0, 1, 3))
        assert changed.nonzero().flatten().tolist() == [p]


def test_zoo_sizes_follow_the_configs():
    assert ZOO["llama3_8b_decode"].published_params == 218_112_000  # Llama-3-8B: 32 layers of it + embeddings = 8.03 B
    assert ZOO["gpt2_block"].published_params * 12 + 50257 * 768 + 1024 * 768 + 2 * 768 == 124_439_808  # GPT-2's 124 M
    shapes = ZOO["llama3_8b_decode"].input_shapes(16)
    assert shapes[0] == (16, 1, 4096) and shapes[-1] == (16, 8, 2048, 128) and len(shapes) == 7
    assert ZOO["llama3_8b_prefill"].input_shapes(1)[0] == (1, 512, 4096)
    assert ZOO["llama3_8b_prefill"].large and not ZOO["llama_tiny_prefill"].large
