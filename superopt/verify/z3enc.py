"""Graphs as Z3 terms, and the decision of ``lhs != rhs`` from tracked axiom instances.

Tensors are values of one uninterpreted sort ``Tensor``. Output ``k`` of an operator is an
uninterpreted function ``op_k(attribute ints..., tensors...) -> Tensor``: tuple attributes are
flattened to their items (the function's name records the tuple lengths), and attributes that
are not integers (activation names, eps, opaque targets) become integer codes. Sources are
constants named after the source. Nothing here knows any operator: adding one needs no change.

Each axiom has a tracking literal ``axiom:NAME``; an instance is asserted as
``axiom:NAME => l == r``, the negated goal is asserted plainly, and the check runs under the
assumption of every tracking literal, so the unsat core names the axioms a proof used.

>>> enc = Z3Encoding()
>>> x = enc.source("input", "x")
>>> str(enc.apply("transpose", 0, (("perm", (1, 0)),), [x]))
'transpose_0[2](1, 0, input:x)'
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import z3
from z3 import z3core

__all__ = ["Z3Encoding", "Z3Terms", "Decision", "decide"]

_CODE_BASE = 10 ** 9  # codes of non-integer attribute values; no integer attribute gets near it


class Z3Encoding:
    """Declarations shared by every proof in one process (Z3 hash-conses the terms)."""

    def __init__(self, ctx: z3.Context | None = None):
        self.ctx = ctx or z3.main_ctx()
        self.tensor = z3.DeclareSort("Tensor", self.ctx)
        self._funcs: dict[tuple, z3.FuncDeclRef] = {}
        self._codes: dict[Any, int] = {}
        self._tracks: dict[str, z3.BoolRef] = {}
        self._ints: dict[int, z3.ArithRef] = {}
        self._solver: z3.Solver | None = None

    def code(self, value) -> int:
        """A stable integer for a non-integer attribute value (within this process)."""
        key = (type(value).__name__, repr(value))
        if key not in self._codes:
            self._codes[key] = _CODE_BASE + len(self._codes)
        return self._codes[key]

    def flatten(self, value) -> tuple[tuple[int, ...], int]:
        """``(ints, shape)``: a tuple attribute gives its items and its length, a scalar -1."""
        if isinstance(value, tuple):
            items = [v if isinstance(v, int) and not isinstance(v, bool) else self.code(v) for v in value]
            return tuple(items), len(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,), -1
        return (self.code(value),), -1

    def func(self, op: str, index: int, shape: tuple, n_inputs: int) -> z3.FuncDeclRef:
        key = (op, index, shape, n_inputs)
        f = self._funcs.get(key)
        if f is None:
            lens = "x".join(str(s) for s in shape if s >= 0)
            name = f"{op}_{index}" + (f"[{lens}]" if lens else "") + (f"/{n_inputs}" if n_inputs > 2 else "")
            n_ints = sum(1 if s < 0 else s for s in shape)
            sig = [z3.IntSort(self.ctx)] * n_ints + [self.tensor] * n_inputs + [self.tensor]
            f = self._funcs[key] = z3.Function(name, *sig)
        return f

    def source(self, op: str, name: str) -> z3.ExprRef:
        return z3.Const(f"{op}:{name}", self.tensor)

    def apply(self, op: str, index: int, attrs: Sequence[tuple[str, Any]], args: Sequence[z3.ExprRef]) -> z3.ExprRef:
        """The term for output ``index`` of ``op`` with normalized ``attrs`` on ``args``."""
        ints, shape = [], []
        for _, v in attrs:
            items, s = self.flatten(v)
            ints.extend(items)
            shape.append(s)
        f = self.func(op, index, tuple(shape), len(args))
        return self._app(f, [self._int(i) for i in ints] + list(args))

    def _int(self, i: int) -> z3.ArithRef:
        v = self._ints.get(i)
        if v is None:
            v = self._ints[i] = z3.IntVal(i, self.ctx)
        return v

    def _app(self, f: z3.FuncDeclRef, args: list) -> z3.ExprRef:
        """``f(*args)`` without the Python API's per-argument checks (the sorts are right by
        construction); ten times faster, which matters for proofs with many instances."""
        n = len(args)
        arr = (z3.Ast * n)()
        for i, a in enumerate(args):
            arr[i] = a.as_ast()
        return z3.ExprRef(z3core.Z3_mk_app(self.ctx.ref(), f.as_ast(), n, arr), self.ctx)

    def implies_eq(self, guard: z3.BoolRef, left: z3.ExprRef, right: z3.ExprRef) -> z3.BoolRef:
        """``guard => left == right``, through the low-level API like :meth:`_app`."""
        ref = self.ctx.ref()
        eq = z3core.Z3_mk_eq(ref, left.as_ast(), right.as_ast())
        return z3.BoolRef(z3core.Z3_mk_implies(ref, guard.as_ast(), eq), self.ctx)

    def solver(self) -> z3.Solver:
        """The solver every decision of this encoding uses (in its own push/pop scope)."""
        if self._solver is None:
            self._solver = z3.SolverFor("QF_UFLIA", ctx=self.ctx)
        return self._solver

    def track(self, axiom: str) -> z3.BoolRef:
        b = self._tracks.get(axiom)
        if b is None:
            b = self._tracks[axiom] = z3.Bool(f"axiom:{axiom}", self.ctx)
        return b



class Z3Terms:
    """The verifier's analysis of the one e-graph (:mod:`superopt.pattern.egraph`): the Z3 term
    of each class, the one of the e-node it was created with. Every equality the e-graph knows is
    then one Z3 can re-derive from the asserted instances; terms are built lazily (only those a
    proof's instances and goals mention).

    >>> from superopt.ir import TensorType
    >>> from superopt.pattern.egraph import EGraph, ENode
    >>> terms = Z3Terms(Z3Encoding()); eg = EGraph([terms])
    >>> x = eg.add(ENode("input", (("name", "x"),), (), 0, (TensorType((2, 3)),)))
    >>> str(terms.term(eg.add_term("transpose", 0, (("perm", (1, 0)),), [x])))
    'transpose_0[2](1, 0, input:x)'
    """

    repairs = False  # the e-graph need not call :meth:`repair`

    def __init__(self, enc: Z3Encoding):
        self.enc = enc
        self._created: dict[int, tuple] = {}
        self._terms: dict[int, object] = {}

    def make(self, eg, c: int, e) -> None:
        self._created[c] = e

    def join(self, eg, a: int, b: int) -> None:
        pass  # a class keeps its own term: the members of a class are provably equal

    def repair(self, eg, c: int, e) -> bool:
        return False

    def term(self, c: int):
        """The Z3 term class ``c`` was created with (children first, without recursion: chains
        of classes can be thousands deep)."""
        terms, stack = self._terms, [c]
        while stack:
            top = stack[-1]
            if top in terms:
                stack.pop()
                continue
            e = self._created[top]
            missing = [k for k in e.kids if k not in terms]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            terms[top] = (self.enc.source(e.op, dict(e.attrs)["name"]) if e.op in ("input", "weight")
                          else self.enc.apply(e.op, e.k, e.attrs, [terms[k] for k in e.kids]))
        return terms[c]

@dataclass
class Decision:
    """Z3's answer: ``sat``, ``unsat`` or ``unknown``/``timeout``, and the axioms of the core."""
    answer: str
    axioms: tuple[str, ...] = ()
    seconds: float = 0.0


def decide(enc: Z3Encoding, instances: Sequence[tuple[str, z3.ExprRef, z3.ExprRef]],
           goals: Sequence[tuple[z3.ExprRef, z3.ExprRef]], timeout_s: float, minimize: bool = True) -> Decision:
    """Is ``OR(l != r for goals)`` unsat under the instances? The core is made minimal by
    dropping one axiom at a time (each check is a small ground problem). One solver per
    encoding is reused inside a push/pop scope: creating a solver costs more than a check."""
    t0 = time.perf_counter()
    s = enc.solver()
    s.push()
    try:
        s.set("timeout", max(1, int(timeout_s * 1000)))
        names = sorted({a for a, _, _ in instances})
        ref = enc.ctx.ref()
        for axiom, left, right in instances:
            z3core.Z3_solver_assert(ref, s.solver, enc.implies_eq(enc.track(axiom), left, right).as_ast())
        s.add(z3.Or([left != right for left, right in goals]) if len(goals) > 1 else goals[0][0] != goals[0][1])
        answer = s.check(*[enc.track(a) for a in names])
        if answer != z3.unsat:
            reason = s.reason_unknown() if answer == z3.unknown else ""
            word = "timeout" if "timeout" in reason or "canceled" in reason else str(answer)
            return Decision(word, (), time.perf_counter() - t0)
        core = _names(s.unsat_core())
        if minimize and len(core) > 1:
            core = _minimize(enc, s, core, t0 + timeout_s)
        return Decision("unsat", tuple(core), time.perf_counter() - t0)
    finally:
        s.pop()


def _names(core) -> list[str]:
    return sorted(str(b).split(":", 1)[1] for b in core)


def _minimize(enc: Z3Encoding, s: z3.Solver, core: list[str], deadline: float) -> list[str]:
    needed = list(core)
    for name in core:
        if name not in needed:
            continue
        if time.perf_counter() > deadline:
            break
        trial = [a for a in needed if a != name]
        if s.check(*[enc.track(a) for a in trial]) == z3.unsat:
            needed = _names(s.unsat_core())
    return needed
