"""Incremental e-matching (pattern/ematch.py, search/saturate.py): semi-naive matching finds
every match a full rematch finds, the growth bound applied while matching drops exactly the
matches past it, and rules of one form are compiled once (pattern/compile.py)."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from superopt.ir import GraphBuilder, Rule
from superopt.pattern import EGraph
from superopt.pattern import ematch_pattern as match_pattern, height, index_by_op, tops_of
from superopt.pattern import RuleSet
from superopt.pattern.ematch import Reuse, near_match

N = 4  # square values: a transpose keeps the type, so any two classes may be unioned


def _side(build, n=N, names=("x", "y")):
    b = GraphBuilder()
    vals = [b.input(name, (n, n)) for name in names]
    outs = build(b, *vals)
    return b.build(outs if isinstance(outs, list) else [outs])


def _t(b, v):
    return b.op("transpose", v, perm=(1, 0))


#: left sides of one and of several tops (the last two: tops sharing a node, tops sharing a variable)
SIDES = [
    (lambda b, x: _t(b, _t(b, x)), ("x",)),
    (lambda b, x, y: b.op("relu", b.op("add", x, y)), ("x", "y")),
    (lambda b, x, y: b.op("add", b.op("relu", x), b.op("sigmoid", y)), ("x", "y")),
    (lambda b, x, y: b.op("add", _t(b, x), _t(b, y)), ("x", "y")),
    (lambda b, x: [b.op("relu", _t(b, x)), b.op("sigmoid", _t(b, x))], ("x",)),
    (lambda b, x: [b.op("relu", x), b.op("sigmoid", x)], ("x",)),
]


def _rules():
    return RuleSet([Rule(_side(f, N, names), _side(f, N, names)) for f, names in SIDES])


def _random_graph(rng: random.Random, steps: int):
    b = GraphBuilder()
    vals = [b.input("a", (N, N)), b.input("b", (N, N))]
    for _ in range(steps):
        op = rng.choice(["relu", "sigmoid", "transpose", "add"])
        v = rng.choice(vals)
        if op == "add":
            vals.append(b.op("add", v, rng.choice(vals)))
        elif op == "transpose":
            vals.append(_t(b, v))
        else:
            vals.append(b.op(op, v))
    return b.build(vals[-3:])


def _canon(eg: EGraph, m) -> tuple:
    return m.pattern, tuple(eg.find(c) for c in m.binds), tuple(eg.canonical(e) for e in m.apps)


def _all(eg: EGraph, rs: RuleSet) -> set:
    index = index_by_op(eg)
    return {_canon(eg, m) for p in rs.patterns for m in match_pattern(eg, p, index)}


def _change(eg: EGraph, rng: random.Random, k: int) -> None:
    """``k`` random edits: a union of two classes or a new e-node on a class."""
    for _ in range(k):
        classes = list(eg.nodes)
        a = rng.choice(classes)
        if rng.random() < 0.5:
            eg.union(a, rng.choice(classes))
        else:
            eg.add_app(rng.choice(["relu", "sigmoid"]), (), [a], (eg.types[a],))
        eg.rebuild()


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 14), st.integers(1, 4), st.randoms(use_true_random=False))
def test_semi_naive_matching_finds_every_new_match(steps, edits, rng):
    rs = _rules()
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    eg.touched = set()
    before = _all(eg, rs)
    _change(eg, rng, edits)
    depth = max(height(p) for p in rs.patterns)
    levels = eg.take_dirty_levels(depth + 1)
    full, index = _all(eg, rs), index_by_op(eg)
    near = set()
    for p in rs.patterns:
        close = index_by_op(eg, levels[height(p) + 1])
        got = (match_pattern(eg, p, index, near=close) if len(tops_of(p)) > 1 else match_pattern(eg, p, close))
        near |= {_canon(eg, m) for m in got}
    old = {(p, tuple(eg.find(c) for c in binds), tuple(eg.canonical(e) for e in apps)) for p, binds, apps in before}
    assert full - old <= near  # every match that is new since the last search is found near the change
    assert near <= full


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 14), st.integers(1, 3), st.randoms(use_true_random=False))
def test_the_growth_bound_while_matching_drops_exactly_the_matches_past_it(steps, cap, rng):
    rs = _rules()
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    for c in eg.nodes:
        eg.gen[c] = rng.randrange(4)
    index = index_by_op(eg)
    for p in rs.patterns:
        every = match_pattern(eg, p, index)
        young = [m for m in every if max(eg.gen[eg.find(c)] for c in
                                         list(m.binds) + [eg.lookup(e) for e in m.apps]) < cap]
        stats: dict = {}
        assert match_pattern(eg, p, index, cap=cap, stats=stats) == young
        assert (stats["held"] > 0) >= (len(young) < len(every))


def test_matches_are_cut_at_the_limit_and_a_cut_search_leaves_no_binding_behind():
    # relu(add(x, y)) over all 16 pairs of 4 inputs: 28 matches (add commutes: both orders of
    # distinct arguments); a multi-top pattern whose first top is cut still joins every second top
    b = GraphBuilder()
    xs = [b.input(f"x{k}", (N, N)) for k in range(4)]
    g = b.build([b.op("relu", b.op("add", u, v)) for u in xs for v in xs])
    eg = EGraph()
    eg.add_graph(g)
    pat = _rules().patterns[1]  # relu(add(x, y))
    every = match_pattern(eg, pat, index_by_op(eg))
    assert len(every) == 28 and match_pattern(eg, pat, index_by_op(eg), limit=5) == every[:5]
    b = GraphBuilder()
    xs = [b.input(f"x{k}", (N, N)) for k in range(3)]
    eg = EGraph()
    eg.add_graph(b.build([b.op(op, x) for x in xs for op in ("relu", "sigmoid")]))
    pair = _rules().patterns[5]  # relu(x), sigmoid(x)
    assert len(match_pattern(eg, pair, index_by_op(eg))) == 3
    assert len(match_pattern(eg, pair, index_by_op(eg), limit=2)) == 2


def test_rules_of_one_form_are_compiled_once():
    tt, one = SIDES[0]
    small = Rule(_side(tt, 2, one), _side(lambda b, x: x, 2, one))
    large = Rule(_side(tt, 6, one), _side(lambda b, x: x, 6, one))  # the same rewrite at other sizes
    other = Rule(_side(tt, 2, one), _side(lambda b, x: b.op("relu", b.op("relu", x)), 2, one))
    rs = RuleSet([small, large, other])
    assert [p.rule_id for p in rs.patterns] == [small.id, other.id]
    assert [why for _, why in rs.skipped] == [f"the same rewrite as rule {small.id} up to sizes and names"]


@settings(max_examples=300, deadline=None)  # (60 examples missed a reuse one level too shallow; 300 catch it)
@given(st.integers(3, 14), st.integers(1, 4), st.integers(1, 40), st.randoms(use_true_random=False))
def test_reusing_earlier_searches_gives_the_very_matches_of_matching_again_in_order(steps, edits, limit, rng):
    """Matching that takes each top candidate's matches from an earlier search where nothing
    they depend on changed since (``Reuse``) returns the same list as matching again, in the
    same order and cut at the same place, everywhere and near the changes, over several rounds
    of changes (a pattern is not matched at every round); and a pattern whose tops match
    nowhere near a change (``near_match``) has the matches it had."""
    rs = _rules()
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    eg.touched = set()
    depth = max(height(p) for p in rs.patterns)
    changed = [{} for _ in range(depth + 2)]
    caches: dict = {p.index: {} for p in rs.patterns}
    last = {p.index: _keys(eg, match_pattern(eg, p, index_by_op(eg), limit, reuse=Reuse(caches[p.index], changed, 0,
                                                                                            height(p))))
            for p in rs.patterns}
    when = {p.index: 0 for p in rs.patterns}  # the round each pattern was last matched in
    for now in range(1, 5):
        levels, index = _round(eg, rng, edits, changed, now)
        for p in rs.patterns:
            if rng.random() < 0.3:
                continue  # not matched this round: its cache must hold across two rounds of changes
            close = index_by_op(eg, levels[height(p) + 1])
            for where in (index, close):
                want = match_pattern(eg, p, where, limit)
                assert match_pattern(eg, p, where, limit, reuse=Reuse(caches[p.index], changed, now, height(p))) == want
            if when[p.index] == now - 1 and not near_match(eg, p, close):  # nothing new since its last matching
                assert _keys(eg, match_pattern(eg, p, index, limit)) == [(k[0], *_recanon(eg, k)) for k in last[p.index]]
            last[p.index], when[p.index] = _keys(eg, match_pattern(eg, p, index, limit)), now


def _round(eg: EGraph, rng: random.Random, edits: int, changed: list, now: int) -> tuple[list, dict]:
    """One round of ``edits`` random changes: the dirty classes per level (recorded in
    ``changed`` as changed at round ``now``) and the index of the whole e-graph after them."""
    _change(eg, rng, edits)
    levels = eg.take_dirty_levels(len(changed) - 1)
    for h, dirty in enumerate(levels):
        changed[h].update(dict.fromkeys(dirty, now))
    return levels, index_by_op(eg)


def _keys(eg: EGraph, matches) -> list:
    return [_canon(eg, m) for m in matches]


def _recanon(eg: EGraph, key) -> tuple:
    return tuple(eg.find(c) for c in key[1]), tuple(eg.canonical(e) for e in key[2])


@settings(max_examples=150, deadline=None)
@given(st.integers(3, 14), st.integers(1, 4), st.integers(1, 40), st.integers(1, 3), st.randoms(use_true_random=False))
def test_reuse_under_the_growth_bound_gives_the_matches_of_matching_again(steps, edits, limit, cap, rng):
    """A top candidate whose own class was touched but whose arguments' surroundings were not
    reuses its matches, unless the growth bound refused its class then (a union may have
    lowered the class's generation since): the same list as matching again under the bound."""
    rs = _rules()
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    for c in eg.nodes:
        eg.gen[c] = rng.randrange(4)
    eg.touched = set()
    depth = max(height(p) for p in rs.patterns)
    changed = [{} for _ in range(depth + 2)]
    caches: dict = {p.index: {} for p in rs.patterns}
    for p in rs.patterns:
        match_pattern(eg, p, index_by_op(eg), limit, cap, reuse=Reuse(caches[p.index], changed, 0, height(p)))
    for now in range(1, 5):
        levels, index = _round(eg, rng, edits, changed, now)  # (a union keeps the lower generation: it may lift the bound)
        for p in rs.patterns:
            if rng.random() < 0.3:
                continue
            close = index_by_op(eg, levels[height(p) + 1])
            for where in (index, close):
                want = match_pattern(eg, p, where, limit, cap)
                reuse = Reuse(caches[p.index], changed, now, height(p))
                assert match_pattern(eg, p, where, limit, cap, reuse=reuse) == want


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 12))
def test_a_narrowed_index_is_the_index_of_its_classes(seed, steps):
    """The search's indexes near a change are nested: each narrower one is kept from the widest
    (``eindex.narrowed``), and must be what building it gives: the same lists in the same
    order, and the same candidates for every pattern's tops (taken from the wider index's)."""
    from superopt.pattern.eindex import candidates, narrowed
    rng = random.Random(seed)
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    _change(eg, rng, 3)
    classes = sorted(eg.nodes)
    wide = set(rng.sample(classes, max(1, len(classes) * 2 // 3)))
    only = set(rng.sample(sorted(wide), max(1, len(wide) // 2)))
    rs = _rules()
    built, part = index_by_op(eg, only), narrowed(index_by_op(eg, wide), only)
    assert dict(built) == dict(part)
    for p in rs.patterns:
        for t in tops_of(p):
            assert candidates(eg, p, t, part) == candidates(eg, p, t, built)
