"""The hand-written candidates that are beyond both the generator's and the axioms' reach: none.

The generator enumerates graphs of up to three operators with at most three inputs each
(:mod:`superopt.generate.families`); everything it finds is credited to it. The one step it could
never find, batch norm as a per-channel affine map (eight operators on the right, five inputs on
the left, where the generator stops at three of each), used to be written here; it is now read off
the axioms that state it (``batchnorm_affine`` and ``batchnorm_affine_2d`` in
``specs/extended.axioms``) by :mod:`superopt.generate.axiom_rules`, listed under ``"axioms"`` in
``rules/default.json``. What belongs here is only a rule that is larger than the generator's
reach *and* not the statement of an axiom, each with a comment saying why; there is none.

``scripts/make_default_rules.py`` verifies whatever this returns and stores it with settings
``{"source": "curated"}``. (The textbook examples used by ``--example-rules`` and the tests live in
:mod:`superopt.rules.examples`; they are not shipped.)

>>> curated_rules()
[]
"""

from __future__ import annotations

from ..ir.rule import Rule

__all__ = ["curated_rules"]


def curated_rules() -> list[Rule]:
    """Every curated candidate (what ``scripts/make_default_rules.py`` verifies and ships)."""
    return []
