"""Errors of the generator: bad settings, unusable output paths, foreign checkpoints."""

from __future__ import annotations

from ..errors import SuperoptError

__all__ = ["GenerateError", "CheckpointMismatchError", "MissingDependencyError"]


class GenerateError(SuperoptError):
    """Generator settings or paths that cannot work (the message says how to fix them)."""


class CheckpointMismatchError(GenerateError):
    """A checkpoint next to the output was written by a run with different settings."""


class MissingDependencyError(GenerateError):
    """An optional dependency (Dask) is needed for what was asked and is not installed."""
