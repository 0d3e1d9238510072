"""Is a rule an instance of a smaller rule? The one e-matcher over the rule's own terms.

Rule ``R`` is an instance of ``P`` when replacing ``P``'s variables (its input tensors) by
sub-terms of ``R`` turns ``P``'s left side into ``R``'s left side and ``P``'s right side into
``R``'s right side (or both into ``R`` reversed), outputs matched in some common order.
``tr(tr(relu(x))) => relu(x)`` is an instance of ``tr(tr(y)) => y``; ``mul(add(x, x), z) =>
add(mul(x, z), mul(x, z))`` is an instance of distributivity with ``y := x``. A variable only
matches a value of its own type, so instances keep the concrete shapes.

Both sides of ``R`` go into one e-graph (:mod:`superopt.pattern.egraph`), where equal
sub-terms are one class (a commutative operator's arguments in one order). Each output of
``P``'s sides is compiled once into the one pattern form (``compile_output``: attributes
literal, variables typed), ``P``'s left outputs are matched at ``R``'s by the one e-matcher
(``match_classes``), and ``P``'s right side, built in the same e-graph under the match, must
land in the classes of ``R``'s right outputs.

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

from ..ir import Graph, Rule
from ..pattern.compile import compile_output
from ..pattern.egraph import EGraph, ENode
from ..pattern.ematch import match_classes

__all__ = ["InstanceIndex", "rule_size"]


def rule_size(rule: Rule) -> tuple[int, int]:
    """``(operators on both sides, -variables)``: smaller is more general."""
    return sum(rule.size), -len(rule.lhs.input_names)


def _add(eg: EGraph, g: Graph, env: dict) -> list[int]:
    """Add ``g``'s operators over the classes ``env`` gives its variables (by name); the classes
    of its outputs. A commutative operator's arguments go in class order, so that the same term
    written either way is one class."""
    cls: dict[tuple[int, int], int] = {}
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            cls[(i, 0)] = env[n.name]
            continue
        kids = [cls[(r.node, r.index)] for r in n.inputs]
        if n.opdef.commutative:
            kids.sort()
        for k, c in enumerate(eg.add_app(n.op, n.attrs, kids, n.types)):
            cls[(i, k)] = c
    return [cls[(r.node, r.index)] for r in g.outputs]


class _Target:
    """A rule about to be checked: both sides in one e-graph."""

    def __init__(self, rule: Rule):
        self.eg = EGraph(analyses=())
        env = {}
        for g in (rule.lhs, rule.rhs):
            for i in g.inputs + g.weights:
                n = g.nodes[i]
                env.setdefault(n.name, self.eg.add(ENode(n.op, n.attrs, (), 0, n.types)))
        self.outs = (_add(self.eg, rule.lhs, env), _add(self.eg, rule.rhs, env))


def _roots(g: Graph) -> tuple:
    """What makes each output of ``g``: ``(op, attrs, index)``, or ``"$"`` for an input tensor."""
    return tuple("$" if g.nodes[r.node].name is not None else (g.nodes[r.node].op, g.nodes[r.node].attrs, r.index)
                 for r in g.outputs)


def _ops(g: Graph) -> frozenset:
    """The operators with their attributes used in ``g``."""
    return frozenset((n.op, n.attrs) for n in g.nodes if n.name is None)


class _Pattern:
    """A kept rule, its left outputs compiled for matching."""

    def __init__(self, rule: Rule):
        self.rule, self.size = rule, rule_size(rule)
        g = rule.lhs
        self.outs = [None if g.nodes[r.node].name is not None else compile_output(g, r, f"instance:{rule.id}:{k}")
                     for k, r in enumerate(g.outputs)]

        self.roots = _roots(g)
        self.instances = (_ops(rule.lhs), _ops(rule.rhs))  # the operators with attributes of each side

    def _envs(self, t: _Target, k: int, c: int) -> list[dict]:
        """The variable bindings under which left output ``k`` is class ``c``."""
        pat = self.outs[k]
        if pat is None:
            r = self.rule.lhs.outputs[k]
            n = self.rule.lhs.nodes[r.node]
            return [{n.name: c}] if t.eg.types[c] == n.types[0] else []
        return [dict(zip(pat.var_names, binds)) for _, _, binds, _ in match_classes(t.eg, pat, [c])
                if all(t.eg.types[b] == ty for b, ty in zip(binds, pat.var_types))]

    def matches(self, t: _Target, side: int) -> bool:
        """``R``'s ``side`` (0 left, 1 right) is an instance of this rule's left side, and the
        other side of this rule's right side, outputs in some order."""
        lhs, rhs = t.outs[side], t.outs[1 - side]
        n = len(lhs)
        if len(self.outs) != n:
            return False
        for perm in itertools.permutations(range(n)):
            envs = [{}]
            for k in range(n):
                found = self._envs(t, perm[k], lhs[k])
                envs = [{**e, **f} for e in envs for f in found if all(e.get(v, c) == c for v, c in f.items())]
            for env in envs:
                built = _add(t.eg, self.rule.rhs, env)
                if all(built[perm[k]] == rhs[k] for k in range(n)):
                    return True
        return False


class InstanceIndex:
    """Rules kept so far, indexed by the operators at their left side's outputs."""

    def __init__(self):
        self._by_roots: dict[tuple, list[_Pattern]] = {}

    def add(self, rule: Rule) -> None:
        p = _Pattern(rule)
        self._by_roots.setdefault(tuple(sorted(p.roots, key=repr)), []).append(p)

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
        target, sides = None, (rule.lhs, rule.rhs)
        ops = [_ops(g) for g in sides]
        for side in (0, 1):
            for p in self._candidates(_roots(sides[side])):
                if p.size < size and p.instances[0] <= ops[side] and p.instances[1] <= ops[1 - side]:
                    target = target or _Target(rule)
                    if p.matches(target, side):
                        return p.rule
        return None
