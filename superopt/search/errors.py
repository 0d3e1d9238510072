"""Errors of the search and of the optimize pipeline."""

from __future__ import annotations

from ..errors import SuperoptError

__all__ = ["SearchError", "RulesError", "ModelError", "NumericMismatchError"]


class SearchError(SuperoptError):
    """The search was asked for something it cannot do (alpha < 1, a budget of 0...)."""


class RulesError(SearchError):
    """A rule database is missing, unreadable, of another version, or holds no usable rule."""


class ModelError(SearchError):
    """A model cannot be loaded or has nothing the search can work on."""


class NumericMismatchError(SearchError):
    """The optimized model's outputs differ from the original's; nothing was written."""
