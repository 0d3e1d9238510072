"""Errors of the cost model: bad profiles, unknown devices, measuring problems."""

from __future__ import annotations

from ..errors import SuperoptError

__all__ = ["CostError", "ProfileError", "UnknownDeviceError"]


class CostError(SuperoptError):
    """The cost model cannot price a graph as asked."""


class ProfileError(CostError):
    """A profile file is unreadable, of another format version, or for another device."""


class UnknownDeviceError(CostError):
    """A device name has no analytic description."""
