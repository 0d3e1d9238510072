"""Soundness of the search: attributes bind exactly, and every applied instance is proven.

The class of bug: a rule proven with one attribute value (or at one size) applied to a model
with another. For every kind of attribute a rule can carry (eps, stride, padding, groups,
activation, axis, perm, split sizes), a true rule and models whose attributes agree with it,
disagree with it, or disagree among themselves: the search's result must always compute what
the model computes, and where the attributes agree the rule must apply.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.cost import CostModel
from superopt.errors import ShapeError
from superopt.ir import GraphBuilder, Ref, Rule
from superopt.search import RuleSet, fold_constants, search
from superopt.search.instance_proofs import InstanceProofs
from superopt.driver import relative_error
from superopt.semantics import evaluate

H100 = CostModel("h100")


def _gate(tmp_path=None):
    return InstanceProofs(store=None if tmp_path is None else tmp_path / "proofs.db")


def _check_same(g, h, scale=1.0, seed=0):
    """``h`` computes what ``g`` computes, on inputs of this scale (small ones expose eps)."""
    rng = np.random.default_rng(seed)
    env = {n.name: rng.standard_normal(n.types[0].shape) * scale for n in g.nodes if n.op == "input"}
    env.update({n.name: g.data[n.name].astype(np.float64) for n in g.nodes if n.op == "weight"})
    err = relative_error(evaluate(fold_constants(h), env), evaluate(g, env))
    assert err < 1e-6, f"outputs differ (relative error {err:.2e})"


def _applied(g, rule, gate=None, max_lift=0):
    res = search(g, RuleSet([rule], max_lift), H100, progress=False, proofs=gate or _gate())
    res.graph.check()
    for scale in (1.0, 0.003, 30.0):
        _check_same(g, res.graph, scale)
    return bool(res.report.rules_applied), res


# ---- one true rule per attribute kind, and models built with given attribute values -------------

def _w(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _layernorm(eps_a, eps_b, build_rule=False):
    """concat[0](layernorm(x0), layernorm(x1)) => layernorm(concat[0](x0, x1)), the issue's case."""
    b = GraphBuilder()
    x0, x1 = b.input("x0", (4, 8)), b.input("x1", (4, 8))
    lhs = b.op("concat", b.op("layernorm", x0, eps=eps_a), b.op("layernorm", x1, eps=eps_b), axis=0)
    if not build_rule:
        return b.build([lhs])
    b2 = GraphBuilder()
    y0, y1 = b2.input("x0", (4, 8)), b2.input("x1", (4, 8))
    return Rule(b.build([lhs]), b2.build([b2.op("layernorm", b2.op("concat", y0, y1, axis=0), eps=eps_a)]))


def _conv_pair(attrs_a, attrs_b, build_rule=False, seed=0):
    """concat[1](conv(x, w0), conv(x, w1)) => conv(x, concat[0](w0, w1)) with given conv attributes."""
    rng = np.random.default_rng(seed)
    cin = 4
    ga, gb = attrs_a.get("groups", 1), attrs_b.get("groups", 1)
    b = GraphBuilder()
    x = b.input("x", (1, cin, 8, 8))
    if build_rule:
        w0, w1 = b.weight("w0", (4, cin // ga, 3, 3)), b.weight("w1", (4, cin // gb, 3, 3))
    else:
        w0 = b.weight("w0", data=_w(rng, 4, cin // ga, 3, 3))
        w1 = b.weight("w1", data=_w(rng, 4, cin // gb, 3, 3))
    lhs = b.op("concat", b.op("conv2d", x, w0, **attrs_a), b.op("conv2d", x, w1, **attrs_b), axis=1)
    if not build_rule:
        return b.build([lhs])
    b2 = GraphBuilder()
    y, v0, v1 = b2.input("x", (1, cin, 8, 8)), b2.weight("w0", (4, cin // ga, 3, 3)), b2.weight("w1", (4, cin // gb, 3, 3))
    return Rule(b.build([lhs]), b2.build([b2.op("conv2d", y, b2.op("concat", v0, v1, axis=0), **attrs_a)]))


CONV_KINDS = {
    "stride": ({"stride": (1, 1)}, {"stride": (2, 2)}),
    "padding": ({"padding": (1, 1)}, {"padding": (0, 0)}),
    "groups": ({"groups": 1}, {"groups": 2}),
    "activation": ({"activation": "none"}, {"activation": "relu"}),
}


@pytest.mark.parametrize("kind", sorted(CONV_KINDS))
def test_conv_attributes_bind_exactly(kind):
    same, other = CONV_KINDS[kind]
    rule = _conv_pair(same, same, build_rule=True)
    assert _applied(_conv_pair(same, same), rule)[0]  # agrees with the rule: applied
    tried = 0
    for a, b in ((other, other), (same, other), (other, same)):
        try:
            g = _conv_pair(a, b)
        except ShapeError:  # mixed strides or paddings do not concatenate: no such model
            continue
        tried += 1
        assert not _applied(g, rule)[0]  # other attributes: the rule is not applied
    assert tried


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1e-5, 3e-5, 1e-6, 1e-3]), st.sampled_from([1e-5, 3e-5, 1e-6, 1e-3]))
def test_eps_binds_exactly(eps_a, eps_b):
    rule = _layernorm(1e-5, 1e-5, build_rule=True)
    applied, res = _applied(_layernorm(eps_a, eps_b), rule)
    assert applied == (eps_a == eps_b)  # one parameter, two values: no match
    if applied:
        assert [n.attr["eps"] for n in res.graph.nodes if n.op == "layernorm"] == [eps_a]


def _axis_perm_split(kind, value):
    """Rules over axes, permutations and split sizes, and a model with ``value`` in its place."""
    def rule_and_model(build):
        b = GraphBuilder()
        x, y = b.input("x", (4, 6)), b.input("y", (4, 6))
        if kind == "axis":  # split[axis=a](concat[axis=a](x, y)) => x, y
            parts = b.op("split", b.op("concat", x, y, axis=0), axis=value if not build else 0, sizes=(4, 4))
            return b.build(list(parts)), [x, y], b
        if kind == "perm":  # transpose(transpose(x, p), p^-1) => x
            b = GraphBuilder()
            x, p = b.input("x", (4, 6)), (1, 0)
            return b.build([b.op("transpose", b.op("transpose", x, perm=p), perm=value if not build else p)]), [x], b
        # split sizes: split[0, sizes](concat[0](x, y)) => x, y at equal sizes only
        parts = b.op("split", b.op("concat", x, y, axis=0), axis=0, sizes=value if not build else (4, 4))
        return b.build(list(parts)), [x, y], b
    return rule_and_model


def _rule_of(kind):
    g, outs, b = _axis_perm_split(kind, None)(True)
    b2 = GraphBuilder()
    refs = {n.name: b2.input(n.name, n.types[0].shape) for n in g.nodes if n.op == "input"}
    return Rule(g, b2.build([refs[g.nodes[r.node].name] for r in outs]))


@pytest.mark.parametrize("kind,values", [("axis", [0, 1]), ("perm", [(1, 0), (0, 1)]),
                                         ("split sizes", [(4, 4), (3, 5), (5, 3), (2, 6)])])
def test_layout_attributes_bind_exactly(kind, values):
    rule = _rule_of(kind)
    for v in values:
        try:
            g = _axis_perm_split(kind, v)(False)[0]
        except ShapeError:  # an ill-shaped model (axis 1 of a concat on axis 0): nothing to test
            continue
        applied, _ = _applied(g, rule)
        assert applied == (v == values[0]), (kind, v)


# ---- the gate alone: what a loose binding would have built is refused ---------------------------

def test_the_gate_refuses_instances_with_attributes_the_rule_does_not_carry():
    gate = _gate()
    true_rule = _layernorm(3e-5, 3e-5, build_rule=True)
    assert gate.admit("ln", true_rule)
    lhs = _layernorm(3e-5, 1e-6)  # the model, with the rule's literal eps on the right
    assert not gate.admit("ln", Rule(lhs, _layernorm(1e-5, 1e-5, build_rule=True).rhs))
    conv = _conv_pair({"groups": 2}, {"groups": 2}, build_rule=True)  # concat of grouped convs: false
    assert not gate.admit("conv", conv)
    assert (gate.ran, gate.proved, gate.refused) == (3, 1, 2)


# ---- a rule true at one size only ---------------------------------------------------------------

def _forged(rows, build_rule=False):
    """x y^T + y x^T => 2 x y^T: true when x and y are single rows (x y^T is then a 1x1 scalar)."""
    b = GraphBuilder()
    x, y = b.input("x", (rows, 16)), b.input("y", (rows, 16))
    xy = b.op("matmul", x, b.op("transpose", y, perm=(1, 0)))
    lhs = b.build([b.op("add", xy, b.op("matmul", y, b.op("transpose", x, perm=(1, 0))))])
    if not build_rule:
        return lhs
    b2 = GraphBuilder()
    x2, y2 = b2.input("x", (rows, 16)), b2.input("y", (rows, 16))
    m = b2.op("matmul", x2, b2.op("transpose", y2, perm=(1, 0)))
    return Rule(lhs, b2.build([b2.op("add", m, m)]))


def test_a_rule_true_at_one_size_is_refused_at_others(tmp_path):
    rule = _forged(1, build_rule=True)
    gate = _gate(tmp_path)
    # the rule as if a proof covered it at one row (it is true there; the axioms cannot show it),
    # stored by hand the way the gate stores a proof it ran
    gate._new.append((rule.id, rule.id, "unsat", "[]", 0.0))
    assert gate.flush() == 1
    gate = _gate(tmp_path)
    applied, _ = _applied(_forged(1), rule, gate)
    assert applied and gate.reused == 1 and gate.ran == 0  # applied where a proof covers it
    for rows in (2, 3, 8):
        gate = _gate(tmp_path)
        applied, _ = _applied(_forged(rows), rule, gate)
        assert not applied and gate.refused == 1 and gate.ran == 1, rows


# ---- the reproduction, end to end ------------------------------------------------------

@pytest.fixture(autouse=True)
def _proof_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_PROOF_CACHE", str(tmp_path / "cache.db"))  # never the shipped database


def test_two_layernorms_with_different_eps_stay_right(tmp_path, capsys):
    import json
    import torch
    import torch.nn.functional as F
    from superopt.cli import main

    class TwoNorms(torch.nn.Module):
        def forward(self, x, y):
            return torch.cat([F.layer_norm(x, (8,), eps=3e-5), F.layer_norm(y, (8,), eps=1e-6)], 0)

    src, out = tmp_path / "m.pt2", tmp_path / "o.pt2"
    torch.export.save(torch.export.export(TwoNorms(), (torch.randn(4, 8), torch.randn(4, 8))), str(src))
    assert main(["optimize", str(src), "-o", str(out), "--json"]) == 0
    json.loads(capsys.readouterr().out)
    optimized = torch.export.load(str(out)).module()
    gen = torch.Generator().manual_seed(0)
    for scale in (1.0, 0.003, 30.0):
        x, y = (torch.randn(4, 8, generator=gen) * scale for _ in range(2))
        torch.testing.assert_close(optimized(x, y), TwoNorms()(x, y), rtol=1e-4, atol=1e-5)


# ---- a database of the old schema ---------------------------------------------------------------

def _v1_database(path):
    """A schema-1 file as superopt 0.x wrote it: no shape_key column, no instance_proofs table."""
    import sqlite3
    from superopt.rules import RuleDB
    from superopt.verify.result import VerifyResult
    with RuleDB.create(path, {"max_ops": 2}) as db:
        db.add([(_layernorm(1e-5, 1e-5, build_rule=True), VerifyResult("proven", "unsat", 0.1, ("a",), "passed", 0.0))])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP INDEX rules_shape; ALTER TABLE rules DROP COLUMN shape_key; DROP TABLE instance_proofs; "
                       "ALTER TABLE rules DROP COLUMN all_ranks; ALTER TABLE rules DROP COLUMN batch_inputs; "
                       "ALTER TABLE rules DROP COLUMN ranks; UPDATE meta SET value = '1' WHERE key = 'schema_version';")
    conn.close()


def test_an_old_database_is_refused_naming_the_command_then_migrated(tmp_path, capsys, monkeypatch):
    from superopt.cli import main
    from superopt.pattern.family import shape_key
    from superopt.rules import RuleDB
    path = tmp_path / "old.db"
    _v1_database(path)
    assert main(["rules", "list", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"superopt rules migrate --db {path}" in err and err.count("\n") == 1
    assert main(["rules", "migrate", "--db", str(path)]) == 0
    assert "schema 1 -> 3" in capsys.readouterr().out
    with RuleDB.open(path) as db:
        (stored,) = db.query()
        assert db.meta["schema_version"] == 3 and stored.shape_key == shape_key(stored.rule)
        assert not stored.all_ranks and stored.ranks.startswith("per instance")
    assert main(["rules", "migrate", "--db", str(path)]) == 0 and "already" in capsys.readouterr().out
    monkeypatch.delenv("SUPEROPT_PROOF_CACHE")
    gate = InstanceProofs.for_rules(path)  # a writable schema-2 database keeps its instance proofs
    assert gate.store == path and gate.admit(stored.id, stored.rule) and gate.flush() == 1
    again = InstanceProofs.for_rules(path)
    assert again.admit(stored.id, stored.rule) and (again.ran, again.reused) == (0, 1)


# ---- rank-generic rules: extra leading axes, axes and permutations shifted ------------------------

def _rank_rules():
    """Rules at rank 2 over operators that map batch axes through."""
    def rule(f, g, shapes):
        sides = []
        for h in (f, g):
            b = GraphBuilder()
            xs = [b.input(f"x{k}", s) for k, s in enumerate(shapes)]
            out = h(b, *xs)
            sides.append(b.build([out] if isinstance(out, Ref) else list(out)))
        return Rule(*sides)
    t = lambda b, x, p=(1, 0): b.op("transpose", x, perm=p)
    return {
        "transpose": rule(lambda b, x: t(b, t(b, x)), lambda b, x: x, [(4, 6)]),
        "split of concat": rule(lambda b, x, y: b.op("split", b.op("concat", x, y, axis=1), axis=1, sizes=(6, 6)),
                                lambda b, x, y: (x, y), [(4, 6), (4, 6)]),
        "matmul of concat": rule(lambda b, x, w, v: b.op("concat", b.op("matmul", x, w), b.op("matmul", x, v), axis=1),
                                 lambda b, x, w, v: b.op("matmul", x, b.op("concat", w, v, axis=1)),
                                 [(4, 6), (6, 3), (6, 3)]),
    }


@pytest.mark.parametrize("name", ["transpose", "split of concat", "matmul of concat"])
def test_rank_two_rules_apply_to_batched_values(name):
    rule = _rank_rules()[name]
    b = GraphBuilder()
    if name == "transpose":
        x = b.input("x", (2, 3, 5, 7))
        g = b.build([b.op("transpose", b.op("transpose", x, perm=(0, 1, 3, 2)), perm=(0, 1, 3, 2))])
        wrong = b.build([b.op("transpose", b.op("transpose", x, perm=(1, 0, 3, 2)), perm=(0, 1, 3, 2))])
    elif name == "split of concat":
        x, y = b.input("x", (3, 5, 7)), b.input("y", (3, 5, 7))
        g = b.build(list(b.op("split", b.op("concat", x, y, axis=2), axis=2, sizes=(7, 7))))
        wrong = b.build(list(b.op("split", b.op("concat", x, y, axis=1), axis=1, sizes=(5, 5))))
    else:
        rng = np.random.default_rng(0)
        x = b.input("x", (2, 16, 32))
        w, v = (b.weight(n, data=rng.standard_normal((32, 8)).astype(np.float32)) for n in ("w", "v"))
        g = b.build([b.op("concat", b.op("matmul", x, w), b.op("matmul", x, v), axis=2)])
        wrong = b.build([b.op("concat", b.op("matmul", x, w), b.op("matmul", x, v), axis=1)])
    assert not _applied(g, rule)[0]  # rank-generic matching is off by default (see pattern.MAX_LIFT)
    gate = _gate()
    applied, res = _applied(g, rule, gate, max_lift=2)
    assert applied and gate.proved >= 1, res.report.instance_proofs
    applied, _ = _applied(wrong, rule, _gate(), max_lift=2)  # an axis the rule does not shift to: no match
    assert not applied
