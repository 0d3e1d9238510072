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
