"""The graph identities and compile-time graphs the kernel generator's moves rely on.

Each move records an :class:`~superopt.kernel.verify.Identity` (a rule the verifier proves from
``specs/``), instantiated at a small instance of the region's pattern: the axioms hold for every
shape (``shapes x=any``), and a cross-check at 4096 x 6144 would cost seconds. Weight-only
products (a norm weight folded into the next weight, the column sums a LayerNorm's centering
needs) are small graphs over the region's sources, evaluated once at compile time.
"""

from __future__ import annotations

from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule

__all__ = ["rows_shift_rule", "rows_rule", "swap_rule", "fold_rule", "fold_graph", "colsum_graph", "rowvec_matmul_graph", "merge_preps"]


def _small(*dims):
    """Identity instances keep the region's ranks and broadcast pattern at sizes of at most 8:
    the identities are axioms over every shape (``shapes x=any``), and a crosscheck at the full
    4096 x 6144 costs seconds each."""
    return tuple(min(d, 8) for d in dims)


def rows_rule(m, k, n) -> Rule:
    m, k, n = _small(m, k, n)

    def side(commuted):
        b = GraphBuilder()
        x, u, w = b.input("x", (m, k)), b.input("u", (m, 1)), b.input("w", (k, n))
        return b.build([b.op("mul", b.op("matmul", x, w), u) if commuted else b.op("matmul", b.op("mul", x, u), w)])
    return Rule(side(False), side(True))


def rows_shift_rule(m, k, n) -> Rule:
    """matmul(x + u, y) = matmul(x, y) + u ⊗ (1ᵀy) for a column u [m, 1] (``matmul_add_rows``)."""
    m, k, n = _small(m, k, n)

    def side(moved):
        b = GraphBuilder()
        x, u, y = b.input("x", (m, k)), b.input("u", (m, 1)), b.input("y", (k, n))
        if moved:
            ones = b.op("ones", shape=(1, k))
            return b.build([b.op("add", b.op("matmul", x, y), b.op("mul", u, b.op("matmul", ones, y)))])
        return b.build([b.op("matmul", b.op("add", x, u), y)])
    return Rule(side(False), side(True))


def swap_rule(m, k) -> Rule:
    m, k = _small(m, k)

    def side(swapped):
        b = GraphBuilder()
        x, u, g = b.input("x", (m, k)), b.input("u", (m, 1)), b.input("g", (k,))
        return b.build([b.op("mul", b.op("mul", x, g), u) if swapped else b.op("mul", b.op("mul", x, u), g)])
    return Rule(side(False), side(True))


def fold_rule(m, k, n, dtype) -> Rule:
    m, k, n = _small(m, k, n)

    def side(folded):
        b = GraphBuilder()
        x, g, w = b.input("x", (m, k)), b.input("g", (k,)), b.input("w", (k, n))
        if folded:
            return b.build([b.op("matmul", x, b.op("mul", w, b.op("reshape", g, shape=(k, 1))))])
        return b.build([b.op("matmul", b.op("mul", x, g), w)])
    return Rule(side(False), side(True))


def _src(gb: GraphBuilder, region: Graph, name: str):
    t = region.nodes[region.by_name[name]].types[0]
    return gb.input(name, t.shape, t.dtype)


def _folded(gb, region, gs, w, k):
    out = _src(gb, region, w)
    for g in gs:
        out = gb.op("mul", out, gb.op("reshape", _src(gb, region, g), shape=(k, 1)))
    return out


def fold_graph(region: Graph, gs: tuple, w: str, k: int) -> Graph:
    """W with every norm weight g folded into its rows: g[:,None]·W."""
    gb = GraphBuilder()
    return gb.build([_folded(gb, region, gs, w, k)])


def colsum_graph(region: Graph, gs: tuple, w: str, k: int, n: int) -> Graph:
    """The column sums of the folded weight, [N]: what subtracting a row mean costs after a matmul."""
    gb = GraphBuilder()
    ones = gb.op("ones", shape=(1, k))
    wf = _folded(gb, region, gs, w, k)
    if gb.type_of(wf).dtype != "float32":
        wf = gb.op("cast", wf, dtype="float32")
    return gb.build([gb.op("reshape", gb.op("matmul", ones, wf), shape=(n,))])


def rowvec_matmul_graph(region: Graph, beta: str, w: str, k: int, n: int) -> Graph:
    """beta @ W, [N]: a norm bias carried through the matmul."""
    gb = GraphBuilder()
    bt = gb.op("reshape", _src(gb, region, beta), shape=(1, k))
    return gb.build([gb.op("reshape", gb.op("matmul", bt, _src(gb, region, w)), shape=(n,))])


def merge_preps(region: Graph, preps) -> Graph:
    b = GraphBuilder()
    srcs = {}
    outs = []
    for _, g in preps:
        remap = {}
        for i, node in enumerate(g.nodes):
            if node.name is not None:
                if node.name not in srcs:
                    t = region.nodes[region.by_name[node.name]].types[0]
                    srcs[node.name] = b.weight(node.name, t.shape, region.data.get(node.name), t.dtype)
                remap[Ref(i, 0)] = srcs[node.name]
            else:
                remap[Ref(i, 0)] = b.add(node.op, [remap[r] for r in node.inputs], node.attr)[0]
        outs.append(remap[g.outputs[0]])
    return b.build(outs)


