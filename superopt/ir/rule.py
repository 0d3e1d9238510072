"""A rewrite rule: two graphs over the same inputs that compute the same outputs.

Output ``k`` of ``lhs`` equals output ``k`` of ``rhs``. Both sides name the same sources
(inputs and weights) with the same types; these are the rule's variables. Its identity is the
hash of its canonical form (sources renamed canonically on both sides together), so a rule
and its renamed copy have the same ``id``. Problems are found when the rule is built.

>>> from superopt.ir import GraphBuilder
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (2, 2))
...     return b.build([f(b, x)])
>>> r = Rule(side(lambda b, x: b.op("transpose", b.op("transpose", x, perm=(1, 0)), perm=(1, 0))),
...          side(lambda b, x: x))
>>> r.text()
'transpose[perm=(1,0)](transpose[perm=(1,0)](x)) => x'
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from ..errors import GraphError
from .graph import Graph, GraphBuilder, Ref
from .hashing import canonical_labels
from .printing import to_expr
from .serialize import graph_from_json, graph_to_json

__all__ = ["Rule"]


def _sources(g: Graph) -> dict[str, tuple]:
    return {g.nodes[i].name: (g.nodes[i].op, g.nodes[i].types[0]) for i in g.inputs + g.weights}


@dataclass(frozen=True, eq=False)
class Rule:
    """``lhs`` rewrites to ``rhs``; see the module docstring."""

    lhs: Graph
    rhs: Graph

    def __post_init__(self):
        a, b = _sources(self.lhs), _sources(self.rhs)
        if a != b:
            raise GraphError(f"rule sides must have the same inputs and weights: {sorted(a)} vs {sorted(b)}")
        if len(self.lhs.outputs) != len(self.rhs.outputs):
            raise GraphError(f"rule sides have {len(self.lhs.outputs)} and {len(self.rhs.outputs)} outputs")
        for k, (p, q) in enumerate(zip(self.lhs.outputs, self.rhs.outputs)):
            if self.lhs.type_of(p) != self.rhs.type_of(q):
                raise GraphError(f"rule output {k}: {self.lhs.type_of(p)!r} on the left, {self.rhs.type_of(q)!r} on the right")

    @cached_property
    def id(self) -> str:
        """Hash of the canonical rule (renaming-invariant), 16 hex digits."""
        canon = self.canonical()
        return hashlib.blake2b(repr((canon.lhs.key(), canon.rhs.key())).encode(), digest_size=8).hexdigest()

    def canonical(self) -> "Rule":
        """The rule with its variables renamed canonically (by the left side, then the right)."""
        both = _pair(self.lhs, self.rhs)
        label = canonical_labels(both)
        names = {both.nodes[i].name: label[i] for i in label}
        return Rule(_rename(self.lhs, names), _rename(self.rhs, names))

    @property
    def size(self) -> tuple[int, int]:
        """Operators on each side (sources not counted)."""
        return (sum(1 for _ in self.lhs.compute_nodes()), sum(1 for _ in self.rhs.compute_nodes()))

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(sorted({n.op for g in (self.lhs, self.rhs) for n in g.nodes if n.name is None}))

    def reversed(self) -> "Rule":
        return Rule(self.rhs, self.lhs)

    def text(self) -> str:
        """One line: ``lhs => rhs``."""
        return f"{to_expr(self.lhs)} => {to_expr(self.rhs)}"

    def to_json(self) -> dict:
        return {"lhs": graph_to_json(self.lhs), "rhs": graph_to_json(self.rhs)}

    @staticmethod
    def from_json(doc: dict) -> "Rule":
        return Rule(graph_from_json(doc["lhs"]), graph_from_json(doc["rhs"]))

    def __eq__(self, other):
        return isinstance(other, Rule) and self.id == other.id

    def __hash__(self):
        return hash(self.id)


def _pair(lhs: Graph, rhs: Graph) -> Graph:
    """One graph holding both sides (shared sources), outputs left then right."""
    b = GraphBuilder()
    remap = b.copy_nodes(lhs, range(len(lhs.nodes)))
    by_name = {lhs.nodes[i].name: Ref(i, 0) for i in lhs.inputs + lhs.weights}
    remap_r = {Ref(i, 0): remap[by_name[rhs.nodes[i].name]] for i in rhs.inputs + rhs.weights}
    for i, n in enumerate(rhs.nodes):
        if n.name is None:
            out = b.add(n.op, [remap_r[r] for r in n.inputs], n.attr)
            remap_r.update({Ref(i, k): o for k, o in enumerate(out)})
    return b.build([remap[r] for r in lhs.outputs] + [remap_r[r] for r in rhs.outputs])


def _rename(g: Graph, names: dict[str, str]) -> Graph:
    b = GraphBuilder()
    remap: dict[Ref, Ref] = {}
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            t = n.types[0]
            new = names[n.name]
            r = b.input(new, t.shape, t.dtype) if n.op == "input" else b.weight(new, t.shape, g.data.get(n.name), t.dtype)
            remap[Ref(i, 0)] = r
        else:
            out = b.add(n.op, [remap[r] for r in n.inputs], n.attr)
            remap.update({Ref(i, k): o for k, o in enumerate(out)})
    return b.build([remap[r] for r in g.outputs])
