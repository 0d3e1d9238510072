"""Rank-polymorphic matching (pattern/compile.py, ematch.py, match.py): a rule over batch-generic
operators matches values with extra leading axes (axes counted from the end), in both searches,
only where its operators allow, and every lifted instance passes the proof gate at its own ranks."""

from __future__ import annotations

import pytest

from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.search import search
from superopt.search.instance_proofs import InstanceProofs
from superopt.pattern import RuleSet, compile_pattern
from superopt.search.saturate import saturate

H100 = CostModel("h100")


def _side(shape, f):
    b = GraphBuilder()
    return b.build([f(b, b.input("x", shape))])


def _tt(perm):
    return lambda b, x: b.op("relu", b.op("transpose", b.op("transpose", x, perm=perm), perm=perm))


#: transpose(transpose(x)) = x, stated at rank 2
TT = Rule(_side((2, 3), lambda b, x: b.op("transpose", b.op("transpose", x, perm=(1, 0)), perm=(1, 0))),
          _side((2, 3), lambda b, x: x))


def _run(kind, g, rules, gate):
    rs = RuleSet(rules, max_lift=2)
    if kind == "saturate":
        return saturate(g, rs, H100, gate)
    return search(g, rs, H100, progress=False, proofs=gate)


def _ops(res):
    return [n.op for n in res.graph.nodes if n.name is None]


@pytest.mark.parametrize("kind", ["saturate", "backtrack"])
@pytest.mark.parametrize("shape, perm", [((4, 5, 6), (0, 2, 1)), ((3, 4, 5, 6), (0, 1, 3, 2))])
def test_a_rank_two_rule_applies_at_rank_three_and_four(kind, shape, perm):
    gate = InstanceProofs(store=None)
    res = _run(kind, _side(shape, _tt(perm)), [TT], gate)
    assert _ops(res) == ["relu"]
    assert gate.proved >= 1 and gate.refused == 0  # proven at the lifted instance itself


@pytest.mark.parametrize("kind", ["saturate", "backtrack"])
def test_a_rule_is_not_lifted_onto_an_axis_counted_from_the_start(kind):
    # (1, 0, 2) swaps the two leading axes: under one extra axis the rule's (1, 0) reads (0, 2, 1)
    res = _run(kind, _side((4, 5, 6), _tt((1, 0, 2))), [TT], InstanceProofs(store=None))
    assert _ops(res) == ["transpose", "transpose", "relu"]


def test_a_rule_with_an_operator_that_fixes_the_rank_is_not_lifted():
    rule = Rule(_side((2, 3), lambda b, x: b.op("reshape", b.op("reshape", x, shape=(6,)), shape=(2, 3))),
                _side((2, 3), lambda b, x: x))
    assert compile_pattern(rule, 0, max_lift=2).max_lift == 0
    assert compile_pattern(TT, 0, max_lift=2).max_lift == 2


def test_the_lifted_matchers_agree_with_each_other():
    g = _side((3, 4, 5, 6), lambda b, x: b.op("transpose", b.op("transpose", b.op("relu", x), perm=(0, 1, 3, 2)),
                                              perm=(0, 1, 3, 2)))
    back = _run("backtrack", g, [TT], InstanceProofs(store=None))
    sat = _run("saturate", g, [TT], InstanceProofs(store=None))
    assert _ops(back) == _ops(sat) == ["relu"]


class _TrustsRankTwo:
    """A gate that takes any rank-2 instance as proven (as a database that wrongly claimed a rule
    would) and asks the real prover about the others."""

    def __init__(self):
        self.real = InstanceProofs(store=None)
        self.lifted: list[Rule] = []

    def admit(self, rule_id, instance):
        if all(len(n.types[0].shape) == 2 for n in instance.lhs.nodes if n.name is not None):
            return True
        self.lifted.append(instance)
        return self.real.admit(rule_id, instance)

    def flush(self):
        return self.real.flush()

    def counts(self):
        return self.real.counts()


@pytest.mark.parametrize("kind", ["saturate", "backtrack"])
def test_a_forged_rule_trusted_at_rank_two_is_refused_at_rank_three(kind):
    # matmul(x, y) = matmul(y, x) is false; the gate trusts it at rank 2 only
    def side(swap):
        b = GraphBuilder()
        x, y = b.input("x", (4, 4)), b.input("y", (4, 4))
        return b.build([b.op("matmul", *((y, x) if swap else (x, y)))])
    forged = Rule(side(False), side(True))
    b = GraphBuilder()
    x, y = b.input("x", (3, 8, 8)), b.input("y", (3, 8, 8))
    v, w = b.input("v", (8, 8)), b.input("w", (8, 8))
    g = b.build([b.op("relu", b.op("matmul", x, y)), b.op("relu", b.op("matmul", v, w))])
    gate = _TrustsRankTwo()
    rs = RuleSet([forged], max_lift=2)
    if kind == "saturate":
        eg = saturate(g, rs, H100, gate).egraph
        batched = [c for c, t in eg.types.items() if t.shape == (3, 8, 8) and
                   any(e.op == "matmul" for e in eg.nodes[c])]
        assert all(len([e for e in eg.nodes[c] if e.op == "matmul"]) == 1 for c in batched)
        plain = [c for c, t in eg.types.items() if t.shape == (8, 8) and any(e.op == "matmul" for e in eg.nodes[c])]
        assert any(len([e for e in eg.nodes[c] if e.op == "matmul"]) == 2 for c in plain)  # trusted at rank 2
    else:
        search(g, rs, H100, progress=False, proofs=gate)
    assert gate.lifted and gate.real.refused >= 1  # the rank-3 instance went to the prover, which refused it
    assert {len(n.types[0].shape) for i in gate.lifted for n in i.lhs.nodes if n.name is not None} == {3}
