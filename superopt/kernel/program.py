"""The kernel program: one fused GPU kernel over a small subgraph (Mirage's block level).

A :class:`KernelProgram` has concrete **dims** (named sizes), named global **inputs** and
**outputs** (dtype and shape), a **grid** (the dims whose tiles map to program ids: ``M`` is
tiled by ``BLOCK_M``, ``B:1`` gives one program per index and no tile axis), at most one
**loop** dim walked tile by tile, **accumulators** (initial value, updated once per loop
iteration), and three statement blocks: ``pre`` (before the loop), ``body`` (in it), ``post``.
Dims in neither grid nor loop are *full*: one tile covers them (padded to a power of two).

A statement computes one tile value; a tile's axes are dim names. Operators:

* ``load T[ix, ...]`` (one index per axis of T: ``K``, ``K+32`` (offset), ``H/4`` (GQA: the
  head index divided by 4), ``0`` (a constant index); ``mask=0`` drops the edge mask),
  ``store T[ix, ...] v``; ``dot a b`` (``a[X,K] @ b[K,Y]``, float32 accumulation); ``trans a``;
* elementwise ``add sub mul div maximum`` (operands broadcast by dim name: one operand's dims
  are a subsequence of the other's), ``exp`` (``scale=s``: exp(s·x)), ``rsqrt`` (``eps=e``:
  1/sqrt(x+e)), ``neg relu sigmoid tanh gelu gelu_tanh silu``, ``pow exponent=c``,
  ``cast dtype=bf16``; ``addmask s m scale=c`` (an attention's additive mask on scores that
  ``exp scale=c`` will scale: s + m/c, see ``semantics``);
* row reductions ``sum v dim=K`` and ``max v dim=K`` (padding never counts);
  ``causal v q=M k=S`` (-inf where key index > query index);
* ``update acc v`` (body only): the accumulator's value for the next iteration. An accumulator
  over the loop dim (a *lane accumulator*: initial value 0, each lane of the loop tile summed
  separately) is read after the loop only by ``sum acc dim=LOOP``; its loop blocks divide the dim.

Operands are value names or numbers (``0.5``, ``1e-06``, or exact fractions ``1/40``).
Tile sizes, warps and stages are not part of a program: they are a :class:`TileConfig`.

>>> p = parse_program(EXAMPLE)
>>> parse_program(p.text()) == p, p.tile_dims("r")
(True, ('M', 'N'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union

from .errors import KernelError, KernelParseError

__all__ = ["Axis", "Tensor", "Stmt", "Acc", "KernelProgram", "TileConfig", "parse_program", "DTYPES",
           "UNARY", "BINARY", "REDUCTIONS", "EXAMPLE"]

#: short dtype names of the text form -> torch/IR names
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
UNARY = ("exp", "rsqrt", "neg", "relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "pow", "cast", "trans")
BINARY = ("add", "sub", "mul", "div", "maximum", "dot", "addmask")
REDUCTIONS = ("sum", "max")
#: attributes each operator takes, with their types
_ATTRS = {"exp": {"scale": float}, "addmask": {"scale": float}, "rsqrt": {"eps": float}, "pow": {"exponent": float}, "cast": {"dtype": str},
          "sum": {"dim": str}, "max": {"dim": str}, "causal": {"q": str, "k": str}, "load": {"mask": int}}
_REQUIRED = {"addmask": ("scale",), "pow": ("exponent",), "cast": ("dtype",), "sum": ("dim",), "max": ("dim",), "causal": ("q", "k")}

Const = Union[float, Fraction]
Arg = Union[str, float, Fraction]


@dataclass(frozen=True)
class Axis:
    """How one axis of a global tensor is indexed: ``dim // div + offset`` (dim None: ``offset``)."""

    dim: str | None
    offset: int = 0
    div: int = 1

    def text(self) -> str:
        if self.dim is None:
            return str(self.offset)
        s = self.dim + (f"/{self.div}" if self.div != 1 else "")
        return s + (f"{self.offset:+d}" if self.offset else "")

    @staticmethod
    def parse(s: str) -> "Axis":
        m = re.fullmatch(r"\s*(?:([A-Za-z_]\w*)(?:/(\d+))?([+-]\d+)?|(\d+))\s*", s)
        if not m:
            raise KernelParseError(f"bad index {s!r}: expected DIM, DIM+c, DIM/g or a constant")
        if m.group(4) is not None:
            return Axis(None, int(m.group(4)))
        return Axis(m.group(1), int(m.group(3) or 0), int(m.group(2) or 1))


@dataclass(frozen=True)
class Tensor:
    """A global tensor: an input or an output of the kernel."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Stmt:
    """One statement: ``out = op args attrs`` (``store``/``update`` have no ``out``).

    For ``load``/``store`` ``tensor`` and ``index`` say what is read or written.
    """

    out: str
    op: str
    args: tuple[Arg, ...] = ()
    attrs: tuple[tuple[str, object], ...] = ()
    tensor: str = ""
    index: tuple[Axis, ...] = ()

    def attr(self, name, default=None):
        return dict(self.attrs).get(name, default)


@dataclass(frozen=True)
class Acc:
    """An accumulator of the loop: its tile dims and initial value (a number, -inf allowed)."""

    name: str
    dims: tuple[str, ...]
    init: float


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (per tiled dim), warps and pipeline stages: the autotuning space, as data.
    ``split`` > 1 cuts the loop into that many chunks run by separate programs, their partial
    accumulators then combined (see :mod:`superopt.kernel.split`). ``prepass`` runs the loop
    twice: first the accumulators that need no ``dot`` (a norm's sum of squares), then the rest
    (see :func:`~superopt.kernel.triton_lower.prepass_split`); what is computed is the same.
    ``gemv`` computes every ``dot`` as products summed over the contraction, off the tensor
    cores, so that its rows may be tiled one at a time (``tl.dot`` needs 16): a decode step's
    one-row linear, whose column tiles can then be narrower than 16 (more programs streaming the
    weights; see :func:`~superopt.kernel.triton_lower.gemv_dot`). ``tma`` loads the loop's 2-d tiles
    through Hopper's tensor memory accelerator (host tensor descriptors, whose boxes past a
    tensor's edge read as zero, as a masked load's ``other=0``; see
    :func:`~superopt.kernel.triton_lower.tma_loads`). ``blocked`` reads the loop's 2-d tiles of
    compile-time weights (``X__t``, a weight's transpose made when the kernel is chosen) from a
    tile-blocked copy, each tile one contiguous run, a grid tile's tiles one after another, made
    by :func:`~superopt.kernel.triton_lower.blocked_arrays` with the weight (see
    :func:`~superopt.kernel.triton_lower.blocked_loads`); with ``tma`` too, the other tiles that
    qualify go through descriptors. ``swap`` takes a loop's ``acc + dot x y`` as
    ``dot(yᵀ, xᵀ)`` into an accumulator kept transposed until after the loop (the weight tile
    the tensor cores' left operand; see :func:`~superopt.kernel.triton_lower.swapped_accs`).

    >>> TileConfig((("M", 16), ("N", 64)), 4, 2).block("N"), TileConfig((("K", 64),), split=4).text()
    (64, 'K=64 warps=4 stages=2 split=4')
    >>> TileConfig((("K", 64),), prepass=True).text()
    'K=64 warps=4 stages=2 prepass'
    >>> TileConfig((("M", 1), ("N", 8), ("K", 512)), 2, 4, gemv=True).text()
    'M=1 N=8 K=512 warps=2 stages=4 gemv'
    >>> TileConfig((("M", 16), ("N", 32), ("K", 256)), 4, 4, tma=True).text()
    'M=16 N=32 K=256 warps=4 stages=4 tma'
    >>> TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, blocked=True).text()
    'M=16 N=64 K=256 warps=4 stages=3 blocked'
    >>> TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, tma=True, blocked=True, swap=True).text()
    'M=16 N=64 K=256 warps=4 stages=3 tma blocked swap'
    """

    blocks: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 2
    split: int = 1
    prepass: bool = False
    gemv: bool = False
    tma: bool = False
    blocked: bool = False
    swap: bool = False

    def __post_init__(self):
        if not isinstance(self.split, int) or self.split < 1:
            raise KernelError(f"split={self.split!r}: the loop split must be a whole number >= 1 (1: no split)")
        if self.prepass and self.split != 1:
            raise KernelError("a config cannot both split its loop and run a prepass loop; use one of them")
        if self.tma and self.gemv:
            raise KernelError("a tma config takes no gemv; use one of them")
        if self.swap and self.gemv:
            raise KernelError("a gemv config takes no swap (it has no tensor-core dot); use one of them")

    def block(self, dim: str) -> int:
        for d, b in self.blocks:
            if d == dim:
                return b
        raise KernelError(f"the tile config has no block size for dim {dim!r}; give one, e.g. ({dim!r}, 16)")

    def text(self) -> str:
        return (" ".join(f"{d}={b}" for d, b in self.blocks) + f" warps={self.num_warps} stages={self.num_stages}"
                + (f" split={self.split}" if self.split != 1 else "") + (" prepass" if self.prepass else "") + (" gemv" if self.gemv else "") + (" tma" if self.tma else "")
                + (" blocked" if self.blocked else "") + (" swap" if self.swap else ""))


@dataclass(frozen=True)
class KernelProgram:
    """One fused kernel (see the module docstring). Built only valid: checked on construction."""

    name: str
    dims: tuple[tuple[str, int], ...]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    grid: tuple[tuple[str, bool], ...]
    loop: str | None = None
    accs: tuple[Acc, ...] = ()
    pre: tuple[Stmt, ...] = ()
    body: tuple[Stmt, ...] = ()
    post: tuple[Stmt, ...] = ()
    _tiles: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self):
        from .validate import validate
        self._tiles.update(validate(self))

    # ---- queries ---------------------------------------------------------------------------
    @property
    def dim_sizes(self) -> dict[str, int]:
        return dict(self.dims)

    def role(self, dim: str) -> str:
        """``grid`` (tiled), ``program`` (one program per index), ``loop`` or ``full``."""
        for d, tiled in self.grid:
            if d == dim:
                return "grid" if tiled else "program"
        return "loop" if dim == self.loop else "full"

    def tiled_dims(self) -> tuple[str, ...]:
        """Dims whose block size comes from the config (tiled grid dims and the loop dim)."""
        out = tuple(d for d, t in self.grid if t)
        return out + ((self.loop,) if self.loop else ())

    def tile_dims(self, value: str) -> tuple[str, ...]:
        """The dims of a value's tile."""
        return self._tiles[value]

    def tensor(self, name: str) -> Tensor:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KernelError(f"{self.name}: no tensor {name!r}")

    def statements(self):
        """Every statement with its block name, in program order."""
        for block in ("pre", "body", "post"):
            for s in getattr(self, block):
                yield block, s

    def text(self) -> str:
        from .textform import to_text
        return to_text(self)

    def __str__(self):
        return self.text()


def parse_program(text: str) -> KernelProgram:
    """Read a program from its text form (``parse_program(p.text()) == p``)."""
    from .textform import from_text
    return from_text(text)


EXAMPLE = """\
kernel linear_relu
dim M 5
dim K 40
dim N 24
input x f32[5,40]
input w f32[40,24]
output y f32[5,24]
grid M N
loop K
acc acc[M,N] = 0
body:
  a = load x[M,K]
  b = load w[K,N]
  c = dot a b
  d = add acc c
  update acc d
post:
  r = relu acc
  store y[M,N] r
"""
