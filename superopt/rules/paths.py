"""Where the shipped rule database lives (a library fact, so the CLIs and the optimizer share it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_db_path"]


def default_db_path() -> Path:
    """``rules/default.db`` next to the package's source tree."""
    return Path(__file__).resolve().parents[2] / "rules" / "default.db"
