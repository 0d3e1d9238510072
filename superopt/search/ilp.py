"""Extraction by an integer program (Tensat's, tightened), solved by HiGHS (scipy's: :mod:`.highs`).

A binary per e-node, a binary per costly multi-output application (paid once for all its
outputs), and order variables where cycles remain. Before the solver the program is shrunk
(:class:`Reduced`): classes that can be computed for free (weights, compile-time values, views
of them) are fixed to a free pick and leave the program; e-nodes that use their own class are
dropped, and so is an e-node *dominated* by another of its class (it uses a subset of the
other's classes and costs no less), which can only be picked where the other could be.

The rows: a root picks one e-node, every class at most one, and for every pair of classes
(user ``c``, used ``d``) the e-nodes of ``c`` that use ``d`` weigh no more than ``d``'s picks.
Tensat writes that row per e-node; with at most one pick per class the row per class pair is
as valid and much tighter: where alternatives of a class all use one value, per-e-node rows let
the relaxation pay a tenth of that value in each of ten alternatives (SqueezeNet's relaxation
was 29 against an optimum of 253, and HiGHS branched for seconds). Order constraints forbid
cycles among the classes that are still on one (:func:`ilp_choice`). HiGHS gets no starting
point (given the local search's pick as one, NASNet-A's program under the Inductor model took
2.7 s against 2.4 s without, the relaxation being weak: 953 against 1693): the program asks for
a pick cheaper than the local search's by more than the gap, and where there is none that pick is proven within the gap; the solver's lower bound
gives the gap otherwise. On the zoo (2 cores) the reduced program is 200-5,800 variables
and closes within 1% in 0.02-2.5 s (Inception-v3 under the analytic model is the slowest).
"""

from __future__ import annotations

import time
from collections import defaultdict

from .choice import Problem, on_cycles
from .highs import Result, SolverMissing, highs_core, run_highs
from ..pattern.egraph import ENode, scc_ranks

__all__ = ["SolverMissing", "ilp_choice", "EAGER_ORDER", "Reduced"]


#: at most this many classes on the reduced program's cycles are ordered from the first round on
EAGER_ORDER = 400
#: the share of the node budget spent asking for a pick more than the gap cheaper than the known one
PROVE_SHARE = 0.6
#: branch-and-bound nodes the program may take (all its solves together): the limit that decides
NODES = 2000
#: how far below a class :meth:`Reduced.required` looks for the classes all its e-nodes need
REQUIRED_DEPTH = 8


class Reduced:
    """The program's part of a :class:`Problem`: ``fixed`` (class -> its free pick), and per
    class left (``classes``, those the roots reach through the e-nodes kept) its candidate
    e-nodes with the classes they use that are not fixed (``kids``)."""

    def __init__(self, p: Problem):
        self.p = p
        self.fixed = _free_picks(p)
        self.cands: dict[int, list[ENode]] = {}
        self.kids: dict[ENode, frozenset] = {}
        stack, seen = [r for r in p.roots if r not in self.fixed], set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            self.cands[c] = self._undominated(c)
            stack.extend(d for e in self.cands[c] for d in self.kids[e])
        self.classes = list(self.cands)

    def _undominated(self, c: int) -> list[ENode]:
        p, find, fixed, kept = self.p, self.p.eg.find, self.fixed, []
        options = []
        for e in p.cands[c]:
            kids = {find(k) for k in e.kids}
            if c not in kids:
                options.append((p.app_cost[e.app], e, frozenset(k for k in kids if k not in fixed)))
        options.sort(key=lambda t: (t[0], len(t[2])))
        for cost, e, kids in options:
            if not any(k <= kids and (kc == 0 or (len(f.types) == 1 and len(e.types) == 1 and kc <= cost))
                       for kc, f, k in kept):
                kept.append((cost, e, kids))
                self.kids[e] = kids
        return [e for _, e, _ in kept]

    def required(self, depth: int = REQUIRED_DEPTH) -> dict[int, set[int]]:
        """Per class with alternatives, the classes every one of its e-nodes needs (within
        ``depth`` steps) beyond those its e-nodes all use directly, and what those need: the
        cuts ``picks(c) <= picks(d)`` (where the alternatives of a class meet again)."""
        memo: dict[tuple[int, int], frozenset] = {}

        def need(c: int, h: int) -> frozenset:
            if h == 0:
                return frozenset()
            if (c, h) not in memo:
                memo[(c, h)] = frozenset()  # a cycle back to c within ``depth`` adds nothing
                sets = [frozenset().union(*([e_kids] + [need(k, h - 1) for k in e_kids]))
                        for e_kids in (self.kids[e] for e in self.cands[c])]
                memo[(c, h)] = frozenset.intersection(*sets) if sets else frozenset()
            return memo[(c, h)]

        out = {}
        for c in self.classes:
            if len(self.cands[c]) > 1:
                common = frozenset.intersection(*(self.kids[e] for e in self.cands[c]))
                implied = common.union(*(need(k, depth - 1) for k in common))
                extra = need(c, depth) - implied - {c}
                if extra:
                    out[c] = extra
        return out

    def cyclic(self) -> set[int]:
        """The classes on a cycle of the reduced e-graph (only these need order variables)."""
        succ = {c: sorted({d for e in self.cands[c] for d in self.kids[e]}) for c in self.classes}
        comp = scc_ranks(self.classes, succ)
        size = defaultdict(int)
        for c in self.classes:
            size[comp[c]] += 1
        return {c for c in self.classes if size[comp[c]] > 1}


def _free_picks(p: Problem) -> dict[int, ENode]:
    """Per class that some free e-node computes from free classes only, such an e-node (found
    bottom up, so the picks never form a cycle): no program needs to price these."""
    eg, fixed = p.eg, {}
    waiting: dict[int, list] = defaultdict(list)  # class -> free e-nodes waiting on it
    left: dict[tuple, int] = {}
    ready = []
    for c in p.classes:
        for e in p.cands[c]:
            if p.app_cost[e.app] == 0:
                kids = {eg.find(k) for k in e.kids}
                left[(c, e)] = len(kids)
                for k in kids:
                    waiting[k].append((c, e))
                if not kids:
                    ready.append((c, e))
    while ready:
        c, e = ready.pop()
        if c in fixed:
            continue
        fixed[c] = e
        for key in waiting.pop(c, ()):
            left[key] -= 1
            if left[key] == 0:
                ready.append(key)
    return fixed


def ilp_choice(p: Problem, seconds: float, bound: float | None = None, gap: float = 0.0,
               eager: int = EAGER_ORDER, nodes: int = NODES) -> tuple[dict[int, ENode] | None, str, float | None]:
    """The integer program's acyclic pick (or None), the solver's status and its dual bound
    (no graph of the e-graph costs less, by the program's objective).

    Acyclicity: when at most ``eager`` classes lie on the reduced e-graph's cycles, they are
    ordered from the start; else it is lazy: the program is first solved with no order
    constraints, and while its pick has a cycle, solved again with order constraints over the
    classes found on the cycles so far. ``gap``: the relative gap at which HiGHS may stop (0:
    prove optimality). ``bound``: the objective of a known pick (the local search's), in place
    of a warm start. Within :data:`PROVE_SHARE` of the ``nodes`` the program asks for a pick
    more than ``gap`` cheaper than it: where there is none, the answer is None, the status says
    the known pick is within ``gap`` of the optimum and the dual bound is ``bound * (1 - gap)``
    (the proof HiGHS would need with the pick as its incumbent). Where that takes too many
    nodes (the optimum is just under the known pick), the rest go to the program with a pick no
    dearer than the known one, to ``gap``.

    ``nodes`` (branch-and-bound nodes, all rounds together) decides where the solver stops, so
    the answer does not depend on the machine's speed or load; ``seconds`` is a safety net
    only: where it stops the solver, the status says ``time limit``.

    >>> from superopt.pattern.egraph import EGraph
    >>> from superopt.cost import CostModel
    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (64, 64))
    >>> eg = EGraph(); roots = eg.add_graph(b.build([b.op("relu", x)]))
    >>> choice, status, dual = ilp_choice(Problem(eg, roots, CostModel("h100")), 5.0)
    >>> sorted(e.op for e in choice.values()), status
    (['input', 'relu'], 'optimal')
    """
    highs_core()  # raises SolverMissing before any work
    deadline = time.perf_counter() + seconds
    red = Reduced(p)
    if not red.classes:  # every root computed for free
        return dict(red.fixed), "optimal", 0.0
    prog = _Program(red)
    on_cycle = red.cyclic()
    # few classes on cycles: order them at once, so the first answer is acyclic and the solver's
    # bound is the program's, not that of a program whose picks may support themselves in a cycle
    ordered: set[int] = on_cycle if len(on_cycle) <= eager else set()
    dual, budget = None, [int(PROVE_SHARE * nodes)]
    if bound is not None and gap > 0:  # first, within a share of the nodes: is the pick within the gap?
        cutoff = bound * (1 - gap)
        choice, status, dual = _rounds(p, prog, ordered, cutoff, gap, deadline, budget)
        if choice is not None:
            return choice, status, dual
        if status == "infeasible":  # no pick under the cutoff: the known one is within the gap
            return None, f"known pick within {100 * gap:g}% of the optimum", cutoff
    budget[0] += nodes - int(PROVE_SHARE * nodes)
    cutoff = None if bound is None else bound * (1 + 1e-9) + 1e-9  # then: one no dearer, to the gap
    choice, status, dual2 = _rounds(p, prog, ordered, cutoff, gap, deadline, budget)
    duals = [d for d in (dual, dual2) if d is not None]
    return choice, "known pick, nothing cheaper" if status == "infeasible" else status, max(duals) if duals else None


def _rounds(p: Problem, prog: "_Program", ordered: set[int], cutoff: float | None, gap: float,
            deadline: float, budget: list[int]) -> tuple[dict[int, ENode] | None, str, float | None]:
    """:func:`ilp_choice`'s rounds with the objective at most ``cutoff`` (``ordered`` grows in
    place), within ``budget[0]`` nodes (the nodes used are taken off it); the status
    ``infeasible`` where no pick is under the cutoff."""
    dual = None
    for rounds in range(1, len(prog.red.classes) + 2):
        left = deadline - time.perf_counter()
        if left <= 0 or budget[0] <= 0:
            return None, f"{'time' if left <= 0 else 'node'} limit, no acyclic pick in {rounds - 1} rounds", dual
        res = prog.solve(ordered, left, gap, cutoff, budget[0])
        budget[0] -= max(res.nodes, 1)
        if getattr(res, "mip_dual_bound", None) is not None and res.status in (0, 1):
            dual = float(res.mip_dual_bound)  # a bound of this round's program: valid for later rounds
            if cutoff is not None:  # a bound of the picks under the cutoff: the others cost more
                dual = min(dual, cutoff)
        if res.status == 2 and cutoff is not None:  # none under the cutoff (a relaxation if lazy)
            return None, "infeasible", cutoff
        stop = "time" if res.limit == "time" else "node"
        if res.x is None:
            return None, res.message if res.status != 1 else f"{stop} limit, nothing found", dual
        choice = prog.choice(res.x)
        cyc = on_cycles(p, choice)
        if not cyc:
            done = "optimal" if gap == 0 else f"optimal within {100 * gap:g}%"
            status = done if res.status == 0 else f"{stop} limit, best found" if res.status == 1 else res.message
            return choice, status + (f" ({rounds} rounds)" if rounds > 1 else ""), dual
        ordered |= cyc
    return None, "no acyclic pick", dual  # unreachable: each round orders a new class


class _Program:
    """The integer program of a :class:`Reduced` problem (see the module docstring): the rows
    that do not depend on the ordered classes are built once."""

    def __init__(self, red: Reduced):
        import numpy as np
        self.red, cost = red, red.p.app_cost
        self.enodes = [(c, e) for c in red.classes for e in red.cands[c]]
        self.col = {(c, e): i for i, (c, e) in enumerate(self.enodes)}
        apps = list(dict.fromkeys(e.app for _, e in self.enodes if len(e.types) > 1 and cost[e.app] > 0))
        self.app_col = {a: len(self.enodes) + i for i, a in enumerate(apps)}
        self.base = len(self.enodes) + len(apps)
        self.obj = np.zeros(self.base)
        for (c, e), i in self.col.items():
            if e.app not in self.app_col:
                self.obj[i] = cost[e.app]
        for a, i in self.app_col.items():
            self.obj[i] = cost[a]
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []
        picks = {c: [(self.col[(c, e)], 1.0) for e in red.cands[c]] for c in red.classes}
        for c in dict.fromkeys(r for r in red.p.roots if r in picks):
            self._row(picks[c], 1.0, 1.0)
        self.uses: dict[tuple[int, int], list[int]] = defaultdict(list)  # (user, used) -> e-node columns
        for c in red.classes:
            self._row(picks[c], 0.0, 1.0)
            for e in red.cands[c]:
                for d in red.kids[e]:
                    self.uses[(c, d)].append(self.col[(c, e)])
                if e.app in self.app_col:
                    self._row([(self.col[(c, e)], 1.0), (self.app_col[e.app], -1.0)], -np.inf, 0.0)
        for (c, d), cols in self.uses.items():
            self._row([(i, 1.0) for i in cols] + [(j, -v) for j, v in picks[d]], -np.inf, 0.0)
        for c, needed in red.required().items():
            for d in needed:
                self._row(picks[c] + [(j, -v) for j, v in picks[d]], -np.inf, 0.0)

    def _row(self, entries, low, high, into=None):
        rows, cols, vals, lo, hi = into or (self.rows, self.cols, self.vals, self.lo, self.hi)
        r = len(lo)
        for j, v in entries:
            rows.append(r), cols.append(j), vals.append(v)
        lo.append(low), hi.append(high)

    def solve(self, ordered: set[int], seconds: float, gap: float = 0.0, cutoff: float | None = None,
              nodes: int | None = None) -> Result:
        """HiGHS on the program with order variables for the classes in ``ordered`` (a class
        that picks an e-node using another ordered class comes after it) and the objective at
        most ``cutoff``."""
        import numpy as np
        extra = ([], [], [], [], [])
        order = {c: self.base + i for i, c in enumerate(sorted(ordered))}
        n = self.base + len(order)
        eps, big = 1.0 / (len(order) + 1), 2.0
        rows0 = len(self.lo)
        for (c, d), cols in self.uses.items():
            if c in order and d in order:
                self._row([(order[c], 1.0), (order[d], -1.0)] + [(i, -big) for i in cols], eps - big, np.inf, extra)
        if cutoff is not None:
            self._row([(j, v) for j, v in enumerate(self.obj) if v], -np.inf, cutoff, extra)
        rows = np.array(self.rows + [r + rows0 for r in extra[0]], dtype=np.int64)
        cols = np.array(self.cols + extra[1], dtype=np.int64)
        vals = np.array(self.vals + extra[2], dtype=np.float64)
        integrality = np.ones(n)
        integrality[self.base:] = 0
        obj = np.concatenate([self.obj, np.zeros(len(order))])
        return run_highs(obj, (rows, cols, vals), np.array(self.lo + extra[3]), np.array(self.hi + extra[4]),
                         integrality, seconds, gap, nodes)

    def choice(self, x) -> dict[int, ENode]:
        """The picked e-node of each class of the program, and the fixed classes' free picks."""
        out = dict(self.red.fixed)
        for (c, e), i in self.col.items():
            if x[i] > 0.5:
                out[c] = e
        return out
