"""The one place attributes bind: attribute patterns, how an operator's attributes split for
matching, and binding a pattern to a value.

An attribute pattern is a literal (:class:`ALit`: equal or no match), a variable
(:class:`AVar`: binds the value; met again, it must be the same value) or a tuple of patterns
(:class:`ATuple`). Axioms write them (``transpose(x, perm=(a, b))``); a rule compiled for the
search has one per attribute, by the attribute's kind (``Attr.carries``):

* sizes (``size``, ``kernel``: split sizes, reshape targets, constants' extents) are free: they
  follow the match's shapes and are re-derived for the right side (``instantiate.dim_map``);
* parameters (kinds in ``PARAMETERS``: real values such as eps, a convolution's stride, padding
  and groups) are variables, one per distinct value of the rule, bound to the match's values
  (:func:`bind_params`);
* axes and permutations of an operator that maps batch axes through are literals *shifted* by
  the match's extra leading axes (:func:`shift`);
* every other attribute is a literal (:func:`facets` splits an e-node's or node's attributes
  the same way, so one tuple comparison checks them all).

>>> env = bind_attr(ATuple((AVar("a"), AVar("b"))), (1, 0), {})
>>> env, bind_attr(AVar("a"), 2, env), bind_attr(ALit(3), 3, env) is env
({'a': 1, 'b': 0}, None, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

from ..errors import SuperoptError
from ..ir.ops import REGISTRY, attrs_carrying, get_op, normalize_attrs

__all__ = ["AVar", "ALit", "ATuple", "AttrPat", "PARAMETERS", "ALL_PARAMETERS", "SHAPE_ATTRS", "param_attrs",
           "free_attrs", "window_attrs", "shifted_attrs", "shift", "facets", "split_attrs", "attrs_match", "bind_attr", "bind_attrs", "compile_attrs",
           "bind_params", "normalized_attrs"]


@dataclass(frozen=True)
class AVar:
    """An attribute variable (an integer, or a whole tuple when used as one)."""
    name: str

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class ALit:
    """An attribute literal: the value must be equal."""
    value: Any

    def __str__(self):
        return repr(self.value)


@dataclass(frozen=True)
class ATuple:
    """A tuple of attribute patterns, matched item by item."""
    items: tuple

    def __str__(self):
        return "(" + ", ".join(map(str, self.items)) + ("," if len(self.items) == 1 else "") + ")"


AttrPat = Union[AVar, ALit, ATuple]

#: attribute kinds (``Attr.carries``) that are a rule's parameters where the search matches:
#: each distinct value of such an attribute in a rule is a parameter, bound to the model's value
#: (one value per parameter); the other kinds (sizes aside) must equal the rule's. ``real``
#: (eps) is always a parameter; ``window`` (a convolution's stride, padding and groups, a
#: pool's kernel, stride and padding) only for a rule whose form the database holds at two or
#: more values of each window, carried through (``compile.RuleSet``; the generator keeps one
#: rule per window as that evidence), else its windows are literals (``facets(..., windows=True)``).
#: A parameter value a rule does not hold at is refused by the instance proof. Widening it to
#: ``ALL_PARAMETERS`` is sound too, but axes and activations change what most rules mean, so
#: nearly every such match would be a refused proof.
PARAMETERS = ("real", "window")
ALL_PARAMETERS = ("real", "window", "axis", "perm", "")

#: attributes that carry sizes (kernel extents included): free when matching, re-derived at the
#: match's shapes; derived from the registry's ``Attr.carries``
SHAPE_ATTRS = {name: attrs_carrying(name, "size", "kernel") for name, d in REGISTRY.items()
               if d.kind != "source" and attrs_carrying(name, "size", "kernel")}


@lru_cache(maxsize=None)
def param_attrs(op: str) -> tuple[str, ...]:
    """Attributes that are parameters of a rule (batch-norm eps...): bound by the match."""
    return attrs_carrying(op, *PARAMETERS)


@lru_cache(maxsize=None)
def window_attrs(op: str) -> tuple[str, ...]:
    """Stride, padding and groups of a convolution, kernel, stride and padding of a pool:
    parameters of a rule only where rules of its form were found at more than one value of
    each (``compile.RuleSet``), else literals."""
    return attrs_carrying(op, "window")


@lru_cache(maxsize=None)
def free_attrs(op: str) -> tuple[str, ...]:
    """Attributes a match may differ in: sizes, then parameters (sorted by name each)."""
    return tuple(sorted(SHAPE_ATTRS.get(op, ()))) + tuple(sorted(set(param_attrs(op)) - set(SHAPE_ATTRS.get(op, ()))))


@lru_cache(maxsize=None)
def shifted_attrs(op: str) -> tuple[str, ...]:
    """Axis and permutation attributes of an operator that maps batch axes through: under
    extra leading axes they shift, so they are checked against the match's lift, not indexed."""
    return attrs_carrying(op, "axis", "perm") if get_op(op).lifts else ()


def shift(value, carries: str, lift: int):
    """An axis or permutation of the rule as it reads under ``lift`` extra leading axes.

    >>> shift(1, "axis", 1), shift((1, 0), "perm", 1)
    (2, (0, 2, 1))
    """
    if not lift:
        return value
    if carries == "axis":
        return value + lift
    return tuple(range(lift)) + tuple(p + lift for p in value)


@lru_cache(maxsize=65536)
def facets(op: str, attrs: tuple, windows: bool = False) -> tuple[tuple, tuple]:
    """What a compiled pattern node compares of a node's attributes: the literal ones (all but
    sizes, parameters, axes and permutations; with ``windows``, the windows are literal too:
    a rule whose form was not found at other windows) and the values of the shifted ones."""
    moved = shifted_attrs(op)
    skip = set(free_attrs(op)) | set(moved)
    if windows:
        skip -= set(window_attrs(op))
    fixed = tuple(kv for kv in attrs if kv[0] not in skip) if skip else attrs
    if not moved:
        return fixed, ()
    attr = dict(attrs)
    return fixed, tuple(attr.get(k) for k in moved)


def split_attrs(opdef, attrs: tuple, windows: bool = False) -> tuple[tuple, tuple]:
    """A rule node's attributes as a pattern node keeps them: the literals (windows among them
    with ``windows``), and the shifted ones as ``(name, value, carries)``."""
    fixed, moved = facets(opdef.name, attrs, windows)
    names = shifted_attrs(opdef.name)
    return fixed, tuple((k, v, opdef.attr_index[k].carries) for k, v in zip(names, moved))


def attrs_match(pn, op: str, attrs: tuple, lift: int = 0) -> bool:
    """Pattern node ``pn``'s literals equal the attributes ``attrs`` of an ``op`` node, and so
    do its axes and permutations as they read under ``lift`` extra leading axes."""
    fixed, moved = facets(op, attrs, pn.windows)
    if fixed != pn.fixed:
        return False
    return all(shift(v, carries, lift) == got for (_, v, carries), got in zip(pn.shifted, moved))


def _bind(name, value, env: dict):
    if name in env:
        return env if env[name] == value else None
    env = dict(env)
    env[name] = value
    return env


def bind_attr(p: AttrPat, value, env: dict):
    """``env`` extended so that pattern ``p`` reads ``value``, or None (``env`` is not changed)."""
    if isinstance(p, ALit):
        return env if p.value == value else None
    if isinstance(p, AVar):
        return _bind(p.name, value, env)
    if not isinstance(value, tuple) or len(value) != len(p.items):
        return None
    for x, y in zip(p.items, value):
        env = bind_attr(x, y, env)
        if env is None:
            return None
    return env


def compile_attrs(names, pats: tuple) -> tuple:
    """An operator's attribute patterns (one per attribute name in ``names``, sorted, defaults
    filled) in the form :func:`bind_attrs` reads: literals ``(position, value)`` first (they
    fail fastest), then negative literal axes, then the rest ``(position, pattern)``."""
    lits, ends, rest = [], [], []
    for i, (name, p) in enumerate(zip(names, pats)):
        if name == "axis" and type(p) is ALit and isinstance(p.value, int) and p.value < 0:
            ends.append((i, p.value))  # counts from the end of the first input
        elif type(p) is ALit:
            lits.append((i, p.value))
        else:
            rest.append((i, p))
    return tuple(lits), tuple(ends), tuple(rest)


def bind_attrs(compiled: tuple, attrs: tuple, env: dict, rank: int = 0):
    """``env`` extended so that an operator's compiled attribute patterns
    (:func:`compile_attrs`) read its ``attrs`` (sorted ``(name, value)`` pairs), or None. A
    negative literal axis counts from the end of the first input, of rank ``rank`` (nodes
    store axes from the front)."""
    lits, ends, rest = compiled
    for i, want in lits:
        if attrs[i][1] != want:
            return None
    for i, want in ends:
        if attrs[i][1] != want + rank:
            return None
    for i, p in rest:
        if type(p) is AVar and p.name not in env:
            env = {**env, p.name: attrs[i][1]}
        else:
            env = bind_attr(p, attrs[i][1], env)
            if env is None:
                return None
    return env


def bind_params(pairs, env: dict | None = None) -> dict | None:
    """A rule's parameters bound (on top of ``env``): ``((attribute, rule value), match value)``
    pairs, each distinct rule value a variable; None when one meets two match values.

    >>> bind_params([(("eps", 1e-5), 3e-5)] * 2), bind_params([(("eps", 1e-5), 3e-5), (("eps", 1e-5), 1e-6)])
    ({('eps', 1e-05): 3e-05}, None)
    """
    env = {} if env is None else env
    for name, value in pairs:
        env = _bind(name, value, env)
        if env is None:
            return None
    return env


@lru_cache(maxsize=65536)
def normalized_attrs(op: str, raw: tuple) -> tuple | None:
    """``normalize_attrs`` (defaults filled, values checked) of ``(name, value)`` pairs, or None."""
    try:
        return normalize_attrs(get_op(op), dict(raw))
    except SuperoptError:
        return None
