"""Is a rule an instance of a smaller rule? A small term matcher over rule sides.

Rule ``R`` is an instance of ``P`` when replacing ``P``'s variables (its input tensors) by
sub-terms of ``R`` turns ``P``'s left side into ``R``'s left side and ``P``'s right side into
``R``'s right side (or both into ``R`` reversed), outputs matched in some common order.
``tr(tr(relu(x))) => relu(x)`` is an instance of ``tr(tr(y)) => y``; ``mul(add(x, x), z) =>
add(mul(x, z), mul(x, z))`` is an instance of distributivity with ``y := x``. A variable only
matches a value of its own type, so instances keep the concrete shapes.

>>> from superopt.ir import GraphBuilder, Rule
>>> def rule(f, g, shape=(2, 2)):
...     def side(h):
...         b = GraphBuilder(); x = b.input("x", shape)
...         return b.build([h(b, x)])
...     return Rule(side(f), side(g))
>>> tt = lambda b, x: b.op("transpose", b.op("transpose", x, perm=(1, 0)), perm=(1, 0))
>>> small = rule(tt, lambda b, x: x)
>>> big = rule(lambda b, x: tt(b, b.op("relu", x)), lambda b, x: b.op("relu", x))
>>> index = InstanceIndex(); index.add(small)
>>> index.find(big) is small
True
"""

from __future__ import annotations

import itertools
from functools import cached_property

from ..ir import Graph, Ref, Rule

__all__ = ["InstanceIndex", "rule_size"]


def rule_size(rule: Rule) -> tuple[int, int]:
    """``(operators on both sides, -variables)``: smaller is more general."""
    return sum(rule.size), -len(rule.lhs.input_names)


class _Side:
    """A rule side as terms: a structural key per value (inputs as ``("$", name)``)."""

    def __init__(self, g: Graph):
        self.g = g
        self.keys: dict[Ref, tuple] = {}
        for i, n in enumerate(g.nodes):
            if n.name is not None:
                self.keys[Ref(i, 0)] = ("$", n.name)
                continue
            args = [self.keys[r] for r in n.inputs]
            if n.opdef.commutative:
                args.sort(key=repr)
            for k in range(len(n.types)):
                self.keys[Ref(i, k)] = (n.op, n.attrs, k, tuple(args))

    @cached_property
    def roots(self) -> tuple:
        """What makes each output: ``(op, attrs, index)``, or ``"$"`` for an input tensor."""
        out = []
        for r in self.g.outputs:
            n = self.g.nodes[r.node]
            out.append("$" if n.name is not None else (n.op, n.attrs, r.index))
        return tuple(out)

    @cached_property
    def instances(self) -> frozenset:
        """The operators with their attributes used on this side."""
        return frozenset((n.op, n.attrs) for n in self.g.nodes if n.name is None)


def _match(p: _Side, pref: Ref, t: _Side, tref: Ref, env: dict):
    """Every extension of ``env`` (variable -> target key) under which ``pref`` becomes ``tref``."""
    pn = p.g.nodes[pref.node]
    if pn.name is not None:
        key = t.keys[tref]
        if pn.name in env:
            if env[pn.name] == key:
                yield env
        elif p.g.type_of(pref) == t.g.type_of(tref):
            yield {**env, pn.name: key}
        return
    tn = t.g.nodes[tref.node]
    if tn.name is not None or tn.op != pn.op or tn.attrs != pn.attrs or pref.index != tref.index:
        return
    orders = [tn.inputs]
    if pn.opdef.commutative and len(tn.inputs) == 2:
        orders.append(tn.inputs[::-1])
    for t_ins in orders:
        envs = [env]
        for p_in, t_in in zip(pn.inputs, t_ins):
            envs = [e2 for e in envs for e2 in _match(p, p_in, t, t_in, e)]
        yield from envs


def _instantiate(p: _Side, ref: Ref, env: dict, memo: dict) -> tuple:
    if ref in memo:
        return memo[ref]
    n = p.g.nodes[ref.node]
    if n.name is not None:
        out = env[n.name]
    else:
        args = [_instantiate(p, r, env, memo) for r in n.inputs]
        if n.opdef.commutative:
            args.sort(key=repr)
        out = (n.op, n.attrs, ref.index, tuple(args))
    memo[ref] = out
    return out


class _Pattern:
    def __init__(self, rule: Rule):
        self.rule, self.lhs, self.rhs = rule, _Side(rule.lhs), _Side(rule.rhs)
        self.size = rule_size(rule)

    def matches(self, lhs: _Side, rhs: _Side) -> bool:
        n = len(lhs.g.outputs)
        if len(self.lhs.g.outputs) != n:
            return False
        for perm in itertools.permutations(range(n)):
            envs = [{}]
            for k in range(n):
                pref, tref = self.lhs.g.outputs[perm[k]], lhs.g.outputs[k]
                envs = [e2 for e in envs for e2 in _match(self.lhs, pref, lhs, tref, e)]
            for env in envs:
                memo: dict = {}
                if all(_instantiate(self.rhs, self.rhs.g.outputs[perm[k]], env, memo) == rhs.keys[rhs.g.outputs[k]]
                       for k in range(n)):
                    return True
        return False


class InstanceIndex:
    """Rules kept so far, indexed by the operators at their left side's outputs."""

    def __init__(self):
        self._by_roots: dict[tuple, list[_Pattern]] = {}

    def add(self, rule: Rule) -> None:
        p = _Pattern(rule)
        self._by_roots.setdefault(tuple(sorted(p.lhs.roots, key=repr)), []).append(p)

    def _candidates(self, roots: tuple):
        seen = set()
        for mask in itertools.product((False, True), repeat=len(roots)):
            key = tuple(sorted(("$" if m else r for m, r in zip(mask, roots)), key=repr))
            if key not in seen:
                seen.add(key)
                yield from self._by_roots.get(key, ())

    def find(self, rule: Rule) -> Rule | None:
        """A kept rule, strictly more general than ``rule``, of which ``rule`` is an instance."""
        size = rule_size(rule)
        lhs, rhs = _Side(rule.lhs), _Side(rule.rhs)
        for a, b in ((lhs, rhs), (rhs, lhs)):
            for p in self._candidates(a.roots):
                if (p.size < size and p.lhs.instances <= a.instances and p.rhs.instances <= b.instances
                        and p.matches(a, b)):
                    return p.rule
        return None
