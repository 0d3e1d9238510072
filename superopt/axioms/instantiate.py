"""Instances of an axiom: concrete shapes and attribute values turn its two terms into graphs.

Used by the numeric check (``superopt specs check``) and by tests. Shapes not fixed by a
template are drawn from one shared base shape of random rank; often a variable gets a variant
of it instead: a *broadcasting* one (leading axes dropped, some axes set to 1), so that axioms
over ``add``/``mul`` are tried where numpy broadcasting is at work, or one with an axis
*resized*, so that concatenated pieces differ in size. Conditions ``name == expr`` define a
dimension or an attribute instead of filtering; reshape targets (``shape=s``) are drawn as
factorizations of a tensor variable's size. A draw under which a side does not type-check, or
a condition fails, is not an instance; one under which both sides type-check with different
output types is a *mismatch*: the axiom is false there.
"""

from __future__ import annotations

import numpy as np

from ..errors import SuperoptError
from ..ir.graph import GraphBuilder, Ref
from ..ir.opdefs import INDEX_INPUTS
from ..ir.ops import get_op
from ..ir.rule import Rule
from .parse import attr_var_uses
from .terms import ATuple, AVar, Axiom, Var, eval_attr, eval_cond, rules_hold

__all__ = ["build_instance", "sample_instances", "SAMPLE_DOMAINS", "SideMismatch", "index_vars"]

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
    "scale": (1.0, 0.5, 0.125),
    "exponent": (1.0, 2.0, 3.0, -1.0),
}
_ITEMS = {"stride": (1, 2), "padding": (0, 1, 2), "kernel": (1, 2, 3, 5), "sizes": (1, 2, 3, 4),
          "shape": (1, 2, 3, 4)}
_DIMS = (1, 2, 3, 4, 5)
_RESHAPED = "shape"  # whole-tuple attributes drawn as factorizations of a tensor's size
_SCAN = 60  # draws built per axiom to look for mismatches, when asked to


class SideMismatch(SuperoptError):
    """Both sides of an axiom instance are well-formed but their output types differ."""


def build_instance(ax: Axiom, env: dict, shapes: dict) -> Rule:
    """The rule ``lhs => rhs`` at these values; raises SuperoptError if a side is ill-formed
    (:class:`SideMismatch` if both are well-formed but of different types).

    >>> from superopt.axioms import parse_axioms
    >>> ax, = parse_axioms("axiom t: relu(transpose(x, perm=(1, 0))) == transpose(relu(x), perm=(1, 0))")
    >>> build_instance(ax, {}, {"x": (2, 3)}).text()
    'relu(transpose[perm=(1,0)](x)) => transpose[perm=(1,0)](relu(x))'
    """
    sides, index = [], index_vars(ax)
    for term in (ax.lhs, ax.rhs):
        b = GraphBuilder()
        refs = {v: b.input(v, shapes[v], "int64" if v in index else "float32") for v in ax.tensor_vars}
        sides.append(b.build([_build(term, b, refs, env)]))
    lt, rt = (g.type_of(g.outputs[0]) for g in sides)
    if lt != rt:
        raise SideMismatch(f"the left side is {lt!r} and the right side {rt!r}")
    return Rule(*sides)


def index_vars(ax: Axiom) -> set[str]:
    """Tensor variables used as indices (registry ``INDEX_INPUTS``): they are int64."""
    out = set()

    def walk(t):
        if isinstance(t, Var):
            return
        k = INDEX_INPUTS.get(t.op, (None,))[0]
        if k is not None and k < len(t.args) and isinstance(t.args[k], Var):
            out.add(t.args[k].name)
        for a in t.args:
            walk(a)

    walk(ax.lhs)
    walk(ax.rhs)
    return out


def _build(t, b: GraphBuilder, refs: dict, env: dict) -> Ref:
    if isinstance(t, Var):
        return refs[t.name]
    args = [_build(a, b, refs, env) for a in t.args]
    attrs = {k: eval_attr(p, env) for k, p in t.attrs}
    outs = b.add(t.op, args, attrs)
    if t.index >= len(outs):
        raise SuperoptError(f"{t.op} has {len(outs)} outputs, [{t.index}] asked")
    return outs[t.index]


def _pick(seq, rng: np.random.Generator):
    return seq[int(rng.integers(len(seq)))]


class _Sampler:
    """Draws assignments for one axiom; what only depends on the axiom is computed once."""

    def __init__(self, ax: Axiom, rng: np.random.Generator):
        self.ax, self.rng = ax, rng
        self.tensors, self.dims = ax.tensor_vars, ax.dim_vars
        self.free = [v for v in self.tensors if v not in ax.shapes and ax.rules.get(v, ("any",))[0] == "any"]
        self.related = _dependency_order(ax.rules)
        self.domains, self.reshaped = {}, []
        for v, (op, attr, how) in attr_var_uses(ax).items():
            if v in self.dims:
                continue  # a dimension of a shape template too: drawn with the dimensions
            if how == "whole" and attr == _RESHAPED:
                self.reshaped.append(v)
            else:
                self.domains[v] = _domain(op, attr, how)
        self.defs = [(c[1][1], c[2]) for c in ax.where if c[0] == "==" and c[1][0] == "var"]
        self.perms = _perm_tuples(ax)

    def draw(self):
        """One assignment ``(env, shapes)`` where the conditions hold, or None."""
        rng, env = self.rng, {}
        for v, dom in self.domains.items():
            env[v] = _pick(dom, rng) if dom != "perm" else tuple(rng.permutation(int(rng.integers(2, 5))).tolist())
        for items in self.perms:  # a permutation written item by item is drawn as a permutation
            env.update(zip(items, rng.permutation(len(items)).tolist()))
        pool = _pool(rng)
        for d in self.dims:
            env[d] = _pick(pool, rng)
        base = tuple(_pick(pool, rng) for _ in range(int(rng.integers(1, 5))))
        shapes = {v: _variant(base, rng, pool) for v in self.free}
        self._define(self.dims, env, shapes)
        for v, tpl in self.ax.shapes.items():
            shapes[v] = tuple(env[d] if isinstance(d, str) else d for d in tpl)
        for v in self.related:
            kind, other = self.ax.rules[v]
            shapes[v] = shapes[other] if kind == "like" else _bcast_variant(shapes[other], rng, pool)
        for v in self.reshaped:
            env[v] = _factorization(int(np.prod(shapes[_pick(self.tensors, rng)])), rng) if self.tensors else (1,)
        self._define(env.keys(), env, shapes)
        try:
            ok = rules_hold(self.ax.rules, shapes) and all(eval_cond(c, env, shapes) for c in self.ax.where)
            return (env, shapes) if ok else None
        except (KeyError, IndexError, ZeroDivisionError):
            return None

    def _define(self, names, env, shapes):
        """Apply the conditions ``name == expr`` that define one of ``names`` and can be evaluated."""
        names = set(names)
        for name, expr in self.defs:
            if name in names:
                try:
                    env[name] = eval_cond(expr, env, shapes)
                except (KeyError, IndexError, ZeroDivisionError):
                    pass


def _perm_tuples(ax: Axiom) -> list[tuple[str, ...]]:
    """The ``perm=(p0, p1, ...)`` tuples whose items are all variables."""
    out = []

    def walk(t):
        if isinstance(t, Var):
            return
        for name, p in t.attrs:
            if name == "perm" and isinstance(p, ATuple) and all(isinstance(x, AVar) for x in p.items):
                out.append(tuple(x.name for x in p.items))
        for a in t.args:
            walk(a)
    walk(ax.lhs)
    walk(ax.rhs)
    return list(dict.fromkeys(out))


def _domain(op: str, attr: str, how: str):
    if how == "item":
        return _ITEMS.get(attr, (0, 1, 2, 3))
    if attr == "perm":
        return "perm"
    a = get_op(op).attr_index[attr]
    return a.choices or SAMPLE_DOMAINS.get(attr, (0, 1, 2, 3))


def _dependency_order(rules: dict) -> list[str]:
    """Variables with a ``like``/``bcast`` rule, each after the variable it refers to."""
    order: list[str] = []

    def visit(v):
        rule = rules.get(v, ("any",))
        if rule[0] != "any" and v not in order:
            visit(rule[1])
            order.append(v)

    for v in rules:
        visit(v)
    return order


def _pool(rng: np.random.Generator) -> tuple:
    """The sizes of one draw: all of 1..5, or (a third of the time) few distinct sizes, so that
    shapes agree by coincidence and a lower-rank operand type-checks where it should not."""
    r = rng.random()
    if r < 2 / 3:
        return _DIMS
    return (2,) if r < 5 / 6 else (1, 2)


def _variant(base: tuple, rng: np.random.Generator, pool=_DIMS) -> tuple:
    """``base`` itself half of the time, else a shape that broadcasts with it or one with an
    axis resized (as the pieces of a concat are)."""
    r = rng.random()
    if r < 0.4:
        return base
    if r < 0.8 or not base:
        return _bcast_variant(base, rng, pool)
    k = int(rng.integers(len(base)))
    return base[:k] + (_pick(_DIMS, rng),) + base[k + 1:]


def _bcast_variant(shape: tuple, rng: np.random.Generator, pool=_DIMS) -> tuple:
    """A shape that broadcasts with ``shape``: leading axes dropped (often), added (sometimes),
    some axes set to 1."""
    r = rng.random()
    if r < 0.5 and shape:
        shape = shape[int(rng.integers(1, len(shape) + 1)):]
    elif r < 0.6:
        shape = tuple(_pick(pool, rng) for _ in range(int(rng.integers(1, 3)))) + shape
    return tuple(1 if rng.random() < 1 / 3 else d for d in shape)


def _factorization(n: int, rng: np.random.Generator) -> tuple:
    """A random shape of 1 to 4 axes with ``n`` elements."""
    dims = [1] * int(rng.integers(1, 5))
    p = 2
    while n > 1:
        while n % p:
            p += 1
        dims[int(rng.integers(len(dims)))] *= p
        n //= p
    return tuple(dims)


def _signature(ax: Axiom, env: dict, shapes: dict) -> tuple:
    """The structure of an instance: each tensor's rank and which of its axes are 1, each
    attribute value; instances that differ in it exercise different cases (broadcasting,
    ranks, attributes)."""
    attrs = tuple(repr(env[v]) for v in ax.attr_vars if v in env and v not in ax.dim_vars)
    return tuple((len(shapes[v]), tuple(d == 1 for d in shapes[v])) for v in ax.tensor_vars) + attrs


def sample_instances(ax: Axiom, rng: np.random.Generator, want: int = 4, tries: int = 400,
                     mismatches: list | None = None, enough: int | None = None):
    """Up to ``want`` distinct instances ``(env, shapes, rule)`` found in ``tries`` draws.

    Draws go on until ``enough`` instances are found (default ``want``): those returned are
    the first of each distinct :func:`_signature` in the order found, then the first others. When
    ``mismatches`` is a list, at least ``_SCAN`` draws are built, and those where both sides
    are well-formed but of different types are appended to it as ``(env, shapes, message)``.

    >>> from superopt.axioms import parse_axioms
    >>> ax, = parse_axioms("axiom t: relu(transpose(x, perm=(1, 0))) == transpose(relu(x), perm=(1, 0))")
    >>> [len(shapes["x"]) for env, shapes, rule in sample_instances(ax, np.random.default_rng(0), want=3)]
    [2, 2, 2]
    """
    sampler, found, seen, built = _Sampler(ax, rng), [], set(), 0
    scan = _SCAN if mismatches is not None else 0
    for _ in range(tries):
        if len(found) >= (enough or want) and built >= scan:
            break
        drawn = sampler.draw()
        if drawn is None:
            continue
        env, shapes = drawn
        key = (tuple(sorted((k, repr(v)) for k, v in env.items())), tuple(sorted(shapes.items())))
        if key in seen:
            continue
        seen.add(key)
        built += 1
        try:
            found.append((env, shapes, build_instance(ax, env, shapes)))
        except SideMismatch as e:
            if mismatches is not None:
                mismatches.append((env, shapes, str(e)))
        except SuperoptError:
            continue
    chosen, kinds = [], set()
    for f in found:
        sig = _signature(ax, f[0], f[1])
        if sig not in kinds:
            kinds.add(sig)
            chosen.append(f)
    return (chosen + [f for f in found if not any(f is c for c in chosen)])[:want]
