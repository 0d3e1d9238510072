"""Errors of the search (the optimize pipeline's own live in :mod:`superopt.errors`, re-exported
here for code that imported them from the search)."""

from __future__ import annotations

from ..errors import ModelError, NumericMismatchError, RulesError, SuperoptError

__all__ = ["SearchError", "RulesError", "ModelError", "NumericMismatchError"]


class SearchError(SuperoptError):
    """The search was asked for something it cannot do (alpha < 1, a budget of 0...)."""
