"""Structural hashes and the canonical form of a graph.

``named_hash`` identifies a graph up to node order (the search's dedup key: same inputs by
name). ``structural_hash`` and ``canonicalize`` also forget the names of inputs and weights:
two graphs get the same value exactly when one is the other with its nodes reordered and its
sources renamed (the generator's dedup key). Inputs are told apart by their types and by how
they are used (a colour refinement upward from their users); sources the refinement cannot
tell apart are tried in every order (when there are at most ``MAX_TIES`` orders) and the smallest
hash wins. Past that cap the labels come from individualization and refinement (as nauty does):
the colours are refined to a fixed point, one source of the first tied cell is singled out, in
turn each one that no automorphism swapping two sources makes redundant, and the smallest hash
over the leaves wins. Both ways depend only on the graph's structure, never on node order.

>>> from superopt.ir import GraphBuilder
>>> def g(a, b):
...     bl = GraphBuilder(); x = bl.input(a, (2, 2)); y = bl.input(b, (2, 2))
...     return bl.build([bl.op("matmul", x, y)])
>>> structural_hash(g("x", "y")) == structural_hash(g("p", "q"))
True
>>> named_hash(g("x", "y")) == named_hash(g("p", "q"))
False
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Mapping

from .graph import Graph, GraphBuilder, Ref

__all__ = ["named_hash", "structural_hash", "canonicalize", "canonical_labels", "MAX_TIES"]

MAX_TIES = 5040


def _h(*parts) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


def _idx(i: int) -> bytes:
    """Output index as bytes: one byte below 255 (the historical encoding), else escaped."""
    return bytes([i]) if i < 255 else b"\xff" + i.to_bytes(8, "big")


def _node_hashes(g: Graph, label: Mapping[int, str] | None) -> list[bytes]:
    """Merkle hash of every node; sources hashed by ``label`` (None: by type only)."""
    out: list[bytes] = []
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            out.append(_h(n.op, n.types, None if label is None else label[i]))
            continue
        args = [out[r.node] + _idx(r.index) for r in n.inputs]
        if n.opdef.commutative:
            args.sort()
        out.append(_h(n.op, n.attrs, n.types, tuple(args)))
    return out


def _graph_hash(g: Graph, hashes: list[bytes], label: Mapping[int, str]) -> str:
    outs = tuple(hashes[r.node] + _idx(r.index) for r in g.outputs)
    sources = tuple(sorted(hashes[i] for i in label))
    return hashlib.blake2b(repr((outs, sources)).encode(), digest_size=16).hexdigest()


def named_hash(g: Graph) -> str:
    """Hash invariant to node order, not to input names."""
    label = {i: g.nodes[i].name for i in g.inputs + g.weights}
    return _graph_hash(g, _node_hashes(g, label), label)


def _upward(g: Graph, blind: list[bytes]) -> list[bytes]:
    """Each node's context: how its users (and the outputs) consume it, recursively."""
    uses: list[list] = [[] for _ in g.nodes]
    for k, r in enumerate(g.outputs):
        uses[r.node].append((b"out", k, r.index, b""))
    up: list[bytes] = [b""] * len(g.nodes)
    for i in range(len(g.nodes) - 1, -1, -1):
        n = g.nodes[i]
        up[i] = _h(tuple(sorted(uses[i])))
        comm = n.opdef.commutative if n.name is None else False
        for pos, r in enumerate(n.inputs):
            uses[r.node].append((blind[i], -1 if comm else pos, r.index, up[i]))
    return up


def canonical_labels(g: Graph) -> dict[int, str]:
    """Canonical names for the sources: ``i0, i1, ...`` for inputs, ``w0, ...`` for weights."""
    sources = list(g.inputs + g.weights)
    blind = _node_hashes(g, None)
    up = _upward(g, blind)
    key = {i: (g.nodes[i].op, blind[i], up[i]) for i in sources}
    sources.sort(key=lambda i: key[i])
    groups = [list(grp) for _, grp in itertools.groupby(sources, key=lambda i: key[i])]
    n_orders = 1
    for grp in groups:
        for k in range(2, len(grp) + 1):
            n_orders *= k
    if n_orders > MAX_TIES:
        return _refined_labels(g, {i: _h(key[i]) for i in sources})
    best = None
    for choice in itertools.product(*(itertools.permutations(grp) for grp in groups)):
        label = _names(g, [i for grp in choice for i in grp])
        h = _graph_hash(g, _node_hashes(g, label), label)
        if best is None or h < best[0]:
            best = (h, label)
    return best[1] if best else {}


def _names(g: Graph, order) -> dict[int, str]:
    label, counts = {}, {"input": 0, "weight": 0}
    for i in order:
        op = g.nodes[i].op
        label[i] = f"{op[0]}{counts[op]}"
        counts[op] += 1
    return label


def _refine(g: Graph, colour: dict[int, bytes]) -> dict[int, bytes]:
    """Colour refinement to a fixed point: a source's colour absorbs the Merkle hash of its
    users' values under the current colours and how the outputs consume them."""
    while True:
        down = _node_hashes(g, {i: c.hex() for i, c in colour.items()})
        up = _upward(g, down)
        new = {i: _h(c, down[i], up[i]) for i, c in colour.items()}
        if len(set(new.values())) == len(set(colour.values())):
            return colour
        colour = new


def _swap_classes(g: Graph, sources) -> dict[int, int]:
    """Sources grouped by automorphisms that swap two of them: swapping the names of ``a`` and
    ``b`` leaves the named hash unchanged exactly when the transposition is an automorphism,
    and such swaps compose (a class is a set of freely interchangeable sources)."""
    base = {i: f"s{i}" for i in sources}
    ref = _graph_hash(g, _node_hashes(g, base), base)
    rep: dict[int, int] = {}
    reps: list[int] = []
    for i in sources:
        for r in reps:
            if g.nodes[r].types == g.nodes[i].types and g.nodes[r].op == g.nodes[i].op:
                swapped = {**base, i: base[r], r: base[i]}
                if _graph_hash(g, _node_hashes(g, swapped), swapped) == ref:
                    rep[i] = r
                    break
        else:
            rep[i] = i
            reps.append(i)
    return rep


def _refined_labels(g: Graph, colour: dict[int, bytes]) -> dict[int, str]:
    """Exact canonical labels by individualization-refinement (see the module docstring)."""
    rep = _swap_classes(g, list(colour))
    best: list = [None]

    def search(colour, depth):
        colour = _refine(g, colour)
        order = sorted(colour, key=lambda i: colour[i])
        cells = [list(c) for _, c in itertools.groupby(order, key=lambda i: colour[i])]
        tied = next((c for c in cells if len(c) > 1), None)
        if tied is None:
            label = _names(g, order)
            h = _graph_hash(g, _node_hashes(g, label), label)
            if best[0] is None or h < best[0][0]:
                best[0] = (h, label)
            return
        tried = set()
        for i in tied:
            if rep[i] in tried:
                continue
            tried.add(rep[i])
            search({**colour, i: _h(b"individual", colour[i], depth)}, depth + 1)

    search(colour, 0)
    return best[0][1] if best[0] else {}


def structural_hash(g: Graph) -> str:
    """Hash invariant to node order and to the names of inputs and weights."""
    label = canonical_labels(g)
    return _graph_hash(g, _node_hashes(g, label), label)


def canonicalize(g: Graph) -> Graph:
    """The canonical member of ``g``'s class: sources renamed canonically and listed first
    (inputs, then weights, by canonical name), other nodes in depth-first order from the
    outputs, dead nodes dropped. Weight data follows the renaming."""
    label = canonical_labels(g)
    hashes = _node_hashes(g, label)
    b = GraphBuilder()
    remap: dict[Ref, Ref] = {}
    for i in sorted(label, key=lambda i: (g.nodes[i].op != "input", int(label[i][1:]))):
        n = g.nodes[i]
        t = n.types[0]
        if n.op == "input":
            remap[Ref(i, 0)] = b.input(label[i], t.shape, t.dtype)
        else:
            remap[Ref(i, 0)] = b.weight(label[i], t.shape, g.data.get(n.name), t.dtype)
    order: list[int] = []
    seen = set(label)

    def visit(i: int):
        stack = [(i, False)]
        while stack:
            j, done = stack.pop()
            if done:
                order.append(j)
                continue
            if j in seen:
                continue
            seen.add(j)
            stack.append((j, True))
            n = g.nodes[j]
            ins = sorted(n.inputs, key=lambda r: hashes[r.node]) if n.opdef.commutative else list(n.inputs)
            stack.extend((r.node, False) for r in reversed(ins))

    for r in g.outputs:
        visit(r.node)
    for j in order:
        n = g.nodes[j]
        ins = sorted(n.inputs, key=lambda r: hashes[r.node] + _idx(r.index)) if n.opdef.commutative else n.inputs
        out = b.add(n.op, [remap[r] for r in ins], n.attr)
        remap.update({Ref(j, k): o for k, o in enumerate(out)})
    return b.build([remap[r] for r in g.outputs])
