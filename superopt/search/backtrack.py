"""TASO's cost-based backtracking search over rewrites.

A priority queue of graphs ordered by cost: pop the cheapest, apply every rule at every
match, and queue each result that costs less than ``alpha`` x the best cost so far and was
not seen before; stop when ``budget`` graphs were expanded, ``time_limit`` seconds passed or
the queue ran dry. Two graphs count as the same when their exact hashes are equal
(:meth:`ExactForms.key_after`: a sum of random 128-bit values over the elements of the
graph's exact form, updated in time of the rewrite's size; pairwise comparisons of forms
took 70% of Inception's search). A plan whose cost is known only once it is built (a rewrite that
changes what is folded at compile time) is checked against the bound when popped. Children are
queued as plans (the parent and the rewrite) and built only when popped, so a wide frontier costs
little memory. A plan is popped only if the gate of :mod:`superopt.search.instance_proofs` admits
its instance (proven at the match's own sizes and attributes), so no state whose history holds an
unproven instance becomes the result.

>>> from superopt.ir import GraphBuilder, Rule
>>> from superopt.cost import CostModel
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (1, 4, 8, 8)); w = b.weight("w", (4, 4, 3, 3))
...     return b.build([f(b, x, w)])
>>> fuse = Rule(side(lambda b, x, w: b.op("relu", b.op("conv2d", x, w, padding=(1, 1)))),
...             side(lambda b, x, w: b.op("conv2d", x, w, padding=(1, 1), activation="relu")))
>>> b = GraphBuilder(); x = b.input("img", (1, 16, 32, 32)); w = b.weight("k", (16, 16, 3, 3))
>>> g = b.build([b.op("relu", b.op("conv2d", x, w, padding=(1, 1)))])
>>> res = search(g, [fuse], CostModel("h100"), progress=False)
>>> [n.op for n in res.graph.nodes], res.report.stop_reason.value, list(res.report.rules_applied.values())
(['input', 'weight', 'conv2d'], 'exhausted', [1])
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from tqdm import tqdm

from ..cost.model import CostModel
from ..ir.graph import Graph
from ..ir.rule import Rule
from .errors import SearchError
from ..pattern import RuleSet, match_all, reachable_rules
from .report import SearchReport, StopReason
from .instance_proofs import InstanceProofs
from .rewrite import Rewriter
from .state import ExactForms, State

__all__ = ["SearchResult", "search", "check_limits", "DEFAULT_ALPHA", "DEFAULT_BUDGET", "DEFAULT_TIME_LIMIT"]

DEFAULT_ALPHA = 1.05
DEFAULT_BUDGET = 1000
DEFAULT_TIME_LIMIT = 60.0


@dataclass
class SearchResult:
    """The best graph, its state (with its history of rewrites) and the report."""

    graph: Graph
    state: State
    first: State
    report: SearchReport
    rewriter: Rewriter = field(repr=False, default=None)


def check_limits(alpha: float, budget: int, time_limit: float) -> None:
    if not alpha >= 1.0:
        raise SearchError(f"alpha must be at least 1 (it bounds how much worse than the best a queued graph "
                          f"may be), got {alpha}")
    if budget < 1:
        raise SearchError(f"budget must be at least 1 expanded graph, got {budget}")
    if not time_limit > 0:
        raise SearchError(f"time limit must be positive, got {time_limit}")


def search(graph: Graph, rules: Sequence[Rule] | RuleSet, cost: CostModel, alpha: float = DEFAULT_ALPHA,
           budget: int = DEFAULT_BUDGET, time_limit: float = DEFAULT_TIME_LIMIT, progress: bool = True,
           labels: dict | None = None, proofs: InstanceProofs | None = None) -> SearchResult:
    """Search for the cheapest graph equal to ``graph`` under ``rules`` (see the module docstring);
    ``labels`` renames rule ids in the report (reversed rules after the rule they reverse);
    ``proofs`` is the instance-proof gate (default: the one for the rules' database, see
    :meth:`InstanceProofs.for_rules`)."""
    check_limits(alpha, budget, time_limit)
    ruleset = rules if isinstance(rules, RuleSet) else RuleSet(reachable_rules(list(rules), graph))
    t0 = time.perf_counter()
    cost.assume_layout_of(graph)  # one-node prices at the convolution layout Inductor picks for it
    first = State.from_graph(graph, cost)
    first.matches = match_all(first, ruleset)
    if proofs is None:
        proofs = InstanceProofs.for_rules(getattr(rules, "source", None))
    rw = Rewriter(ruleset, cost, proofs)
    rep = SearchReport(alpha=alpha, budget=budget, time_limit=time_limit, rules=len(ruleset),
                       rules_skipped=len(ruleset.skipped), nodes_before=_count(first), cost_before=first.cost,
                       labels=dict(labels or {}))
    rep.seconds["match first graph"] = time.perf_counter() - t0
    best = _loop(first, rw, rep, alpha, budget, time_limit, progress, t0)
    _finish_report(rep, rw, first, best, t0)
    return SearchResult(best.to_graph(), best, first, rep, rw)


def _loop(first: State, rw: Rewriter, rep: SearchReport, alpha, budget, time_limit, progress, t0) -> State:
    best, tick, exact = first, itertools.count(), ExactForms(first)
    seen: dict = {exact.key_of(first): True, first.key: True}
    queue = [(first.cost, next(tick), first, None)]
    bar = tqdm(total=budget, desc="search", unit="graph", disable=not progress, leave=False)
    by_pattern: Counter = Counter()
    rep.stop_reason = StopReason.EXHAUSTED
    while queue:
        if rep.explored >= budget:
            rep.stop_reason = StopReason.BUDGET
            break
        if time.perf_counter() - t0 > time_limit:
            rep.stop_reason = StopReason.TIME_LIMIT
            break
        _, _, parent, plan = heapq.heappop(queue)
        t1 = time.perf_counter()
        admitted = plan is None or rw.admit(parent, plan)  # no unproven instance enters a result
        rep.seconds["instance proofs"] += time.perf_counter() - t1
        if not admitted:
            continue
        t1 = time.perf_counter()
        st = parent if plan is None else rw.apply(parent, plan)
        if plan is not None:
            exact.inherit(st, parent, plan)
        rep.seconds["apply"] += time.perf_counter() - t1
        if plan is not None and not plan.exact and st.cost >= alpha * best.cost:
            rep.pruned_by_cost += 1
            continue
        rep.explored += 1
        if st.cost < best.cost:
            best = st
        t1 = time.perf_counter()
        for m in st.matches:
            p = rw.plan(st, m)
            if p is None:
                continue
            rep.candidates += 1
            by_pattern[m.pattern] += 1
            cost = st.cost + p.dcost
            if p.exact and cost >= alpha * best.cost:
                rep.pruned_by_cost += 1
                continue
            if _seen(seen, exact, st, p, rep):
                rep.duplicates += 1
            else:
                heapq.heappush(queue, (cost if p.exact else st.cost, next(tick), st, p))
        rep.seconds["plan"] += time.perf_counter() - t1
        rep.queue_peak = max(rep.queue_peak, len(queue))
        bar.update(1)
        bar.set_postfix(best=f"{best.cost:.1f}us", queue=len(queue))
    bar.close()
    for p, n in by_pattern.items():
        rep.by_rule[rep.label(rw.rules.patterns[p].rule_id)] += n
    return best


def _seen(seen: dict, exact: ExactForms, st: State, plan, rep: SearchReport) -> bool:
    """Whether the graph ``plan`` makes from ``st`` was queued before (recording it if not):
    its exact hash (:meth:`ExactForms.key_after`, in time of the rewrite's size) decides; the
    cheap key only counts how often it would have collided."""
    key = exact.key_after(st, plan)
    cheap = plan.key(st)
    if key in seen:
        return True
    if cheap in seen:
        rep.key_collisions += 1
    seen[key] = seen[cheap] = True
    return False


def _count(st: State) -> int:
    """Operators that run (sources and compile-time values left out)."""
    return sum(1 for i, n in st.nodes.items() if n.name is None and not st.const[i])


def _finish_report(rep: SearchReport, rw: Rewriter, first: State, best: State, t0: float) -> None:
    rep.cost_after = best.cost
    rep.nodes_after = _count(best)
    rep.rules_applied = dict(Counter(rep.label(step.rule_id) for step in best.history()))
    rep.steps = [dict(step._asdict(), rule_id=rep.label(step.rule_id)) for step in best.history()]
    rep.rejected = rw.rejected.copy()
    rep.plans_reused = rw.reused
    rw.proofs.flush()
    rep.instance_proofs = rw.proofs.counts()
    rep.seconds["total"] = time.perf_counter() - t0
