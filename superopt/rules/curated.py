"""The hand-written candidates that are larger than the generator's reach.

The generator enumerates graphs of up to three operators with at most three inputs each
(:mod:`superopt.generate.families`); everything it finds is credited to it, and nothing it
finds is written here. What is left is the one step of the batch-norm fold that no small graph
expresses: batch norm as a per-channel affine map. Its right side needs the batch norm itself
on constant tensors (``s / sqrt(v + eps)`` is ``batchnorm(ones, s, 0, 0, v)`` and the shift is
``batchnorm(zeros, s, b, m, v)``), two reshapes, a mul and an add: eight operators over five
inputs, where the generator stops at three. From there the search composes the fold out of
generated rules: ``mul(conv(x, w), s) = conv(x, w * s)`` (family ``cnn_scale``), distributivity
and associativity of per-channel operands (family ``eltwise``), so a ``Conv2d(bias=True) ->
BatchNorm2d`` folds as well as a bias-free one.

The grouped-query attention identity (issue 23) is the other: attention over key-value heads
repeated per query group (HF's ``repeat_kv``: reshape, expand, reshape; ``repeat_interleave``
imports as the same three) equals ``sdpa`` with ``gqa=1`` over the unrepeated heads. Its left
side has seven operators over three inputs (four with the mask), beyond the generator's three;
axioms ``sdpa_gqa_repeat_kv`` and ``sdpa_gqa_repeat_kv_mask`` of ``specs/llm.axioms`` prove it.

These are *candidates* like any other: ``scripts/make_default_rules.py`` verifies them (axioms
``batchnorm_affine`` and ``batchnorm_affine_2d`` of ``specs/extended.axioms``) and stores them
with settings ``{"source": "curated"}``. (The textbook examples used by ``--example-rules`` and
the tests live in :mod:`superopt.rules.examples`; they are not shipped.)

>>> [r.text()[:40] for r in curated_rules()[:2]]  # doctest: +NORMALIZE_WHITESPACE
['batchnorm(x, s, b, m, v) => t0 = zeros[s', 'batchnorm(x, s, b, m, v) => t0 = zeros[s']
>>> for r in curated_rules()[2:]:
...     print(r.text().split(" => ")[1])
sdpa[gqa=1, scale=0.125](q, k, v)
sdpa[causal=1, gqa=1, scale=0.125](q, k, v)
sdpa[gqa=1, scale=0.125](q, k, v, m)
"""

from __future__ import annotations

from ..ir.graph import GraphBuilder
from ..ir.rule import Rule

__all__ = ["curated_rules", "batchnorm_affine", "gqa_attention"]

_N, _C, _HW = 2, 6, 5


def batchnorm_affine(rank: int = 4) -> Rule:
    """batchnorm(x) => x * scale + shift, scale and shift per channel (folded at compile time).

    Larger than the generator's reach: eight operators on the right, five inputs on the left
    (see the module docstring). At rank 4 scale and shift are ``[C,1,1]`` (an image), at rank 2
    ``[1,C]`` (``BatchNorm1d`` after a linear layer)."""
    shape = (_N, _C, _HW, _HW + 2) if rank == 4 else (_N, _C)
    vec = (_C, 1, 1)

    def side(build):
        b = GraphBuilder()
        x = b.input("x", shape)
        s, bias, m, v = (b.weight(n, (_C,)) for n in ("s", "b", "m", "v"))
        return b.build([build(b, x, s, bias, m, v)])

    def rhs(b, x, s, bias, m, v):
        zero = b.op("zeros", shape=(_C,))
        scale = b.op("batchnorm", b.op("ones", shape=(1, _C)), s, zero, zero, v)
        shift = b.op("batchnorm", b.op("zeros", shape=(1, _C)), s, bias, m, v)
        if rank == 4:
            scale, shift = b.op("reshape", scale, shape=vec), b.op("reshape", shift, shape=vec)
        return b.op("add", b.op("mul", x, scale), shift)
    return Rule(side(lambda b, x, s, bias, m, v: b.op("batchnorm", x, s, bias, m, v)), side(rhs))


def gqa_attention(causal: int = 0, mask: bool = False) -> Rule:
    """sdpa(q, repeat_kv(k), repeat_kv(v)) => sdpa(q, k, v, gqa=1): the repeated keys and values
    are never materialized (larger than the generator's reach: see the module docstring)."""
    n, hkv, r, lq, s, e = 2, 2, 3, 4, 5, 6

    def side(gqa: bool):
        b = GraphBuilder()
        q, k, v = b.input("q", (n, hkv * r, lq, e)), b.input("k", (n, hkv, s, e)), b.input("v", (n, hkv, s, e))
        extra = (b.input("m", (n, 1, lq, s)),) if mask else ()
        if not gqa:
            k, v = (b.op("reshape", b.op("expand", b.op("reshape", t, shape=(n, hkv, 1, s, e)),
                                         shape=(n, hkv, r, s, e)), shape=(n, hkv * r, s, e)) for t in (k, v))
        return b.build([b.op("sdpa", q, k, v, *extra, scale=0.125, causal=causal, gqa=int(gqa))])
    return Rule(side(False), side(True))


def curated_rules() -> list[Rule]:
    """Every curated candidate (what ``scripts/make_default_rules.py`` verifies and ships)."""
    return [batchnorm_affine(4), batchnorm_affine(2), gqa_attention(0), gqa_attention(1), gqa_attention(0, mask=True)]
