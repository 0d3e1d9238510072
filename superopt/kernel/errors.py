"""Errors of the kernel level (subclasses of :class:`superopt.errors.SuperoptError`)."""

from __future__ import annotations

from ..errors import SuperoptError

__all__ = ["KernelError", "KernelParseError", "KernelCompileError"]


class KernelError(SuperoptError):
    """A kernel program is ill-formed (the message names the statement and how to fix it)."""


class KernelParseError(KernelError):
    """The text form of a kernel program cannot be read (the message names the line)."""


class KernelCompileError(KernelError):
    """A kernel program cannot be compiled (Triton missing, or a config that does not fit it)."""
