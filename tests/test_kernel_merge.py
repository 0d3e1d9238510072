"""Sibling linears merged into one projection (superopt.kernel.merge) and how the kernel pass
keeps the merge only where a kernel uses it."""

import numpy as np
from hypothesis import given, settings, strategies as st

from superopt.ir.graph import GraphBuilder
from superopt.kernel.choose import choose_kernels
from superopt.kernel.merge import MERGED_SUFFIX, merge_linear_siblings
from superopt.kernel.profile import KernelProfile
from superopt.semantics.reference import evaluate


def _graph(widths, lead=(2,), shared_weight=False, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", lead + (8,))
    h = b.op("relu", x)
    ws = [b.weight(f"w{i}", (8, n), rng.standard_normal((8, n)).astype(np.float32)) for i, n in enumerate(widths)]
    outs = [b.op("matmul", h, w) for w in ws]
    if shared_weight:   # the first weight also read elsewhere (tied): it must stay
        outs.append(b.op("matmul", b.op("add", x, x), ws[0]))
    return b.build(outs)


def _run(g, x):
    return evaluate(g, {"x": x, **{k: np.asarray(v, np.float64) for k, v in g.data.items()}})


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=1, max_size=5), lead=st.sampled_from([(), (3,), (2, 3)]),
       shared=st.booleans(), seed=st.integers(0, 100))
def test_a_merged_projection_computes_the_same_values_and_keeps_no_copy_of_the_weights(widths, lead, shared, seed):
    lead = lead or (1,)
    g = _graph(tuple(widths), lead, shared, seed)
    m, n = merge_linear_siblings(g)
    assert n == (1 if len(widths) >= 3 else 0)
    x = np.random.default_rng(seed).standard_normal(lead + (8,))
    for a, b in zip(_run(g, x), _run(m, x)):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-12)
    if n:
        assert sum(nd.op == "matmul" for nd in m.nodes) == 1 + shared
        names = {nd.name for nd in m.nodes if nd.op == "weight"}
        assert any(s.endswith(MERGED_SUFFIX) for s in names)
        assert names - {s for s in names if s.endswith(MERGED_SUFFIX)} == ({"w0"} if shared else set())
    else:
        assert m is g


def test_the_kernel_pass_keeps_the_graph_when_no_kernel_uses_the_merge():
    g = _graph((8, 4, 4), (2,))
    out, report = choose_kernels(g, None, "NVIDIA H100 80GB HBM3", "fp32", profile=KernelProfile())
    assert out is g and report.merged == 0 and report.chosen == 0


def test_three_siblings_of_different_inputs_are_not_merged():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x, y = b.input("x", (2, 8)), b.input("y", (2, 8))
    w = [b.weight(f"w{i}", (8, 4), rng.standard_normal((8, 4)).astype(np.float32)) for i in range(3)]
    g = b.build([b.op("matmul", x, w[0]), b.op("matmul", y, w[1]), b.op("matmul", x, w[2])])
    assert merge_linear_siblings(g) == (g, 0)


def _fused_gated(n=6, lead=(2,), act="silu", up_first=True, axis=-1, seed=0, use_pieces=False):
    """x -> matmul by one [8, 2n] weight -> split in two -> up * act(gate) (Phi-3's gate_up_proj)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", lead + (8,))
    y = b.op("matmul", x, b.weight("w", (8, 2 * n), rng.standard_normal((8, 2 * n)).astype(np.float32)))
    rank = len(lead) + 1
    gate, up = b.op("split", y, axis=axis % rank, sizes=(n, n))
    if use_pieces:   # the pieces read elsewhere too: no gated pair
        return b.build([b.op("mul", up, b.op(act, gate)), gate])
    a = b.op(act, gate)
    return b.build([b.op("mul", up, a) if up_first else b.op("mul", a, up)])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 9), lead=st.sampled_from([(1,), (3,), (2, 3)]), act=st.sampled_from(["silu", "gelu", "relu"]),
       up_first=st.booleans(), seed=st.integers(0, 100))
def test_a_split_gated_projection_computes_the_same_values(n, lead, act, up_first, seed):
    from superopt.kernel.merge import PART_SUFFIX, split_gated_projections
    from superopt.kernel.regions import find_regions
    g = _fused_gated(n, lead, act, up_first, seed=seed)
    s, count = split_gated_projections(g)
    assert count == 1
    assert sum(nd.op == "matmul" for nd in s.nodes) == 2 and not any(nd.op == "split" for nd in s.nodes)
    assert {nd.name for nd in s.nodes if nd.op == "weight"} == {f"w{PART_SUFFIX}0", f"w{PART_SUFFIX}1"}
    assert [r.kind for r in find_regions(s)] == ["gated"]
    x = np.random.default_rng(seed).standard_normal(lead + (8,))
    for a, b in zip(_run(g, x), _run(s, x)):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_splits_that_are_not_a_gated_pair_stay():
    from superopt.kernel.merge import split_gated_projections
    for g in (_fused_gated(use_pieces=True), _fused_gated(n=6, lead=(12,), axis=0)):
        assert split_gated_projections(g) == (g, 0)
