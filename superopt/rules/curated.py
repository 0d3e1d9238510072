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

These are *candidates* like any other: ``scripts/make_default_rules.py`` verifies them (axioms
``batchnorm_affine`` and ``batchnorm_affine_2d`` of ``specs/extended.axioms``) and stores them
with settings ``{"source": "curated"}``. (The textbook examples used by ``--example-rules`` and
the tests live in :mod:`superopt.rules.examples`; they are not shipped.)

>>> [r.text()[:40] for r in curated_rules()]  # doctest: +NORMALIZE_WHITESPACE
['batchnorm(x, s, b, m, v) => t0 = zeros[s', 'batchnorm(x, s, b, m, v) => t0 = zeros[s']
"""

from __future__ import annotations

from ..ir.graph import GraphBuilder
from ..ir.rule import Rule

__all__ = ["curated_rules", "batchnorm_affine"]

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


def curated_rules() -> list[Rule]:
    """Every curated candidate (what ``scripts/make_default_rules.py`` verifies and ships)."""
    return [batchnorm_affine(4), batchnorm_affine(2)]
