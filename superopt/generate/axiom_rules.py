"""Rules read off axioms: an axiom whose statement is itself a rewrite the optimizer needs and
that is larger than the generator's reach becomes a candidate rule at the families' sizes.

Batch normalization as a per-channel affine map (``batchnorm_affine``, ``batchnorm_affine_2d`` of
``specs/extended.axioms``) is the case: batch norm has five inputs where the generator enumerates
operators of at most three (:data:`superopt.generate.opsets.MAX_INPUTS`), and the affine form has
eight operators where it stops at three. So instead of a hand-written rule, the axiom that
decomposes it is instantiated here and proven like every candidate (its proof is the axiom).

>>> [r.text()[:24] for r in axiom_rules(["batchnorm_affine_2d"])]
['batchnorm(x, s, b, m, v)']
"""

from __future__ import annotations

from ..axioms.instantiate import build_instance
from ..axioms.parse import load_axioms
from ..axioms.terms import eval_cond
from ..ir.rule import Rule
from .errors import GenerateError

__all__ = ["axiom_rules", "SIZES", "ATTRS"]

#: the sizes a template dimension takes, by name (the families' image and sequence sizes:
#: batch 2, channels 6, a 5x7 image), and attribute variables by name (batch norm's eps)
SIZES = {"n": 2, "c": 6, "h": 5, "wd": 7, "b": 2, "s": 3, "d": 5, "f": 7, "o": 6}
ATTRS = {"e": 1e-5}


def axiom_rules(names, axioms=None) -> list[Rule]:
    """The named axioms as rules (left => right) at :data:`SIZES`; every tensor variable of each
    must have a shape template, and every attribute variable a value in :data:`ATTRS`."""
    by_name = {a.name: a for a in (load_axioms() if axioms is None else axioms)}
    out = []
    for name in names:
        ax = by_name.get(name)
        if ax is None:
            raise GenerateError(f"no axiom named {name!r} in the specs; `superopt specs list` shows them")
        out.append(_instance(ax))
    return out


def _instance(ax) -> Rule:
    env = {**ATTRS}
    shapes = {}
    for v in ax.tensor_vars:
        tpl = ax.shapes.get(v)
        if tpl is None:
            raise GenerateError(f"axiom {ax.name}: {v} has no shape template; only templated axioms become rules")
        for d in tpl:
            if isinstance(d, str):
                env.setdefault(d, SIZES.get(d, 4))
        shapes[v] = tuple(env[d] if isinstance(d, str) else d for d in tpl)
    if not all(eval_cond(c, env, shapes) for c in ax.where):
        raise GenerateError(f"axiom {ax.name}: its conditions do not hold at the sizes {SIZES}")
    return build_instance(ax, env, shapes)
