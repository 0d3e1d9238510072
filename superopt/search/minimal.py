"""Keep the original wherever a rewrite does not pay: the extracted pick, with every class whose
e-node is not the search input's own switched back to it when the cost model prices the graph
no dearer (within :data:`NEGLIGIBLE_US` a value).

Extraction minimizes the price; among picks of equal price it has no reason to prefer the
graph the user wrote, so rewrites the cost model sees as free ride along with the ones that
pay. The price is a model, and a free rewrite is where it is least likely to be right: in
BERT-base (batch 16, bf16, H100) the rule that merges a linear's bias into the next
LayerNorm's bias (``add(add(x1, g1), add(g0, x0)) => add(add(g0, g1), add(x0, x1))``, priced
the same: one fused pointwise group either way) made the model 4.1% slower under
``torch.compile`` with freezing, while the rewrites that paid (the q/k/v projections merged)
ran at 1.000x without it (``scripts/check_rewrite_gpu.py``). A compiler should not change what
it cannot show to help.

Each switch is first priced on the class's neighbourhood (the operators within two steps of
it, the values the rest of the graph reads from it kept as outputs): a switch that prices the
neighbourhood dearer is a rewrite that pays, and stays. The rest are tried on the whole graph
all at once, then, where that prices dearer, in halves, recursively, in the order the graph
computes them, until no class changes or :data:`WHOLE_PRICES` whole-graph prices are spent
(the neighbourhood misses what the model decides over the whole graph, such as the layout:
NASNet-A's 200 locally free switches are dearer together); the whole graph's price always
decides, never the local one. A switch that would close a cycle (an original e-node reading a
value the pick computes from it) is refused.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..errors import SuperoptError
from ..ir.graph import Graph, GraphBuilder, Ref
from ..pattern.egraph import OPAQUE_MARK, EGraph, ENode, real_attrs
from .choice import postorder

__all__ = ["original_enodes", "prefer_original", "LOCAL_DEPTH", "NEGLIGIBLE_US", "WHOLE_PRICES"]

#: whole-graph prices the switching back may take (each is a full cost-model run: 0.1 s on
#: NASNet-A, whose 200 locally free switches took 223 of them, 24 s, before this bound); past
#: it the remaining rewrites stay as extracted
WHOLE_PRICES = 8

#: a rewrite must lower the modelled time by more than this (per value it computes otherwise)
#: to be applied: 10 ns is under any GPU timer's resolution and well inside the model's error
NEGLIGIBLE_US = 0.01

#: steps around a class (to its operands and its users, in the pick) that its switch is first
#: priced on: enough for the fusion groups the cost model forms around one operator
LOCAL_DEPTH = 2


def original_enodes(eg: EGraph, graph: Graph) -> dict[int, ENode]:
    """Class -> the e-node of ``graph`` (the search's input) that computes it, canonical (nodes
    the e-graph does not hold, and those computed from them, are left out)."""
    cls: dict[tuple[int, int], int] = {}
    out: dict[int, ENode] = {}
    for i, n in enumerate(graph.nodes):
        if any((r.node, r.index) not in cls for r in n.inputs):
            continue
        attrs = n.attrs + ((OPAQUE_MARK, i),) if n.op == "opaque" else n.attrs
        kids = tuple(cls[(r.node, r.index)] for r in n.inputs)
        for k in range(len(n.types)):
            e = eg.canonical(ENode(n.op, attrs, kids, k, n.types))
            c = eg.lookup(e)
            if c is not None:
                cls[(i, k)] = c
                out.setdefault(c, e)
    return out


def _users(eg: EGraph, choice: dict, order: list[int]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for c in order:
        for k in choice[c].kids:
            out.setdefault(eg.find(k), set()).add(c)
    return out


def _near(eg: EGraph, choice: dict, users: dict, centre: int, extra: ENode, depth: int = LOCAL_DEPTH) -> set[int]:
    """Classes within ``depth`` steps of ``centre`` in the pick (both ways), and ``extra``'s kids."""
    seen, frontier = {centre}, [centre]
    for _ in range(depth):
        nxt = []
        for c in frontier:
            for k in list(choice[c].kids) + list(users.get(c, ())):
                k = eg.find(k)
                if k not in seen:
                    seen.add(k)
                    nxt.append(k)
        frontier = nxt
    return seen | {eg.find(k) for k in extra.kids}


def _local_graph(eg: EGraph, choice: dict, inside: set[int], outs: list[int]) -> Graph:
    """The graph computing ``outs`` by ``choice`` within ``inside``; values from outside (and
    sources) enter as inputs, compile-time ones as weights (free to the cost model). A pick
    with a cycle inside (a switch whose e-node reads, through the pick, its own class) is a
    SuperoptError (:func:`postorder` finds it)."""
    find = eg.find
    inner = {c: e for c, e in choice.items() if c in inside and e.op not in ("input", "weight")}
    leaves = {c for c in outs if c not in inner} | {k for e in inner.values() for k in map(find, e.kids)
                                                    if k not in inner}
    try:
        order = postorder(eg, inner, outs, leaves)
    except AssertionError:
        raise SuperoptError("the pick reads a class through itself (a cycle)") from None
    b = GraphBuilder()
    refs: dict[int, Ref] = {}

    def ref(c: int) -> Ref:
        if c not in refs:  # a leaf: entered where first read
            t = eg.types[c]
            refs[c] = b.weight(f"v{c}", t.shape, None, t.dtype) if eg.const[c] else b.input(f"v{c}", t.shape, t.dtype)
        return refs[c]
    for c in order:
        e = inner[c]
        refs[c] = b.add(e.op, [ref(find(k)) for k in e.kids], dict(real_attrs(e.attrs)))[e.k]
    return b.build([ref(c) for c in outs])


def _locally_free(eg: EGraph, choice: dict, users: dict, roots: set[int], c: int, e: ENode,
                  price: Callable[[Graph], float]) -> bool:
    """Whether switching class ``c`` to ``e`` prices the neighbourhood of ``c`` no dearer (the
    values the rest of the graph reads from it stay its outputs)."""
    inside = _near(eg, choice, users, c, e)
    local = {k: choice[k] for k in inside if k in choice}
    trial = {**local, c: e}
    outs = sorted(k for k in inside if k in roots or users.get(k, set()) - inside)
    if c not in outs:
        outs.append(c)
    try:
        now, then = price(_local_graph(eg, local, inside, outs)), price(_local_graph(eg, trial, inside, outs))
    except (SuperoptError, KeyError, RecursionError):   # a neighbourhood the builder cannot form
        return False
    return then <= now + NEGLIGIBLE_US


def _by_structure(price: Callable[[Graph], float]) -> Callable[[Graph], float]:
    """``price``, remembered per graph structure, names aside (the cost model reads no names, and
    the neighbourhood graphs have no weight data): NASNet-A's 168 switches priced 336
    neighbourhoods, 162 of them distinct (its cells repeat)."""
    seen: dict = {}

    def priced(g: Graph) -> float:
        key = (tuple((n.op, tuple(a for a in n.attrs if a[0] != "name"), n.inputs, n.types) for n in g.nodes),
               g.outputs)
        try:
            got = seen.get(key)
        except TypeError:  # an attribute that cannot be hashed: price it
            return price(g)
        if got is None:
            got = seen[key] = price(g)
        return got
    return priced


def prefer_original(eg: EGraph, choice: dict[int, ENode], roots: Sequence[int], graph: Graph,
                    price: Callable[[dict], float], best: float, allowed: Callable[[int, ENode], bool],
                    local_price: Callable[[Graph], float] | None = None) -> tuple[dict[int, ENode], float, int]:
    """``choice`` with the classes it computes switched back to the search input's e-node where
    ``price(choice)`` (the cost model's price of the pick's graph) stays within
    :data:`NEGLIGIBLE_US` per switched class of ``best`` (see the module docstring); ``allowed(class, e-node)``: whether the e-node may be picked there
    (a compile-time class takes compile-time e-nodes only); ``local_price``: the cost model's
    price of a graph, used to try each switch on the class's neighbourhood first (a whole
    graph priced per class took 4 s on ResNet-50). Returns (pick, its price, classes switched
    back)."""
    orig = original_enodes(eg, graph)
    switched, budget = 0, [WHOLE_PRICES]
    if local_price is not None:
        local_price = _by_structure(local_price)
    tops = {eg.find(r) for r in roots}

    def differs(c: int) -> bool:
        e = orig.get(c)
        return e is not None and eg.canonical(choice[c]) != e and allowed(c, e)

    def attempt(group: list[int]) -> bool:
        nonlocal choice, best
        trial = dict(choice)
        trial.update({c: orig[c] for c in group})
        if any(eg.find(k) not in trial for c in group for k in orig[c].kids):
            return False
        try:
            postorder(eg, trial, roots)
        except AssertionError:
            return False
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        p = price(trial)
        if p > best + NEGLIGIBLE_US * len(group):
            return False
        choice, best = trial, min(best, p)
        return True

    def settle(group: list[int]) -> int:
        if not group or attempt(group):
            return len(group)
        if len(group) == 1 or budget[0] <= 0:
            return 0
        half = len(group) // 2
        return settle(group[:half]) + settle(group[half:])

    tried: set[int] = set()
    while True:
        order = postorder(eg, choice, roots)
        todo = [c for c in order if c not in tried and differs(c)]
        if not todo or budget[0] <= 0:
            return choice, best, switched
        tried.update(todo)
        if local_price is not None:
            users = _users(eg, choice, order)
            todo = [c for c in todo if all(eg.find(k) in choice for k in orig[c].kids)
                    and _locally_free(eg, choice, users, tops, c, orig[c], local_price)]
        switched += settle(todo)
