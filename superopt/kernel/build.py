"""Building kernel programs statement by statement, with the abstract expression of each.

The generator's translators emit statements through a :class:`ProgramBuilder`. Every statement
carries an *abstract expression* (a term string over the region's operators, as
:func:`term` spells it); the builder checks each against the target's subexpressions as it is
emitted, and a statement computing anything else prunes the partial program there (Mirage's
pruning: a partial program is kept only if what it computes is a subexpression of the
(rewritten) target). A value accumulated over the loop is ``partial(e)`` inside the body; only
``acc + partial(e)`` into an accumulator that starts at 0 makes ``e`` after the loop.
"""

from __future__ import annotations

from fractions import Fraction

from .program import Acc, Axis, KernelProgram, Stmt, Tensor
from .textform import fmt_num

__all__ = ["term", "target_set", "Pruned", "ProgramBuilder", "COMMUTATIVE"]

COMMUTATIVE = frozenset({"add", "mul", "maximum"})


def term(op: str, *args) -> str:
    """The abstract expression ``op(args)``; commutative operators sort their arguments.

    >>> term("mul", "x", "g") == term("mul", "g", "x")
    True
    """
    parts = [a if isinstance(a, str) else fmt_num(a) for a in args]
    if op in COMMUTATIVE:
        parts.sort()
    return f"{op}({','.join(parts)})"


def _subterms(t: str, acc: set):
    acc.add(t)
    depth, start = 0, t.find("(")
    if start < 0:
        return
    for j in range(start + 1, len(t) - 1):
        if t[j] == "(":
            depth += 1
        elif t[j] == ")":
            depth -= 1
        elif t[j] == "," and depth == 0:
            _subterms(t[start + 1:j], acc)
            start = j
    _subterms(t[start + 1:-1], acc)


def target_set(terms) -> set[str]:
    """Every subexpression of the given terms."""
    acc: set[str] = set()
    for t in terms:
        _subterms(t, acc)
    return acc


def _split_args(inner: str) -> list[str]:
    out, depth, start = [], 0, 0
    for j, ch in enumerate(inner):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(inner[start:j])
            start = j + 1
    return out + [inner[start:]]


def canonical(t: str) -> str:
    """``t`` with the arguments of every commutative operator sorted again (after a rewrite)."""
    i = t.find("(")
    if i < 0:
        return t
    op, args = t[:i], [canonical(a) for a in _split_args(t[i + 1:-1])]
    return f"{op}({','.join(sorted(args) if op in COMMUTATIVE else args)})"


class Pruned(Exception):
    """A partial program computes something that is not a subexpression of the target."""


class ProgramBuilder:
    """Collects dims, tensors and statements; ``target`` is the set of allowed expressions."""

    def __init__(self, name: str, target: set[str]):
        self.name, self.target = name, target
        self.dims: dict[str, int] = {}
        self.inputs: dict[str, Tensor] = {}
        self.outputs: list[Tensor] = []
        self.grid: list[tuple[str, bool]] = []
        self.loop: str | None = None
        self.accs: list[Acc] = []
        self.blocks = {"pre": [], "body": [], "post": []}
        self.terms: dict[str, str] = {}
        self.memo: dict[tuple, str] = {}
        self.count = 0
        self.rewrites: list[tuple[str, str]] = []

    def rewrite(self, new: str, old: str):
        """A move replaced the target's subexpression ``old`` by the equal ``new`` (an identity)."""
        self.rewrites.append((new, old))
        self.target |= target_set([new])

    def dim(self, name: str, size: int) -> str:
        self.dims[name] = size
        return name

    def fresh(self, stem: str = "t") -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def original(self, t: str) -> str:
        """``t`` with the moves' rewrites undone: the target's spelling of the same value."""
        for new, old in reversed(self.rewrites):
            if new in t:
                t = canonical(t.replace(new, old))
        return t

    def check(self, t: str, what: str):
        t = self.original(t)
        if t not in self.target and not t.startswith("partial(") and t != "shift":
            raise Pruned(f"{what} computes {t}, not a subexpression of the target")

    def emit(self, block: str, op: str, args=(), attrs=(), t: str | None = None, tensor: str = "",
             index=(), stem: str = "t") -> str:
        """Append ``name = op args`` to ``block`` (reusing an identical earlier statement)."""
        key = (block, op, tuple(args), tuple(attrs), tensor, tuple(index))
        if key in self.memo:
            return self.memo[key]
        out = self.fresh(stem)
        if t is not None:
            self.check(t, f"{block} statement {out} = {op}")
            self.terms[out] = t
        self.blocks[block].append(Stmt(out, op, tuple(args), tuple(sorted(attrs)), tensor, tuple(index)))
        self.memo[key] = out
        return out

    def load(self, block: str, tensor: str, dtype: str, shape: tuple, index: tuple, t: str) -> str:
        if tensor not in self.inputs:
            self.inputs[tensor] = Tensor(tensor, dtype, tuple(shape))
        idx = tuple(Axis.parse(a) if isinstance(a, str) else a for a in index)
        return self.emit(block, "load", (), (), t, tensor, idx, stem=tensor.replace(".", "_") + "_")

    def acc(self, name: str, dims: tuple, init: float = 0.0) -> str:
        self.accs.append(Acc(name, tuple(dims), float(init)))
        return name

    def update(self, acc: str, value: str):
        self.blocks["body"].append(Stmt(acc, "update", (value,)))

    def store(self, block: str, tensor: str, dtype: str, shape: tuple, index: tuple, value: str):
        if tensor not in [o.name for o in self.outputs]:
            self.outputs.append(Tensor(tensor, dtype, tuple(shape)))
        idx = tuple(Axis.parse(a) for a in index)
        self.blocks[block].append(Stmt("", "store", (value,), (), tensor, idx))

    def build(self) -> KernelProgram:
        return KernelProgram(self.name, tuple(self.dims.items()), tuple(self.inputs.values()), tuple(self.outputs),
                             tuple(self.grid), self.loop, tuple(self.accs), tuple(self.blocks["pre"]),
                             tuple(self.blocks["body"]), tuple(self.blocks["post"]))


def frac(n: int) -> Fraction:
    return Fraction(1, n)
