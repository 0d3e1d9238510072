"""Regions cut for the kernel generator (superopt.kernel.regions)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.ir import GraphBuilder
from superopt.kernel.regions import find_regions, inline_graph, replace_region
from superopt.semantics.reference import evaluate, random_inputs


def _block(norm="layernorm", gated=True, bias=False, residual=True, attention=True, layers=1, d=8, f=12, t=4):
    """A small transformer block from the operators the IR has: pre-norm, q/k/v, attention,
    output projection + residual, then a (gated) MLP + residual."""
    b = GraphBuilder()
    rng = np.random.default_rng(0)

    def w(name, shape):
        return b.weight(name, shape, rng.standard_normal(shape).astype(np.float32))

    def normed(x, tag):
        if norm == "layernorm":
            return b.op("mul", b.op("layernorm", x), w(f"g{tag}", (d,)))
        sq = b.op("pow", x, exponent=2.0)
        return b.op("mul", x, b.op("tanh", sq))  # a row-local stand-in

    h = b.input("x", (t, d))
    for layer in range(layers):
        if attention:
            a = normed(h, f"a{layer}")
            q, k, v = (b.op("reshape", b.op("matmul", a, w(f"w{c}{layer}", (d, d))), shape=(1, t, d)) for c in "qkv")
            o = b.op("reshape", b.op("sdpa", q, k, v, scale=0.5, causal=1), shape=(t, d))
            o = b.op("matmul", o, w(f"wo{layer}", (d, d)))
            h = b.op("add", h, o) if residual else o
        m = normed(h, f"m{layer}")
        up = b.op("matmul", m, w(f"wu{layer}", (d, f)))
        if bias:
            up = b.op("add", up, w(f"bu{layer}", (f,)))
        if gated:
            gate = b.op("matmul", m, w(f"wg{layer}", (d, f)))
            act = b.op("mul", b.op("mul", gate, b.op("sigmoid", gate)), up)
        else:
            act = b.op("gelu", up)
        down = b.op("matmul", act, w(f"wd{layer}", (f, d)))
        h = b.op("add", h, down) if residual else down
    return b.build([h])


def _ops(g, r):
    return [g.nodes[i].op for i in r.nodes if g.nodes[i].op != "weight"]


def test_regions_of_a_gated_block():
    g = _block()
    regions = find_regions(g)
    kinds = [r.kind for r in regions]
    assert kinds == ["linear", "linear", "linear", "attention", "linear", "gated", "linear"]
    q = regions[0]
    assert _ops(g, q) == ["layernorm", "mul", "matmul", "reshape"]  # the norm recomputed per projection
    gated = regions[5]
    assert gated.matmuls == 2 and "sigmoid" in _ops(g, gated) and len(gated.outputs) == 1
    out_proj = regions[4]
    assert _ops(g, out_proj)[-1] == "add"  # the residual is the output projection's epilogue
    for r in regions:
        r.graph.check()
        assert r.matmuls <= 2 and len(r.outputs) <= 2


def test_the_residual_stream_is_a_boundary_input():
    g = _block(layers=2)
    for r in find_regions(g):
        assert all(g.nodes[i].op not in ("sdpa",) or i in r.anchors for i in r.nodes)
        # no region swallows the other layer: each has at most two matmuls
        assert r.matmuls <= 2


def _same(g, h):
    env = random_inputs(g, np.random.default_rng(1))
    for a, b in zip(evaluate(g, env), evaluate(h, env)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(norm=st.sampled_from(["layernorm", "other"]), gated=st.booleans(), bias=st.booleans(),
       residual=st.booleans(), attention=st.booleans(), layers=st.integers(1, 2))
def test_replacing_a_region_by_its_own_graph_is_the_identity(norm, gated, bias, residual, attention, layers):
    g = _block(norm, gated, bias, residual, attention, layers)
    regions = find_regions(g)
    assert regions
    for r in regions:
        h = replace_region(g, r, inline_graph(r.graph))
        h.check()
        assert h.key() == g.key()
        _same(g, h)


def test_replacement_must_keep_types():
    from superopt.errors import GraphError
    g = _block()
    r = find_regions(g)[0]
    with pytest.raises(GraphError, match="replacement gives"):
        replace_region(g, r, lambda b, ins: [b.input("z", (3, 3))])


def test_canonical_regions_of_repeated_layers_share_the_structure_not_the_data():
    """The canonical form is computed once per structure (superopt.kernel.regions._CANONICAL):
    a layer's region gets the same canonical graph as a fresh computation, with its own weights."""
    from superopt.ir.hashing import named_hash
    from superopt.kernel import regions as R
    g = _block(layers=3, gated=False, bias=True)
    regions = find_regions(g)
    R._CANONICAL.clear()
    memo = [R.canonical_region(r.graph) for r in regions]
    assert len(R._CANONICAL) < len(regions)  # the layers repeat: fewer structures than regions
    for r, (canon, back) in zip(regions, memo):
        R._CANONICAL.clear()
        fresh, fresh_back = R.canonical_region(r.graph)
        assert back == fresh_back and named_hash(canon) == named_hash(fresh)
        assert canon.nodes == fresh.nodes and list(canon.data) == list(fresh.data)
        for name, old in back.items():
            if old in r.graph.data:
                assert np.array_equal(canon.data[name], r.graph.data[old])
    wu = [dict(back) for _, back in memo if any(v.startswith("wu") for v in back.values())]
    assert len({v for b in wu for v in b.values() if v.startswith("wu")}) == 3  # each layer's own weight


@pytest.mark.parametrize("prologue", [True, False])
def test_row_regions_are_the_row_cuts_of_find_regions(prologue):
    from superopt.kernel.regions import row_regions
    g = _block(layers=2, gated=False, residual=True)
    want = {r.anchors: r for r in find_regions(g, prologue=prologue, rows=True) if r.kind == "rows"}
    got = row_regions(g, prologue=prologue)
    assert got and list(got) == list(want)
    for k, r in got.items():
        assert (r.nodes, r.inputs, r.outputs) == (want[k].nodes, want[k].inputs, want[k].outputs)
        assert r.graph.key() == want[k].graph.key()
