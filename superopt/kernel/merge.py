"""Sibling linear layers merged into one: the q, k and v projections of one input (three or more
matmuls of one value by weight matrices) become one matmul by the weights concatenated along
their columns, and a split of its result.

Why: a decode step then reads its input and computes its norm once, and one kernel streams all
the weights (1x4096 -> 4096 + 1024 + 1024 on an H100: three norm -> linear kernels took
15.3 + 8.6 + 8.6 us, Inductor's norm and merged k/v projection about 25). Inductor merges such
projections itself under freezing; the kernel pass needs the merge in the graph to cut one
region around it. Two siblings are left alone: they are a gated pair (gate and up), which
:func:`~superopt.kernel.regions.find_regions` cuts as one region with its SiLU·mul epilogue.

The rewrite is the identity ``split(matmul(x, concat(A, B))) = (matmul(x, A), matmul(x, B))``
(the rule database's concat/split algebra) applied n - 1 times: the weights concatenated one at
a time, the result split back one piece at a time (nested two-way splits, views). The identity
is checked as a proven rule (:func:`~superopt.kernel.verify.check_identity`: found proven in
the database or proven now) at a small instance of each rank before it is applied (stated for
three pieces at once the verifier finds no proof within its bound); the concatenated weight
is computed once, here (a constant fold of the nested concatenations).

The same identity read the other way splits a **fused gated projection**
(:func:`split_gated_projections`): Phi-3's ``gate_up_proj``, one matmul whose result is chunked
into gate and up and multiplied as ``up · act(gate)`` (the graph search merges a gated pair so
too), becomes two matmuls by the weight's column halves (constant slices), so that the region
cutter sees the gated pair it cuts with the SiLU·mul in the kernel's epilogue; otherwise the
activation and the product are the down projection's prologue, recomputed by every program of
that kernel (Phi-3-mini's at batch 16 ran 41 us where Inductor's activation kernel and GEMM
took 22.7). Which form is faster is the device's to say (at batch 1 the split form ran slower
in the model): the kernel pass splits only where the whole-model verdict kept a kernel of the
split form (:func:`~superopt.kernel.choose.choose_kernels`).
"""

from __future__ import annotations

import functools

import numpy as np

from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule
from .regions import Region, region_graph, replace_regions
from .verify import Identity, check_identity

__all__ = ["merge_linear_siblings", "merge_rule", "sibling_matmuls", "split_gated_projections", "MIN_SIBLINGS",
           "MERGED_SUFFIX", "PART_SUFFIX"]

#: the name of a merged weight ends with this (how the kernel pass tells a merged projection)
MERGED_SUFFIX = "__merged"
#: the names of a split gated projection's weights end with this and the piece's number
PART_SUFFIX = "__part"
#: the fewest sibling linears merged (two are a gated pair: see the module docstring)
MIN_SIBLINGS = 3


def merge_rule(x_shape: tuple[int, ...], ns: tuple[int, ...]) -> Rule:
    """The identity for ``len(ns)`` pieces at a small instance: ``x`` of the rank of ``x_shape``
    (sizes at most 4), weights [k, n_i] (n_i at most 4 + i, so the pieces differ)."""
    xs = tuple(min(d, 4) for d in x_shape)
    k, widths = xs[-1], tuple(min(n, 4 + i) for i, n in enumerate(ns))

    def side(merged: bool) -> Graph:
        b = GraphBuilder()
        x = b.input("x", xs)
        ws = [b.input(f"w{i}", (k, n)) for i, n in enumerate(widths)]
        if not merged:
            return b.build([b.op("matmul", x, w) for w in ws])
        y = b.op("matmul", x, b.op("concat", *ws, axis=1))
        return b.build(list(b.op("split", y, axis=len(xs) - 1, sizes=widths)))
    return Rule(side(False), side(True))


@functools.lru_cache(maxsize=None)
def _proven(rank: int) -> str:
    rule = merge_rule((2,) * (rank - 2) + (3, 4), (2, 3))
    return check_identity(Identity(f"merge two sibling linears (rank {rank})", rule))


def _groups(g: Graph) -> list[list[int]]:
    """Matmuls of one value by weight matrices with data (same dtype), in groups of at least
    :data:`MIN_SIBLINGS`."""
    by_input: dict[Ref, list[int]] = {}
    for i, n in enumerate(g.nodes):
        if n.op != "matmul":
            continue
        w = g.nodes[n.inputs[1].node]
        if w.op == "weight" and w.name in g.data and w.types[0].rank == 2:
            by_input.setdefault(n.inputs[0], []).append(i)
    out = []
    for sibs in by_input.values():
        dtypes = {g.nodes[g.nodes[i].inputs[1].node].types[0].dtype for i in sibs}
        if len(sibs) >= MIN_SIBLINGS and len(dtypes) == 1:
            out.append(sibs)
    return out


def sibling_matmuls(g: Graph) -> set[int]:
    """The matmul nodes of ``g`` that :func:`merge_linear_siblings` would merge."""
    return {i for sibs in _groups(g) for i in sibs}


def _emitter(g: Graph, sibs: list[int]):
    ws = [g.nodes[g.nodes[i].inputs[1].node] for i in sibs]
    ns = tuple(w.types[0].shape[1] for w in ws)
    data = np.concatenate([np.asarray(g.data[w.name]) for w in ws], axis=1)
    name = "__".join(w.name for w in ws) + MERGED_SUFFIX
    dtype, rank = ws[0].types[0].dtype, g.type_of(g.nodes[sibs[0]].inputs[0]).rank

    def emit(b: GraphBuilder, ins: list[Ref]) -> list[Ref]:
        rest = b.op("matmul", ins[0], b.weight(name, data.shape, data, dtype))
        parts = []
        for i in range(len(ns) - 1, 0, -1):   # peel the last piece off: one two-way split each
            rest, last = b.op("split", rest, axis=rank - 1, sizes=(sum(ns[:i]), ns[i]))
            parts.insert(0, last)
        return [rest] + parts
    return emit


def merge_linear_siblings(g: Graph, prove: bool = True) -> tuple[Graph, int]:
    """``g`` with every group of sibling linears merged (see the module docstring) where the
    identity is proven at its rank, and how many groups were merged. ``prove=False`` skips the
    proof (a trial merge: the kernel pass proves it only where it keeps the merge)."""
    todo = []
    for sibs in _groups(g):
        rank = g.type_of(g.nodes[sibs[0]].inputs[0]).rank
        if rank < 2 or prove and not _proven(rank).startswith("proven"):
            continue
        weights = {g.nodes[i].inputs[1].node for i in sibs}
        nodes = set(sibs) | {w for w in weights if {u for u, _ in g.users.get(Ref(w, 0), ())} <= set(sibs)}
        outs = [Ref(i, 0) for i in sibs]
        sub, boundary = region_graph(g, nodes, outs)
        todo.append((Region("merge", tuple(sibs), tuple(sorted(nodes)), boundary, tuple(outs), sub),
                     _emitter(g, sibs)))
    if not todo:
        return g, 0
    return replace_regions(g, [(r, _fix_inputs(r, e)) for r, e in todo]), len(todo)


def _fix_inputs(region: Region, emit):
    """The region's boundary starts with x (then any weight that other nodes read too): the
    emitter reads x; the weights are replaced by their concatenation."""
    def run(b: GraphBuilder, ins: list[Ref]) -> list[Ref]:
        return emit(b, ins[:1])
    return run


def _gated_splits(g: Graph) -> list[tuple[int, int]]:
    """(matmul, split) of every fused gated projection: a matmul by a weight matrix with data
    whose only user is a two-way split of its last axis, one piece through an elementwise
    activation into a product with the other (``up * act(gate)``, either order)."""
    out = []
    for i, n in enumerate(g.nodes):
        if n.op != "matmul":
            continue
        w = g.nodes[n.inputs[1].node]
        users = g.users.get(Ref(i, 0), ())
        if w.op != "weight" or w.name not in g.data or w.types[0].rank != 2 or len(users) != 1:
            continue
        s = users[0][0]
        sn = g.nodes[s]
        if sn.op != "split" or len(sn.types) != 2 or sn.attr["axis"] != n.types[0].rank - 1:
            continue
        if any(_gates(g, Ref(s, a), Ref(s, 1 - a)) for a in (0, 1)):
            out.append((i, s))
    return out


def _gates(g: Graph, gate: Ref, up: Ref) -> bool:
    """Whether ``gate`` is used only by one elementwise unary operator whose result is used only
    by a product with ``up``, and ``up`` only by that product (none of them a graph output)."""
    acts = g.users.get(gate, ())
    if len(acts) != 1 or gate in g.outputs or up in g.outputs or Ref(acts[0][0], 0) in g.outputs:
        return False
    act = g.nodes[acts[0][0]]
    if len(act.inputs) != 1 or not act.opdef.elementwise or len(act.types) != 1:
        return False
    prods = g.users.get(Ref(acts[0][0], 0), ())
    if len(prods) != 1 or g.nodes[prods[0][0]].op != "mul":
        return False
    ups = g.users.get(up, ())
    return len(ups) == 1 and ups[0][0] == prods[0][0] and set(g.nodes[prods[0][0]].inputs) == {up, Ref(acts[0][0], 0)}


def _part_emitter(g: Graph, mm: int, split: int):
    n = g.nodes[mm]
    w = g.nodes[n.inputs[1].node]
    sizes = tuple(g.nodes[split].attr["sizes"])
    data = np.asarray(g.data[w.name])
    cuts = [data[:, :sizes[0]], data[:, sizes[0]:]]

    def emit(b: GraphBuilder, ins: list[Ref]) -> list[Ref]:
        return [b.op("matmul", ins[0], b.weight(f"{w.name}{PART_SUFFIX}{k}", c.shape, np.ascontiguousarray(c),
                                                w.types[0].dtype)) for k, c in enumerate(cuts)]
    return emit


def split_gated_projections(g: Graph, prove: bool = True) -> tuple[Graph, int]:
    """``g`` with every fused gated projection split in two (see the module docstring) where the
    identity is proven at its rank, and how many were split. ``prove=False`` skips the proof (a
    trial: the kernel pass proves it only where it keeps the split)."""
    todo = []
    for mm, split in _gated_splits(g):
        rank = g.type_of(g.nodes[mm].inputs[0]).rank
        if rank < 2 or prove and not _proven(rank).startswith("proven"):
            continue
        w = g.nodes[mm].inputs[1].node
        nodes = {mm, split} | ({w} if {u for u, _ in g.users.get(Ref(w, 0), ())} == {mm} else set())
        outs = [Ref(split, 0), Ref(split, 1)]
        sub, boundary = region_graph(g, nodes, outs)
        region = Region("split", (mm,), tuple(sorted(nodes)), boundary, tuple(outs), sub)
        todo.append((region, _fix_inputs(region, _part_emitter(g, mm, split))))
    if not todo:
        return g, 0
    return replace_regions(g, todo), len(todo)
