"""Numeric cross-check of a rule: both sides in float64 on random inputs, at several shapes.

A proof is only as good as the axioms and their translation; evaluating both sides with the
reference semantics catches an unsound axiom or a translation bug. The rule is evaluated at
its own shapes with several random seeds, and at up to two *rescaled* instantiations: sizes
(other than 1, and other than conv-kernel extents) are mapped to new values consistently
across source shapes and size attributes (reshape shapes, split sizes, constants' sizes), and
both sides are rebuilt (an instantiation under which a side no longer type-checks is skipped).

>>> from superopt.ir import GraphBuilder, Rule
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (2, 3))
...     return b.build([f(b, x)])
>>> r = Rule(side(lambda b, x: b.op("relu", b.op("relu", x))), side(lambda b, x: b.op("relu", x)))
>>> cc = crosscheck(r)
>>> cc.passed, cc.instantiations
(True, 5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SuperoptError
from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.ops import REGISTRY, attrs_carrying
from ..ir.rule import Rule
from ..semantics.reference import evaluate, random_inputs, positive_sources

__all__ = ["CrossCheck", "crosscheck", "rescaled", "SIZE_ATTRS", "KERNEL_INPUTS"]

#: attributes whose integers are sizes, by operator: they follow a rescaling (kernel extents do
#: not); derived from the registry's ``Attr.carries``
SIZE_ATTRS = {name: attrs_carrying(name, "size") for name, d in REGISTRY.items()
              if d.kind != "source" and attrs_carrying(name, "size")}
#: (operator, input position) whose axes 2 and 3 are kernel extents: never rescaled
KERNEL_INPUTS = {("conv2d", 1), ("conv2d_bias", 1), ("enlarge", 0)}


@dataclass
class CrossCheck:
    """``passed``, the largest relative error seen, and where it failed."""
    passed: bool
    error: float
    instantiations: int
    detail: str = ""


def _kernel_sources(g: Graph) -> set[str]:
    """Sources whose values flow into a conv kernel."""
    stack = [n.inputs[pos].node for n in g.nodes for (op, pos) in KERNEL_INPUTS
             if n.op == op and pos < len(n.inputs)]
    seen, names = set(), set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g.nodes[i]
        if n.name is not None:
            names.add(n.name)
        stack.extend(r.node for r in n.inputs)
    return names


def _sizes(rule: Rule) -> list[int]:
    """The sizes that may be rescaled: not 0 or 1, not a kernel's extent."""
    frozen, sizes = {0, 1}, set()
    for g in (rule.lhs, rule.rhs):
        kernels = _kernel_sources(g)
        for i in g.inputs + g.weights:
            n = g.nodes[i]
            shape = n.types[0].shape
            sizes.update(shape)
            if n.name in kernels and len(shape) == 4:
                frozen.update(shape[2:])
    return sorted(sizes - frozen)


def _value_maps(sizes: list[int]):
    yield {v: 2 * v for v in sizes}
    yield {v: 3 * v for v in sizes}
    for v in sizes:
        yield {v: 2 * v}
    yield {v: v + 1 for v in sizes}


def _map_attr(value, vmap):
    if isinstance(value, tuple):
        return tuple(vmap.get(v, v) for v in value)
    return vmap.get(value, value)


def _rebuild(g: Graph, vmap: dict) -> Graph:
    b = GraphBuilder()
    out: dict[Ref, Ref] = {}
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            shape = tuple(vmap.get(d, d) for d in n.types[0].shape)
            src = b.input if n.op == "input" else b.weight
            out[Ref(i, 0)] = src(n.name, shape, dtype=n.types[0].dtype)
            continue
        attrs = dict(n.attrs)
        for name in SIZE_ATTRS.get(n.op, ()):
            attrs[name] = _map_attr(attrs[name], vmap)
        res = b.add(n.op, [out[r] for r in n.inputs], attrs)
        out.update({Ref(i, k): r for k, r in enumerate(res)})
    return b.build([out[r] for r in g.outputs])


def rescaled(rule: Rule, want: int = 2) -> list[Rule]:
    """Up to ``want`` copies of the rule at other shapes (see the module docstring)."""
    if rule.lhs.data or rule.rhs.data:
        return []
    found, seen = [], {_source_shapes(rule)}
    for vmap in _value_maps(_sizes(rule)):
        try:
            r = Rule(_rebuild(rule.lhs, vmap), _rebuild(rule.rhs, vmap))
        except SuperoptError:
            continue
        key = _source_shapes(r)
        if key in seen:
            continue
        seen.add(key)
        found.append(r)
        if len(found) >= want:
            break
    return found


def _source_shapes(r: Rule) -> tuple:
    return tuple(r.lhs.nodes[i].types[0].shape for i in r.lhs.inputs + r.lhs.weights)


def _error(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference relative to the outputs' scale (inf when shapes or NaNs differ)."""
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return float("inf")
    a, b = np.where(nan_a, 0.0, a), np.where(nan_b, 0.0, b)
    if a.size == 0:
        return 0.0
    scale = max(1.0, float(np.max(np.abs(a))), float(np.max(np.abs(b))))
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
    diff = np.where(a == b, 0.0, diff)  # equal infinities
    return float(np.max(diff)) / scale


#: operators that only move values: a source that reaches an input which must be positive (a
#: batch-norm variance) through them must be drawn positive too
def _compare(rule: Rule, rng: np.random.Generator) -> float:
    env = random_inputs(rule.lhs, rng)
    for name in (positive_sources(rule.lhs) | positive_sources(rule.rhs)) & env.keys():
        env[name] = rng.uniform(0.5, 1.5, np.shape(env[name]))
    env.update({k: np.asarray(v, dtype=np.float64) for k, v in rule.lhs.data.items()})
    left, right = evaluate(rule.lhs, env), evaluate(rule.rhs, env)
    return max(_error(np.asarray(a), np.asarray(b)) for a, b in zip(left, right))


def crosscheck(rule: Rule, seed: int = 0, seeds: int = 3, rtol: float = 1e-8) -> CrossCheck:
    """Evaluate both sides at the rule's shapes (``seeds`` draws) and at rescaled shapes."""
    rng = np.random.default_rng(seed)
    cases = [(rule, "the rule's shapes")] * seeds
    cases += [(r, "rescaled shapes " + _shapes(r)) for r in rescaled(rule)]
    worst = 0.0
    for r, where in cases:
        err = _compare(r, rng)
        worst = max(worst, err)
        if not err <= rtol:
            return CrossCheck(False, worst, len(cases), f"max relative error {err:.3g} at {where}")
    return CrossCheck(True, worst, len(cases))


def _shapes(r: Rule) -> str:
    g = r.lhs
    return ", ".join(f"{g.nodes[i].name}={list(g.nodes[i].types[0].shape)}" for i in g.inputs + g.weights)
