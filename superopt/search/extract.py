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

import time
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


def drop_cycles(p: _Problem) -> int:
    """Break the e-graph's cycles before the integer program, keeping the merges: inside a
    strongly connected part keep an e-node only if each child in that part is *earlier* than
    its class by the e-node's weight, where a class's level is its least number of costly
    operators on a path from the sources (an e-node weighs 1 if it costs anything, else 0).
    A merged operator and its parts sit at one level, so the free ``split`` of the merge is
    kept in each part and the costly ``concat`` of the parts is dropped from the merge
    (Tensat's filter by greedy tree cost dropped the merges instead: a merged operator costs
    as much as its parts). What is left can only cycle through free operators at one level;
    the integer program orders those where it picks them. Returns the e-nodes dropped."""
    cyclic = _cyclic_edges(p)
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
    return dropped


def _levels(p: _Problem, weight: dict) -> dict[int, int]:
    """Per class, the least total weight along a longest path from the sources over its
    e-nodes (a fixpoint over a worklist, as :func:`greedy_choice`)."""
    eg, level = p.eg, {}
    kids_of = {c: [(weight[e.app], {eg.find(k) for k in e.kids}) for e in p.cands[c]] for c in p.classes}
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
        vals = [w + max((level[k] for k in kids), default=0) for w, kids in kids_of[c] if all(k in level for k in kids)]
        if vals and (c not in level or min(vals) < level[c]):
            level[c] = min(vals)
            for u in users.get(c, ()):
                if u not in queued:
                    queued.add(u)
                    work.append(u)
    return level


def ilp_choice(p: _Problem, seconds: float, bound: float | None = None) -> tuple[dict[int, ENode] | None, str, float | None]:
    """The integer program's acyclic pick (or None), the solver's status and its optimality gap.

    Acyclicity is lazy: the program is first solved with no order constraints, and while its
    pick has a cycle, solved again with order constraints over the classes found on the cycles
    so far (most of an e-graph's cycles are never attractive, and constraints over all of them
    made HiGHS time out), all within ``seconds``."""
    try:
        from scipy.optimize import milp  # noqa: F401
    except ImportError:
        raise SolverMissing("the integer program needs scipy (pip install 'superopt[ilp]'); "
                            "greedy extraction is used instead") from None
    prog = _Program(p, bound)
    deadline = time.perf_counter() + seconds
    ordered: set[int] = set()
    gap = None
    for rounds in range(1, len(p.classes) + 2):
        left = deadline - time.perf_counter()
        if left <= 0:
            return None, f"time limit, no acyclic pick in {rounds - 1} rounds", gap
        res = prog.solve(ordered, left)
        gap = None if getattr(res, "mip_gap", None) is None else float(res.mip_gap)
        if res.x is None:
            return None, res.message, gap
        choice = prog.choice(res.x)
        cyc = _on_cycles(p, choice)
        if not cyc:
            status = "optimal" if res.status == 0 else "time limit, best found" if res.status == 1 else res.message
            return choice, status + (f" ({rounds} rounds)" if rounds > 1 else ""), gap
        ordered |= cyc
    return None, "no acyclic pick", gap  # unreachable: each round orders a new class


class _Program:
    """The integer program of a :class:`_Problem` (see the module docstring): the rows that do
    not depend on the ordered classes are built once."""

    def __init__(self, p: _Problem, bound: float | None):
        import numpy as np
        self.p, eg = p, p.eg
        self.enodes = [(c, e) for c in p.classes for e in p.cands[c]]
        self.col = {(c, e): i for i, (c, e) in enumerate(self.enodes)}
        apps = list(dict.fromkeys(e.app for _, e in self.enodes if len(e.types) > 1))
        self.app_col = {a: len(self.enodes) + i for i, a in enumerate(apps)}
        self.base = len(self.enodes) + len(apps)
        self.obj = np.zeros(self.base)
        for (c, e), i in self.col.items():
            if e.app not in self.app_col:
                self.obj[i] = p.app_cost[e.app]
        for a, i in self.app_col.items():
            self.obj[i] = p.app_cost[a]
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []
        for c in p.roots:
            self._row([(self.col[(c, e)], 1.0) for e in p.cands[c]], 1.0, np.inf)
        self.kids = {}
        for (c, e), i in self.col.items():
            self.kids[i] = kids = {eg.find(k) for k in e.kids}
            for d in kids:
                if d == c:
                    self._row([(i, 1.0)], 0.0, 0.0)
                else:
                    self._row([(i, 1.0)] + [(self.col[(d, f)], -1.0) for f in p.cands[d]], -np.inf, 0.0)
            if e.app in self.app_col:
                self._row([(i, 1.0), (self.app_col[e.app], -1.0)], -np.inf, 0.0)
        if bound is not None:
            self._row([(j, v) for j, v in enumerate(self.obj) if v], -np.inf, bound * (1 + 1e-9) + 1e-9)

    def _row(self, entries, low, high, into=None):
        rows, cols, vals, lo, hi = into or (self.rows, self.cols, self.vals, self.lo, self.hi)
        r = len(lo)
        for j, v in entries:
            rows.append(r), cols.append(j), vals.append(v)
        lo.append(low), hi.append(high)

    def solve(self, ordered: set[int], seconds: float):
        """HiGHS on the program with order variables for the classes in ``ordered``: a picked
        e-node of an ordered class comes after each ordered class it uses."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
        extra = ([], [], [], [], [])
        order = {c: self.base + i for i, c in enumerate(sorted(ordered))}
        n = self.base + len(order)
        eps, big = 1.0 / (len(order) + 1), 2.0
        rows0 = len(self.lo)
        for c in order:
            for e in self.p.cands[c]:
                i = self.col[(c, e)]
                for d in self.kids[i]:
                    if d in order and d != c:
                        self._row([(order[c], 1.0), (order[d], -1.0), (i, -big)], eps - big, np.inf, extra)
        rows = self.rows + [r + rows0 for r in extra[0]]
        a = coo_matrix((self.vals + extra[2], (rows, self.cols + extra[1])), shape=(rows0 + len(extra[3]), n)).tocsr()
        integrality = np.ones(n)
        integrality[self.base:] = 0
        obj = np.concatenate([self.obj, np.zeros(len(order))])
        return milp(obj, constraints=LinearConstraint(a, self.lo + extra[3], self.hi + extra[4]),
                    integrality=integrality, bounds=Bounds(np.zeros(n), np.ones(n)),
                    options={"time_limit": seconds, "disp": False})

    def choice(self, x) -> dict[int, ENode]:
        """Per class, the cheapest of its picked e-nodes."""
        out: dict[int, ENode] = {}
        cost = self.p.app_cost
        for (c, e), i in self.col.items():
            if x[i] > 0.5 and (c not in out or cost[e.app] < cost[out[c].app]):
                out[c] = e
        return out


def _on_cycles(p: _Problem, choice: dict[int, ENode]) -> set[int]:
    """The classes on a cycle of ``choice`` among those the roots need (empty: acyclic)."""
    eg = p.eg
    need, stack = set(), list(p.roots)
    while stack:
        c = stack.pop()
        if c not in need:
            need.add(c)
            stack.extend(eg.find(k) for k in choice[c].kids)
    succ = {c: sorted({eg.find(k) for k in choice[c].kids}) for c in need}
    comp = _components(sorted(need), succ)
    sizes = Counter(comp.values())
    return {c for c in need if sizes[comp[c]] > 1 or c in succ[c]}


def _cyclic_edges(p: _Problem) -> set[tuple[int, int]]:
    """Class edges (user, used) inside a strongly connected component: only these can close a
    cycle."""
    eg = p.eg
    succ = {c: sorted({eg.find(k) for e in p.cands[c] for k in e.kids}) for c in p.classes}
    comp = _components(p.classes, succ)
    return {(c, d) for c in p.classes for d in succ[c] if c != d and comp[c] == comp[d]}


def _components(nodes: Sequence[int], succ: dict[int, list[int]]) -> dict[int, int]:
    """Each node's strongly connected component (a representative), by Tarjan's algorithm
    without recursion."""
    index, low, comp, on, stack, count = {}, {}, {}, set(), [], 0
    for start in nodes:
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
    return comp


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
    best, origins = build_graph(eg, greedy_choice(p), roots, graph)
    how = Extraction("greedy", dropped=drop_cycles(p))
    shared = greedy_choice(p, share=True)
    if not _on_cycles(p, shared):
        g, o = build_graph(eg, shared, roots, graph)
        if cost.graph_cost(g) < cost.graph_cost(best):
            best, origins, how.method = g, o, "greedy (shared)"
    if ilp_seconds is None:
        how.status = "integer program not asked for"
    else:
        try:
            choice, how.status, how.gap = ilp_choice(p, ilp_seconds)
        except SolverMissing as e:
            choice, how.status = None, str(e)
        if choice is not None:
            g, o = build_graph(eg, choice, roots, graph)
            if cost.graph_cost(g) < cost.graph_cost(best):
                best, origins, how.method = g, o, "ilp"
    how.origins = origins
    return best, how
