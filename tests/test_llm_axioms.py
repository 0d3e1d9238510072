"""specs/llm.axioms: wrong twins of its axioms fail the numeric check (so the check reaches the
cases that matter), and the small rules the generator finds over the new operators are proven."""

from __future__ import annotations

import pytest

from superopt.axioms import check_axiom, parse_axioms
from superopt.ir import GraphBuilder, Rule
from superopt.verify import verify_rules


WRONG = """
axiom swap_same_axis_by_sign: mean(sum(x, axis=a, keepdim=1), axis=b, keepdim=1) == sum(mean(x, axis=b, keepdim=1), axis=a, keepdim=1)
    where a != b
    shapes x=any
axiom gqa_tiled: sdpa(q, reshape(expand(reshape(k, shape=(b, 1, h, s, e)), shape=(b, r, h, s, e)), shape=(b, hq, s, e)),
         reshape(expand(reshape(v, shape=(b, 1, h, s, f)), shape=(b, r, h, s, f)), shape=(b, hq, s, f)), scale=c)
        == sdpa(q, k, v, scale=c, gqa=1)
    where hq == h * r
    shapes q=[b, hq, l, e], k=[b, h, s, e], v=[b, h, s, f]
axiom mean_is_sum: mean(x, axis=a, keepdim=1) == sum(x, axis=a, keepdim=1)
    shapes x=any
axiom silu_is_gelu_tanh: silu(x) == gelu_tanh(x)
    shapes x=any
axiom rowscale_left: matmul(x, mul(w, u)) == mul(matmul(x, w), u)
    shapes x=[n, d], u=[n, 1], w=[d, m]
"""


@pytest.mark.parametrize("ax", parse_axioms(WRONG, "wrong_llm.axioms"), ids=lambda ax: ax.name)
def test_wrong_twins_fail_the_check(ax):
    assert not check_axiom(ax).ok


def _rule(left, right, shape=(3, 4, 2)):
    def side(f):
        b = GraphBuilder()
        x, s = b.input("x", shape), b.input("s", ())
        return b.build([f(b, x, s)])
    return Rule(side(left), side(right))


RULES = {
    "mean_sum_swap": _rule(lambda b, x, s: b.op("mean", b.op("sum", x, axis=0), axis=2),
                           lambda b, x, s: b.op("sum", b.op("mean", x, axis=2), axis=0)),
    "sum_smul": _rule(lambda b, x, s: b.op("smul", b.op("sum", x, axis=1, keepdim=0), s),
                      lambda b, x, s: b.op("sum", b.op("smul", x, s), axis=1, keepdim=0)),
    "silu_of_a_scale_through_reshape": _rule(
        lambda b, x, s: b.op("reshape", b.op("silu", b.op("smul", x, s)), shape=(12, 2)),
        lambda b, x, s: b.op("silu", b.op("smul", b.op("reshape", x, shape=(12, 2)), s))),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_rules_over_the_new_operators_are_proven(name):
    result, = verify_rules([RULES[name]], timeout_s=30, progress=False)
    assert result.status == "proven" and result.crosscheck == "passed", result


def test_a_false_reduction_rule_is_not_proven():
    wrong = _rule(lambda b, x, s: b.op("mean", b.op("sum", x, axis=1), axis=1),
                  lambda b, x, s: b.op("sum", b.op("mean", x, axis=1), axis=1))
    result, = verify_rules([wrong], timeout_s=30, progress=False)
    assert result.status != "proven"
