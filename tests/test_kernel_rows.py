"""Row-owning linear kernels: the residual add and the LayerNorm over N in the matmul's epilogue.

Regions (``row_regions``), the translation (grid over M alone, N one padded tile, the norm's
statistics after the loop), its proof (fingerprint and float64, forged norms refused), its
tuning space, and the kernel pass choosing it. The Triton interpreter runs are in
``test_kernel_rows_triton.py``.
"""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernel_regions import program_inputs, residual_layernorm
from superopt.codegen.fx import to_fx
from superopt.ir import GraphBuilder
from superopt.kernel import TileConfig, default_configs, generate_kernels, parse_program, run_reference, verify_kernel
from superopt.kernel.choose import cached_candidates, choose_kernels
from superopt.kernel.configs import ROW_ACC_ELEMS, SMEM_BYTES, row_configs, row_dims, split_configs
from superopt.kernel.model_tuning import distinct_regions
from superopt.kernel.profile import KernelEntry, KernelProfile, region_signature
from superopt.kernel.regions import canonical_region, find_regions, inline_graph, replace_region, row_regions
from superopt.kernel.triton_lower import full_block
from superopt.kernel.tune import config_text, stream_configs, tuning_space
from superopt.semantics.reference import evaluate, random_inputs


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kcache"))


def _block(pre_ln: bool, d=24, f=40, t=9, seed=0):
    """Two linears with residual adds and LayerNorms as BERT (post-LN: the norm after the
    residual) or GPT-2 (pre-LN: the norm before the next linear, the residual stream read again)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()

    def w(name, shape):
        return b.weight(name, shape, (rng.standard_normal(shape) / shape[0] ** 0.5).astype(np.float32))

    def norm(v, tag):
        return b.op("add", b.op("mul", b.op("layernorm", v), w(f"g{tag}", (d,))), w(f"b{tag}", (d,)))

    x = b.input("x", (t, d))
    r = b.op("add", x, b.op("add", b.op("matmul", b.op("relu", x), w("wo", (d, d))), w("bo", (d,))))
    if pre_ln:
        up = b.op("gelu", b.op("matmul", norm(r, "1"), w("wu", (d, f))))
        return b.build([b.op("add", r, b.op("matmul", up, w("wd", (f, d))))])
    h = norm(r, "1")
    up = b.op("gelu", b.op("matmul", h, w("wu", (d, f))))
    return b.build([norm(b.op("add", h, b.op("matmul", up, w("wd", (f, d)))), "2")])


def _ops(g, r):
    return [g.nodes[i].op for i in r.nodes if g.nodes[i].opdef.kind not in ("source", "constant") and g.nodes[i].op != "weight"]


# ---- regions ---------------------------------------------------------------------------------

def test_post_ln_regions_take_the_norm_with_one_output():
    g = _block(pre_ln=False)
    rows = row_regions(g)
    assert len(rows) == 2
    for r in rows.values():
        assert r.kind == "rows" and _ops(g, r)[-4:] == ["add", "layernorm", "mul", "add"] and len(r.outputs) == 1
        r.graph.check()
    assert [r.kind for r in find_regions(g)] == ["linear", "linear", "linear"]   # the default cut is unchanged


def test_pre_ln_region_outputs_the_residual_stream_too():
    g = _block(pre_ln=True)
    (r,) = row_regions(g).values()
    assert _ops(g, r) == ["relu", "matmul", "add", "add", "layernorm", "mul", "add"]
    assert len(r.outputs) == 2
    pre_norm = next(o for o in r.outputs if g.nodes[o.node].op == "add" and
                    any(g.nodes[u].op == "layernorm" for u, _ in g.users[o]))
    assert any(u not in r.nodes for u, _ in g.users[pre_norm])   # read again after the region: the stream
    # the default cut keeps the norm in the next linear's prologue, as before
    assert [_ops(g, x)[0] for x in find_regions(g) if x.anchors != r.anchors][0] == "layernorm"


@settings(max_examples=12, deadline=None)
@given(pre_ln=st.booleans(), seed=st.integers(0, 3))
def test_replacing_a_row_region_by_its_own_graph_is_the_identity(pre_ln, seed):
    g = _block(pre_ln, seed=seed)
    for r in row_regions(g).values():
        h = replace_region(g, r, inline_graph(r.graph))
        h.check()
        assert h.key() == g.key()
        env = random_inputs(g, np.random.default_rng(seed))
        for a, b in zip(evaluate(g, env), evaluate(h, env)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_norm_over_another_axis_is_not_taken():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.op("reshape", b.op("add", b.op("matmul", x, b.weight("w", (8, 12))), b.input("res", (4, 12))), shape=(4, 3, 4))
    g = b.build([b.op("layernorm", y)])
    assert row_regions(g) == {}


# ---- translation and proof -------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n,pre_ln", [(9, 32, 40, False), (8, 64, 24, True), (40, 48, 80, False),
                                          (17, 40, 33, True)])
def test_row_kernels_are_proved_and_own_whole_rows(m, k, n, pre_ln):
    region = residual_layernorm(m, k, n, pre_ln=pre_ln)
    rep = generate_kernels(region)
    cand = rep.best
    assert cand is not None and cand.verdict.ok, rep.table()
    p = cand.program
    assert p.grid == (("M", True),) and p.role("N") == "full" and row_dims(p) == ("N",)
    assert len(p.outputs) == (2 if pre_ln else 1)
    assert any("split=" in c for c in cand.verdict.checks)    # the split schedule was checked too
    ins = program_inputs(region, cand)
    env = random_inputs(region, np.random.default_rng(3))
    env.update({k_: np.asarray(v, float) for k_, v in region.data.items()})
    want = evaluate(region, env)
    for cfg in (default_configs(p)[0], default_configs(p)[-1], TileConfig((("M", 16), ("K", 16)), split=2)):
        for got, w in zip(run_reference(p, ins, cfg), want):
            np.testing.assert_allclose(got.reshape(np.shape(w)), w, rtol=1e-9, atol=1e-9)


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(8, 64), n=st.integers(2, 80), pre_ln=st.booleans(),
       bm=st.sampled_from([16, 32]), bk=st.sampled_from([16, 32]), split=st.integers(1, 3))
def test_row_kernels_match_the_region_at_any_size_and_tiling(m, k, n, pre_ln, bm, bk, split):
    region = residual_layernorm(m, k, n, pre_ln=pre_ln)
    cand = generate_kernels(region, verify=False).candidates[0]
    ins = program_inputs(region, cand)
    env = random_inputs(region, np.random.default_rng(3))
    env.update({k_: np.asarray(v, float) for k_, v in region.data.items()})
    split = min(split, -(-k // bk))
    for got, w in zip(run_reference(cand.program, ins, TileConfig((("M", bm), ("K", bk)), split=split)),
                      evaluate(region, env)):
        np.testing.assert_allclose(got.reshape(np.shape(w)), w, rtol=1e-9, atol=1e-9)


def test_a_norm_before_and_after_the_matmul():
    region = residual_layernorm(9, 48, 40, prologue=True)
    cand = generate_kernels(region).best
    assert cand is not None and cand.verdict.ok
    assert cand.program.grid == (("M", True),)
    assert {i.name.split(":")[0] for i in cand.identities} >= {"matmul_add_rows", "mul_rowscale_matmul"}


def test_padding_of_768_to_1024_never_counts():
    region = residual_layernorm(3, 32, 768, pre_ln=True)
    cand = generate_kernels(region).best
    assert cand is not None and cand.verdict.ok, cand
    assert full_block(768) == 1024
    ins = program_inputs(region, cand)
    ins["res"][:] += 100.0    # a large mean: a padded zero counted would move it visibly
    got = run_reference(cand.program, ins, TileConfig((("M", 16), ("K", 32))))[1]
    r = ins["res"] + ins["x"] @ ins["w"] + ins["bias"]
    c = r - r.mean(axis=-1, keepdims=True)
    want = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * ins["g"] + ins["beta"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def post_ln():
    region = residual_layernorm(9, 32, 40)
    return region, generate_kernels(region).best


def _forged(region, cand, old, new, match):
    text = cand.program.text()
    assert re.search(old, text), text
    v = verify_kernel(parse_program(re.sub(old, new, text, count=1)), region, cand.identities, cand.prep)
    assert not v.ok and re.search(match, v.reason), v.reason


def test_variance_without_the_mean_subtracted_is_refused(post_ln):
    region, cand = post_ln
    text = cand.program.text()
    y = re.search(r"(t\d+) = sum (t\d+) dim=N", text).group(2)          # the pre-norm value
    c = re.search(rf"(t\d+) = sub {y} t\d+", text).group(1)             # y - mean
    _forged(region, cand, rf"= mul {c} {c}", f"= mul {y} {y}", "fingerprint differs")


def test_eps_dropped_is_refused(post_ln):
    region, cand = post_ln
    _forged(region, cand, r"rsqrt (t\d+) eps=1e-05", r"rsqrt \1", "fingerprint differs")


def test_padding_counted_in_the_mean_is_refused(post_ln):
    region, cand = post_ln
    _forged(region, cand, r"mul (t\d+) 1/40", r"mul \1 1/64", "fingerprint differs")   # N=40 padded to 64


def test_a_norm_over_the_tile_not_the_row_is_refused():
    """Tiling N (a grid over M and N) would normalize each 16-column tile on its own."""
    region = residual_layernorm(9, 32, 40)
    text = generate_kernels(region).best.program.text().replace("grid M\n", "grid M N\n")
    v = verify_kernel(parse_program(text), region)
    assert not v.ok and "fingerprint differs" in v.reason, v.reason


# ---- configs -----------------------------------------------------------------------------------

def test_row_configs_bound_registers_and_shared_memory():
    region = residual_layernorm(128, 768, 768, dtype="bfloat16")
    p = generate_kernels(region, verify=False).candidates[0].program
    cfgs = row_configs(p, limit=100)
    assert cfgs and cfgs == default_configs(p, limit=100)
    for c in cfgs:
        assert c.block("M") in (16, 32, 64) and c.block("M") * 1024 <= ROW_ACC_ELEMS
        assert c.block("K") in (32, 64, 128) and c.num_warps in (4, 8) and c.num_stages in (2, 3, 4)
        assert c.num_stages * (c.block("K") * 1024 + c.block("M") * c.block("K")) * 2 <= SMEM_BYTES
    assert {c.block("M") for c in cfgs} == {16, 32, 64}
    splits = split_configs(p, cfgs)
    assert splits and all(c.split > 1 for c in splits)       # 2-8 programs over M: split-K offered
    assert stream_configs(p) == []                          # never the streaming shapes (BLOCK_M 128 x 1024)
    space = tuning_space(p, 12)
    assert any(c.split > 1 for c in space) and all(c.block("M") * 1024 <= ROW_ACC_ELEMS for c in space)


def test_other_programs_keep_their_configs():
    from kernel_regions import matmul_epilogue
    p = generate_kernels(matmul_epilogue()).best.program
    assert row_dims(p) == () and default_configs(p)[0].text() == "M=16 N=16 K=16 warps=4 stages=2"


# ---- the kernel pass and tuning reach them -----------------------------------------------------

def test_tuning_lists_the_row_region_first():
    g = _block(pre_ln=False)
    sigs = [region_signature(full) for full, _ in distinct_regions(g, rows=True)]
    assert len(distinct_regions(g)) < len(sigs)   # row regions only where asked (they lost on the H100)
    rows = row_regions(g)
    assert rows
    for r in find_regions(g):    # every region still tuned; a row region just before its normal form
        sig = region_signature(canonical_region(r.graph)[0])
        assert sig in sigs
        if r.anchors in rows:
            assert sigs.index(region_signature(canonical_region(rows[r.anchors].graph)[0])) < sigs.index(sig)


def test_kernel_pass_uses_a_measured_row_kernel_and_the_model_is_unchanged():
    g = _block(pre_ln=True)
    (row,) = row_regions(g).values()
    canon = canonical_region(row.graph)[0]
    cands, _ = cached_candidates(canon)
    assert cands
    prog = cands[0].program
    prof = KernelProfile()
    prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog.text(), config_text(default_configs(prog)[0]),
                         1.0, 3.0))
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.chosen == 1 and [r.kind for r in rep.regions if r.decision == "kernel"] == ["rows"], rep.table()
    h.check()
    assert [n.op for n in h.nodes].count("layernorm") == 0   # the next linear reads the kernel's normalized rows
    x = torch.randn(9, 24)
    np.testing.assert_allclose(to_fx(h)(x).numpy(), to_fx(g)(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_wide_row_falls_back_to_narrow_loop_tiles():
    """N = 1600 (GPT-2 XL) pads to 2048: a 32 x 2048 bf16 weight tile per stage leaves no room for
    two stages, so the loop tile is 16."""
    p = generate_kernels(residual_layernorm(4, 64, 1600, dtype="bfloat16"), verify=False).candidates[0].program
    cfgs = row_configs(p)
    assert cfgs and {c.block("K") for c in cfgs} == {16} and all(c.block("M") * 2048 <= ROW_ACC_ELEMS for c in cfgs)
    assert all(c.num_stages * (16 * 2048 + c.block("M") * 16) * 2 <= SMEM_BYTES for c in cfgs)
