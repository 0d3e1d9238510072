"""Fingerprint semantics: exact arithmetic in the prime field GF(p), p = 2**31 - 1.

Inputs are drawn uniformly from the field. Linear operators (add, mul, smul, matmul, conv,
pooling sums, layout) are computed exactly mod p. Every non-linear elementwise operator (relu,
sigmoid, tanh, gelu, and the exp/rsqrt inside softmax, layer norm and batch norm) is a fixed
*random function* of the field element, keyed by its name (a 64-bit mixing hash of the value).
Max pooling takes the max of the integer representatives of the window, which keeps the
layout identities (concat on other axes, padding never wins) and nothing else. Division by a
constant count (averages, means) is multiplication by its field inverse.

So two graphs that compute the same polynomial over the field, treating each random function
as an independent unknown function, agree everywhere; two graphs that differ agree at a
random point with probability at most d/p per output element (Schwartz–Zippel, d the degree of
the larger graph's polynomial in its inputs, at most about 3**ops for the tiny graphs the
generator builds), and a random function's values collide with probability 1/p. For the
generator's graphs (d < 100) a fingerprint collision between graphs that are not equal has
probability below 100/2**31 ≈ 5e-8 per pair, and two independent fingerprints (two seeds)
square it. Attention is softmax(q·kᵀ)·v with its exp a random function keyed by the scale (the
plain ``exp`` of softmax at scale 1, so the defining equation holds exactly), masked keys
contributing 0; ``pow`` with an integer exponent 0..64 is the exact power (so pow(x, 2) is
mul(x, x)), with any other exponent a random function keyed by it; an embedding picks rows
by the index modulo the table size, and so does index_copy. ``mean`` is the exact sum times the
field inverse of the count, ``cast`` the identity (a change of precision, not of value); rsqrt,
silu, gelu_tanh, cos and sin are random functions, and so are a comparison, a logical and/or (of
the pair, made one element) and a boolean mask's additive form (they only build attention masks); attention with gqa=1 repeats the key-value heads
exactly as the reference does. Max pooling is the exception to that bound: the max of uniform field values in
overlapping windows coincides far more often than 1/p, so graphs with max pooling can collide
(the generator checks every candidate with two more seeds). A collision only ever makes a
*candidate*: the verifier proves every rule.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np

from ..ir.graph import Graph
from .interpret import interpret
from .reference import causal_mask, conv2d_with, grouped_heads, identity_conv, index_copy, windows

__all__ = ["P", "Field", "to_field", "matmul_mod"]

P = (1 << 31) - 1
_LIMB = 1 << 16


def to_field(x) -> np.ndarray:
    """Map integer-valued numbers into the field (negative ones wrap around). An int64 array
    already in [0, p) (random field inputs, a field computation's values) is returned as it
    is: two comparisons instead of a division per element (a Llama layer's weights are 10^8)."""
    x = np.asarray(x, dtype=np.int64)
    if x.size and x.min() >= 0 and x.max() < P:
        return x
    return np.mod(x, P)


def _mod(x):
    return np.mod(x, P)


#: a fixed multiplier that makes one field element of two: the argument of a binary random function
_PAIR = 1_000_003


def _pair(x, y):
    """``x + _PAIR * y`` mod p, broadcast: the key of a random function of two arguments."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64))
    return _mod(x + _mod(y * _PAIR))


def _exact(contract, a, b):
    """An integer bilinear ``contract(a, b)`` reduced mod p without int64 overflow.

    b is split in 16-bit limbs: each partial sum is below K * 2**47, exact for contraction
    lengths K < 2**16.
    """
    lo, hi = b & (_LIMB - 1), b >> 16
    return _mod(_mod(contract(a, hi)) * _LIMB + contract(a, lo))


#: below this many multiply-adds numpy's integer matmul is faster than the four BLAS products
#: (measured: 8x8x8 15 vs 42 us, 32x64x32 112 vs 63 us); the generator's fingerprints are all small
_BLAS_MIN_MACS = 16384


#: contractions at most this long keep _exact's partial sums below 2**63 (K * 2**47)
_EXACT_MAX_K = (1 << 16) - 1


def matmul_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b mod p, exactly: through float64 BLAS (:func:`_matmul_limbs`) where that is faster,
    else numpy's integer matmul (:func:`_exact`); a contraction of 2**20 or more, too long for
    either, is summed in pieces (it went to ``_exact``, whose int64 sums overflow past 2**16)."""
    k = a.shape[-1]
    if k >= 1 << 20:
        parts = [matmul_mod(a[..., i:i + _EXACT_MAX_K], b[..., i:i + _EXACT_MAX_K, :])
                 for i in range(0, k, _EXACT_MAX_K)]
        return _mod(np.sum(parts, axis=0))
    if a.size * b.shape[-1] < _BLAS_MIN_MACS:
        return _exact(np.matmul, a, b)
    return _matmul_limbs(a, b)


def _matmul_limbs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b mod p through float64 BLAS: 16-bit limbs give products below 2**32 and sums below
    2**52 for contractions shorter than 2**20 (numpy's integer matmul has no BLAS and was most of
    a kernel verification's time at 4096 x 6144). 2**32 = 2 mod p, since p = 2**31 - 1."""
    a1, a0 = (a >> 16).astype(np.float64), (a & 0xFFFF).astype(np.float64)
    b1, b0 = (b >> 16).astype(np.float64), (b & 0xFFFF).astype(np.float64)
    hh = np.mod((a1 @ b1).astype(np.int64), P)
    hl = np.mod((a1 @ b0).astype(np.int64) + (a0 @ b1).astype(np.int64), P)
    ll = np.mod((a0 @ b0).astype(np.int64), P)
    return np.mod(2 * hh + hl * 65536 + ll, P)


def _mulmod(a, b):
    return _mod(np.asarray(a, dtype=np.int64) * np.asarray(b, dtype=np.int64))


def _inverse(a):
    """Field inverse of every element (0 maps to 0)."""
    result = np.ones_like(a)
    base, e = _mod(a), P - 2
    while e:
        if e & 1:
            result = _mulmod(result, base)
        base = _mulmod(base, base)
        e >>= 1
    return result


def _inv_int(n: int) -> int:
    return pow(int(n), P - 2, P)


class Field:
    """The fingerprint interpreter for one seed (the seed keys the random functions).

    >>> f = Field(seed=0)
    >>> f.fn("relu", np.array([5])) == f.fn("relu", np.array([5]))
    array([ True])
    """

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.table = self._table()

    # -- random functions -----------------------------------------------------------------
    def _key(self, name: str) -> np.uint64:
        d = hashlib.blake2b(f"{self.seed}:{name}".encode(), digest_size=8).digest()
        return np.uint64(int.from_bytes(d, "little"))

    def fn(self, name: str, x: np.ndarray) -> np.ndarray:
        """The random function ``name`` applied elementwise (splitmix64 of value xor key)."""
        z = np.asarray(x, dtype=np.int64).astype(np.uint64) ^ self._key(name)
        with np.errstate(over="ignore"):
            z = z + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        return (z % np.uint64(P)).astype(np.int64)

    # -- operators --------------------------------------------------------------------------
    def _table(self):
        fn = self.fn

        def conv(a, x, w, b=None):  # conv2d, and conv2d_bias with its bias b
            y = _exact(lambda u, v: conv2d_with(u, v, a["stride"], a["padding"], a["groups"]), x, w)
            if b is not None:
                y = _mod(y + b.reshape(-1, 1, 1))
            return fn("relu", y) if a["activation"] == "relu" else y

        def avgpool(a, x):
            s = windows(x, a["kernel"], a["stride"], a["padding"]).sum(axis=(4, 5))
            return _mulmod(_mod(s), _inv_int(a["kernel"][0] * a["kernel"][1]))

        def maxpool(a, x):
            return windows(x, a["kernel"], a["stride"], a["padding"], -1).max(axis=(4, 5))

        def batchnorm(a, x, scale, bias, mean, var):
            shp = (1, -1) + (1,) * (x.ndim - 2)
            r = _mulmod(fn(f"rsqrt{a['eps']!r}", var), scale)
            return _mod(_mulmod(_mod(x - mean.reshape(shp)), r.reshape(shp)) + bias.reshape(shp))

        def softmax(a, x):
            e = fn("exp", x)
            return _mulmod(e, _inverse(_mod(e.sum(axis=a["axis"], keepdims=True))))

        def layernorm(a, x):
            axes = tuple(range(x.ndim - a["ndim"], x.ndim))
            inv_n = _inv_int(int(np.prod([x.shape[k] for k in axes])))
            c = _mod(x - _mulmod(_mod(x.sum(axis=axes, keepdims=True)), inv_n))
            var = _mulmod(_mod(_mulmod(c, c).sum(axis=axes, keepdims=True)), inv_n)
            return _mulmod(c, fn(f"rsqrt{a['eps']!r}", var))

        def sdpa(a, q, k, v, mask=None):
            to_groups, from_groups = grouped_heads(q, k, v, a["gqa"])
            gq, gk, gv = to_groups(q, k, v)
            s = from_groups(matmul_mod(gq, np.swapaxes(gk, -1, -2)))
            if mask is not None:
                s = _mod(s + mask)
            e = fn("exp" if a["scale"] == 1.0 else f"exp*{a['scale']!r}", s)
            if a["causal"]:
                e = np.where(causal_mask(*s.shape[-2:]), e, 0)
            p = _mulmod(e, _inverse(_mod(e.sum(axis=-1, keepdims=True))))
            return from_groups(matmul_mod(to_groups(p, k, v)[0], gv))

        def power(a, x):
            c = a["exponent"]
            if c == int(c) and 0 <= c <= 64:
                out = np.ones_like(x)
                for _ in range(int(c)):
                    out = _mulmod(out, x)
                return out
            return fn(f"pow{c!r}", x)

        def enlarge(a, w):
            kh, kw = w.shape[2:]
            dh, dw = (a["kernel"][0] - kh) // 2, (a["kernel"][1] - kw) // 2
            return np.pad(w, ((0, 0), (0, 0), (dh, dh), (dw, dw)))

        def split(a, x):
            return tuple(np.split(x, np.cumsum(a["sizes"])[:-1], axis=a["axis"]))

        def total(a, x):
            return _mod(x.sum(axis=a["axis"], keepdims=bool(a["keepdim"])))

        def mean(a, x):
            return _mulmod(total(a, x), _inv_int(x.shape[a["axis"]]))

        def slice_(a, x):
            idx = [slice(None)] * x.ndim
            idx[a["axis"]] = slice(a["start"], a["end"], a["step"])
            return x[tuple(idx)]

        return {
            "identity_matrix": lambda a: np.eye(a["n"], dtype=np.int64),
            "identity_conv": lambda a: identity_conv(a["channels"], a["kernel"], a["groups"], 1, np.int64),
            "ones": lambda a: np.ones(a["shape"], dtype=np.int64),
            "zeros": lambda a: np.zeros(a["shape"], dtype=np.int64),
            "pool_kernel": lambda a: np.full((a["channels"], 1) + a["kernel"],
                                             _inv_int(a["kernel"][0] * a["kernel"][1]), dtype=np.int64),
            "add": lambda a, x, y: _mod(x + y),
            "mul": lambda a, x, y: _mulmod(x, y),
            "smul": lambda a, x, s: _mulmod(x, s),
            "relu": lambda a, x: fn("relu", x),
            "sigmoid": lambda a, x: fn("sigmoid", x),
            "tanh": lambda a, x: fn("tanh", x),
            "gelu": lambda a, x: fn("gelu", x),
            "matmul": lambda a, x, y: matmul_mod(x, y),
            "conv2d": conv,
            "conv2d_bias": conv,
            "enlarge": enlarge,
            "transpose": lambda a, x: np.transpose(x, a["perm"]),
            "reshape": lambda a, x: np.reshape(x, a["shape"]),
            "concat": lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
            "split": split,
            "avgpool2d": avgpool,
            "maxpool2d": maxpool,
            "batchnorm": batchnorm,
            "softmax": softmax,
            "layernorm": layernorm,
            "sdpa": sdpa,
            "embedding": lambda a, w, ids: w[np.mod(ids, w.shape[0])],
            "pow": power,
            "mean": mean,
            "sum": total,
            "rsqrt": lambda a, x: fn("rsqrt", x),
            "silu": lambda a, x: fn("silu", x),
            "cos": lambda a, x: fn("cos", x),
            "sin": lambda a, x: fn("sin", x),
            "gelu_tanh": lambda a, x: fn("gelu_tanh", x),
            "clamp": lambda a, x: fn(f"clamp{a['lo']!r},{a['hi']!r}", x),
            "cast": lambda a, x: x,
            "expand": lambda a, x: np.broadcast_to(x, a["shape"]).copy(),
            "slice": slice_,
            "index_copy": lambda a, x, ids, src: index_copy(x, ids, src, a["axis"], mod=True),
            "compare": lambda a, x, y: fn(f"compare_{a['cmp']}", _pair(x, y)),
            "logical": lambda a, x, y: fn(f"logical_{a['fn']}", _pair(x, y)),
            "mask_bias": lambda a, m: fn("mask_bias", m),
        }

    def evaluate(self, g: Graph, env: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Evaluate over the field; ``env`` maps source names to field arrays (int64 in [0, p))."""
        env = {k: to_field(v) for k, v in (env or {}).items()}
        return interpret(g, env, self.table, "fingerprint", to_field)

    def random_inputs(self, g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Uniform field values for every input and weight."""
        return {g.nodes[i].name: rng.integers(0, P, g.nodes[i].types[0].shape, dtype=np.int64)
                for i in g.inputs + g.weights}
