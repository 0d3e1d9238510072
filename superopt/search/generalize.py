"""Does a rule still hold when a size-1 axis becomes larger (or the reverse)?

Matching binds rule variables to values of the same rank but any sizes. Sizes other than 1 do
not change what the operators mean, but a size-1 axis broadcasts: a rule generated with a
batch of 1 (or with a [C,1,1] bias) is applied to a batch of 8 only after this check. Both
sides are rebuilt at the rule's own shapes with the flagged axes changed (1 -> 3, other -> 1)
and evaluated in float64 on random inputs; the answer is cached per rule and pattern of axes.

>>> from superopt.ir import GraphBuilder, Rule
>>> from superopt.search.pattern import compile_pattern
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (1, 4)); y = b.input("y", (1, 4))
...     return b.build([f(b, x, y)])
>>> sound = compile_pattern(Rule(side(lambda b, x, y: b.op("add", x, y)), side(lambda b, x, y: b.op("add", y, x))), 0)
>>> GeneralityCheck().holds(sound, ((0,), (0,)))
True
>>> wrong = compile_pattern(Rule(side(lambda b, x, y: b.op("matmul", x, b.op("transpose", y, perm=(1, 0)))),
...                              side(lambda b, x, y: b.op("matmul", y, b.op("transpose", x, perm=(1, 0))))), 0)
>>> GeneralityCheck().holds(wrong, ((0,), (0,)))  # x y^T = y x^T for single rows only
False
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import GraphBuilder
from ..ir.types import TensorType
from ..semantics.reference import evaluate, random_inputs
from .instantiate import Template, dim_map, rebuild
from .pattern import Pattern

__all__ = ["GeneralityCheck", "TRIED_SIZE"]

#: the size a flagged size-1 axis takes in the check
TRIED_SIZE = 3


def _graph(tpl: Template, pat: Pattern, var_t):
    b = GraphBuilder()
    refs = [(b.weight if w else b.input)(name, t.shape) for name, t, w in zip(pat.var_names, var_t, pat.var_weight)]
    made: list[tuple] = []
    for t in tpl.nodes:
        ins = [refs[s[1]] if s[0] == "v" else made[s[1]][s[2]] for s in t.inputs]
        made.append(b.add(t.op, ins, dict(t.attrs)))
    return b.build([refs[s[1]] if s[0] == "v" else made[s[1]][s[2]] for s in tpl.outputs])


class GeneralityCheck:
    """Cached answers to "does this rule hold at this pattern of size-1 axes"."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._answers: dict = {}

    def holds(self, pat: Pattern, flags: tuple) -> bool:
        key = (pat.rule.id, flags)
        if key not in self._answers:
            self._answers[key] = self._check(pat, flags)
        return self._answers[key]

    def _check(self, pat: Pattern, flags: tuple) -> bool:
        var_t = []
        for t, axes in zip(pat.var_types, flags):
            shape = [(1 if d != 1 else TRIED_SIZE) if a in axes else d for a, d in enumerate(t.shape)]
            var_t.append(TensorType(tuple(shape), t.dtype))
        dm = dim_map([(a.shape, b.shape) for a, b in zip(pat.var_types, var_t)])
        sides = [rebuild(g, pat.var_names, var_t, dm) for g in (pat.rule.lhs, pat.rule.rhs)]
        if None in sides:
            return False
        lhs, rhs = (_graph(s, pat, var_t) for s in sides)
        if [lhs.type_of(r) for r in lhs.outputs] != [rhs.type_of(r) for r in rhs.outputs]:
            return False
        env = random_inputs(lhs, np.random.default_rng(self.seed))
        try:
            got, want = evaluate(rhs, env), evaluate(lhs, env)
        except (ValueError, FloatingPointError):
            return False
        return all(np.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(got, want))


