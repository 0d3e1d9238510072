"""The extraction's integer program (search/ilp.py) on random e-graphs with cycles, against brute force: the
shrinking keeps an optimal pick, the answer is acyclic and optimal (or within the gap asked for), the bound is
a true lower bound, and extract() never returns worse than greedy with a gap consistent with its bound."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings, strategies as st

from superopt.cost import CostModel
from superopt.ir import GraphBuilder
from superopt.search import extract as X
from superopt.search.choice import Problem, on_cycles
from superopt.pattern.egraph import EGraph
from superopt.search.ilp import Reduced, ilp_choice

H100 = CostModel("h100")
OPS = ("relu", "tanh", "sigmoid", "add", "mul")


@st.composite
def egraphs(draw):
    """A small elementwise graph with a split (a two-output application) and several outputs
    (shared values), in an e-graph where some classes got another e-node over other classes
    or were merged (alternatives and cycles), with a random price per application (some free)."""
    b = GraphBuilder()
    x = b.input("x", (8, 8))
    vals = [x, *b.op("split", b.input("z", (8, 16)), axis=1, sizes=(8, 8))]
    for _ in range(draw(st.integers(2, 5))):
        op = draw(st.sampled_from(OPS))
        args = [draw(st.sampled_from(vals)) for _ in range(2 if op in ("add", "mul") else 1)]
        vals.append(b.op(op, *args))
    g = b.build(vals[-draw(st.integers(1, 3)):])
    eg = EGraph()
    roots = eg.add_graph(g)
    classes = sorted(c for c in eg.classes() if eg.types[c].shape == (8, 8))
    t = eg.types[classes[0]]
    for _ in range(draw(st.integers(0, 3))):  # another e-node for a class, over any classes
        op = draw(st.sampled_from(OPS))
        kids = [draw(st.sampled_from(classes)) for _ in range(2 if op in ("add", "mul") else 1)]
        eg.union(draw(st.sampled_from(classes)), eg.add_app(op, (), kids, (t,))[0])
    for a, c in draw(st.lists(st.tuples(st.sampled_from(classes), st.sampled_from(classes)), max_size=2)):
        eg.union(a, c)
    eg.rebuild()
    p = Problem(eg, roots, H100)
    for app in sorted(p.app_cost, key=repr):
        if app[0] != "input":
            p.app_cost[app] = float(draw(st.sampled_from((0, 1, 2, 5, 9))))
    return p, g


def _optimum(p: Problem) -> float:
    """The least DAG cost over every acyclic choice (brute force)."""
    best = float("inf")
    for pick in itertools.product(*(p.cands[c] for c in p.classes)):
        choice = dict(zip(p.classes, pick))
        if not on_cycles(p, choice):
            best = min(best, X._Live(p, choice).cost)
    return best


def _small(p: Problem) -> bool:
    n = 1
    for c in p.classes:
        n *= max(1, len(p.cands[c]))
    return n <= 20000


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_the_program_is_optimal_and_its_bound_is_a_lower_bound(case):
    p, _ = case
    if not _small(p):
        return
    opt = _optimum(p)
    choice, status, dual = ilp_choice(p, 20.0)
    assert choice is not None and status.startswith("optimal"), status
    assert not on_cycles(p, choice)
    assert abs(X._Live(p, choice).cost - opt) <= 1e-6 * max(1.0, opt)
    assert dual is not None and dual <= opt + 1e-6 * max(1.0, opt)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs(), st.sampled_from((0.0, 0.01, 0.2)))
def test_warm_start_answers_a_cheaper_pick_or_proves_the_known_one_within_the_gap(case, gap):
    p, _ = case
    if not _small(p):
        return
    opt = _optimum(p)
    known = X._Live(p, X.greedy_choice(p)).cost
    choice, status, dual = ilp_choice(p, 20.0, bound=known, gap=gap)
    assert dual is not None and dual <= opt + 1e-6 * max(1.0, opt)  # a true lower bound
    if choice is None:  # the known pick is proven within the gap
        assert "within" in status and known * (1 - gap) <= opt + 1e-6 * max(1.0, opt)
    else:
        found = X._Live(p, choice).cost
        assert not on_cycles(p, choice) and found <= known + 1e-6 * max(1.0, known)
        assert found * (1 - gap) <= opt + 1e-6 * max(1.0, opt)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_the_free_picks_cost_nothing_and_the_reduced_program_keeps_the_optimum(case):
    p, _ = case
    red = Reduced(p)
    assert all(p.app_cost[e.app] == 0 for e in red.fixed.values())
    for c, e in red.fixed.items():  # a free pick uses free classes only: the fixed part is closed
        assert all(p.eg.find(k) in red.fixed for k in e.kids)
    for c in red.classes:  # no e-node of the program uses its own class or a fixed one
        assert all(c not in red.kids[e] and not red.kids[e] & red.fixed.keys() for e in red.cands[c])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_extract_is_never_worse_than_greedy_and_reports_a_consistent_gap(case):
    p, g = case
    best, how = X.extract(p.eg, p.roots, g, H100, 10.0, 0.01)
    assert H100.graph_cost(best) <= how.greedy_cost + 1e-9
    assert how.objective is not None
    if how.bound is not None:
        assert how.bound <= how.objective * (1 + 1e-9) + 1e-9
        assert abs(how.gap - max(0.0, (how.objective - how.bound) / how.objective)) < 1e-8 if how.objective else True
        assert how.gap <= 0.01 or not how.status.startswith(("optimal", "known pick within"))
