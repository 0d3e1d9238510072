"""The hand-written candidates that are beyond both the generator's and the axioms' reach.

The generator enumerates graphs of up to three operators with at most three inputs each
(:mod:`superopt.generate.families`); everything it finds is credited to it. The one step it could
never find, batch norm as a per-channel affine map (eight operators on the right, five inputs on
the left, where the generator stops at three of each), used to be written here; it is now read off
the axioms that state it (``batchnorm_affine`` and ``batchnorm_affine_2d`` in
``specs/extended.axioms``) by :mod:`superopt.generate.axiom_rules`, listed under ``"axioms"`` in
``rules/default.json``. What belongs here is only a rule that is larger than the generator's
reach *and* not read off an axiom by :mod:`superopt.generate.axiom_rules`, each with the reason.

The grouped-query attention identity is the one such rule: attention over key-value heads repeated
per query group (HF's ``repeat_kv``: reshape, expand, reshape; ``repeat_interleave`` imports as the
same three) equals ``sdpa`` with ``gqa=1`` over the unrepeated heads. Its left side has seven
operators over three inputs (four with the mask), beyond the generator's three. It is the statement
of axioms ``sdpa_gqa_repeat_kv`` and ``sdpa_gqa_repeat_kv_mask`` of ``specs/llm.axioms``, which prove
it; it is written here only because :mod:`superopt.generate.axiom_rules` instantiates axioms at one
fixed size table, which has no head-group sizes (``hq == h * r``) and uses ``e`` for eps where
these axioms use it for the head size. Teaching axiom_rules per-axiom sizes empties this file.

``scripts/make_default_rules.py`` verifies whatever this returns and stores it with settings
``{"source": "curated"}``. (The textbook examples used by ``--example-rules`` and the tests live in
:mod:`superopt.rules.examples`; they are not shipped.)

>>> for r in curated_rules():
...     print(r.text().split(" => ")[1])
sdpa[gqa=1, scale=0.125](q, k, v)
sdpa[causal=1, gqa=1, scale=0.125](q, k, v)
sdpa[gqa=1, scale=0.125](q, k, v, m)
"""

from __future__ import annotations

from ..ir.graph import GraphBuilder
from ..ir.rule import Rule

__all__ = ["curated_rules", "gqa_attention"]


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
    return [gqa_attention(0), gqa_attention(1), gqa_attention(0, mask=True)]
