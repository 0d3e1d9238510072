"""Lazy package exports: a package's public names imported on first use.

The torch-based packages (models, frontend, codegen) use it so that ``superopt --help`` and the
stages that never touch torch do not pay for importing it.
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``names[attr]`` (a submodule, relative to
    ``package``) when ``attr`` is first asked for."""
    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
