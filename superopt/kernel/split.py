"""Split schedules: the loop dim cut into ``split`` chunks run by separate programs, then the
partial accumulators combined (split-K for few-row linears, flash-decoding for attention).

A :class:`~superopt.kernel.program.TileConfig` with ``split = S > 1`` runs a program in two
steps: ``S`` partial programs per grid tile, chunk ``c`` walking loop tiles
``[c·per, min((c+1)·per, T))`` (``T`` loop tiles, ``per = ceil(T/S)``: whole tiles, the last
chunk short or empty), each ending with its accumulators; then one combine per grid tile that
merges the ``S`` partials and runs the post-block. This is sound only where every accumulator
combines associatively across chunks; :func:`split_kind` decides it from the statements:

* ``sum``: init 0 and the update ``add acc v`` with ``v`` reading no accumulator: the value is a
  sum over loop tiles, and partial sums add (a reassociation of the sum);
* ``max``: a running max (a finite init <= -1e30, the update ``maximum acc t`` with ``t`` reading
  no accumulator): partials combine by max (associative);
* ``rescale`` (online softmax, the statement shapes :mod:`superopt.kernel.attention` emits): init
  0, the update ``add (mul acc alpha) x`` with ``alpha = exp (sub m m_new) scale=s`` (``m`` a
  ``max`` accumulator, ``m_new`` its update value) and ``x`` either ``sum P dim=LOOP`` or
  ``dot P' V`` (``P'`` = ``P`` or ``cast P``; ``V`` reading no accumulator), where
  ``P = exp (sub SC m_new) scale=s`` and ``SC`` reads no accumulator. By induction a chunk
  ends with ``acc_c = Σ_{its tiles} exp(s·(SC - m_c))·(...)``, so
  ``Σ_c acc_c·exp(s·(m_c - m))`` with ``m = max_c m_c`` is the unsplit accumulator exactly
  (an empty chunk has ``acc_c = 0``; a finite init keeps exp(s·(init - m)) from being NaN).

Anything else is refused with a :class:`KernelError` naming the accumulator and why.

In the field semantics (:mod:`superopt.kernel.semantics`) every max is the exact real 0, so
every rescale factor of the combine is exp(0) = 1 (an empty chunk's exp(s·(init - 0)) = 0
multiplies a partial that is 0): the combine is the plain sum of the partials, a
reassociation of the unsplit sum, exact in GF(p); the fingerprint is the same as unsplit.

>>> from superopt.kernel.program import parse_program, EXAMPLE, TileConfig
>>> p = parse_program(EXAMPLE)
>>> split_kind(p), chunks(p, TileConfig((("M", 16), ("N", 16), ("K", 16)), split=2))
({'acc': ('sum',)}, (3, 2))
"""

from __future__ import annotations

from .errors import KernelError
from .program import KernelProgram, Stmt, TileConfig

__all__ = ["split_kind", "chunks", "check_split", "needed_pre", "MAX_INIT"]

#: a running max must start at or below this (and finite) to be split
MAX_INIT = -1e30


class _Defs:
    """Body (and pre) definitions of a program, and which accumulators a value reads."""

    def __init__(self, p: KernelProgram):
        self.p = p
        self.accs = {a.name: a for a in p.accs}
        self.defs = {s.out: s for s in p.pre + p.body if s.out and s.op != "update"}
        self.updates = {s.out: s.args[0] for s in p.body if s.op == "update"}
        self._reads: dict[str, frozenset] = {}

    def stmt(self, v) -> Stmt | None:
        return self.defs.get(v) if isinstance(v, str) else None

    def reads(self, v) -> frozenset:
        """The accumulators ``v`` reads, transitively through the body."""
        if not isinstance(v, str):
            return frozenset()
        if v in self.accs:
            return frozenset((v,))
        if v not in self._reads:
            s = self.defs.get(v)
            self._reads[v] = frozenset().union(*(self.reads(a) for a in s.args)) if s else frozenset()
        return self._reads[v]

    def other(self, s: Stmt, acc: str):
        """The operand of a binary ``s`` that is not ``acc`` (None if neither is exactly it)."""
        if len(s.args) == 2 and s.args[0] == acc:
            return s.args[1]
        if len(s.args) == 2 and s.args[1] == acc:
            return s.args[0]
        return None


def _fail(p: KernelProgram, acc: str, why: str):
    raise KernelError(f"kernel {p.name}: cannot split loop {p.loop!r}: accumulator {acc!r} {why}")


def _max_kind(d: _Defs, name: str):
    acc, u = d.accs[name], d.stmt(d.updates[name])
    if u is None or u.op != "maximum":
        return None
    t = d.other(u, name)
    if t is None or d.reads(t):
        _fail(d.p, name, "is a maximum of a value that reads an accumulator")
    if not (acc.init <= MAX_INIT and acc.init > float("-inf")):
        _fail(d.p, name, f"is a running max that starts at {acc.init}; start it at a finite value <= {MAX_INIT}")
    return ("max",)


def _exp_of_shift(d: _Defs, v, left, right) -> float | None:
    """The scale s if ``v`` is ``exp (sub left right) scale=s`` (left None: any accumulator-free
    value), else None."""
    e = d.stmt(v)
    if e is None or e.op != "exp":
        return None
    sub = d.stmt(e.args[0])
    if sub is None or sub.op != "sub" or sub.args[1] != right:
        return None
    if left is None and d.reads(sub.args[0]) or left is not None and sub.args[0] != left:
        return None
    return float(e.attr("scale", 1.0))


def _rescaled_term(d: _Defs, x, mnew: str) -> float | None:
    """The scale of P if ``x`` is ``sum P dim=LOOP`` or ``dot P' V`` (see the module docstring)."""
    s = d.stmt(x)
    if s is None:
        return None
    if s.op == "sum" and s.attr("dim") == d.p.loop:
        return _exp_of_shift(d, s.args[0], None, mnew)
    if s.op == "dot" and not d.reads(s.args[1]):
        pv = d.stmt(s.args[0])
        src = pv.args[0] if pv is not None and pv.op == "cast" else s.args[0]
        return _exp_of_shift(d, src, None, mnew)
    return None


def _rescale_kind(d: _Defs, name: str, maxes: dict):
    u = d.stmt(d.updates[name])
    if u is None or u.op != "add":
        _fail(d.p, name, "is not updated by 'add'")
    for scaled, x in ((u.args[0], u.args[1]), (u.args[1], u.args[0])):
        mul = d.stmt(scaled)
        if mul is None or mul.op != "mul" or d.other(mul, name) is None:
            continue
        alpha = d.other(mul, name)
        for m in maxes:
            mnew = d.updates[m]
            s = _exp_of_shift(d, alpha, m, mnew)
            if s is None:
                continue
            if _rescaled_term(d, x, mnew) != s:
                _fail(d.p, name, f"is rescaled by exp({s:g}·({m} - new max)) but what it adds is not a sum or "
                                 f"product of exp({s:g}·(scores - new max)) (the online-softmax shape)")
            return ("rescale", m, s)
        _fail(d.p, name, "is multiplied by a factor that is not exp(scale·(m_old - m_new)) of a running max")
    _fail(d.p, name, "adds a value that reads an accumulator (neither a plain sum nor the online-softmax rescale)")


def split_kind(program: KernelProgram) -> dict[str, tuple]:
    """How each accumulator combines across chunks: ``("sum",)``, ``("max",)`` or
    ``("rescale", max_acc, scale)``; raises :class:`KernelError` where a split is unsound."""
    p = program
    if p.loop is None:
        raise KernelError(f"kernel {p.name}: has no loop to split; use split=1")
    stores = [blk for blk, s in p.statements() if s.op == "store" and blk != "post"]
    if stores:
        raise KernelError(f"kernel {p.name}: cannot split loop {p.loop!r}: a store in the {stores[0]} block would "
                          f"run once per chunk; store after the loop")
    d = _Defs(p)
    kinds: dict[str, tuple] = {}
    for a in p.accs:
        k = _max_kind(d, a.name)
        if k:
            kinds[a.name] = k
    maxes = dict(kinds)
    for a in p.accs:
        if a.name in kinds:
            continue
        u = d.stmt(d.updates[a.name])
        v = d.other(u, a.name) if u is not None and u.op == "add" else None
        if v is not None and not d.reads(v):
            if a.init != 0:
                _fail(p, a.name, f"is a sum that starts at {a.init}, not 0 (each chunk would add it once)")
            kinds[a.name] = ("sum",)
        else:
            if a.init != 0:
                _fail(p, a.name, f"starts at {a.init}, not 0")
            kinds[a.name] = _rescale_kind(d, a.name, maxes)
    return kinds


def chunks(program: KernelProgram, config: TileConfig) -> tuple[int, int]:
    """(loop tiles T, tiles per chunk) of ``config``'s split of ``program``'s loop."""
    n, b = program.dim_sizes[program.loop], config.block(program.loop)
    t = -(-n // b)
    return t, -(-t // max(1, config.split))


def check_split(program: KernelProgram, config: TileConfig) -> dict[str, tuple] | None:
    """The combine plan of ``config`` (None for split = 1); raises where a split is unsound."""
    if config.split == 1:
        return None
    return split_kind(program)


def needed_pre(program: KernelProgram, stmts) -> tuple[Stmt, ...]:
    """The pre statements that ``stmts`` need (directly or through other pre statements): each
    kernel of a split runs only the part of the pre-block it uses."""
    need = {a for s in stmts for a in s.args if isinstance(a, str)}
    keep = []
    for s in reversed(program.pre):
        if s.out in need:
            keep.append(s)
            need.update(a for a in s.args if isinstance(a, str))
    return tuple(reversed(keep))
