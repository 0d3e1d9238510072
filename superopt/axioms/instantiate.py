"""Instances of an axiom: concrete shapes and attribute values turn its two terms into graphs.

Used by the numeric check (``superopt specs check``) and by tests. Shapes not fixed by a
template are drawn from one shared base shape, or at random rank, so that elementwise axioms
are tried at several ranks; an assignment under which a side does not type-check, or a
condition fails, is simply not an instance.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import SuperoptError
from ..ir.graph import GraphBuilder, Ref
from ..ir.ops import get_op
from ..ir.rule import Rule
from .parse import attr_var_uses
from .terms import Axiom, Call, Var, eval_attr, eval_cond

__all__ = ["build_instance", "sample_instances", "SAMPLE_DOMAINS"]

#: values tried for attribute variables, by attribute name (``item`` uses take the integers)
SAMPLE_DOMAINS = {
    "stride": ((1, 1), (2, 2), (1, 2)),
    "padding": ((0, 0), (1, 1), (0, 1), (2, 2)),
    "kernel": ((1, 1), (3, 3), (1, 3), (3, 1), (5, 5), (2, 2)),
    "axis": (0, 1, 2, 3, -1),
    "groups": (1, 2),
    "activation": ("none", "relu"),
    "eps": (1e-5, 1e-3),
    "ndim": (1, 2),
    "n": (1, 2, 3, 4),
    "channels": (1, 2, 4),
    "sizes": (1, 2, 3),
}
_ITEMS = {"stride": (1, 2), "padding": (0, 1, 2), "kernel": (1, 2, 3, 5), "sizes": (1, 2, 3, 4)}
_DIMS = (1, 2, 3, 4, 5)


def build_instance(ax: Axiom, env: dict, shapes: dict) -> Rule:
    """The rule ``lhs => rhs`` at these values; raises SuperoptError if a side is ill-formed."""
    sides = []
    for term in (ax.lhs, ax.rhs):
        b = GraphBuilder()
        refs = {v: b.input(v, shapes[v]) for v in ax.tensor_vars}
        sides.append(b.build([_build(term, b, refs, env)]))
    return Rule(*sides)


def _build(t, b: GraphBuilder, refs: dict, env: dict) -> Ref:
    if isinstance(t, Var):
        return refs[t.name]
    args = [_build(a, b, refs, env) for a in t.args]
    attrs = {k: eval_attr(p, env) for k, p in t.attrs}
    outs = b.add(t.op, args, attrs)
    if t.index >= len(outs):
        raise SuperoptError(f"{t.op} has {len(outs)} outputs, [{t.index}] asked")
    return outs[t.index]


def _draw_attr(ax: Axiom, rng: np.random.Generator) -> dict:
    env = {}
    for v, (op, attr, how) in attr_var_uses(ax).items():
        a = get_op(op).attr_index[attr]
        if how == "item":
            dom = _ITEMS.get(attr, (0, 1, 2, 3))
        elif attr == "perm":
            r = int(rng.integers(2, 5))
            dom = tuple(itertools.permutations(range(r)))
        elif a.choices:
            dom = a.choices
        else:
            dom = SAMPLE_DOMAINS.get(attr, (0, 1, 2, 3))
        env[v] = dom[int(rng.integers(len(dom)))]
    return env


def _draw_shapes(ax: Axiom, env: dict, rng: np.random.Generator) -> dict:
    for d in ax.dim_vars:
        env.setdefault(d, int(rng.choice(_DIMS)))
    rank = int(rng.integers(1, 5))
    base = tuple(int(rng.choice(_DIMS)) for _ in range(rank))
    shapes = {}
    for v in ax.tensor_vars:
        if v in ax.shapes:
            shapes[v] = tuple(env[d] if isinstance(d, str) else d for d in ax.shapes[v])
        else:
            shapes[v] = base
    return shapes


def _define(ax: Axiom, env: dict, shapes: dict) -> bool:
    """Apply conditions of the form ``var == expr`` as definitions, then test the rest."""
    for c in ax.where:
        if c[0] == "==" and c[1][0] == "var" and c[1][1] in ax.attr_vars:
            try:
                env[c[1][1]] = eval_cond(c[2], env, shapes)
            except (KeyError, IndexError, ZeroDivisionError):
                return False
    try:
        return all(eval_cond(c, env, shapes) for c in ax.where)
    except (KeyError, IndexError, ZeroDivisionError):
        return False


def sample_instances(ax: Axiom, rng: np.random.Generator, want: int = 4, tries: int = 400):
    """Up to ``want`` distinct instances ``(env, shapes, rule)`` found in ``tries`` draws."""
    found, seen = [], set()
    for _ in range(tries):
        env = _draw_attr(ax, rng)
        shapes = _draw_shapes(ax, env, rng)
        if not _define(ax, env, shapes):
            continue
        key = (tuple(sorted((k, repr(v)) for k, v in env.items())), tuple(sorted(shapes.items())))
        if key in seen:
            continue
        try:
            rule = build_instance(ax, env, shapes)
        except SuperoptError:
            continue
        seen.add(key)
        found.append((env, shapes, rule))
        if len(found) >= want:
            break
    return found
