"""The extraction's integer program (search/ilp.py) on random e-graphs with cycles, against brute force: the
shrinking keeps an optimal pick, the answer is acyclic and optimal (or within the gap asked for), the bound is
a true lower bound, and extract() never returns worse than greedy with a gap consistent with its bound."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hypothesis import HealthCheck, given, settings, strategies as st

from superopt.cost import CostModel
from superopt.ir import GraphBuilder
from superopt.search import extract as X
from superopt.search.minimal import NEGLIGIBLE_US
from superopt.search.choice import Problem, on_cycles
from superopt.pattern.egraph import EGraph
from superopt.search.highs import run_highs
from superopt.search import ilp as I
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs(), st.sampled_from((0.0, 0.01, 0.2)))
def test_part_by_part_from_a_known_pick_is_as_good_as_the_whole_program(case, gap):
    """With the known pick itself (not only its cost) the program is solved part by part where
    it splits: the same promises as the whole program's warm start."""
    p, _ = case
    if not _small(p):
        return
    unfiltered = X.greedy_choice(p)  # may hold e-nodes the filter drops: the whole program then
    X.drop_cycles(p)
    opt = _optimum(p)
    known = X.greedy_choice(p) if gap != 0.2 else unfiltered
    cost = X._Live(p, known).cost
    choice, status, dual = ilp_choice(p, 20.0, gap=gap, known=known)
    assert dual is not None and dual <= opt + 1e-6 * max(1.0, opt)
    if choice is None:
        assert "within" in status and cost * (1 - gap) <= opt + 1e-6 * max(1.0, opt)
    else:
        found = X._Live(p, choice).cost
        assert not on_cycles(p, choice) and found <= cost + 1e-6 * max(1.0, cost)
        assert (found - dual) <= gap * found + 1e-6 * max(1.0, found)


def _acyclic_parts(p):
    """``(reduced program, required classes, parts)`` of a small problem whose reduced program
    is acyclic and not empty (its cycles dropped first), else None: what the parts tests check."""
    if not _small(p):
        return None
    X.drop_cycles(p)
    red = Reduced(p)
    if red.cyclic() or not red.classes:
        return None
    return (red,) + tuple(red.parts())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_required_classes_are_in_every_pick_and_the_parts_share_only_them(case):
    p, _ = case
    got = _acyclic_parts(p)
    if got is None:
        return
    red, required, parts = got
    assert sorted(c for part in parts for c in part) == sorted(red.classes)  # a partition
    where = {c: i for i, part in enumerate(parts) for c in part}
    for c in red.classes:  # an e-node uses its own part or required classes only
        for e in red.cands[c]:
            assert all(where[d] == where[c] or d in required for d in red.kids[e])
    for pick in itertools.product(*(p.cands[c] for c in p.classes)):  # every acyclic pick needs them
        choice = dict(zip(p.classes, pick))
        if not on_cycles(p, choice):
            live = X._Live(p, choice)
            assert all(live.ref[c] > 0 for c in required), "a required class left out"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs(), st.sampled_from((0.0, 0.01, 0.5)))
def test_every_acyclic_pick_meets_the_cover_rows(case, cheap):
    """A cover row (ilp._covers) says: a class picked means its anchor picked or an e-node of
    its cover picked. Checked on every acyclic pick of every class's closure (the least set of
    picks the program allows with that class picked), at several shares of "cheap"."""
    p, _ = case
    if not _small(p):
        return
    X.drop_cycles(p)
    red = Reduced(p)
    if not red.classes:
        return
    required, _ = red.parts() if not red.cyclic() else (frozenset(), None)
    saved = I.COVER_CHEAP
    try:
        I.COVER_CHEAP = cheap
        rows = I._covers(red, red.classes, set(red.classes), required)
    finally:
        I.COVER_CHEAP = saved
    for pick in itertools.product(*(red.cands[c] for c in red.classes)):
        choice = dict(zip(red.classes, pick))
        for c, cover, anchor in rows:
            live, stack, cyclic = set(), [(c, ())], False
            while stack:  # the classes c's pick needs, through the program's own kids
                d, path = stack.pop()
                if d in path:
                    cyclic = True
                    break
                if d not in live:
                    live.add(d)
                stack.extend((k, path + (d,)) for k in red.kids[choice[d]])
            if cyclic:
                continue
            assert anchor in live or any(v in live and choice[v] == e for v, e in cover), (c, cover, anchor)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs(), st.sampled_from((0.0, 0.01)))
def test_the_program_with_cover_rows_everywhere_keeps_its_promises(case, gap):
    """The cover rows added to every program, however small: still optimal (or within the gap of
    a true lower bound) against brute force, whole and part by part."""
    p, _ = case
    if not _small(p):
        return
    opt = _optimum(p)
    saved = I.COVER_MIN
    try:
        I.COVER_MIN = 0
        choice, status, dual = ilp_choice(p, 20.0)
        assert choice is not None and not on_cycles(p, choice)
        assert abs(X._Live(p, choice).cost - opt) <= 1e-6 * max(1.0, opt) and dual <= opt + 1e-6 * max(1.0, opt)
        X.drop_cycles(p)
        known = X.greedy_choice(p)
        cost = X._Live(p, known).cost
        choice, status, dual = ilp_choice(p, 20.0, gap=gap, known=known)
    finally:
        I.COVER_MIN = saved
    filtered = _optimum(p)
    assert dual is not None and dual <= filtered + 1e-6 * max(1.0, filtered)
    found = cost if choice is None else X._Live(p, choice).cost
    assert found <= cost + 1e-6 * max(1.0, cost) and found * (1 - gap) <= filtered + 1e-6 * max(1.0, filtered)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_greedy_values_are_the_least_tree_costs_and_its_pick_is_acyclic(case):
    """Greedy (a worklist over the classes) gives each class the least tree cost
    (against rounds over every class until nothing improves), by an e-node giving it; its pick
    has no cycle. (Which of tied e-nodes it keeps is the worklist's order: a tie rule over tree
    costs, which count a shared subgraph once per use, lost somewhere whichever way it went;
    docs/search.md, session 38 merged.)"""
    p, _ = case
    values, choice = X._least(p, p.app_cost, False)
    want: dict = {}
    for _ in range(len(p.classes) + 1):
        for c in p.classes:
            for e in p.cands[c]:
                kids = p.kid_classes[e]
                if all(k in want for k in kids):
                    v = p.app_cost[e.app] + sum(want[k] for k in kids)
                    if c not in want or v < want[c] - 1e-9:
                        want[c] = v
    assert values.keys() == want.keys()
    for c, v in values.items():
        assert abs(v - want[c]) <= 1e-6 * max(1.0, v)
        e = choice[c]
        assert abs(p.app_cost[e.app] + sum(values[k] for k in p.kid_classes[e]) - v) <= 1e-6 * max(1.0, v)
    if set(p.roots) <= choice.keys():
        assert not on_cycles(p, choice)


def test_the_program_splits_where_only_required_values_join_its_parts():
    """Two relu chains on two inputs, each with an alternative (a second path to the same value):
    two parts; their picks put together are the whole program's."""
    b = GraphBuilder()
    outs = []
    for name in ("x", "y"):
        v = b.input(name, (8, 8))
        outs.append(b.op("tanh", b.op("relu", v)))
    g = b.build(outs)
    eg = EGraph()
    roots = eg.add_graph(g)
    for r in roots:  # another way to the same value: sigmoid of the input
        inner = eg.nodes[eg.find(r)][0].kids[0]
        src = eg.nodes[eg.find(inner)][0].kids[0]
        eg.union(eg.find(r), eg.add_app("sigmoid", (), [src], (eg.types[eg.find(r)],))[0])
    eg.rebuild()
    p = Problem(eg, roots, H100)
    required, parts = Reduced(p).parts()
    assert len(parts) == 2 and set(required) >= {eg.find(r) for r in roots}
    whole, _, _ = ilp_choice(p, 20.0)
    known = X.greedy_choice(p)
    split, status, dual = ilp_choice(p, 20.0, gap=0.0, known=known)
    assert "2 parts" in status
    got = X._Live(p, split if split is not None else known).cost
    assert abs(got - X._Live(p, whole).cost) < 1e-9 and abs(dual - got) < 1e-6


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_a_parts_least_cost_is_below_every_acyclic_pick_of_it(case):
    """``_least_cost`` decides a part without HiGHS where it is above the cutoff: it must be a
    lower bound of what every acyclic pick pays in that part (``_pick_cost``, which is the
    program's own objective of the pick)."""
    p, _ = case
    got = _acyclic_parts(p)
    if got is None:
        return
    red, required, parts = got
    for pick in itertools.product(*(p.cands[c] for c in p.classes)):
        choice = dict(zip(p.classes, pick))
        mine = None if on_cycles(p, choice) else I._in_program(red, choice)
        if mine is None:
            continue
        for part in parts:
            has = {c: mine[c] for c in part if c in mine}
            paid = I._pick_cost(red, has)
            assert paid == I._Program(red, part, required).cost_of(has)
            assert I._least_cost(red, part, required) <= paid + 1e-9


def test_an_equal_program_is_solved_once(monkeypatch):
    """Parts that are the same program (a model's repeated blocks) are asked of HiGHS once;
    another cutoff is another program."""
    b = GraphBuilder()
    v = b.input("x", (8, 8))
    g = b.build([b.op("tanh", b.op("relu", v))])
    eg = EGraph()
    roots = eg.add_graph(g)
    r = eg.find(roots[0])
    src = eg.nodes[eg.find(eg.nodes[r][0].kids[0])][0].kids[0]
    eg.union(r, eg.add_app("sigmoid", (), [src], (eg.types[r],))[0])
    eg.rebuild()
    prog = I._Program(Reduced(Problem(eg, roots, H100)))
    calls = []
    real = I.run_highs
    monkeypatch.setattr(I, "run_highs", lambda *a: calls.append(a) or real(*a))
    solved: dict = {}
    first = prog.solve(set(), 10.0, 0.01, 5.0, 100, solved)
    assert prog.solve(set(), 10.0, 0.01, 5.0, 100, solved) is first and len(calls) == 1
    prog.solve(set(), 10.0, 0.01, 4.0, 100, solved)
    assert len(calls) == 2


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
    # values switched back to the input's own computation may cost up to NEGLIGIBLE_US each
    assert H100.graph_cost(best) <= how.greedy_cost + NEGLIGIBLE_US * how.kept_original + 1e-9
    assert how.objective is not None
    if how.bound is not None:
        assert how.bound <= how.objective * (1 + 1e-9) + 1e-9
        assert abs(how.gap - max(0.0, (how.objective - how.bound) / how.objective)) < 1e-8 if how.objective else True
        assert how.gap <= 0.01 or not how.status.startswith(("optimal", "known pick within"))


@st.composite
def programs(draw):
    """A small 0/1 program: random costs, rows with random bounds (some infinite), some
    columns continuous, and a duplicate entry now and then (summed, as scipy's sparse matrix does)."""
    n, m = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    obj = np.array(draw(st.lists(st.integers(-3, 5), min_size=n, max_size=n)), dtype=float)
    entries = draw(st.lists(st.tuples(st.integers(0, m - 1), st.integers(0, n - 1), st.integers(-2, 2)),
                            min_size=1, max_size=3 * n))
    rows, cols, vals = (np.array(v) for v in zip(*entries))
    lo = np.array(draw(st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 1.0]), min_size=m, max_size=m)))
    width = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, np.inf]), min_size=m, max_size=m)))
    hi = np.where(np.isinf(lo), np.where(np.isinf(width), 1.0, width), np.where(np.isinf(lo), 0.0, lo) + width)
    integrality = np.array(draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n, max_size=n)), dtype=float)
    return obj, (rows.astype(np.int64), cols.astype(np.int64), vals.astype(float)), lo, hi, integrality


@settings(max_examples=60, deadline=None)
@given(programs())
def test_highs_without_scipy_optimize_answers_as_milp(prog):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    obj, (rows, cols, vals), lo, hi, integrality = prog
    got = run_highs(obj, (rows, cols, vals), lo, hi, integrality, 10.0, 0.0)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), len(obj))).tocsr()
    want = milp(obj, constraints=LinearConstraint(a, lo, hi), integrality=integrality,
                bounds=Bounds(np.zeros(len(obj)), np.ones(len(obj))), options={"time_limit": 10.0, "mip_rel_gap": 0})
    assert got.status == want.status and (got.x is None) == (want.x is None)
    if want.x is not None:
        assert abs(got.fun - want.fun) < 1e-6 and (got.mip_dual_bound is None) == (want.mip_dual_bound is None)
        assert want.mip_dual_bound is None or abs(got.mip_dual_bound - want.mip_dual_bound) < 1e-6
        assert np.all(a @ got.x >= lo - 1e-6) and np.all(a @ got.x <= hi + 1e-6)


def test_the_solver_loads_without_importing_scipy_optimize():
    code = ("import sys; from superopt.search.highs import run_highs; import numpy as np; "
            "r = run_highs(np.array([1.0, 2.0]), (np.array([0, 0]), np.array([0, 1]), np.array([1.0, 1.0])), "
            "np.array([1.0]), np.array([2.0]), np.ones(2), 5.0, 0.0); "
            "print(r.status, *r.x.tolist(), 'scipy.optimize' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.split() == ["0", "1.0", "0.0", "False"], out.stderr[-2000:]


def _set_cover(seed: int):
    """A 0/1 set cover whose optimum takes HiGHS several branch-and-bound nodes (seeds 2, 22)."""
    rng = np.random.default_rng(seed)
    a = (rng.random((60, 40)) < 0.12).astype(float)
    a[np.arange(60), rng.integers(0, 40, 60)] = 1
    rows, cols = np.nonzero(a)
    obj = rng.integers(5, 15, 40).astype(float)
    return obj, (rows, cols, np.ones(len(rows))), np.ones(60), np.full(60, np.inf), np.ones(40)


def test_the_node_budget_decides_where_the_solver_stops_not_the_clock():
    for seed in (2, 22):
        prog = _set_cover(seed)
        whole = run_highs(*prog, 100.0, 0.0)
        assert whole.status == 0 and whole.nodes > 3 and whole.limit is None
        cut = [run_highs(*prog, seconds, 0.0, nodes=3) for seconds in (5.0, 50.0, 500.0)]
        assert all(r.limit == "nodes" and r.status == 1 and r.nodes == 3 for r in cut)
        assert all(np.array_equal(r.x, cut[0].x) and r.fun == cut[0].fun and r.mip_dual_bound == cut[0].mip_dual_bound
                   for r in cut)  # the same answer whatever the time limit
        assert cut[0].fun > whole.fun  # and the budget did stop it short


class _SlowClock:
    """``time`` for a machine under load: every reading is ``step`` seconds after the last."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs(), st.sampled_from((1, 3, 2000)))
def test_the_program_answers_the_same_on_a_slow_clock(case, nodes):
    import superopt.search.ilp as I
    p, _ = case
    known = X._Live(p, X.greedy_choice(p)).cost
    want = ilp_choice(p, 1000.0, bound=known, gap=0.01, nodes=nodes)
    real = I.time
    try:
        I.time = _SlowClock(5.0)  # each reading 5 s later: the 1000 s safety net never bites
        got = ilp_choice(p, 1000.0, bound=known, gap=0.01, nodes=nodes)
    finally:
        I.time = real
    assert got == want
    want = ilp_choice(p, 1000.0, gap=0.01, nodes=nodes, known=X.greedy_choice(p))  # part by part
    try:
        I.time = _SlowClock(5.0)
        got = ilp_choice(p, 1000.0, gap=0.01, nodes=nodes, known=X.greedy_choice(p))
    finally:
        I.time = real
    assert got == want


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(egraphs())
def test_the_extraction_reads_no_clock_but_the_programs_safety_net(case):
    """Greedy, the cycle filter, the local search and the switching back to the input read no
    clock at all (the local search is bounded by passes): the pick cannot depend on the load."""
    import time as real_time
    p, g = case
    want, _ = X.extract(p.eg, p.roots, g, H100, None)

    def no_clock():
        raise AssertionError("the extraction read the clock")
    saved = real_time.perf_counter, real_time.time, real_time.monotonic
    try:
        real_time.perf_counter = real_time.time = real_time.monotonic = no_clock
        got, _ = X.extract(p.eg, p.roots, g, H100, None)
    finally:
        real_time.perf_counter, real_time.time, real_time.monotonic = saved
    assert got == want and repr(got) == repr(want)
