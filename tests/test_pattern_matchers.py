"""The one pattern form's matchers against a brute-force reference: on random small graphs and
e-graphs, the graph matcher (``match_all``) and the e-matcher (``match_pattern``) find exactly
the matches that trying every assignment of pattern nodes to nodes finds. The reference reads
only the compiled pattern (operators, attribute facets, wiring, variables' types and weight
flags), so it checks the matchers, not the compiler."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings, strategies as st

from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.pattern import EGraph, RuleSet, ematch_pattern, index_by_op, match_all, tops_of
from superopt.search.state import State

N = 4  # square values: transposes and unions keep types


def _t(b, v, perm=(1, 0)):
    return b.op("transpose", v, perm=perm)


#: left sides and the variables they use (x, y inputs; w a weight), with attributes that bind exactly
SIDES = [
    (lambda b, v: _t(b, _t(b, v["x"])), "x"),
    (lambda b, v: b.op("relu", b.op("add", v["x"], v["y"])), "xy"),
    (lambda b, v: b.op("add", b.op("relu", v["x"]), b.op("sigmoid", v["y"])), "xy"),
    (lambda b, v: b.op("matmul", v["x"], v["w"]), "xw"),
    (lambda b, v: b.op("mul", b.op("add", v["x"], v["w"]), v["x"]), "xw"),
    (lambda b, v: b.op("concat", v["x"], b.op("relu", v["y"]), axis=0), "xy"),
    (lambda b, v: b.op("relu", b.op("concat", v["x"], v["y"], axis=1)), "xy"),
    (lambda b, v: b.op("add", _t(b, v["x"]), _t(b, v["y"])), "xy"),
]


def _side(f, names):
    b = GraphBuilder()
    v = {k: (b.weight if k == "w" else b.input)(k, (N, N)) for k in names}
    return b.build([f(b, v)])


def _rules() -> RuleSet:
    rs = RuleSet([Rule(_side(f, names), _side(f, names)) for f, names in SIDES])
    assert len(rs.patterns) == len(SIDES), rs.skipped
    return rs


def _random_graph(rng: random.Random, steps: int):
    """Inputs, a weight, two planted left sides on random values, and ``steps`` random
    operators (concat makes other sizes)."""
    b = GraphBuilder()
    vals = [b.input("a", (N, N)), b.input("b", (N, N)), b.weight("k", (N, N))]
    for f, _ in rng.sample(SIDES, 2):
        vals.append(f(b, {"x": rng.choice(vals[:2]), "y": rng.choice(vals[:3]), "w": vals[2]}))
    for _ in range(steps):
        op = rng.choice(["relu", "sigmoid", "transpose", "add", "mul", "matmul", "concat"])
        v = rng.choice(vals)
        shape, axis = b.type_of(v).shape, rng.randrange(2)
        if op in ("relu", "sigmoid", "transpose"):
            vals.append(_t(b, v) if op == "transpose" else b.op(op, v))
            continue
        want = {"matmul": lambda t: t[0] == shape[1], "concat": lambda t: t[1 - axis] == shape[1 - axis]}
        ok = [u for u in vals if want.get(op, lambda t: t == shape)(b.type_of(u).shape)]
        if ok:
            u = rng.choice(ok)
            vals.append(b.op(op, v, u, axis=axis) if op == "concat" else b.op(op, v, u))
    return b.build(vals[3:])  # every value an output: nothing is pruned


def _orders(pn):
    return [(0, 1), (1, 0)] if pn.commutative and len(pn.inputs) == 2 else [tuple(range(len(pn.inputs)))]


def _types_fit(pn, types) -> bool:
    return len(types) == len(pn.types) and all(a.dtype == b.dtype and a.rank == b.rank for a, b in zip(pn.types, types))


def _node_fits(pn, op, attrs, n_inputs, types) -> bool:
    attr = dict(attrs)
    return (op == pn.op and n_inputs == len(pn.inputs) and _types_fit(pn, types)
            and all(attr.get(k) == v for k, v in pn.fixed) and all(attr.get(k) == v for k, v, _ in pn.shifted))


def _brute_graph(state: State, pat) -> set:
    """Every injective map of pattern nodes to graph nodes that binds consistently."""
    cands = [[m for m, n in state.nodes.items() if _node_fits(pn, n.op, n.attrs, len(n.inputs), n.types)]
             for pn in pat.pnodes]
    out = set()
    for nodes in itertools.product(*cands):
        if len(set(nodes)) < len(nodes):
            continue
        for orders in itertools.product(*(_orders(pn) for pn in pat.pnodes)):
            binds = _wire(pat, [state.nodes[m].inputs for m in nodes], orders,
                          lambda r, k, idx: r.node == nodes[k] and r.index == idx,
                          lambda r: (state.type_of(r), state.const[r.node]), lambda r: r)
            if binds is not None:
                out.add((pat.index, tuple(nodes), tuple(binds)))
    return out


def _wire(pat, inputs, orders, is_node, type_const, value):
    """Variables' bindings when every pattern edge is a graph edge (None if one is not)."""
    binds = [None] * len(pat.var_names)
    for j, pn in enumerate(pat.pnodes):
        for pos, spec in enumerate(pn.inputs):
            r = inputs[j][orders[j][pos]]
            if spec[0] == "n":
                if not is_node(r, spec[1], spec[2]):
                    return None
                continue
            v = spec[1]
            t, const = type_const(r)
            if binds[v] is None:
                if t.dtype != pat.var_types[v].dtype or t.rank != pat.var_types[v].rank or \
                        (pat.var_weight[v] and not const):
                    return None
                binds[v] = value(r)
            elif binds[v] != value(r):
                return None
    return binds


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 12), st.randoms(use_true_random=False))
def test_the_graph_matcher_finds_exactly_the_brute_force_matches(steps, rng):
    rs = _rules()
    state = State.from_graph(_random_graph(rng, steps), CostModel("h100"))
    got = {(m.pattern, m.nodes, m.binds) for m in match_all(state, rs)}
    want = set().union(*(_brute_graph(state, p) for p in rs.patterns))
    assert got == want


def _brute_egraph(eg: EGraph, pat) -> set:
    """Every choice of one e-node per pattern node (any class) whose wiring holds."""
    enodes = [(c, e) for c, es in eg.nodes.items() for e in es]
    cands = [[(c, e) for c, e in enodes if _node_fits(pn, e.op, e.attrs, len(e.kids), e.types)] for pn in pat.pnodes]
    out = set()
    for apps in itertools.product(*cands):
        for orders in itertools.product(*(_orders(pn) for pn in pat.pnodes)):
            binds = _wire(pat, [[eg.find(k) for k in e.kids] for _, e in apps], orders,
                          lambda kid, k, idx: apps[k][0] == kid and apps[k][1].k == idx,
                          lambda kid: (eg.types[kid], eg.const[kid]), lambda kid: kid)
            if binds is not None:
                out.add((pat.index, tuple(e for _, e in apps), tuple(binds)))
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 10), st.integers(0, 4), st.randoms(use_true_random=False))
def test_the_e_matcher_finds_exactly_the_brute_force_matches(steps, unions, rng):
    rs = _rules()
    eg = EGraph()
    eg.add_graph(_random_graph(rng, steps))
    for _ in range(unions):
        by_type: dict = {}
        for c in eg.nodes:
            by_type.setdefault(eg.types[c], []).append(c)
        pair = rng.choice([cs for cs in by_type.values()])
        eg.union(rng.choice(pair), rng.choice(pair))
        eg.rebuild()
    index = index_by_op(eg)
    for p in rs.patterns:
        assert len(tops_of(p)) == 1
        got = {(m.pattern, m.apps, m.binds) for m in ematch_pattern(eg, p, index)}
        assert got == _brute_egraph(eg, p), p.rule.lhs



def test_the_random_cases_have_matches():
    """The properties above are not vacuous: random graphs hold matches of most patterns."""
    rs, hit = _rules(), set()
    for seed in range(30):
        state = State.from_graph(_random_graph(random.Random(seed), 10), CostModel("h100"))
        hit |= {m.pattern for m in match_all(state, rs)}
    assert len(hit) >= len(SIDES) - 2


def test_the_instance_check_matches_terms_up_to_commutativity_and_exact_types():
    from superopt.generate.instances import InstanceIndex

    def rule(f, g, shapes):
        def side(h):
            b = GraphBuilder()
            v = {k: b.input(k, s) for k, s in shapes.items()}
            return b.build([h(b, v)])
        return Rule(side(f), side(g))

    sq = {"x": (N, N), "y": (N, N)}
    comm = rule(lambda b, v: b.op("add", v["x"], v["y"]), lambda b, v: b.op("add", v["y"], v["x"]), sq)
    index = InstanceIndex()
    index.add(comm)
    relu_sum = rule(lambda b, v: b.op("add", b.op("relu", v["x"]), v["y"]),
                    lambda b, v: b.op("add", v["y"], b.op("relu", v["x"])), sq)
    assert index.find(relu_sum) is comm  # x := relu(x); written either way round
    same = rule(lambda b, v: b.op("add", b.op("relu", v["x"]), v["y"]),
                lambda b, v: b.op("add", b.op("relu", v["x"]), v["y"]), sq)
    assert index.find(same) is comm  # add(y, x) with both orders is one term up to commutativity
    other = rule(lambda b, v: b.op("add", b.op("relu", v["x"]), v["y"]),
                 lambda b, v: b.op("add", v["y"], b.op("sigmoid", v["x"])), sq)
    assert index.find(other) is None
    wide = rule(lambda b, v: b.op("add", b.op("relu", v["x"]), v["y"]),
                lambda b, v: b.op("add", v["y"], b.op("relu", v["x"])), {"x": (N, 2 * N), "y": (N, 2 * N)})
    assert index.find(wide) is None  # the kept rule's variables are N x N: instances keep the shapes
