"""The IR: construction errors, JSON round trip, hashing and canonical form, sub-graphs."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from graphs import random_graphs
from superopt.cli import main
from superopt.errors import AttributeValueError, GraphError, SerializationError, ShapeError, UnknownOperatorError
from superopt.ir import (Graph, GraphBuilder, Ref, Rule, canonicalize, graph_from_json, graph_to_json, named_hash,
                         structural_hash, to_expr, to_text)


def _reordered(g: Graph, rng, rename=None) -> Graph:
    """The same graph with nodes in another topological order and sources renamed."""
    rename = rename or {}
    indeg = {i: len({r.node for r in n.inputs}) for i, n in enumerate(g.nodes)}
    users = {}
    for i, n in enumerate(g.nodes):
        for r in {r.node for r in n.inputs}:
            users.setdefault(r, []).append(i)
    ready, order = [i for i, d in indeg.items() if d == 0], []
    while ready:
        i = ready.pop(int(rng.integers(len(ready))))
        order.append(i)
        for u in users.get(i, []):
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    b = GraphBuilder()
    remap = {}
    for i in order:
        n = g.nodes[i]
        if n.name is not None:
            t = n.types[0]
            new = rename.get(n.name, n.name)
            remap[Ref(i, 0)] = b.input(new, t.shape) if n.op == "input" else b.weight(new, t.shape)
        else:
            outs = b.add(n.op, [remap[r] for r in n.inputs], n.attr)
            remap.update({Ref(i, k): o for k, o in enumerate(outs)})
    return b.build([remap[r] for r in g.outputs])


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_json_round_trip(g):
    doc = json.loads(json.dumps(graph_to_json(g)))
    back = graph_from_json(doc)
    assert back == g
    assert to_text(back) == to_text(g)
    back.check()


@settings(max_examples=60, deadline=None)
@given(random_graphs(), st.integers(0, 2**32 - 1))
def test_hash_ignores_node_order_and_names(g, seed):
    rng = np.random.default_rng(seed)
    same = _reordered(g, rng)
    assert named_hash(same) == named_hash(g)
    renamed = _reordered(g, rng, {"x": "p", "y": "q", "z": "r"})
    assert structural_hash(renamed) == structural_hash(g)
    assert canonicalize(renamed).key() == canonicalize(g).key()


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_hash_sees_structure(g):
    b = GraphBuilder()
    remap = b.copy_nodes(g, range(len(g.nodes)))
    extra = b.op("relu", remap[g.outputs[0]])
    changed = b.build([extra] + [remap[r] for r in g.outputs[1:]])
    assert structural_hash(changed) != structural_hash(g)
    assert named_hash(changed) != named_hash(g)


def test_hash_tells_inputs_apart():
    def g(swap):
        b = GraphBuilder()
        x, y = b.input("x", (2, 3)), b.input("y", (3, 2))
        return b.build([b.op("matmul", *((y, x) if swap else (x, y)))])
    assert structural_hash(g(False)) != structural_hash(g(True))
    b = GraphBuilder()
    x, y = b.input("x", (2, 2)), b.input("y", (2, 2))
    xy, xx = b.build([b.op("add", x, y)]), None
    b2 = GraphBuilder()
    x2 = b2.input("x", (2, 2)); b2.input("y", (2, 2))
    xx = b2.build([b2.op("add", x2, x2)])
    assert structural_hash(xy) != structural_hash(xx)


def test_commutative_inputs_hash_equal():
    def g(swap):
        b = GraphBuilder()
        x, y = b.input("x", (2, 2)), b.input("y", (2, 2))
        m = b.op("matmul", x, y)
        return b.build([b.op("add", *((x, m) if swap else (m, x)))])
    assert named_hash(g(True)) == named_hash(g(False))
    assert canonicalize(g(True)).key() == canonicalize(g(False)).key()


def test_immutable_and_rewrite_makes_new_graph():
    b = GraphBuilder()
    x = b.input("x", (2, 2))
    g = b.build([b.op("relu", x)])
    key = g.key()
    b2 = GraphBuilder()
    remap = b2.copy_nodes(g, range(len(g.nodes)))
    g2 = b2.build([b2.op("tanh", remap[g.outputs[0]])])
    assert g.key() == key and len(g.nodes) == 2 and len(g2.nodes) == 3
    with pytest.raises(AttributeError):
        g.nodes[1].op = "tanh"


def test_multi_output_split_users_and_subgraph():
    b = GraphBuilder()
    x, w = b.input("x", (2, 4)), b.weight("w", (4, 6), np.ones((4, 6)))
    y = b.op("matmul", x, w)
    a, c = b.op("split", y, axis=1, sizes=(2, 4))
    out = b.op("relu", c)
    g = b.build([a, out])
    assert [t.shape for t in g.nodes[3].types] == [(2, 2), (2, 4)]
    assert g.users[Ref(3, 1)] == ((4, 0),)
    assert Ref(2, 0) in g.users and g.users[Ref(2, 0)] == ((3, 0),)
    sub = g.subgraph([out], boundary=[y])
    assert [n.op for n in sub.nodes] == ["input", "split", "relu"]
    assert sub.nodes[0].types[0].shape == (2, 6)
    whole = g.subgraph([out])
    assert "w" in whole.data and to_expr(whole) == "t0 = split[axis=1, sizes=(2,4)](matmul(x, w)); relu(t0.1)"


def test_prune_drops_dead_nodes():
    b = GraphBuilder()
    x = b.input("x", (2, 2))
    b.op("tanh", x)
    g = b.build([b.op("relu", x)])
    assert [n.op for n in g.prune().nodes] == ["input", "relu"]


@pytest.mark.parametrize("build, err, words", [
    (lambda b, x: b.op("matmul", x, x), ShapeError, "matmul contracts 3 with 2"),
    (lambda b, x: b.op("conv2d", x, x), ShapeError, "rank 4"),
    (lambda b, x: b.op("frobnicate", x), UnknownOperatorError, "unknown operator 'frobnicate'"),
    (lambda b, x: b.op("transpose", x, perm=(0, 0)), ShapeError, "not a permutation"),
    (lambda b, x: b.op("split", x, axis=1, sizes=(1, 1)), ShapeError, "do not add up"),
    (lambda b, x: b.op("relu", x, alpha=2), AttributeValueError, "no attribute 'alpha'"),
    (lambda b, x: b.op("conv2d", x, x, activation="swish"), AttributeValueError, "allowed"),
    (lambda b, x: b.op("concat", x), AttributeValueError, "needs attribute 'axis'"),
    (lambda b, x: b.input("x", (1,)), GraphError, "used twice"),
])
def test_ill_formed_graphs_name_the_problem(build, err, words):
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    with pytest.raises(err, match=words):
        build(b, x)


def test_error_names_node_and_shapes():
    b = GraphBuilder()
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    with pytest.raises(ShapeError) as e:
        b.op("matmul", x, y)
    assert "node %2 (matmul)" in str(e.value) and "f32[2,3]" in str(e.value)


def test_bias_addition_broadcasts():
    b = GraphBuilder()
    x, w, bias = b.input("x", (1, 4, 5, 5)), b.weight("w", (8, 4, 3, 3)), b.weight("b", (8, 1, 1))
    y = b.op("add", b.op("conv2d", x, w, padding=(1, 1)), bias)
    assert b.type_of(y).shape == (1, 8, 5, 5)
    f = b.input("f", (2, 16, 768))
    assert b.type_of(b.op("add", f, b.weight("fb", (768,)))).shape == (2, 16, 768)


@pytest.mark.parametrize("doc, words", [
    ("[]", "not a superopt graph"),
    ('{"format": "superopt.graph", "version": 99, "nodes": [], "outputs": []}', "version 99"),
    ('{"format": "superopt.graph", "version": 1, "nodes": [{"op": "relu", "inputs": [[5, 0]]}], "outputs": []}',
     "not a value"),
    ('{"format": "superopt.graph", "version": 1, "nodes": [{"op": "input"}], "outputs": []}', "corrupt"),
])
def test_corrupt_json_is_a_clear_error(doc, words):
    with pytest.raises(SerializationError, match=words):
        graph_from_json(json.loads(doc))


def _cli(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_rejects_bad_graph_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "superopt.graph", "version": 1, "nodes": [{"op": "input", "attrs": {"name": "x", '
                   '"shape": [2, 3]}}, {"op": "matmul", "inputs": [[0, 0], [0, 0]]}], "outputs": [[1, 0]]}')
    code, out, err = _cli(["ir", "check", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and "matmul contracts 3 with 2" in err and "Traceback" not in err
    (tmp_path / "trunc.json").write_text('{"format": "superop')
    code, _, err = _cli(["ir", "check", str(tmp_path / "trunc.json")], capsys)
    assert code == 2 and "not valid JSON" in err
    unknown = tmp_path / "unk.json"
    unknown.write_text('{"format": "superopt.graph", "version": 1, "nodes": [{"op": "input", "attrs": {"name": "x", '
                       '"shape": [2]}}, {"op": "frob", "inputs": [[0, 0]]}], "outputs": [[1, 0]]}')
    code, _, err = _cli(["ir", "check", str(unknown)], capsys)
    assert code == 2 and "unknown operator 'frob'" in err
    code, _, err = _cli(["ir", "check", str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "cannot read" in err


def test_cli_demo_runs(capsys):
    code, out, _ = _cli(["ir", "demo"], capsys)
    assert code == 0 and "max abs difference" in out


def test_rule_checks_its_sides():
    def side(shape, f):
        b = GraphBuilder()
        x = b.input("x", shape)
        return b.build([f(b, x)])
    with pytest.raises(GraphError, match="same inputs"):
        Rule(side((2, 2), lambda b, x: x), side((2, 3), lambda b, x: x))
    with pytest.raises(GraphError, match="output 0"):
        Rule(side((2, 3), lambda b, x: x), side((2, 3), lambda b, x: b.op("transpose", x, perm=(1, 0))))


def test_prune_can_drop_unused_weights():
    b = GraphBuilder()
    x, w = b.input("x", (2, 2)), b.weight("w", (2, 2), np.ones((2, 2)))
    b.op("matmul", x, w)
    g = b.build([b.op("relu", x)])
    assert [n.op for n in g.prune().nodes] == ["input", "weight", "relu"]
    pruned = g.prune(keep_weights=False)
    assert [n.op for n in pruned.nodes] == ["input", "relu"] and not pruned.data


# ---- exact hashing past the tie cap (issue 9, item 9) ----------------------------------------

def _sum_tree(order, pairs):
    """add-tree over 8 same-typed inputs declared in ``order``, paired as ``pairs``."""
    b = GraphBuilder()
    refs = {name: b.input(name, (2, 2)) for name in order}
    level = [b.op("add", refs[p], refs[q]) for p, q in pairs]
    while len(level) > 1:
        level = [b.op("add", level[k], level[k + 1]) for k in range(0, len(level), 2)]
    return b.build(level)


def test_hash_exact_past_the_tie_cap():
    names = [f"x{k}" for k in range(8)]
    pairs = [("x0", "x1"), ("x2", "x3"), ("x4", "x5"), ("x6", "x7")]
    g = _sum_tree(names, pairs)
    shuffled = _sum_tree(["x3", "x6", "x0", "x5", "x1", "x7", "x2", "x4"], pairs)
    assert structural_hash(shuffled) == structural_hash(g)
    assert canonicalize(shuffled).key() == canonicalize(g).key()
    other = _sum_tree(names, [("x0", "x1"), ("x2", "x3"), ("x4", "x6"), ("x5", "x7")])
    assert structural_hash(other) == structural_hash(g)  # isomorphic: a renaming
    b = GraphBuilder()
    r = [b.input(n, (2, 2)) for n in names]
    s = [b.op("add", r[k], r[k + 1]) for k in range(0, 8, 2)]
    unbalanced = b.build([b.op("add", b.op("add", b.op("add", s[0], s[1]), s[2]), s[3])])
    assert structural_hash(unbalanced) != structural_hash(g)


def test_rule_id_ignores_input_declaration_order():
    def side(order, f):
        b = GraphBuilder()
        refs = {n: b.input(n, (2, 2)) for n in order}
        return b.build([f(b, refs)])

    def lhs(b, r):
        s = [b.op("add", r[f"x{2 * k}"], r[f"x{2 * k + 1}"]) for k in range(4)]
        return b.op("add", b.op("mul", s[0], s[1]), b.op("mul", s[2], s[3]))

    def rhs(b, r):
        s = [b.op("add", r[f"x{2 * k}"], r[f"x{2 * k + 1}"]) for k in range(4)]
        return b.op("add", b.op("mul", s[1], s[0]), b.op("mul", s[3], s[2]))

    names = [f"x{k}" for k in range(8)]
    ids = {Rule(side(order, lhs), side(order, rhs)).id
           for order in (names, names[::-1], names[1::2] + names[::2], ["x5", "x2", "x7", "x0", "x3", "x6", "x1", "x4"])}
    assert len(ids) == 1


def test_output_index_past_255_hashes():
    b = GraphBuilder()
    x = b.input("x", (300,))
    parts = b.op("split", x, axis=0, sizes=(1,) * 300)
    g = b.build([parts[299], parts[256], parts[255]])
    h = g.key()
    assert h != b.build([parts[256], parts[299], parts[255]]).key()
    assert len({b.build([parts[k]]).key() for k in (254, 255, 256, 257)}) == 4
    assert structural_hash(g) and canonicalize(g).key() == canonicalize(g).key() and h == g.key()


def _isomorphic(g1: Graph, g2: Graph) -> bool:
    """Brute force: some bijection of sources (same kind and type) makes the named hashes equal."""
    import itertools
    s1, s2 = list(g1.inputs + g1.weights), list(g2.inputs + g2.weights)
    if len(s1) != len(s2):
        return False
    target = named_hash(g2)
    names2 = [g2.nodes[i].name for i in s2]
    for perm in itertools.permutations(names2):
        ren = {g1.nodes[i].name: new for i, new in zip(s1, perm)}
        if any((g1.nodes[i].op, g1.nodes[i].types) != (g2.nodes[j].op, g2.nodes[j].types)
               for i, j in zip(s1, [s2[names2.index(n)] for n in perm])):
            continue
        if named_hash(_reordered(g1, np.random.default_rng(0), ren)) == target:
            return True
    return False


_MANY = ("a", "b", "c", "d", "e")


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([None, 1]), random_graphs(ops=("add", "mul", "matmul", "concat", "tanh"), max_nodes=6,
                                                 names=_MANY),
       st.permutations(_MANY), st.integers(0, 2**32 - 1))
def test_structural_hash_is_renaming_invariant(cap, g, perm, seed):
    import superopt.ir.hashing as hashing
    old = hashing.MAX_TIES
    hashing.MAX_TIES = old if cap is None else cap  # cap=1: every tie goes to individualization
    try:
        renamed = _reordered(g, np.random.default_rng(seed), dict(zip(_MANY, perm)))
        assert structural_hash(renamed) == structural_hash(g)
        assert canonicalize(renamed).key() == canonicalize(g).key()
    finally:
        hashing.MAX_TIES = old


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([None, 1]),
       random_graphs(ops=("add", "matmul", "concat", "tanh"), max_nodes=4, names=("a", "b", "c", "d")),
       random_graphs(ops=("add", "matmul", "concat", "tanh"), max_nodes=4, names=("a", "b", "c", "d")))
def test_structural_hash_separates_non_isomorphic(cap, g1, g2):
    import superopt.ir.hashing as hashing
    old = hashing.MAX_TIES
    hashing.MAX_TIES = old if cap is None else cap
    try:
        g1, g2 = g1.prune(), g2.prune()  # the oracle's named hash does not see dead nodes
        assert (structural_hash(g1) == structural_hash(g2)) == _isomorphic(g1, g2)
    finally:
        hashing.MAX_TIES = old
