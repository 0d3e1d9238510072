"""generate_kernels over the region classes: what it finds, prunes and proves."""

import json

import numpy as np
import pytest

from kernel_regions import (attention, gate_up, gqa_sdpa, hf_rmsnorm_swiglu, layernorm_matmul, masked_sdpa,
                            matmul_epilogue, rmsnorm_matmul)
from superopt.ir.graph import GraphBuilder
from superopt.kernel import generate_kernels, parse_program, run_reference
from superopt.semantics.reference import evaluate, random_inputs


def _ops(program):
    return [s.op for _, s in program.statements()]


def test_rmsnorm_matmul_moves_the_norm_into_the_loop():
    rep = generate_kernels(rmsnorm_matmul(epilogue="bias"))
    assert rep.kind == "matmul" and rep.enumerated == 4 and rep.verified == 2
    assert rep.prune_reasons and all("row scale inside the loop" in r for r in rep.prune_reasons)
    best = rep.best.program
    assert best.loop == "K" and [a.dims for a in best.accs] == [("M",), ("M", "N")]   # sum of squares + matmul
    assert all(s.op != "mul" or "g" not in s.args for s in best.body)                  # g folded into w
    assert rep.best.prep is not None and rep.best.prep.names == ("w__x__g",)
    assert "commute=1 fold=1" in rep.best.moves
    assert {i.name.split(":")[0] for i in rep.best.identities} == {"mul_rowscale_matmul", "matmul_mul_rows"}


@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_matmul_centres_after_the_loop(affine):
    """(x - mean)·W = x·W - mean ⊗ colsum(W): sums of x and x² in the loop, the centering, 1/σ
    and the norm bias (beta·W) after it, colsum and beta·W computed at compile time."""
    rep = generate_kernels(layernorm_matmul(affine=affine))
    best = rep.best
    assert best is not None, rep.table()
    assert len(best.program.accs) == 3 and [s.op for s in best.program.body].count("sum") == 2
    names = set(best.prep.names)
    assert any(n.endswith("__colsum") for n in names) and any("__at__" in n for n in names) == affine
    assert {i.name.split(":")[0] for i in best.identities} >= {"matmul_add_rows", "mul_rowscale_matmul"}
    assert any("row scale inside the loop" in r for r in rep.prune_reasons)


def test_hugging_face_rmsnorm_into_swiglu():
    rep = generate_kernels(hf_rmsnorm_swiglu())
    assert rep.verified == 4 and "low_dot=1" in rep.best.moves
    body = rep.best.program.body
    assert [s.op for s in body].count("dot") == 2 and any(s.op == "cast" for s in body)
    assert "silu" in [s.op for s in rep.best.program.post]


def test_sdpa_with_gqa_attribute():
    rep = generate_kernels(gqa_sdpa())
    assert rep.verified == 4
    packed = next(c for c in rep.candidates if "pack_gqa=1" in c.moves and "online=1" in c.moves)
    assert dict(packed.program.dims)["L"] == 2   # the two query heads of a group, one query each


def test_gate_and_up_share_one_loop():
    rep = generate_kernels(gate_up())
    best = rep.best.program
    assert len(best.accs) == 2 and _ops(best).count("dot") == 2
    assert [s.tensor for s in best.body if s.op == "load"].count("x") == 1
    assert "sigmoid" in [s.op for s in best.post]


def test_matmul_epilogue_and_residual():
    rep = generate_kernels(matmul_epilogue())
    post = [s.op for s in rep.best.program.post]
    assert post[:2] == ["load", "add"] or "gelu" in post
    assert {"gelu", "add", "store"} <= set(post)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_online_softmax_with_gqa(causal):
    rep = generate_kernels(attention(h=4, kvh=2, l=5 if causal else 1, causal=causal))
    assert rep.kind == "attention" and rep.verified >= 2
    online = next(c for c in rep.candidates if "online=1" in c.moves)
    assert online.program.loop == "S" and any(s.op == "max" for s in online.program.body)
    if not causal:   # decode: the two query heads of a group are the rows of one program
        assert any("pack_gqa=1" in c.moves for c in rep.candidates)
    else:
        assert "causal queries of different heads cannot share one tile (pack_gqa with L > 1)" in rep.prune_reasons


def test_long_key_axis_needs_the_online_softmax():
    rep = generate_kernels(attention(h=2, kvh=2, l=3, s=300))
    assert any("larger than 256" in r for r in rep.prune_reasons)
    assert rep.verified == 1 and "online=1" in rep.best.moves


def test_candidates_match_the_region_in_float64():
    for region in (rmsnorm_matmul(epilogue="relu"), gate_up(), attention(causal=1)):
        rep = generate_kernels(region)
        env = random_inputs(region, np.random.default_rng(7))
        env.update({k: np.asarray(v, float) for k, v in region.data.items()})
        want = evaluate(region, env)[0]
        for cand in rep.candidates:
            ins = dict(env)
            if cand.prep:
                ins.update(zip(cand.prep.names, evaluate(cand.prep.graph, env)))
            ins = {t.name: np.asarray(ins[t.name]).reshape(t.shape) for t in cand.program.inputs}
            (got,) = run_reference(cand.program, ins)
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-9, atol=1e-9)


def test_regions_without_a_translation_are_reported():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    rep = generate_kernels(b.build([b.op("relu", x)]))
    assert rep.kind == "none" and rep.candidates == [] and "no translator" in rep.stop
    b = GraphBuilder()
    x, w1, w2 = b.input("x", (4, 32)), b.weight("w1", (32, 32)), b.weight("w2", (32, 32))
    rep = generate_kernels(b.build([b.op("matmul", b.op("relu", b.op("matmul", x, w1)), w2)]))
    assert rep.verified == 0 and any("second loop" in r for r in rep.prune_reasons)


def test_report_table_json_and_size_bound():
    rep = generate_kernels(gate_up(), max_ops=5)
    assert rep.verified == 0 and any("max_ops=5" in r for r in rep.prune_reasons)
    rep = generate_kernels(gate_up())
    doc = json.loads(json.dumps(rep.to_json()))
    assert doc["verified"] == rep.verified and doc["candidates"][0]["verdict"]["status"] == "proved"
    assert "enumerated" in rep.table() and "candidate [" in rep.table()


@pytest.mark.parametrize("mask_shape, l, packs", [((1, 1, 1, 37), 1, True), ((1, 1, 5, 37), 5, False),
                                                  ((5, 37), 5, False), ((1, 4, 1, 37), 1, False)])
def test_masked_attention(mask_shape, l, packs):
    rep = generate_kernels(masked_sdpa(l=l, mask_shape=mask_shape))
    assert rep.verified == (4 if packs else 2), rep.table()
    assert any(s.op == "addmask" for _, s in rep.best.program.statements())


def test_masked_attention_with_a_key_tile_masked_whole():
    """A decode step over a static cache: keys past the position are -inf, and for one row the
    first tile of keys is masked whole; the running max must not turn that into NaN."""
    region = masked_sdpa(h=2, kvh=2, l=3, s=40, mask_shape=(1, 1, 3, 40))
    rng = np.random.default_rng(0)
    env = random_inputs(region, rng)
    mask = np.zeros((1, 1, 3, 40))
    mask[..., 30:] = -np.inf
    mask[0, 0, 1, :16] = -np.inf
    env["mask"] = mask
    want = evaluate(region, env)[0]
    for cand in generate_kernels(region).candidates:
        ins = {t.name: np.asarray(env[t.name]).reshape(t.shape) for t in cand.program.inputs}
        from superopt.kernel.emulate import default_emulation_config
        (got,) = run_reference(cand.program, ins, default_emulation_config(cand.program))
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-9, atol=1e-12)



def test_a_bf16_linears_cast_twin_is_tuned_once():
    """The dot in the weights' dtype (``low_dot``) casts its row operand to bf16; a row loaded from a
    bf16 input already is: that candidate and the one without the cast compile to the same kernel,
    and the tuning plan times it once (a program exported in bf16 was tuned twice per linear)."""
    from superopt.kernel.tune import cast_free_key, plan_region
    b = GraphBuilder()
    x, r = b.input("x", (2, 64), "bfloat16"), b.input("r", (2, 32), "bfloat16")
    g = b.build([b.op("add", b.op("matmul", x, b.weight("w", (64, 32), None, "bfloat16")), r)])
    rep = generate_kernels(g)
    assert len(rep.candidates) == 2 and all(c.verdict.ok for c in rep.candidates), rep.table()
    a, c = (cand.program for cand in rep.candidates)
    assert a.text() != c.text() and cast_free_key(a) == cast_free_key(c)
    plan = plan_region(g, rep.candidates, "bf16")
    assert len(plan.progs) == 1 and len({t[0] for t in plan.tasks}) == 1
    # a cast that changes the dtype is kept: a float32 twin of the region has one candidate per form
    assert cast_free_key(parse_program(a.text().replace("dtype=bf16", "dtype=f16"))) != cast_free_key(c)
