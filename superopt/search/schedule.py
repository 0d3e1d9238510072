"""The saturation's schedule classes: which rules grow the e-graph, which fold it and which merge
unrelated operators (see :mod:`superopt.search.saturate`), read off a rule's two sides and the
operator registry's cost facts (what runs a kernel, what is a view, what is a library call),
whether a growing rewrite pays at its match, and the saturation's limits."""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.model import constant_nodes
from ..ir.graph import Graph
from ..ir.ops import get_op
from ..ir.rule import Rule
from .errors import SearchError
from .ilp import NODES

__all__ = ["Limits", "DEFAULT_LIMITS", "grows", "grows_runs", "may_fold", "runs", "merges", "pays", "pointwise_only", "PAYS_US"]

#: how much cheaper than its left side a growing rewrite's right side must be to fold (a value's
#: worth: :data:`superopt.search.minimal.NEGLIGIBLE_US`)
PAYS_US = 0.01


@dataclass(frozen=True)
class Limits:
    """Bounds of the saturation and of the extraction; ``growth``: the generations growing
    rules may reach; ``merge_growth``: how much one merge round may grow the e-graph, as a
    fraction of its size (see :mod:`superopt.search.saturate`). The integer program stops at ``ilp_gap``
    or after ``ilp_nodes`` branch-and-bound nodes (the limit that decides, so the graph found
    does not depend on the machine's load); ``ilp_seconds`` is only a safety net, and the
    report's ``ilp_status`` says ``time limit`` where it bit."""

    iterations: int = 100
    nodes: int = 10000
    seconds: float = 20.0
    multi_rounds: int = 2
    matches_per_rule: int = 1000
    ban_matches: int = 100
    ban_iterations: int = 2
    ilp_seconds: float = 30.0
    ilp_gap: float = 0.01
    ilp_nodes: int = NODES
    growth: int = 1
    merge_growth: float = 1.0

    def check(self) -> None:
        for name in ("iterations", "nodes", "matches_per_rule", "ban_matches", "ban_iterations", "growth", "ilp_nodes"):
            if getattr(self, name) < 1:
                raise SearchError(f"the saturation's {name.replace('_', ' ')} limit must be at least 1, "
                                  f"got {getattr(self, name)}")
        if self.multi_rounds < 0:
            raise SearchError(f"multi-pattern rounds must be 0 or more, got {self.multi_rounds}")
        if not self.merge_growth > 0:
            raise SearchError(f"a merge round's growth must be positive, got {self.merge_growth}")
        if not 0 <= self.ilp_gap < 1:
            raise SearchError(f"the integer program's gap must be in [0, 1), got {self.ilp_gap}")
        for name in ("seconds", "ilp_seconds"):
            if not getattr(self, name) > 0:
                raise SearchError(f"the saturation's {name.replace('_', ' ')} limit must be positive, "
                                  f"got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()

def grows(rule: Rule, known: frozenset = frozenset()) -> bool:
    """Whether a rule grows the e-graph rather than folding it: its right side runs at least as
    many operators as its left and does away with no operator of the left (associativity,
    commutation, distribution, the reversal of a fusion); compile-time operators are not
    counted, nor operators on the rule's parameters alone (values that depend only on inputs of
    a lower rank than its largest: a rule stated with inputs where a model has weights, as the
    rules read off axioms are). A rule that does away with an operator (batch norm as a scale and
    a shift) moves towards a form without it, so it folds however many operators it writes.
    ``known``: names of the rule's inputs that a match binds to values known at compile time
    (a convolution's kernel scaled by a per-channel factor folds where the kernel is a weight)."""
    return grows_runs(runs(rule.lhs, known), runs(rule.rhs, known))


def grows_runs(lhs: list[str], rhs: list[str]) -> bool:
    return len(rhs) >= len(lhs) and set(lhs) <= set(rhs)


def may_fold(rule: Rule) -> bool:
    """Whether a growing rule folds at some match: with one input as data and the others
    bound to compile-time values."""
    names = [n.name for n in rule.lhs.nodes if n.name is not None and n.op != "weight"]
    return len(names) > 1 and any(not grows(rule, frozenset(names) - {v}) for v in names)


def runs(g: Graph, known: frozenset = frozenset()) -> list[str]:
    """The operators of ``g`` that run on its data (not computed at compile time, nor on its
    lower-rank parameters alone); inputs named in ``known`` count as compile-time."""
    const = constant_nodes(g)
    for i, n in enumerate(g.nodes):
        if n.name in known or (n.name is None and n.inputs and n.opdef.kind == "compute"
                               and all(r.node in const for r in n.inputs)):
            const.add(i)
    top = max((g.nodes[i].types[0].rank for i in g.inputs), default=0)
    data = set()
    for i, n in enumerate(g.nodes):
        if (i in g.inputs and n.types[0].rank == top) or any(r.node in data for r in n.inputs):
            data.add(i)
    return [n.op for i, n in enumerate(g.nodes) if n.name is None and i not in const and i in data
            and getattr(get_op(n.op).cost, "fusion", None) != "view"]  # a view (split) runs no kernel


def merges(rule: Rule, sides: tuple | None = None) -> bool:
    """A rule that runs fewer library operators (matmul, convolution) than it matches, none
    done away with: several merged into one through a concat (a merge by other means).
    ``sides``: the sides' :func:`runs`, where the caller has them."""
    ext = lambda ops: [o for o in ops if getattr(get_op(o).cost, "fusion", None) == "extern"]  # noqa: E731
    if sides is None:
        sides = runs(rule.lhs), runs(rule.rhs)
    lhs, rhs = ext(sides[0]), ext(sides[1])
    return len(rhs) >= 1 and len(lhs) > len(rhs) and set(lhs) == set(rhs)


def pointwise_only(pat) -> bool:
    """Every operator of the pattern fuses as a pointwise operator (registry cost facts)."""
    return all(getattr(get_op(pn.op).cost, "fusion", None) == "pointwise" for pn in pat.pnodes)


def pays(lhs_us: float, tpl, const: list[bool]) -> bool:
    """Whether a growing rewrite's right side (a template at the match's shapes, its nodes
    priced) runs cheaper than its left (``lhs_us``, what the matched operators cost) by more than
    :data:`PAYS_US`: ``maxpool(relu(x))`` as ``relu(maxpool(x))`` runs the ReLU on a quarter of
    the values. ``const``: which of the match's variables are known at compile time (the right
    side's nodes computed from those alone cost nothing). Such a rewrite moves towards a cheaper
    form, as a fold does: every step lowers the tree cost of what it rewrote, so a chain of them
    ends."""
    known: list[bool] = []
    total = 0.0
    for t in tpl.nodes:
        ins = [const[s[1]] if s[0] == "v" else known[s[1]] for s in t.inputs]
        k = t.constant or (bool(ins) and all(ins))
        known.append(k)
        if t.compute and not k:
            total += t.cost
    return total < lhs_us - PAYS_US
