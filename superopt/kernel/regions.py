"""Regions: the small subgraphs of a model that one fused kernel may replace.

The kernel generator works on one region at a time. A region is cut around an *anchor*: a
linear layer (a ``matmul`` whose right operand is a matrix), two sibling linear layers reading
the same value (gate and up projections), or one attention (``sdpa``). Around the anchor it
takes

- the **prologue**: before a linear layer, the norms, elementwise operators, row reductions,
  reshapes and casts that compute its input (RMSNorm with its float32 upcast, LayerNorm), back
  to the values the rest of the graph computes (matmul results, the residual stream, graph
  inputs); before an attention, the repetition of its key and value heads (grouped-query
  attention written with ``expand`` + ``reshape`` or ``repeat_interleave``) and the rotary
  embedding of its queries (``q·cos + rotate_half(q)·sin``, :mod:`superopt.kernel.rotary`)
  where only the attention reads it;
- the **epilogue** of a linear layer: elementwise operators, reshapes and casts after it (bias,
  activation, the SiLU·mul of a gated MLP, a residual add), as long as the region keeps one
  output (``max_outputs``).

With ``rows=True`` (:func:`row_regions`) a linear region's epilogue goes on through a LayerNorm
over its output rows and the norm's gamma and beta (a *row-owning* region, kind ``rows``: its
kernel holds whole rows of N), with the pre-norm sum as a second output where other nodes read it
(the residual stream of a pre-LN block). The default cut is unchanged.

What the kernel generator cannot take stays outside (transposes, other slices and
concatenations, the keys' rotary embedding where the KV cache stores it, softmax written out):
those run as Inductor compiles them.

A prologue node is taken only if every user of its value is in the region or is another linear
layer (the q/k/v projections of one normalized input each recompute the norm in their own
kernel, as Mirage's RMSNorm+matmul kernel does); so the residual stream, used again after the
layer, is a boundary input and not pulled in. Weights and constants inside a region stay in
the region graph (with their data); every other value from outside is a boundary input.

A :class:`Region` carries the original node indices, its boundary inputs and its outputs (as
values of the original graph) and a standalone :class:`~superopt.ir.Graph` computing the
outputs from the boundary inputs. :func:`replace_region` puts anything computing the same
values in its place; replacing a region by its own graph gives the same graph back (up to
node order), which the tests check as a property.

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (4, 8)); w = b.weight("w", (8, 16))
>>> y = b.op("relu", b.op("matmul", b.op("layernorm", x), w))
>>> g = b.build([y])
>>> [r.kind for r in find_regions(g)], [g.nodes[i].op for i in find_regions(g)[0].nodes]
(['linear'], ['weight', 'layernorm', 'matmul', 'relu'])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import GraphError
from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.serialize import graph_to_json
from .headnorm import match_head_norm
from .rotary import match_rotary

__all__ = ["Region", "find_regions", "row_regions", "region_graph", "replace_region", "replace_regions", "inline_graph",
           "as_reference", "reference_text",
           "canonical_region",
           "MAX_REGION_NODES"]

#: a region's size bound (compute nodes): the generator enumerates programs up to about this
MAX_REGION_NODES = 32
#: reductions a kernel can run over a row (not softmax: that belongs to an attention)
_ROW_REDUCTIONS = frozenset({"layernorm", "mean", "sum", "rms_norm", "rmsnorm"})
_KINDS = {"reduction": _ROW_REDUCTIONS, "transparent": frozenset({"reshape", "cast"}),
          "repeat": frozenset({"expand", "repeat_interleave"}), "pointwise": frozenset({"smul"})}
#: what a region may take before its anchor (linear layers; attention: its keys and values only)
_PROLOGUE = {"linear": ("pointwise", "reduction", "transparent"), "attention": ("repeat", "transparent")}
#: operators never taken into a region (gathers, pooling, opaque calls)
_NEVER = frozenset({"embedding", "opaque", "softmax", "avgpool2d", "maxpool2d", "conv2d", "batchnorm", "kernel", "clamp"})


@dataclass(frozen=True)
class Region:
    """A cut of a graph: ``kind`` (``linear``, ``gated``: two sibling linears, ``attention``,
    ``rows``: a linear with the LayerNorm over its output rows, :func:`row_regions`),
    the original ``nodes`` (sorted indices), the boundary ``inputs`` and the ``outputs`` (values
    of the original graph), and ``graph``: the standalone region (inputs in ``inputs`` order)."""

    kind: str
    anchors: tuple[int, ...]
    nodes: tuple[int, ...]
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]
    graph: Graph

    @property
    def matmuls(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op == "matmul")


def _fusion(g: Graph, i: int) -> str:
    """What a kernel can do with node ``i``: ``pointwise`` (elementwise), ``reduction`` (over a
    row), ``transparent`` (reshape, cast: the same elements), ``repeat`` (the key/value heads of
    grouped-query attention), a ``source`` or ``constant``; ``never`` for the rest (transposes,
    concatenations, slices and softmax stay with Inductor)."""
    n = g.nodes[i]
    if n.op in _NEVER:
        return "never"
    if n.opdef.kind in ("source", "constant"):
        return n.opdef.kind
    for kind, ops in _KINDS.items():
        if n.op in ops:
            return kind
    return "pointwise" if n.opdef.elementwise else "never"


def _is_linear(g: Graph, i: int) -> bool:
    n = g.nodes[i]
    return n.op == "matmul" and g.type_of(n.inputs[1]).rank == 2


def _users(g: Graph, i: int) -> set[int]:
    n = g.nodes[i]
    return {u for k in range(len(n.types)) for u, _ in g.users.get(Ref(i, k), ())}


def _keeps_rows(g: Graph, i: int) -> bool:
    """A reshape that keeps the last axis (rows stay rows); casts always do."""
    n = g.nodes[i]
    return n.op != "reshape" or n.types[0].shape[-1:] == g.type_of(n.inputs[0]).shape[-1:]


def _prologue(g: Graph, starts: Sequence[Ref], anchors: set[int], limit: int, accept: tuple,
              taken: set[int]) -> set[int]:
    """Nodes behind ``starts`` that a kernel can compute on the way in (see the module docstring)."""
    cand: set[int] = set()
    stack = [r.node for r in starts]
    while stack and len(cand) < limit:
        i = stack.pop()
        if i in cand or i in anchors or i in taken or _fusion(g, i) not in accept + ("constant",) \
                and g.nodes[i].op != "weight":
            continue
        if "reduction" in accept and not _keeps_rows(g, i):  # a linear's rows: its input's last axis
            continue
        cand.add(i)
        stack.extend(r.node for r in g.nodes[i].inputs)
    outputs = {r.node for r in g.outputs}
    changed = True
    while changed:  # keep only nodes all of whose users are inside (or other linear layers)
        changed = False
        for i in sorted(cand):
            if g.nodes[i].op == "weight":
                continue
            keep = i not in outputs and all(u in cand or u in anchors or _is_linear(g, u) for u in _users(g, i))
            if not keep:
                cand.discard(i)
                changed = True
    return {i for i in cand if g.nodes[i].op != "weight" or _users(g, i) & (cand | anchors)}


def _outputs(g: Graph, nodes: set[int], recomputed: set[int] = frozenset()) -> list[Ref]:
    """Values of ``nodes`` read outside them (weights and constants are copied, and a
    ``recomputed`` prologue stays in the graph for its other users: never outputs)."""
    outs = {r for r in g.outputs if r.node in nodes and g.nodes[r.node].opdef.kind != "source"}
    for i in nodes:
        if g.nodes[i].opdef.kind in ("source", "constant") or i in recomputed:
            continue
        for k in range(len(g.nodes[i].types)):
            if any(u not in nodes for u, _ in g.users.get(Ref(i, k), ())):
                outs.add(Ref(i, k))
    return sorted(outs)


def _epilogue(g: Graph, nodes: set[int], max_outputs: int, limit: int, taken: set[int], pro: set[int]) -> set[int]:
    """Grow ``nodes`` forward over pointwise users and views (whose other operands come from
    before the region, so no cycle forms), then keep the longest prefix of what was added, in
    graph order, that leaves the region at most ``max_outputs`` outputs."""
    first = min(i for i in nodes if g.nodes[i].opdef.kind not in ("source", "constant"))
    grown, added, frontier = set(nodes), [], sorted(nodes)
    while frontier and len(grown) < limit:
        i = frontier.pop(0)
        for u in sorted(_users(g, i)):
            if u in grown or u in taken or _fusion(g, u) not in ("pointwise", "transparent"):
                continue
            others = [x.node for x in g.nodes[u].inputs if x.node not in grown]
            if any(o >= first and _fusion(g, o) not in ("source", "constant") for o in others):
                continue
            extra = {o for o in others if _fusion(g, o) == "constant" or g.nodes[o].op == "weight"}
            grown |= {u} | extra
            added.append((u, extra))
            frontier.append(u)
    best, cur = set(nodes), set(nodes)
    for u, extra in sorted(added):
        cur = cur | {u} | extra
        if len(_outputs(g, cur, pro)) <= max_outputs:
            best = set(cur)
    return best


def region_graph(g: Graph, nodes: set[int], outputs: Sequence[Ref]) -> tuple[Graph, tuple[Ref, ...]]:
    """The standalone graph of ``nodes`` and its boundary inputs (values read from outside,
    in first-use order; graph inputs keep their name, others are named ``in0, in1, ...``)."""
    b = GraphBuilder()
    mapping: dict[Ref, Ref] = {}
    boundary: list[Ref] = []
    taken = {g.nodes[i].name for i in nodes if g.nodes[i].name is not None}
    for i in sorted(nodes):
        n = g.nodes[i]
        for r in n.inputs:
            if r.node not in nodes and r not in mapping:
                src = g.nodes[r.node]
                name = src.name if src.op == "input" else f"in{len(boundary)}"
                while name in taken:
                    name = f"{name}_"
                taken.add(name)
                mapping[r] = b.input(name, g.type_of(r).shape, g.type_of(r).dtype)
                boundary.append(r)
        if n.op == "weight":
            out = (b.weight(n.name, n.types[0].shape, g.data.get(n.name), n.types[0].dtype),)
        else:
            out = b.add(n.op, [mapping[r] for r in n.inputs], n.attr)
        for k, o in enumerate(out):
            mapping[Ref(i, k)] = o
    return b.build([mapping[r] for r in outputs]), tuple(boundary)


def _make(g: Graph, kind: str, anchors: tuple[int, ...], nodes: set[int], outs: Sequence[Ref]) -> Region:
    """The :class:`Region` of a cut. Its standalone graph is built once per graph and cut: the
    kernel pass cuts one graph four ways (with and without prologues and row norms), and most
    cuts come out the same (the memo lives on the immutable graph, so it goes with it)."""
    key = (tuple(sorted(nodes)), tuple(outs))
    memo = vars(g).setdefault("_region_graphs", {})
    if key not in memo:
        memo[key] = region_graph(g, nodes, outs)
    sub, boundary = memo[key]
    return Region(kind, anchors, key[0], boundary, key[1], sub)


def _anchor_groups(g: Graph) -> list[tuple[str, tuple[int, ...]]]:
    """Linear layers (siblings on one input paired when exactly two share it) and attentions."""
    by_input: dict[Ref, list[int]] = {}
    groups = []
    for i, n in enumerate(g.nodes):
        if n.op == "sdpa":
            groups.append(("attention", (i,)))
        elif _is_linear(g, i):
            by_input.setdefault(n.inputs[0], []).append(i)
    for sibs in by_input.values():
        if len(sibs) == 2:
            groups.append(("gated", tuple(sibs)))
        else:
            groups.extend(("linear", (i,)) for i in sibs)
    return sorted(groups, key=lambda kv: kv[1])


def _rotary(g: Graph, anchor: int, taken: set[int]) -> set[int]:
    """The rotary embedding on an attention's queries (:func:`~superopt.kernel.rotary.match_rotary`)
    and a per-head RMSNorm of the queries before it, or either alone
    (:func:`~superopt.kernel.headnorm.match_head_norm`), where only the attention reads them and no
    other region took them; else nothing."""
    q, nodes = g.nodes[anchor].inputs[0], set()
    m = match_rotary(g, q)
    if m is not None:
        if not _owned(g, m.nodes, {anchor}, taken):
            return set()
        q, nodes = m.q, set(m.nodes)
    norm = match_head_norm(g, q)
    if norm is not None:   # with the source's upcast, or reading it where another region computes it
        for inner in (norm.nodes | norm.casts, norm.nodes):
            if _owned(g, inner, nodes | {anchor}, taken):
                return nodes | inner
    return nodes


def _owned(g: Graph, nodes: frozenset[int], readers: set[int], taken: set[int]) -> bool:
    """No other region took ``nodes`` (weights aside: those may be shared, and are copied), none
    is an output of ``g``, and only they and ``readers`` read them."""
    inner = {i for i in nodes if g.nodes[i].op != "weight"}
    return not (inner & taken) and not any(r.node in nodes for r in g.outputs) \
        and all(_users(g, i) <= nodes | readers for i in inner)


def _row_norm(g: Graph, nodes: set[int], anchors: tuple[int, ...], limit: int, taken: set[int],
              pro: set[int]) -> set[int] | None:
    """``nodes`` (a linear region) extended through a LayerNorm over the output's last dim N
    that reads a value of its epilogue, and the pointwise tail after the norm whose other
    operands are weights or constants (its gamma and beta): a *row-owning* region, whose kernel
    holds whole rows of N. None where there is no such norm or the region would have more than
    two outputs (the norm's result, and the pre-norm sum where it has other users)."""
    n_out = g.nodes[anchors[0]].types[0].shape[-1]
    inner = {i for i in nodes if g.nodes[i].opdef.kind not in ("source", "constant") and g.nodes[i].op != "weight"}
    norms = sorted(u for i in inner if i not in pro for u in _users(g, i)
                   if u not in nodes and u not in taken and g.nodes[u].op == "layernorm"
                   and g.nodes[u].attr.get("ndim", 1) == 1 and g.type_of(g.nodes[u].inputs[0]).shape[-1] == n_out)
    if not norms:
        return None
    grown, cur = set(nodes) | {norms[0]}, norms[0]
    while len(grown) < limit:
        users = sorted(_users(g, cur))
        if len(users) != 1 or users[0] in taken or _fusion(g, users[0]) not in ("pointwise", "transparent"):
            break
        u = users[0]
        others = [x.node for x in g.nodes[u].inputs if x.node not in grown]
        if any(_fusion(g, o) != "constant" and g.nodes[o].op != "weight" for o in others):
            break
        grown |= {u} | set(others)
        cur = u
    return grown if len(_outputs(g, grown, pro)) <= 2 else None


def find_regions(g: Graph, max_nodes: int = MAX_REGION_NODES, max_outputs: int = 1,
                 prologue: bool = True, rows: bool = False) -> list[Region]:
    """The regions of ``g`` (see the module docstring), disjoint in their anchors and epilogues,
    in graph order. Prologue nodes may be shared: each region recomputes them. ``prologue=False``
    cuts the same anchors and epilogues without prologues (what is left when the generator has
    no kernel for a norm before the linear). ``rows=True``: a linear region whose epilogue feeds
    a LayerNorm over its output rows takes the norm and its gamma and beta in (kind ``rows``, see
    :func:`row_regions`); the others are cut as without it."""
    return [_make(g, *cut) for cut in _cuts(g, max_nodes, max_outputs, prologue, rows)]


def _cuts(g: Graph, max_nodes: int, max_outputs: int, prologue: bool, rows: bool) -> list[tuple]:
    """``(kind, anchors, nodes, outputs)`` of each region :func:`find_regions` gives, without
    building the region graphs (which cuts are taken depends on their outputs only)."""
    taken: set[int] = set()
    cuts = []
    for kind, anchors in _anchor_groups(g):
        if taken & set(anchors):
            continue
        a = set(anchors)
        attention = kind == "attention"
        starts = list(g.nodes[anchors[0]].inputs[1:3]) if attention else [g.nodes[i].inputs[0] for i in anchors]
        pro = _prologue(g, starts, a, max_nodes, _PROLOGUE["attention" if attention else "linear"], taken) \
            if prologue else set()
        weights = {r.node for i in anchors for r in g.nodes[i].inputs if g.nodes[r.node].op == "weight"}
        nodes = a | pro | weights
        if attention and prologue:
            nodes |= _rotary(g, anchors[0], taken)
        limit = max_outputs
        if not attention:
            nodes = _epilogue(g, nodes, max_outputs, max_nodes, taken, pro)
            row = _row_norm(g, nodes, anchors, max_nodes, taken, pro) if rows else None
            if row is not None:
                kind, nodes, limit = "rows", row, max(max_outputs, 2)
        outs = _outputs(g, nodes, pro)
        if outs and len(outs) <= limit:
            cuts.append((kind, anchors, nodes, outs))
            taken |= {i for i in nodes if i not in pro}
    return cuts


def row_regions(g: Graph, prologue: bool = True) -> dict[tuple[int, ...], Region]:
    """The row-owning regions of ``g`` by their anchors: a linear layer, its epilogue (bias,
    residual add) and the LayerNorm over its output rows after it, with gamma and beta; the
    pre-norm sum is a second output where other nodes read it (the residual stream of a pre-LN
    block). Each covers the region :func:`find_regions` cuts for the same anchors and more, so
    the kernel pass can use it in that region's place, or fall back to it. (Only these regions'
    graphs are built, not those of the other cuts.)"""
    return {cut[1]: _make(g, *cut) for cut in _cuts(g, MAX_REGION_NODES, 1, prologue, True) if cut[0] == "rows"}


def replace_region(g: Graph, region: Region, emit: Callable[[GraphBuilder, list[Ref]], Sequence[Ref]]) -> Graph:
    """``g`` with ``region`` computed by ``emit(builder, boundary_refs) -> output refs`` (one per
    region output, same types). Nodes left without a user are dropped; inputs stay."""
    return replace_regions(g, [(region, emit)])


def replace_regions(g: Graph, todo: Sequence[tuple[Region, Callable]]) -> Graph:
    """:func:`replace_region` for several regions with disjoint outputs at once."""
    b = GraphBuilder()
    remap: dict[Ref, Ref] = {}
    for i in g.inputs:
        remap.update(b.copy_nodes(g, [i]))
    owner = {o: k for k, (r, _) in enumerate(todo) for o in r.outputs}
    if len(owner) != sum(len(r.outputs) for r, _ in todo):
        raise GraphError("regions replaced together must not share an output")
    stack = list(reversed(g.outputs))
    while stack:
        r = stack[-1]
        if r in remap:
            stack.pop()
            continue
        k = owner.get(r)
        deps = todo[k][0].inputs if k is not None else g.nodes[r.node].inputs
        todo_refs = [Ref(x.node, x.index) for x in deps if Ref(x.node, x.index) not in remap]
        if todo_refs:
            stack.extend(todo_refs)
            continue
        stack.pop()
        if k is not None:
            _emit(b, g, todo[k], remap)
        elif g.nodes[r.node].op == "weight" and g.nodes[r.node].name in b._names:
            remap[r] = _named(b, g.nodes[r.node].name)
        else:
            remap.update(b.copy_nodes(g, [r.node], remap))
    return b.build([remap[r] for r in g.outputs])


def _emit(b: GraphBuilder, g: Graph, job, remap: dict) -> None:
    region, emit = job
    got = list(emit(b, [remap[x] for x in region.inputs]))
    if len(got) != len(region.outputs):
        raise GraphError(f"a region with {len(region.outputs)} outputs was replaced by {len(got)} values")
    for o, new in zip(region.outputs, got):
        if b.type_of(new) != g.type_of(o):
            raise GraphError(f"region output {o!r} is {g.type_of(o)!r}; its replacement gives {b.type_of(new)!r}")
        remap[o] = new


def inline_graph(sub: Graph) -> Callable[[GraphBuilder, list[Ref]], list[Ref]]:
    """An ``emit`` for :func:`replace_region` that copies ``sub`` (its inputs bound to the
    boundary values in order, its weights copied with their data)."""
    def emit(b: GraphBuilder, ins: list[Ref]) -> list[Ref]:
        remap = {Ref(i, 0): r for i, r in zip(sub.inputs, ins)}
        for i, n in enumerate(sub.nodes):
            if n.op == "input":
                continue
            if n.op == "weight" and n.name in b._names:  # the same weight, already in the graph being built
                remap[Ref(i, 0)] = _named(b, n.name)
                continue
            remap.update(b.copy_nodes(sub, [i], remap))
        return [remap[r] for r in sub.outputs]
    return emit


def as_reference(region: Graph, keep: frozenset | set = frozenset()) -> Graph:
    """``region`` with every weight made an input of the same name (inputs first, then weights,
    each in node order): the data-free graph a kernel node's call carries. Weights named in
    ``keep`` stay weights, with their data (one-element constants baked into the call's
    program: :func:`~superopt.kernel.tune.bake_constants`)."""
    b = GraphBuilder()
    remap = {}
    order = list(region.inputs) + [i for i in region.weights if region.nodes[i].name not in keep]
    for i in order:
        n = region.nodes[i]
        remap[(i, 0)] = b.input(n.name, n.types[0].shape, n.types[0].dtype)
    for i in region.weights:
        n = region.nodes[i]
        if n.name in keep:
            remap[(i, 0)] = b.weight(n.name, n.types[0].shape, region.data[n.name], n.types[0].dtype)
    for i, n in enumerate(region.nodes):
        if i not in order and (i not in region.weights or n.name not in keep):
            out = b.add(n.op, [remap[tuple(r)] for r in n.inputs], n.attr)
            remap.update({(i, k): o for k, o in enumerate(out)})
    return b.build([remap[tuple(r)] for r in region.outputs])


def reference_text(reference: Graph, keep: frozenset | set = frozenset()) -> str:
    """The ``reference`` string of a call: compact, deterministic graph JSON, without data but
    for the weights in ``keep`` (see :func:`as_reference`)."""
    if reference.weights:
        reference = as_reference(reference, keep)
    return json.dumps(graph_to_json(reference, with_data=bool(keep)), separators=(",", ":"), sort_keys=True)


def canonical_region(g: Graph) -> tuple[Graph, dict[str, str]]:
    """``g`` with its sources renamed canonically (``s_i0, s_w0, ...``: the same names for every
    region of one signature, whatever the model called them), and canonical -> original names.
    Kernels are generated, tuned and stored for the canonical graph, so one measurement serves
    every region of that signature (the k and v projections of a layer, every layer)."""
    nodes, outputs, sources = _canonical_form(g)
    back = {new: g.nodes[i].name for i, new in sources}
    data = {new: np.asarray(g.data[old]) for new, old in back.items() if old in g.data}
    return Graph(nodes, outputs, data), back


#: a region's canonical nodes, outputs and renamed sources, by its structure (its nodes with the
#: sources' names left out): a model repeats its regions layer after layer (BERT-base's 216
#: regions have 9 structures), and only the weights' data differ between them
_CANONICAL: dict[tuple, tuple] = {}


def _canonical_form(g: Graph) -> tuple[tuple, tuple, tuple[tuple[int, str], ...]]:
    """The canonical graph's nodes and outputs, and ``(node, canonical name)`` of each source of
    ``g``; computed once per structure (the canonical labels depend on the structure only)."""
    key = (tuple((n.op, n.types) if n.name is not None else (n.op, n.attrs, n.types, n.inputs) for n in g.nodes),
           g.outputs)
    if key not in _CANONICAL:
        from ..ir.hashing import canonical_labels
        labels = canonical_labels(g)
        b = GraphBuilder()
        remap: dict[Ref, Ref] = {}
        sources = []
        for i, n in enumerate(g.nodes):
            if n.name is not None:
                new = f"s_{labels[i]}"
                sources.append((i, new))
                t = n.types[0]
                out = (b.input(new, t.shape, t.dtype) if n.op == "input" else b.weight(new, t.shape, None, t.dtype),)
            else:
                out = b.add(n.op, [remap[r] for r in n.inputs], n.attr)
            remap.update({Ref(i, k): o for k, o in enumerate(out)})
        if len(_CANONICAL) >= 4096:  # a bound for long-lived processes (tests, the fuzz)
            _CANONICAL.clear()
        _CANONICAL[key] = (tuple(b.nodes), tuple(remap[r] for r in g.outputs), tuple(sources))
    return _CANONICAL[key]


def _named(b: GraphBuilder, name: str) -> Ref:
    return next(Ref(j, 0) for j, m in enumerate(b.nodes) if m.name == name)
