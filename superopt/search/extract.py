"""Extraction: the cheapest graph an e-graph holds, under the cost model.

Greedy extraction (egg's) gives each class the e-node of least *tree* cost (own cost plus its
children's, a shared child counted in each user), found by iterating to a fixpoint; it is fast
and never cyclic, but over-counts shared values, so a merged operator looks as dear as both
halves. Its costs then drive Tensat's cycle filter (:func:`drop_cycles`), and on what is left
(acyclic) a second greedy pass lets each output of a multi-output operator pay its share.
The integer program (Tensat's) counts each
operator application once: a binary per e-node, a root class picks one, a picked e-node's
child classes pick one, a multi-output application is paid once for all its outputs, and an
order variable per class forbids cycles (``t_c >= t_d + eps`` where a picked e-node of ``c``
uses ``d``). It is solved by HiGHS through ``scipy.optimize.milp`` (the optional ``ilp`` extra)
with a time limit, and its answer replaces the greedy one only when it is cheaper (scipy's milp
takes no starting point, so greedy is the fallback, not the start). It runs on the e-graph left
by the cycle filter, which is acyclic, so the order constraints are there for any cycle that
is left rather than doing the work: with them over every cycle, HiGHS did not finish a
544-e-node SqueezeNet e-graph in 10 s; after the filter it takes well under a second.

Classes known at compile time cost nothing and are extracted from compile-time e-nodes only,
so the extracted graph folds them away. Sources keep their names (the weights their data); all
the model's inputs stay, in their order.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Sequence

from ..cost.model import CostModel
from ..ir.graph import Graph, GraphBuilder, Ref
from .egraph import EGraph, ENode, real_attrs

__all__ = ["Extraction", "extract", "greedy_choice", "drop_cycles", "ilp_choice", "build_graph", "SolverMissing"]


class SolverMissing(RuntimeError):
    """scipy (HiGHS) is not installed; greedy extraction is used."""


@dataclass
class Extraction:
    """How the result was extracted: ``greedy`` or ``ilp``; the solver's status and gap."""

    method: str
    status: str = ""
    gap: float | None = None
    dropped: int = 0
    origins: Counter = field(default_factory=Counter)


class _Problem:
    """The candidate e-nodes of each reachable class and the cost of each application."""

    def __init__(self, eg: EGraph, roots: Sequence[int], cost: CostModel):
        self.eg = eg
        self.roots = [eg.find(r) for r in roots]
        self.classes = eg.reachable(self.roots)
        self.cands: dict[int, list[ENode]] = {}
        self.app_cost: dict[tuple, float] = {}
        for c in self.classes:
            nodes = eg.nodes[c]
            if eg.const[c]:
                nodes = [e for e in nodes if self._const(e)]
            self.cands[c] = nodes
            for e in nodes:
                if e.app not in self.app_cost:
                    self.app_cost[e.app] = self._price(e, cost)

    def _const(self, e: ENode) -> bool:
        return e.op == "weight" or self.eg._node_const(e)

    def _price(self, e: ENode, cost: CostModel) -> float:
        if e.op in ("input", "weight") or self._const(e):
            return 0.0
        return cost.node_time(e.op, real_attrs(e.attrs), [self.eg.types[self.eg.find(k)] for k in e.kids], e.types)


def greedy_choice(p: _Problem, costs: dict | None = None, share: bool = False) -> dict[int, ENode]:
    """Per class, the e-node of least tree cost (a fixpoint over a worklist: a class is looked
    at again when a child improves; strict improvements only, so no cycle is ever chosen). With
    ``share`` an output of a multi-output operator pays its share of the operator's tree cost,
    which may choose cycles unless :func:`drop_cycles` ran first."""
    eg, best, choice = p.eg, {}, {}
    kids_of = {c: [(e, {eg.find(k) for k in e.kids}) for e in p.cands[c]] for c in p.classes}
    users: dict[int, set] = {}
    for c, pairs in kids_of.items():
        for _, kids in pairs:
            for k in kids:
                users.setdefault(k, set()).add(c)
    work = deque(p.classes[::-1])
    queued = set(work)
    while work:
        c = work.popleft()
        queued.discard(c)
        improved = False
        for e, kids in kids_of[c]:
            if not all(k in best for k in kids):
                continue
            val = p.app_cost[e.app] + sum(best[k] for k in kids)
            val = val / len(e.types) if share else val
            if c not in best or val < best[c] - 1e-9:
                best[c], choice[c], improved = val, e, True
        if improved:
            for u in users.get(c, ()):
                if u not in queued:
                    queued.add(u)
                    work.append(u)
    if costs is not None:
        costs.update(best)
    return choice


def drop_cycles(p: _Problem, choice: dict[int, ENode], best: dict[int, float]) -> int:
    """Tensat's cycle filtering, done once before the integer program: inside a strongly
    connected part of the e-graph keep an e-node only if it is the greedy pick or every child
    in that part has a smaller greedy cost than its class. The greedy picks are acyclic and the
    other kept edges strictly lower the cost, so what is left is acyclic; returns the e-nodes
    dropped (the integer program is then optimal over what is left)."""
    cyclic = _cyclic_edges(p)
    dropped = 0
    for c in p.classes:
        keep = []
        for e in p.cands[c]:
            inner = [p.eg.find(k) for k in e.kids if (c, p.eg.find(k)) in cyclic or p.eg.find(k) == c]
            if e == choice.get(c) or all(d in best and best[d] < best[c] for d in inner):
                keep.append(e)
        dropped += len(p.cands[c]) - len(keep)
        p.cands[c] = keep
    return dropped


def ilp_choice(p: _Problem, seconds: float, bound: float | None) -> tuple[dict[int, ENode] | None, str, float | None]:
    """The integer program's pick (or None), the solver's status and its optimality gap."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError:
        raise SolverMissing("the integer program needs scipy (pip install 'superopt[ilp]'); "
                            "greedy extraction is used instead") from None
    eg = p.eg
    enodes = [(c, e) for c in p.classes for e in p.cands[c]]
    col = {(c, e): i for i, (c, e) in enumerate(enodes)}
    apps = list(dict.fromkeys(e.app for _, e in enodes if len(e.types) > 1))
    app_col = {a: len(enodes) + i for i, a in enumerate(apps)}
    order_col = {c: len(enodes) + len(apps) + i for i, c in enumerate(p.classes)}
    n = len(enodes) + len(apps) + len(p.classes)
    obj = np.zeros(n)
    for (c, e), i in col.items():
        if e.app not in app_col:
            obj[i] = p.app_cost[e.app]
    for a, i in app_col.items():
        obj[i] = p.app_cost[a]
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries, low, high):
        r = len(lo)
        for j, v in entries:
            rows.append(r), cols.append(j), vals.append(v)
        lo.append(low), hi.append(high)

    cyclic = _cyclic_edges(p)
    eps, big = 1.0 / (len(p.classes) + 1), 2.0
    for c in p.roots:
        row([(col[(c, e)], 1.0) for e in p.cands[c]], 1.0, np.inf)
    for (c, e), i in col.items():
        for d in {eg.find(k) for k in e.kids}:
            row([(i, 1.0)] + [(col[(d, f)], -1.0) for f in p.cands[d]], -np.inf, 0.0)
            if d == c:
                row([(i, 1.0)], 0.0, 0.0)
            elif (c, d) in cyclic:
                row([(order_col[c], 1.0), (order_col[d], -1.0), (i, -big)], eps - big, np.inf)
        if e.app in app_col:
            row([(i, 1.0), (app_col[e.app], -1.0)], -np.inf, 0.0)
    if bound is not None:
        row([(j, v) for j, v in enumerate(obj) if v], -np.inf, bound * (1 + 1e-9) + 1e-9)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    integrality = np.ones(n)
    integrality[len(enodes) + len(apps):] = 0
    lb, ub = np.zeros(n), np.ones(n)
    res = milp(obj, constraints=LinearConstraint(a, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
               options={"time_limit": seconds, "disp": False})
    gap = getattr(res, "mip_gap", None)
    if res.x is None:
        return None, res.message, gap
    choice: dict[int, ENode] = {}
    for (c, e), i in col.items():
        if res.x[i] > 0.5 and (c not in choice or p.app_cost[e.app] < p.app_cost[choice[c].app]):
            choice[c] = e
    status = "optimal" if res.status == 0 else "time limit, best found" if res.status == 1 else res.message
    return choice, status, None if gap is None else float(gap)


def _cyclic_edges(p: _Problem) -> set[tuple[int, int]]:
    """Class edges (user, used) inside a strongly connected component: only these can close a
    cycle, so only these need order constraints (Tarjan's algorithm, no recursion)."""
    eg = p.eg
    succ = {c: sorted({eg.find(k) for e in p.cands[c] for k in e.kids}) for c in p.classes}
    index, low, comp, on, stack, count = {}, {}, {}, set(), [], 0
    for start in p.classes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = count
                count += 1
                stack.append(v)
                on.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp[w] = v
                    if w == v:
                        break
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return {(c, d) for c in p.classes for d in succ[c] if c != d and comp[c] == comp[d]}


def build_graph(eg: EGraph, choice: dict[int, ENode], roots: Sequence[int], graph: Graph) -> tuple[Graph, Counter]:
    """The graph of a choice (sources named as in ``graph``), and the rules its e-nodes came from."""
    b = GraphBuilder()
    refs: dict[int, Ref] = {}
    for i in graph.inputs:
        n = graph.nodes[i]
        refs[eg.lookup(ENode(n.op, n.attrs, (), 0, n.types))] = b.input(n.name, n.types[0].shape, n.types[0].dtype)
    made: dict[tuple, tuple] = {}
    origins: Counter = Counter()
    for c in _postorder(eg, choice, roots, refs):
        e = choice[c]
        key = (e.op, e.attrs, tuple(eg.find(k) for k in e.kids))
        if key not in made:
            made[key] = _emit(b, e, [refs[eg.find(k)] for k in e.kids], graph)
            if eg.origin.get(e):
                origins[eg.origin[e]] += 1
        refs[c] = made[key][e.k]
    return b.build([refs[eg.find(r)] for r in roots]), origins


def _postorder(eg: EGraph, choice: dict, roots, done) -> list[int]:
    """The chosen classes the roots need, each after its children (depth first, no recursion)."""
    order, state = [], {c: 2 for c in done}  # 1: on the path, 2: finished
    for root in roots:
        stack = [(eg.find(root), False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                order.append(c)
                continue
            if state.get(c) == 2:
                continue
            if state.get(c) == 1:
                raise AssertionError("the extraction chose a cycle")  # internal invariant
            state[c] = 1
            stack.append((c, True))
            stack.extend((eg.find(k), False) for k in choice[c].kids if state.get(eg.find(k)) != 2)
    return order


def _emit(b: GraphBuilder, e: ENode, ins: list, graph: Graph) -> tuple:
    if e.op == "weight":
        name = dict(e.attrs)["name"]
        return (b.weight(name, e.types[0].shape, graph.data.get(name), e.types[0].dtype),)
    return b.add(e.op, ins, dict(real_attrs(e.attrs)))


def extract(eg: EGraph, roots: Sequence[int], graph: Graph, cost: CostModel,
            ilp_seconds: float | None) -> tuple[Graph, Extraction]:
    """The cheapest graph found (greedy, then the integer program when ``ilp_seconds`` is given
    and scipy is installed); see the module docstring."""
    p = _Problem(eg, roots, cost)
    costs: dict = {}
    first = greedy_choice(p, costs)
    how = Extraction("greedy", dropped=drop_cycles(p, first, costs))
    best, origins = build_graph(eg, first, roots, graph)
    g, o = build_graph(eg, greedy_choice(p, share=True), roots, graph)
    if cost.graph_cost(g) < cost.graph_cost(best):
        best, origins = g, o
    if ilp_seconds is None:
        how.status = "integer program not asked for"
    else:
        try:
            choice, how.status, how.gap = ilp_choice(p, ilp_seconds, None)
        except SolverMissing as e:
            choice, how.status = None, str(e)
        if choice is not None:
            g, o = build_graph(eg, choice, roots, graph)
            if cost.graph_cost(g) < cost.graph_cost(best):
                best, origins, how.method = g, o, "ilp"
    how.origins = origins
    return best, how
