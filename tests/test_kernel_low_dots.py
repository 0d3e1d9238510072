"""Dots on half-precision tiles in the timed variant (superopt.kernel.tune.low_dots): a bf16
model's regions are imported in float32, so their programs' ``dot P V`` kept P in float32;
the timed variant rounds the computed operand of a dot with a half-precision load to that
precision (as Inductor and cuDNN do), the old variants stay matchable (shipped profile entries),
and the variant runs under Triton's interpreter within bf16 tolerance of float64."""

import os

import numpy as np
import pytest

from superopt.ir.graph import GraphBuilder
from superopt.kernel import generate_kernels
from superopt.kernel.choose import match_candidate
from superopt.kernel.tune import low_dots, specialize, timed_variant, variants


def _decode_attention(h=4, kvh=2, s=64, d=16):
    """SDPA over grouped heads with an additive mask, as a Llama decode step's region (float32)."""
    b = GraphBuilder()
    q = b.input("q", (1, h, 1, d))
    k, v = b.input("k", (1, kvh, s, d)), b.input("v", (1, kvh, s, d))
    mask = b.input("mask", (1, 1, 1, s))
    return b.build([b.op("sdpa", q, k, v, mask, scale=d ** -0.5, causal=0, gqa=1)])


def _linear():
    b = GraphBuilder()
    return b.build([b.op("matmul", b.input("x", (4, 64)), b.weight("w", (64, 32), None))])


def _cands(region):
    return [c for c in generate_kernels(region, verify=False).candidates if c.program.loop]


def test_the_probabilities_are_rounded_before_the_value_dot():
    for c in _cands(_decode_attention()):
        p = specialize(c.program, "bf16")
        low = low_dots(p, "bf16")
        dots = [s for _, s in low.statements() if s.op == "dot"]
        casts = {s.out: s for _, s in low.statements() if s.op == "cast"}
        assert low is not p and low.name.endswith("_lo")
        pv = dots[-1]                      # o += P @ V: P was computed in float32
        assert any(a in casts and casts[a].attr("dtype") == "bf16" for a in pv.args)
        assert not any(a in casts for a in dots[0].args)   # q @ k^T: two loads, unchanged
        assert timed_variant(c.program, set(), "bf16") == low
        assert low_dots(c.program, "fp32") is c.program


def test_a_dot_of_two_loads_is_left_alone_and_old_variants_still_match():
    region = _linear()
    for c in _cands(region):
        names = {"w"}
        vs = variants(c.program, names, "bf16")
        plain = specialize(c.program, "bf16")
        assert vs[0] == plain
        for v in vs:   # every stored form finds its candidate again (shipped profile entries)
            assert match_candidate(v.text(), [c], region, "bf16") is c


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernel under TRITON_INTERPRET=1")
def test_the_rounded_attention_runs_within_bf16_tolerance():
    import torch
    from superopt.kernel.compile import compile_program
    from superopt.kernel.configs import default_configs
    from superopt.semantics.reference import evaluate
    region = _decode_attention()
    rng = np.random.default_rng(0)
    env = {n: rng.standard_normal(region.nodes[i].types[0].shape) for n, i in zip(region.input_names, region.inputs)}
    want = evaluate(region, env)[0]
    for c in _cands(region):
        low = timed_variant(c.program, set(), "bf16")
        run = compile_program(low, default_configs(low)[0])
        names = [t.name for t in low.inputs]
        got = run(*[torch.as_tensor(env[n], dtype=torch.bfloat16) for n in names])[0].float().numpy()
        got = got.reshape(want.shape)   # the packed form writes [B, KV heads, group x L, E]: the same order
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


def test_an_operand_of_two_dots_is_rounded_once():
    """A gated pair over a normalized input that is scaled before its dots (Phi-3's split
    gate_up_proj: x * rsqrt(..) * g feeds both): one cast, read by both dots, and the program
    is well formed (it was rejected: the cast defined twice)."""
    from superopt.kernel.program import parse_program
    b = GraphBuilder()
    x, g = b.input("x", (4, 64)), b.input("g", (4, 64))
    h = b.op("mul", x, g)
    gate = b.op("matmul", h, b.weight("w1", (64, 32), None))
    up = b.op("matmul", h, b.weight("w2", (64, 32), None))
    region = b.build([b.op("mul", b.op("silu", gate), up)])
    progs = [c.program for c in _cands(region)]
    assert progs
    for p in progs:
        low = low_dots(specialize(p, "bf16"), "bf16")
        casts = [s for _, s in low.statements() if s.op == "cast"]
        dots = [s for _, s in low.statements() if s.op == "dot"]
        assert len({s.out for s in casts}) == len(casts)
        assert parse_program(low.text()).text() == low.text()
        if casts:
            assert all(any(c.out in d.args for d in dots) for c in casts)
