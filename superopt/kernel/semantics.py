"""Two semantics of kernel programs, through the tile emulator: float64 and the field GF(p).

**Float64** (:func:`run_reference`): numpy, tile by tile as the Triton kernel runs; casts are
exact (the float64 judge compares the algorithm, the GPU check compares the rounding).
Elementwise operators that are IR operators use the graph's reference table
(:data:`superopt.semantics.REFERENCE`), so a kernel and its region agree by construction.

**Field** (:func:`run_field`): the fingerprint semantics of :mod:`superopt.semantics.field`
extended to tiles and loops. Linear algebra (add, sub, mul, dot, sums) is exact mod p; every
non-linear function is the *same* random function the graph semantics uses for it (looked up
in :class:`~superopt.semantics.field.Field`'s table by operator name where the IR has the
operator; ``exp`` is the key ``exp`` of softmax, or ``exp*s`` of attention at scale ``s``;
``rsqrt eps=e`` is layer norm's ``rsqrt{e}``); so a kernel is compared with the region graph's
own fingerprint. Numbers are exact: a constant is a dyadic float or a fraction ``a/b``, mapped
to ``a·b⁻¹`` (a ring homomorphism from the rationals with denominator prime to p). Division is
multiplication by the field inverse (0 maps to 0, as the graph semantics does).

**Masked attention** (``addmask s m scale=c``): the graph's field semantics of ``sdpa`` with a
mask takes the random function ``exp*c`` of s + m (the logit in the units of the unscaled
score), and so does the kernel's; in float64 the kernel's logit is s + m/c, so that exp(c·(s + m/c))
= exp(c·s + m) is the reference's softmax(c·s + m).

**The running max** (online softmax) is the one non-algebraic piece: the max only *shifts* the
exponent and the result does not depend on it mathematically (softmax(x - c) = softmax(x) for
any row constant c, and the rescaling exp(m_old - m_new) keeps every partial sum at the same
shift). A max has no meaning in the field, so the field semantics evaluates the program with
every ``max`` result replaced by the real number 0: values computed only from maxima and
constants (*shift values*) are kept as exact reals (exp(0 - 0) = 1), and enter the field only
when mixed with data (a -inf becomes a sentinel: exp of it is 0, a sum or product of it is an
error). The field check therefore proves P[max := 0] equal to the graph; P[max := 0] = P over
the reals exactly when P does not depend on the value of its maxima, and that is what
``verify_kernel`` checks numerically: the float64 run with every max shifted by a random
offset per element must agree with the run with the true max. A program that uses a max other
than as a shift fails one of the two checks; a max mixed with data in an operation the field
cannot do exactly (a maximum of data, exp of a non-zero shift) is refused outright.
"""

from __future__ import annotations

from fractions import Fraction
from math import sqrt

import numpy as np

from ..semantics.field import P, Field, _inverse, _mod, _mulmod, matmul_mod, to_field
from ..semantics.reference import REFERENCE, erf
from .emulate import emulate
from .errors import KernelError
from .program import KernelProgram, TileConfig

__all__ = ["run_reference", "run_field", "FloatArith", "FieldArith", "ShiftError"]

_NEG_INF = -1     # the field's -inf sentinel (field elements are in [0, p))
_UNSET = -2       # an output element no program wrote


class ShiftError(KernelError):
    """A running max (a shift value) is used where the field cannot follow it exactly."""


def _float_unary(op, a, x):
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if op in REFERENCE and op not in ("rsqrt", "cast"):
            return REFERENCE[op](a, x)
        if op == "exp":
            return np.exp(a.get("scale", 1.0) * x)
        if op == "rsqrt":
            return 1.0 / np.sqrt(x + a.get("eps", 0.0))
        if op == "neg":
            return -x
        if op == "silu":
            return x / (1.0 + np.exp(-x))
        if op == "gelu":
            return 0.5 * x * (1.0 + erf(x / sqrt(2.0)))
        if op == "gelu_tanh":
            return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
        if op == "cast":
            return x
    raise KernelError(f"no float64 semantics for kernel operator {op!r}")


#: arrays at least this large are flattened through torch where they are strided (below)
_TORCH_COPY_MIN = 1 << 20


def flat_rows(x, dtype) -> np.ndarray:
    """``x`` as a flat ``dtype`` array in row-major order. A program's compile-time weights are
    transposed views of the region's (``X__t``), so flattening one is a strided copy: torch's
    runs ~3x faster than numpy's (a 14336x4096 float64 transpose: 0.36 s against 1.1 s on two
    cores), and generating a Llama decode step's gate/up kernel flattened 20 of them."""
    x = np.asarray(x, dtype=dtype)
    if x.flags.c_contiguous or x.size < _TORCH_COPY_MIN:
        return x.reshape(-1)
    import torch
    return torch.from_numpy(x).contiguous().numpy().reshape(-1)


class FloatArith:
    """float64 numpy; ``shift`` (rng or None) offsets every max by a random amount per element."""

    def __init__(self, shift: np.random.Generator | None = None):
        self.shift = shift

    def flat_input(self, x, shape):
        return flat_rows(x, np.float64)

    def new_output(self, n):
        return np.full(n, np.nan)

    def finish(self, out, shape, name):
        return out.reshape(shape)

    def load(self, src, flat, keep, garbage):
        return np.where(keep, src[flat], np.nan if garbage else 0.0)

    def store(self, out, flat, valid, v):
        v = np.broadcast_to(v, flat.shape)
        out[flat[valid]] = v[valid]

    def const(self, c):
        return np.float64(c)

    def full(self, shape, c):
        return np.full(shape, float(c))

    reshape = staticmethod(np.reshape)
    broadcast = staticmethod(lambda v, shape: np.broadcast_to(v, shape).copy())
    transpose = staticmethod(lambda v: np.swapaxes(v, -1, -2))  # a tile's two dims, after the program axis

    def dot(self, a, b, keep_a=None, keep_b=None):
        """``a @ b``; ``keep_*``: the contraction lanes of that operand that count (None: all)."""
        a = a if keep_a is None else np.where(keep_a, a, 0.0)
        b = b if keep_b is None else np.where(keep_b[:, None], b, 0.0)
        return a @ b

    def reduce(self, op, x, axis, valid):
        if op == "sum":
            return np.where(valid, x, 0.0).sum(axis=axis)
        m = np.where(valid, x, -np.inf).max(axis=axis)
        if self.shift is not None:
            m = m + self.shift.uniform(-2.0, 2.0, m.shape)
        return m

    def causal(self, x, keep):
        return np.where(keep, x, -np.inf)

    def apply(self, op, a, *xs):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if op == "addmask":
                return xs[0] + xs[1] / a["scale"]
            if op in ("add", "sub", "mul", "div", "maximum"):
                x, y = xs
                return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                        "maximum": np.maximum}[op](x, y)
            return _float_unary(op, a, xs[0])


# ---- the field ------------------------------------------------------------------------------

class _Shift:
    """A shift value: an exact real array computed from maxima (as 0) and constants."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = np.asarray(x, dtype=np.float64)


def _embed(x: np.ndarray) -> np.ndarray:
    """Exact reals into the field (-inf to the sentinel); a non-dyadic value is refused."""
    out = np.empty(x.shape, dtype=np.int64)
    for v in np.unique(x):
        if np.isneginf(v):
            e = _NEG_INF
        elif not np.isfinite(v):
            raise ShiftError(f"the value {v} (from a running max) cannot enter the field")
        else:
            f = Fraction(float(v))
            e = (f.numerator % P) * pow(f.denominator, P - 2, P) % P
        out[x == v] = e
    return out


def const_to_field(c) -> int:
    f = Fraction(c) if isinstance(c, Fraction) else Fraction(float(c))
    return (f.numerator % P) * pow(f.denominator, P - 2, P) % P


class FieldArith:
    """The fingerprint semantics over tiles (see the module docstring)."""

    def __init__(self, field: Field, rng: np.random.Generator):
        self.field, self.rng = field, rng

    # -- storage --
    def flat_input(self, x, shape):
        return to_field(flat_rows(x, np.int64))

    def new_output(self, n):
        return np.full(n, _UNSET, dtype=np.int64)

    def finish(self, out, shape, name):
        return out.reshape(shape)

    def load(self, src, flat, keep, garbage):
        pad = self.rng.integers(0, P, flat.shape, dtype=np.int64) if garbage else 0
        return np.where(keep, src[flat], pad)

    def store(self, out, flat, valid, v):
        v = np.broadcast_to(self.to_field(v), flat.shape)
        out[flat[valid]] = v[valid]

    # -- values --
    def to_field(self, v):
        return _embed(v.x) if isinstance(v, _Shift) else v

    def const(self, c):
        if isinstance(c, Fraction) and c.denominator != 1:
            return np.int64(const_to_field(c))
        return _Shift(float(c))

    def full(self, shape, c):
        return _Shift(np.full(shape, float(c)))

    def reshape(self, v, shape):
        return _Shift(v.x.reshape(shape)) if isinstance(v, _Shift) else v.reshape(shape)

    def broadcast(self, v, shape):
        if isinstance(v, _Shift):
            return _Shift(np.broadcast_to(v.x, shape).copy())
        return np.broadcast_to(v, shape).copy()

    def transpose(self, v):
        return _Shift(np.swapaxes(v.x, -1, -2)) if isinstance(v, _Shift) else np.swapaxes(v, -1, -2)

    # -- operators --
    def dot(self, a, b, keep_a=None, keep_b=None):
        a, b = self.to_field(a), self.to_field(b)
        a = a if keep_a is None else np.where(keep_a, a, 0)
        b = b if keep_b is None else np.where(keep_b[:, None], b, 0)
        if (a == _NEG_INF).any() or (b == _NEG_INF).any():
            raise ShiftError("a -inf reaches a matrix product")
        return matmul_mod(a, b)

    def reduce(self, op, x, axis, valid):
        if op == "max":  # the shift: 0 (see the module docstring)
            shape = list(np.shape(x.x if isinstance(x, _Shift) else x))
            del shape[axis]
            return _Shift(np.zeros(shape))
        x = self.to_field(x)
        if ((x == _NEG_INF) & valid).any():
            raise ShiftError("a sum over a -inf element")
        return _mod(np.where(valid, x, 0).sum(axis=axis))

    def causal(self, x, keep):
        if isinstance(x, _Shift):
            return _Shift(np.where(keep, x.x, -np.inf))
        return np.where(keep, x, _NEG_INF)

    def apply(self, op, a, *xs):
        if all(isinstance(x, _Shift) for x in xs):
            with np.errstate(invalid="ignore"):
                return _Shift(FloatArith().apply(op, a, *(x.x for x in xs)))
        if op == "maximum":
            raise ShiftError("maximum of data (not of running maxima) has no field semantics")
        fs = [self.to_field(x) if isinstance(x, _Shift) else x for x in xs]
        if len(fs) == 2:
            return self.binary(op, *fs)
        return self.unary(op, a, fs[0])

    def binary(self, op, x, y):
        op = "add" if op == "addmask" else op   # the field's exp*c keys the unscaled logit s + m
        inf = (x == _NEG_INF) | (y == _NEG_INF)
        if op in ("add", "sub"):
            if op == "sub" and ((y == _NEG_INF) & (x != _NEG_INF)).any():
                raise ShiftError("subtracting -inf from data")
            r = _mod(x + y) if op == "add" else _mod(x - y)
            return np.where(inf, _NEG_INF, r)
        if inf.any():
            raise ShiftError(f"{op} of a -inf element")
        return _mulmod(x, y) if op == "mul" else _mulmod(x, _inverse(y))

    def unary(self, op, a, x):
        inf = x == _NEG_INF
        if op == "exp":
            s = a.get("scale", 1.0)
            return np.where(inf, 0, self.field.fn("exp" if s == 1.0 else f"exp*{s!r}", np.where(inf, 0, x)))
        if inf.any():
            raise ShiftError(f"{op} of a -inf element")
        table = self.field.table
        if op in ("cast",):
            return x
        if op == "neg":
            return table["neg"](a, x) if "neg" in table else _mod(-x)
        if op == "rsqrt" and a.get("eps") is not None:
            return self.field.fn(f"rsqrt{a['eps']!r}", x)
        if op in table:
            return table[op](a, x)
        return self.field.fn(op, x)


def run_reference(program: KernelProgram, inputs: dict, config: TileConfig | None = None,
                  shift_rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """float64 outputs of ``program`` (``shift_rng``: offset every max, see the module docstring)."""
    return emulate(program, inputs, FloatArith(shift_rng), config)


def run_field(program: KernelProgram, inputs: dict, field: Field, rng: np.random.Generator,
              config: TileConfig | None = None) -> list[np.ndarray]:
    """Field outputs of ``program`` (an element no program wrote is -2)."""
    return emulate(program, inputs, FieldArith(field, rng), config)
