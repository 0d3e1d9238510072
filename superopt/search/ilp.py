"""Extraction by an integer program (Tensat's), solved by HiGHS through ``scipy.optimize.milp``.

A binary per e-node, a root class picks one, a picked e-node's child classes pick one, a
multi-output application is paid once for all its outputs (a binary per application), and
order variables forbid cycles. The order constraints are added lazily (:func:`ilp_choice`):
over every cycle of an e-graph they made HiGHS time out, and most cycles are never attractive.
scipy's milp takes no starting point, so the program improves on or certifies the local
search's pick (:mod:`superopt.search.extract`); its lower bound gives the gap. Its
relaxation is weak where alternatives share inputs, so even a 531-e-node SqueezeNet program
takes seconds to close.
"""

from __future__ import annotations

import time

from .choice import Problem, cyclic_edges, on_cycles
from .egraph import ENode

__all__ = ["SolverMissing", "ilp_choice", "EAGER_ORDER"]


class SolverMissing(RuntimeError):
    """scipy (HiGHS) is not installed; greedy extraction is used."""


#: at most this many classes on the e-graph's cycles are ordered from the first round on
EAGER_ORDER = 400


def ilp_choice(p: Problem, seconds: float, bound: float | None = None, gap: float = 0.0,
               eager: int = EAGER_ORDER) -> tuple[dict[int, ENode] | None, str, float | None]:
    """The integer program's acyclic pick (or None), the solver's status and its dual bound
    (no graph of the e-graph costs less, by the program's objective).

    Acyclicity: when at most ``eager`` classes lie on the e-graph's cycles, they are ordered
    from the start; else it is lazy: the program is first solved with no order constraints,
    and while its pick has a cycle, solved again with order constraints over the classes found
    on the cycles so far (constraints over every cycle of an unfiltered e-graph made HiGHS time
    out), all within ``seconds``. ``bound``: the objective of a known pick (the local search's), a cutoff that
    prunes the branch and bound (scipy's milp takes no starting point); ``gap``: the relative
    gap at which HiGHS may stop (0: prove optimality).

    >>> from superopt.search.egraph import EGraph
    >>> from superopt.cost import CostModel
    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (64, 64))
    >>> eg = EGraph(); roots = eg.add_graph(b.build([b.op("relu", x)]))
    >>> choice, status, dual = ilp_choice(Problem(eg, roots, CostModel("h100")), 5.0)
    >>> sorted(e.op for e in choice.values()), status
    (['input', 'relu'], 'optimal')
    """
    try:
        from scipy.optimize import milp  # noqa: F401
    except ImportError:
        raise SolverMissing("the integer program needs scipy (pip install 'superopt[ilp]'); "
                            "extraction by greedy and local search only") from None
    prog = _Program(p, bound)
    deadline = time.perf_counter() + seconds
    cyclic = cyclic_edges(p)
    on_cycle = {c for edge in cyclic for c in edge}
    # few classes on cycles (the cycle filter leaves only free ones): order them at once, so the
    # first answer is acyclic and the solver's bound is the program's, not that of a program
    # whose picks may support themselves through cycles
    ordered: set[int] = on_cycle if len(on_cycle) <= eager else set()
    dual = None
    for rounds in range(1, len(p.classes) + 2):
        left = deadline - time.perf_counter()
        if left <= 0:
            return None, f"time limit, no acyclic pick in {rounds - 1} rounds", dual
        res = prog.solve(ordered, left, gap)
        if getattr(res, "mip_dual_bound", None) is not None and res.status in (0, 1):
            dual = float(res.mip_dual_bound)  # a bound of this round's program: valid for later rounds
        if res.x is None:
            return None, res.message if res.status != 1 else "time limit, nothing found", dual
        choice = prog.choice(res.x)
        cyc = on_cycles(p, choice)
        if not cyc:
            done = "optimal" if gap == 0 else f"optimal within {100 * gap:g}%"
            status = done if res.status == 0 else "time limit, best found" if res.status == 1 else res.message
            return choice, status + (f" ({rounds} rounds)" if rounds > 1 else ""), dual
        ordered |= cyc
    return None, "no acyclic pick", dual  # unreachable: each round orders a new class


class _Program:
    """The integer program of a :class:`Problem` (see the module docstring): the rows that do
    not depend on the ordered classes are built once."""

    def __init__(self, p: Problem, bound: float | None):
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

    def solve(self, ordered: set[int], seconds: float, gap: float = 0.0):
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
                    options={"time_limit": seconds, "disp": False, "mip_rel_gap": gap})

    def choice(self, x) -> dict[int, ENode]:
        """Per class, the cheapest of its picked e-nodes."""
        out: dict[int, ENode] = {}
        cost = self.p.app_cost
        for (c, e), i in self.col.items():
            if x[i] > 0.5 and (c not in out or cost[e.app] < cost[out[c].app]):
                out[c] = e
        return out
