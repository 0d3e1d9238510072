"""Proving one rule: instantiate the axioms on the rule's typed e-graph, then ask Z3.

The loop runs in rounds: find every match of every usable axiom direction on the current
e-graph (an axiom whose pattern uses an operator absent from the graph is not even tried, so
each proof sees only the axioms its operators can use, plus those that the instances bring
in), apply the new ones, restore congruence. It stops when both sides of every output are in
one class, when nothing new appears (saturated: at these shapes the axioms do not imply the
rule), or at a limit (rounds, e-nodes, time). Z3 then decides ``lhs != rhs`` from the tracked
instances; its minimized unsat core is the list of axioms used.

>>> from superopt.axioms import parse_axioms
>>> from superopt.ir import GraphBuilder, Rule
>>> theory = Theory(parse_axioms("axiom add_comm: add(x, y) == add(y, x)"))
>>> def side(swap):
...     b = GraphBuilder(); x, y = b.input("x", (2,)), b.input("y", (2,))
...     return b.build([b.op("add", *((y, x) if swap else (x, y)))])
>>> out = prove(Rule(side(False), side(True)), theory, timeout_s=5)
>>> out.answer, out.axioms
('unsat', ('add_comm',))
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..axioms.terms import Axiom
from ..ir.graph import Graph
from ..ir.rule import Rule
from ..pattern.egraph import EGraph
from .patterns import Direction, directions_of, instantiate, match, term_of
from .z3enc import Z3Encoding, Z3Terms, decide

__all__ = ["Limits", "Theory", "ProofOutcome", "prove"]

_ENCODING: Z3Encoding | None = None


def _encoding() -> Z3Encoding:
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = Z3Encoding()
    return _ENCODING


@dataclass(frozen=True)
class Limits:
    """Bounds of the instantiation: rounds of matching and e-nodes in the graph."""
    rounds: int = 8
    nodes: int = 5000


class Theory:
    """A list of axioms compiled to usable directions, indexed by the operator at the root."""

    def __init__(self, axioms):
        self.axioms: list[Axiom] = list(axioms)
        self.directions: list[Direction] = []
        self.unusable: dict[str, list[str]] = {}
        for ax in self.axioms:
            ds, why = directions_of(ax)
            self.directions.extend(ds)
            if why:
                self.unusable[ax.name] = why
        self.by_root: dict[str, list[int]] = {}
        self.expansions: list[int] = []
        for i, d in enumerate(self.directions):
            if d.expansion and d.trigger is None:
                self.expansions.append(i)
            else:
                self.by_root.setdefault(d.matched.op, []).append(i)

    def matches(self, eg: EGraph):
        """``(direction index, root class, tensor env, attribute env)`` for every match."""
        for op, idx in self.by_root.items():
            if op not in eg.by_op:
                continue
            roots = eg.classes_with(op)
            for i in idx:
                d = self.directions[i]
                if not eg.has_ops(d.ops):
                    continue
                for root, tenv, aenv in match(eg, d, roots):
                    yield i, (root if d.trigger is None else eg.find(tenv[d.pattern.name])), tenv, aenv


@dataclass
class ProofOutcome:
    """``answer`` is unsat (proven), sat, unknown or timeout; ``stop`` why instantiation ended."""
    answer: str
    axioms: tuple[str, ...]
    stop: str
    rounds: int = 0
    nodes: int = 0
    instances: int = 0
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        stats = f"{self.rounds} rounds, {self.nodes} e-nodes, {self.instances} axiom instances"
        if self.answer == "unsat":
            return f"unsat ({stats})"
        if self.answer == "sat":
            return f"sat: the axioms, instantiated to saturation at these shapes, do not imply it ({stats})"
        if self.answer == "unknown":
            return f"unknown: no proof within the {self.stop} ({stats})"
        return f"timeout: no proof after {self.seconds:.2f} s ({stats})"


def _insert(eg: EGraph, g: Graph) -> list[int]:
    """Add a graph's nodes (opaque calls hash-consed like the others); its outputs' classes."""
    cls: dict[tuple[int, int], int] = {}
    for i, n in enumerate(g.nodes):
        outs = eg.add_app(n.op, n.attrs, [cls[(r.node, r.index)] for r in n.inputs], n.types)
        cls.update({(i, k): c for k, c in enumerate(outs)})
    return [cls[(r.node, r.index)] for r in g.outputs]


class _Search:
    """The state of one proof's instantiation."""

    def __init__(self, rule: Rule, theory: Theory, deadline: float, limits: Limits):
        self.theory, self.deadline, self.limits = theory, deadline, limits
        self.terms = Z3Terms(_encoding())
        self.eg = EGraph([self.terms])  # the one e-graph, with the Z3 terms as its analysis
        self.left = _insert(self.eg, rule.lhs)
        self.right = _insert(self.eg, rule.rhs)
        self.instances: list = []
        self.applied: set = set()
        self.rounds = 0
        self.expanded = not theory.expansions

    def _expand(self) -> None:
        """Apply the expansions (bare-variable patterns) to the rule's outputs: enough for
        the proofs that need them (``x = transpose(transpose(x))`` to move a transpose through
        a whole side) while keeping the graph small."""
        eg, th = self.eg, self.theory
        for c in dict.fromkeys(self.left + self.right):
            for i in th.expansions:
                d = th.directions[i]
                self._apply(i, c, {d.pattern.name: c}, {})
        eg.rebuild()
        self.expanded = True

    def _apply(self, i: int, root: int, tenv: dict, aenv: dict) -> None:
        """Apply one match; keep it as an instance only if it merged two classes (any other
        instance is implied by the kept ones and congruence)."""
        found = instantiate(self.eg, self.theory.directions[i], root, tenv, aenv)
        if found is not None and self.eg.union(root, found[0]):
            self.instances.append((i, tenv, found[1]))

    def z3_instances(self) -> list:
        """``(axiom name, left term, right term)`` of every kept instance."""
        out = []
        for i, tenv, env in self.instances:
            d = self.theory.directions[i]
            out.append((d.name, term_of(self.eg, self.terms, d.pattern, tenv, env),
                        term_of(self.eg, self.terms, d.build, tenv, env)))
        return out

    def done(self) -> bool:
        f = self.eg.find
        return all(f(a) == f(b) for a, b in zip(self.left, self.right))

    def run(self) -> str:
        """Instantiate until proven or stopped; returns the stop reason. The expansions
        come in only once the other directions saturate: few proofs need them, and the
        terms they add make every later round larger."""
        eg = self.eg
        for self.rounds in range(1, self.limits.rounds + 1):
            version = eg.version
            stop = self._round()
            eg.rebuild()
            if stop or self.done():
                return stop or "proof"
            if eg.version == version:
                if self.expanded:
                    return "saturated"
                self._expand()
                if self.done():
                    return "proof"
        return "round limit"

    def _round(self) -> str:
        eg, f = self.eg, self.eg.find
        found = []
        for k, m in enumerate(self.theory.matches(eg)):  # all matches first: applying changes eg
            if k % 512 == 511 and time.perf_counter() > self.deadline:
                return "time limit"
            found.append(m)
        for i, root, tenv, aenv in found:
            key = (i, tuple(sorted((v, f(c)) for v, c in tenv.items())), tuple(sorted(aenv.items())))
            if key in self.applied:
                continue
            self.applied.add(key)
            if time.perf_counter() > self.deadline:
                return "time limit"
            self._apply(i, root, tenv, aenv)
            if len(eg) > self.limits.nodes:
                return "e-node limit"
            if self.done():
                return ""
        return ""


def prove(rule: Rule, theory: Theory, timeout_s: float = 5.0, limits: Limits = Limits()) -> ProofOutcome:
    """Try to prove ``rule`` from ``theory`` within ``timeout_s`` seconds.

    Z3 judges every proof. When the instantiation did not join the two sides, Z3 is not asked:
    the e-graph itself is then a model of the instances in which the sides differ (what Z3's
    congruence closure would find), so the answer is sat, or unknown/timeout at a limit.
    """
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    search = _Search(rule, theory, deadline, limits)
    stop = search.run()
    eg = search.eg
    if not search.done():
        answer = {"time limit": "timeout", "saturated": "sat"}.get(stop, "unknown")
        return ProofOutcome(answer, (), stop, search.rounds, len(eg), len(search.instances),
                            time.perf_counter() - t0)
    goals = [(search.terms.term(a), search.terms.term(b)) for a, b in zip(search.left, search.right)]
    left_s = max(0.05, deadline - time.perf_counter())
    dec = decide(search.terms.enc, search.z3_instances(), goals, left_s)
    if dec.answer == "sat":
        raise AssertionError(f"the e-graph joined the sides of {rule.text()} but Z3 finds them different")
    return ProofOutcome(dec.answer, dec.axioms, stop, search.rounds, len(eg), len(search.instances),
                        time.perf_counter() - t0)
