"""Errors of the importers: one class, so the CLI prints one line for every bad model file."""

from __future__ import annotations

from ..errors import SuperoptError

__all__ = ["ModelImportError"]


class ModelImportError(SuperoptError):
    """A model cannot be imported: missing or unreadable file, not a model, truncated archive,
    an importer whose optional dependency is missing, or a program superopt cannot represent
    (dynamic shapes, control flow, training-mode buffer updates)."""
