"""Extraction: the cheapest graph an e-graph holds, under the cost model.

Four steps, each keeping the previous result unless it finds a cheaper graph, then a fifth:

1. Greedy extraction (egg's) gives each class the e-node of least *tree* cost (own cost plus
   its children's, a shared child counted in each user). It is fast and never cyclic, and is
   the fallback, but it over-counts shared values: a merged operator looks as dear as both
   halves, so it never picks a merge.
2. The cycle filter (:func:`drop_cycles`) makes the e-graph acyclic but for free operators,
   keeping the merges: a class's *level* counts the costly operators on its cheapest-level
   path from the sources, and an e-node is kept only if its children in its strongly
   connected part are earlier. Tensat's filter ranked by greedy tree cost instead, and
   dropped every merge (all of BERT's 180).
3. Local search (:func:`local_search`) from the greedy pick on the filtered e-graph, by *DAG*
   cost (each operator application paid once): it adopts a multi-output application in all
   the classes it serves at once, then switches single classes, while the cost drops and no
   cycle forms; a second run also keeps a merge that pays only once its parts' users take it
   too (follow-up moves). On the zoo it comes within 1% of the integer program's optimum in
   well under a second.
4. The integer program (:mod:`superopt.search.ilp`: Tensat's, shrunk and tightened, with
   acyclicity only on the cycles left, solved part by part where the classes every pick needs
   split it) within a time limit, when scipy is installed: it improves on the local search by
   more than the gap or proves it within the gap, and the gap reported is the best program
   objective's distance to the solver's lower bound.

5. Where the pick computes a value otherwise than the search's input and switching it back
   does not price the graph dearer, it is switched back (:mod:`superopt.search.minimal`): a
   rewrite the cost model sees as free is not applied (BERT-base's bias moved into the next
   LayerNorm: free by the price, 4.1% slower on an H100).

The program prices each operator alone (its DAG cost); the cost model prices a whole graph
(under the Inductor model, with its fusions), so each step's pick is kept only if the cost
model prices its graph cheaper than the picks before it.

Classes known at compile time cost nothing and are extracted from compile-time e-nodes only,
so the extracted graph folds them away. Sources keep their names (the weights their data); all
the model's inputs stay, in their order.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Sequence

from ..cost.model import CostModel
from ..ir.graph import Graph, GraphBuilder, Node, Ref, make_node
from .choice import Problem, cyclic_edges, postorder
from ..pattern.egraph import OPAQUE_MARK, EGraph, ENode, real_attrs
from .ilp import NODES, SolverMissing, ilp_choice
from .minimal import prefer_original

__all__ = ["Extraction", "extract", "greedy_choice", "drop_cycles", "local_search", "build_graph", "value_classes",
           "LOCAL_PASSES"]

#: passes of the local search over its moves at most (the zoo's take 2-6; each pass is linear in
#: the e-graph's size)
LOCAL_PASSES = 50


@dataclass
class Extraction:
    """How the result was extracted (``greedy``, ``local search`` or ``ilp``: the pick whose
    graph the cost model prices cheapest), the solver's status, the program's best objective
    found (the DAG cost of the best pick by the program's own prices), the solver's lower bound
    on it, the gap between the two and the e-nodes the cycle filter dropped."""

    method: str
    greedy_cost: float = 0.0
    status: str = ""
    gap: float | None = None
    objective: float | None = None
    bound: float | None = None
    dropped: int = 0
    origins: Counter = field(default_factory=Counter)
    kept_original: int = 0   # classes switched back to the search input's e-node (no dearer)


def greedy_choice(p: Problem) -> dict[int, ENode]:
    """Per class, the e-node of least tree cost (own cost plus its children's; strict
    improvements only, so no cycle is ever chosen)."""
    return _least(p, p.app_cost, False)[1]


def _least(p: Problem, own: dict, longest: bool) -> tuple[dict[int, float], dict[int, ENode]]:
    """Per class, the least value over its e-nodes whose children all have values, and the
    e-node giving it: an e-node's value is ``own[e.app]`` plus the sum of its children's values
    (``longest``: plus the largest): a fixpoint over a worklist, where a class is looked at
    again when one of its children improves."""
    best, choice, kid_classes = {}, {}, p.kid_classes
    kids_of = {c: [(e, kid_classes[e], own[e.app]) for e in p.cands[c]] for c in p.classes}
    users: dict[int, set] = {}
    for c, pairs in kids_of.items():
        for _, kids, _ in pairs:
            for k in kids:
                users.setdefault(k, set()).add(c)
    work = deque(p.classes[::-1])
    queued = set(work)
    get = best.get
    while work:
        c = work.popleft()
        queued.discard(c)
        improved = False
        for e, kids, base in kids_of[c]:
            acc = 0
            for k in kids:
                v = get(k)
                if v is None:
                    break
                if longest:
                    acc = v if v > acc else acc
                else:
                    acc += v
            else:
                val = base + acc  # (as base + sum(...) and base + max(..., default=0))
                old = get(c)
                if old is None or val < old - 1e-9:
                    best[c], choice[c], improved = val, e, True
        if improved:
            for u in users.get(c, ()):
                if u not in queued:
                    queued.add(u)
                    work.append(u)
    return best, choice


def drop_cycles(p: Problem) -> int:
    """Break the e-graph's cycles before the integer program, keeping the merges: inside a
    strongly connected part keep an e-node only if each child in that part is *earlier* than
    its class by the e-node's weight, where a class's level is its least number of costly
    operators on a path from the sources (an e-node weighs 1 if it costs anything, else 0).
    A merged operator and its parts sit at one level, so the free ``split`` of the merge is
    kept in each part and the costly ``concat`` of the parts is dropped from the merge
    (Tensat's filter by greedy tree cost dropped the merges instead: a merged operator costs
    as much as its parts). What is left can only cycle through free operators at one level;
    the integer program orders those where it picks them. Returns the e-nodes dropped."""
    cyclic = cyclic_edges(p)
    if not cyclic:
        return 0
    weight = {app: 0 if c == 0 else 1 for app, c in p.app_cost.items()}
    level = _levels(p, weight)
    dropped = 0
    for c in p.classes:
        keep = []
        for e in p.cands[c]:
            inner = [d for d in {p.eg.find(k) for k in e.kids} if d == c or (c, d) in cyclic]
            if c in level and all(d != c and d in level and level[d] + weight[e.app] <= level[c] for d in inner):
                keep.append(e)
        dropped += len(p.cands[c]) - len(keep)
        p.cands[c] = keep
    p.changed()
    return dropped


def _levels(p: Problem, weight: dict) -> dict[int, int]:
    """Per class, the least total weight along a longest path from the sources over its
    e-nodes."""
    return _least(p, weight, True)[0]


class _Live:
    """A choice with what it makes live: a class is live while the roots or a live class's
    chosen e-node use it, an application while a live class chose it; ``cost`` is the
    choice's DAG cost (each live application paid once). Switches update it incrementally.
    Applications are counted by number (:attr:`Problem.app_numbers`): hashing an application
    (its attributes and types) at every step took a third of the local search."""

    def __init__(self, p: Problem, choice: dict[int, ENode]):
        self.p, self.choice = p, dict(choice)
        self.kids = p.kid_classes
        find = p.eg.find
        for e in self.choice.values():
            if e not in self.kids:
                self.kids[e] = {find(k) for k in e.kids}
        self.number, self.price = p.app_numbers
        self.picked: dict[int, tuple] = {}  # class -> (its choice's application number, its classes)
        self.ref: Counter = Counter()
        self.app_ref = [0] * len(self.price)
        self.cost = 0.0
        for r in set(p.roots):
            self._attach([r])

    def _of(self, c: int) -> tuple:
        got = self.picked.get(c)
        if got is None:
            e = self.choice[c]
            got = self.picked[c] = (self.number[e.app], self.kids[e])
        return got

    def _use(self, app: int, by: int) -> None:
        self.app_ref[app] += by
        if self.app_ref[app] == (1 if by > 0 else 0):
            self.cost += by * self.price[app]

    def _attach(self, stack: list[int]) -> None:
        ref = self.ref
        while stack:
            c = stack.pop()
            ref[c] += 1
            if ref[c] == 1:
                app, kids = self._of(c)
                self._use(app, 1)
                stack.extend(kids)

    def _detach(self, stack: list[int]) -> None:
        ref = self.ref
        while stack:
            c = stack.pop()
            ref[c] -= 1
            if ref[c] == 0:
                app, kids = self._of(c)
                self._use(app, -1)
                stack.extend(kids)

    def switch(self, c: int, e: ENode) -> None:
        """Class ``c`` picks ``e`` (the caller checked that no cycle forms)."""
        old = self._of(c)
        new = self.picked[c] = (self.number[e.app], self.kids[e])
        if self.ref[c] > 0:
            self._attach(list(new[1]))
            self._use(new[0], 1)
            self._use(old[0], -1)
            self._detach(list(old[1]))
        self.choice[c] = e

    def closes_cycle(self, c: int, e: ENode, cyclic: set) -> bool:
        """Whether picking ``e`` for ``c`` makes ``c`` depend on itself (only a child in ``c``'s
        strongly connected part of the e-graph can)."""
        kids = [d for d in self.kids[e] if d == c or (c, d) in cyclic]
        seen, stack = set(), kids
        while stack:
            d = stack.pop()
            if d == c:
                return True
            if d not in seen:
                seen.add(d)
                stack.extend(self._of(d)[1])
        return False


def local_search(p: Problem, start: dict[int, ENode], passes: int = LOCAL_PASSES, follow: bool = False) -> dict[int, ENode]:
    """Improve an acyclic choice by its DAG cost: adopt each multi-output application in all
    the classes it serves at once (a merge pays off only when every part uses it), then
    switch single classes, while the DAG cost drops and no cycle forms, for at most ``passes``
    passes over the moves (a count, not seconds: the pick must not depend on the clock). With
    ``follow``, a multi-output move that does not pay alone is kept if switching the users of
    what it changed to e-nodes that use it then pays (a merge whose parts' users must also
    take it: ResNeXt-50's merged convolution and bias, 0.2% of the cost that single moves
    missed)."""
    live, cyclic = _Live(p, start), cyclic_edges(p)
    apps: dict[tuple, list] = {}
    users: dict[int, list] = {}
    for c in p.classes:
        for e in p.cands[c]:
            if len(e.types) > 1:
                apps.setdefault(e.app, []).append((c, e))
            for d in live.kids[e]:
                users.setdefault(d, []).append((c, e))
    moves = list(apps.values()) + [[(c, e)] for c in p.classes for e in p.cands[c]]
    improved = True
    for _ in range(passes):
        if not improved:
            break
        improved = False
        for move in moves:
            if not any(live.ref[c] for c, _ in move) or all(live.choice[c] == e for c, e in move):
                continue
            before, undo = live.cost, []
            for c, e in move:
                if live.choice[c] != e and not live.closes_cycle(c, e, cyclic):
                    undo.append((c, live.choice[c]))
                    live.switch(c, e)
            if follow and undo and live.cost >= before - 1e-9 and len(move) > 1:
                _follow(live, [c for c, _ in undo], users, cyclic, undo)
            if live.cost < before - 1e-9:
                improved = True
            else:
                for c, e in reversed(undo):
                    live.switch(c, e)
    return live.choice


def _follow(live: "_Live", changed: list[int], users: dict, cyclic: set, undo: list) -> None:
    """After a move that does not pay alone: switch live users of the classes it changed to
    an e-node using them, each where that lowers the cost (recorded in ``undo``)."""
    for c in changed:
        for u, f in users.get(c, ()):
            if live.ref[u] and live.choice[u] != f and not live.closes_cycle(u, f, cyclic):
                was = live.cost
                old = live.choice[u]
                live.switch(u, f)
                if live.cost < was - 1e-9:
                    undo.append((u, old))
                else:
                    live.switch(u, old)


def build_graph(eg: EGraph, choice: dict[int, ENode], roots: Sequence[int], graph: Graph,
                memo: dict | None = None) -> tuple[Graph, Counter]:
    """The graph of a choice (sources named as in ``graph``), and the rules its e-nodes came from.

    ``memo`` (one per e-graph and ``graph``) keeps each e-node's checked node once made: the
    extraction builds the graph of up to a dozen picks that share most of their e-nodes, and
    making a node (its attributes normalized, its types inferred) took two thirds of a build."""
    memo = {} if memo is None else memo
    b = GraphBuilder()

    def add(e: ENode, ins: list[Ref]) -> tuple[Ref, ...]:
        made = memo.get(e)
        if made is None:
            made = memo[e] = _make(e, [b.type_of(r) for r in ins], graph, len(b.nodes))
        return b.append(made[0], ins, made[1])

    refs: dict[int, Ref] = {}
    for i in graph.inputs:
        n = graph.nodes[i]
        e = ENode(n.op, n.attrs, (), 0, n.types)
        refs[eg.lookup(e)] = add(("input", n.name, n.types[0].shape, n.types[0].dtype), [])[0]
    made: dict[tuple, tuple] = {}
    origins: Counter = Counter()
    for c in postorder(eg, choice, roots, refs):
        e = choice[c]
        key = (e.op, e.attrs, tuple(eg.find(k) for k in e.kids))
        if key not in made:
            made[key] = add(e, [refs[eg.find(k)] for k in e.kids])
            if eg.origin.get(e):
                origins[eg.origin[e]] += 1
        refs[c] = made[key][e.k]
    return b.build([refs[eg.find(r)] for r in roots]), origins


def _make(e, in_types: list, graph: Graph, at: int) -> tuple[Node, object]:
    """The node an e-node (or an ``("input", name, shape, dtype)`` tuple) makes, checked as
    :class:`GraphBuilder` checks it, and a weight's data (None for the rest)."""
    if e[0] == "input":
        b = GraphBuilder()
        b.input(*e[1:])
        return b.nodes[0], None
    if e.op == "weight":
        b = GraphBuilder()
        name = dict(e.attrs)["name"]
        b.weight(name, e.types[0].shape, graph.data.get(name), e.types[0].dtype)
        return b.nodes[0], b.data.get(name)
    node = make_node(e.op, [Ref(0, 0)] * len(in_types), in_types, dict(real_attrs(e.attrs)), where=f"node %{at} ({e.op})")
    return node, None


def _distinct(*choices: dict) -> list[dict]:
    """The choices, each once (equal picks give equal costs)."""
    out: list = []
    for ch in choices:
        if ch not in out:
            out.append(ch)
    return out


def value_classes(eg: EGraph, g: Graph, marks: bool = False, opaque: dict | None = None,
                  source: dict | None = None) -> dict:
    """``Ref -> e-class`` for the values of ``g`` found in ``eg`` (None where a node is not
    there); ``marks``: opaque calls carry their node index, as :meth:`EGraph.add_graph` added
    them; else they are found through ``opaque`` ((op, attrs, input classes) -> node index of
    the graph whose classes are ``source``)."""
    out: dict = {}
    for i, n in enumerate(g.nodes):
        kids = tuple(out.get(r) for r in n.inputs)
        for k in range(len(n.types)):
            c = None
            if None not in kids:
                if n.op == "opaque" and not marks:
                    j = (opaque or {}).get((n.op, n.attrs, kids))
                    c = None if j is None else (source or {}).get(Ref(j, k))
                else:
                    attrs = n.attrs + ((OPAQUE_MARK, i),) if n.op == "opaque" else n.attrs
                    c = eg.lookup(ENode(n.op, attrs, kids, k, n.types))
            out[Ref(i, k)] = c
    return out


def extract(eg: EGraph, roots: Sequence[int], graph: Graph, cost: CostModel,
            ilp_seconds: float | None, ilp_gap: float = 0.01, ilp_nodes: int = NODES) -> tuple[Graph, Extraction]:
    """The cheapest graph found: greedy by tree cost (the fallback), then, after the cycle
    filter, the local search by DAG cost, then the integer program when ``ilp_seconds`` is
    given and scipy is installed, warm-started from the local search's pick (a cutoff) and
    stopped at a relative gap of ``ilp_gap`` or after ``ilp_nodes`` branch-and-bound nodes
    (``ilp_seconds``: the wall-clock safety net); see the module docstring. Each pick is kept if
    the cost model prices its graph cheaper. The gap reported is the program's: its best
    objective found (DAG cost) over the solver's lower bound. Nothing here reads the clock
    but that safety net: the same e-graph gives the same graph on a loaded machine."""
    p = Problem(eg, roots, cost)
    greedy = greedy_choice(p)
    memo: dict = {}  # each e-node's node, made once for all the picks built
    best, origins = build_graph(eg, greedy, roots, graph, memo)
    best_cost, best_choice = cost.graph_cost(best), greedy
    how = Extraction("greedy", greedy_cost=best_cost)
    how.dropped = drop_cycles(p)

    seen = [greedy]  # picks priced already (the local searches and the program often agree)

    def consider(choice, method):
        nonlocal best, origins, best_cost, best_choice
        if choice in seen:  # its graph and price are known: equal picks make equal graphs
            return
        seen.append(choice)
        g, o = build_graph(eg, choice, roots, graph, memo)
        c = cost.graph_cost(g)
        if c < best_cost - 1e-9:
            best, origins, best_cost, best_choice, how.method = g, o, c, choice, method

    start = greedy_choice(p)  # the filtered e-graph's greedy pick: the first may hold e-nodes the filter dropped
    plain, follow = local_search(p, start), local_search(p, start, follow=True)
    consider(plain, "local search")
    consider(follow, "local search")
    how.objective = min(_Live(p, ch).cost for ch in _distinct(greedy, plain, follow))
    if ilp_seconds is None:
        how.status = "integer program not asked for"
    else:
        # the program's cutoff is the plain local search's pick: a lower DAG cost is not always
        # a cheaper graph under the Inductor model, so the program still looks for a pick more
        # than the gap under it (Inception-v3: 6.6% by the program's pick, 5.8% by the follow-up
        # moves' pick, which the program had proven within 1%)
        try:
            choice, how.status, dual = ilp_choice(p, ilp_seconds, gap=ilp_gap, nodes=ilp_nodes, known=plain)
        except SolverMissing as e:
            choice, how.status, dual = None, str(e), None
        if choice is not None:
            consider(choice, "ilp")
            how.objective = min(how.objective, _Live(p, choice).cost)
        if dual is not None:
            how.bound = dual
            how.gap = round(max(0.0, (how.objective - dual) / how.objective), 9) if how.objective > 0 else 0.0
    # the search input's own e-node wherever the rewrite does not lower the price (minimal.py)
    kept, _, how.kept_original = prefer_original(
        eg, best_choice, roots, graph, lambda ch: cost.graph_cost(build_graph(eg, ch, roots, graph, memo)[0]), best_cost,
        lambda c, e: not eg.const[eg.find(c)], cost.graph_cost)
    if how.kept_original:
        best, origins = build_graph(eg, kept, roots, graph, memo)
    how.origins = origins
    return best, how
