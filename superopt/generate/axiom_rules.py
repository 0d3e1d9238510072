"""Rules read off axioms: an axiom whose statement is itself a rewrite the optimizer needs and
that is larger than the generator's reach becomes a candidate rule at the families' sizes.

Batch normalization as a per-channel affine map (``batchnorm_affine``, ``batchnorm_affine_2d`` of
``specs/extended.axioms``) is the case: batch norm has five inputs where the generator enumerates
operators of at most three (:data:`superopt.generate.opsets.MAX_INPUTS`), and the affine form has
eight operators where it stops at three. So instead of a hand-written rule, the axiom that
decomposes it is instantiated here and proven like every candidate (its proof is the axiom).

An axiom true in the reals only (``specs/reals.axioms``: relu and a per-channel bias commute
with max pooling) is the other case: the generator's fingerprints, where relu is a random
function and max is taken over residues, never put its two sides in one bucket. An axiom with
window attributes (a pool's kernel, stride, padding) is read at two values of each
(:data:`WINDOWS`), so that the search takes them as parameters of the rule (it does where a
rule's form was found at more than one value: ``superopt.pattern.compile.RuleSet``).

>>> [r.text()[:24] for r in axiom_rules(["batchnorm_affine_2d"])]
['batchnorm(x, s, b, m, v)']
>>> [r.text() for r in axiom_rules(["relu_maxpool"])][1]
'relu(maxpool2d[kernel=(2,2)](x)) => maxpool2d[kernel=(2,2)](relu(x))'
"""

from __future__ import annotations

from ..axioms.instantiate import build_instance
from ..axioms.parse import load_axioms
from ..axioms.terms import eval_cond
from ..ir.rule import Rule
from .errors import GenerateError

__all__ = ["axiom_rules", "SIZES", "ATTRS", "WINDOWS"]

#: the sizes a template dimension takes, by name (the families' image and sequence sizes:
#: batch 2, channels 6, a 5x7 image), and attribute variables by name (batch norm's eps)
SIZES = {"n": 2, "c": 6, "h": 5, "wd": 7, "b": 2, "s": 3, "d": 5, "f": 7, "o": 6}
ATTRS = {"e": 1e-5}
#: window attribute variables (pool kernel, stride, padding) by name: the two values an axiom
#: that has them is read at (every window variable takes its first value, then its second)
WINDOWS = {"k": ((3, 3), (2, 2)), "s": ((2, 2), (1, 1)), "p": ((1, 1), (0, 0))}


def axiom_rules(names, axioms=None) -> list[Rule]:
    """The named axioms as rules (left => right) at :data:`SIZES`; every tensor variable of each
    must have a shape template, and every attribute variable a value in :data:`ATTRS`."""
    by_name = {a.name: a for a in (load_axioms() if axioms is None else axioms)}
    out = []
    for name in names:
        ax = by_name.get(name)
        if ax is None:
            raise GenerateError(f"no axiom named {name!r} in the specs; `superopt specs list` shows them")
        windows = [v for v in ax.attr_vars if v in WINDOWS and v not in ax.dim_vars]
        for pick in range(2 if windows else 1):
            out.append(_instance(ax, {v: WINDOWS[v][pick] for v in windows}))
    return out


def _instance(ax, windows: dict) -> Rule:
    env = {**ATTRS, **windows}
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
