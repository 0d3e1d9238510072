"""The extraction problem of an e-graph: the classes the roots need, their candidate e-nodes,
each operator application's cost, and the cycles of the e-graph and of a choice.

A *choice* maps classes to one e-node each; the graph it stands for is built by
:func:`superopt.search.extract.build_graph`, and exists only if the choice is acyclic.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from typing import Sequence

from ..cost.model import CostModel
from ..pattern.egraph import EGraph, ENode, real_attrs, scc_ranks

__all__ = ["Problem", "cyclic_edges", "on_cycles", "postorder"]


class Problem:
    """The candidate e-nodes of each reachable class and the cost of each application."""

    def __init__(self, eg: EGraph, roots: Sequence[int], cost: CostModel):
        self.eg = eg
        self.roots = [eg.find(r) for r in roots]
        self.classes = eg.reachable(self.roots)
        self.cands: dict[int, list[ENode]] = {}
        self.app_cost: dict[tuple, float] = {}
        self._graph = self._cyclic = None
        for c in self.classes:
            nodes = eg.nodes[c]
            if eg.const[c]:
                nodes = [e for e in nodes if self._const(e)]
            self.cands[c] = nodes
            for e in nodes:
                if e.app not in self.app_cost:
                    self.app_cost[e.app] = self._price(e, cost)

    def class_graph(self) -> tuple[dict[int, list[int]], dict[int, int]]:
        """The classes the candidates of each class use (sorted) and each class's strongly
        connected part (:func:`scc_ranks`: the parts a class uses ranked first), made once until
        the candidates change (:meth:`changed`): the cycle filter and the local searches each
        walked it anew (NASNet-A: 0.04 s a time)."""
        if self._graph is None:
            kid = self.kid_classes
            succ = {c: sorted({k for e in self.cands[c] for k in kid[e]}) for c in self.classes}
            self._graph = succ, scc_ranks(self.classes, succ)
        return self._graph

    def changed(self) -> None:
        """Forget what was derived from the candidates (after they were filtered)."""
        self._graph = self._cyclic = None

    @cached_property
    def kid_classes(self) -> dict[ENode, set[int]]:
        """The classes each candidate e-node uses (shared by the local searches and the costs of
        picks; an e-node of a pick that is not a candidate is added where it is first met)."""
        find = self.eg.find
        return {e: {find(k) for k in e.kids} for c in self.classes for e in self.cands[c]}

    @cached_property
    def app_numbers(self) -> tuple[dict[tuple, int], list[float]]:
        """A number per application, and each one's cost by number (read when first asked
        for: a caller that reprices ``app_cost`` does it before)."""
        number = {app: i for i, app in enumerate(self.app_cost)}
        return number, list(self.app_cost.values())

    def _const(self, e: ENode) -> bool:
        return e.op == "weight" or self.eg._node_const(e)

    def _price(self, e: ENode, cost: CostModel) -> float:
        if e.op in ("input", "weight") or self._const(e):
            return 0.0
        return cost.node_time(e.op, real_attrs(e.attrs), [self.eg.types[self.eg.find(k)] for k in e.kids], e.types)


def on_cycles(p: Problem, choice: dict[int, ENode]) -> set[int]:
    """The classes on a cycle of ``choice`` among those the roots need (empty: acyclic)."""
    eg = p.eg
    need, stack = set(), list(p.roots)
    while stack:
        c = stack.pop()
        if c not in need:
            need.add(c)
            stack.extend(eg.find(k) for k in choice[c].kids)
    succ = {c: sorted({eg.find(k) for k in choice[c].kids}) for c in need}
    comp = scc_ranks(sorted(need), succ)
    sizes = Counter(comp.values())
    return {c for c in need if sizes[comp[c]] > 1 or c in succ[c]}


def cyclic_edges(p: Problem) -> set[tuple[int, int]]:
    """Class edges (user, used) inside a strongly connected component: only these can close a
    cycle."""
    if p._cyclic is None:
        succ, comp = p.class_graph()
        p._cyclic = {(c, d) for c in p.classes for d in succ[c] if c != d and comp[c] == comp[d]}
    return p._cyclic


def postorder(eg: EGraph, choice: dict, roots, done=()) -> list[int]:
    """The chosen classes the roots need, each after its children (depth first, no recursion),
    leaving out ``done`` (classes already built); raises AssertionError where ``choice`` has a
    cycle (extraction never picks one; :mod:`superopt.search.minimal` tries switches that may)."""
    order, state = [], dict.fromkeys(done, 2)  # 1: on the path, 2: finished
    find, get = eg.find, state.get
    for root in roots:
        stack = [(find(root), False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                order.append(c)
                continue
            s = get(c)
            if s == 2:
                continue
            if s == 1:
                raise AssertionError("the extraction chose a cycle")  # internal invariant
            state[c] = 1
            stack.append((c, True))
            for k in choice[c].kids:
                k = find(k)
                if get(k) != 2:
                    stack.append((k, False))
    return order
