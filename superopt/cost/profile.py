"""Profiles: measured operator times, keyed by operator, attributes, input shapes and dtype.

A profile is a JSON file measured on one machine (``superopt profile``) and usable on any
other: it records the device it was measured on, the torch version and the settings. Each
entry holds the median eager time (what one operator call costs in a torch program,
launch included) and the median time inside a CUDA graph (the kernel alone); their
difference is the launch overhead.

>>> from superopt.ir import TensorType
>>> p = Profile(device="cpu", device_name="test cpu")
>>> p.add(ProfileEntry("relu", {}, [[2, 4]], "float32", eager_us=3.0, graph_us=1.0))
>>> p.lookup("relu", {}, [TensorType((2, 4))]).eager_us
3.0
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..ir.types import TensorType
from .errors import ProfileError

__all__ = ["FORMAT", "VERSION", "ProfileEntry", "Profile", "op_key", "load_profile"]

FORMAT = "superopt.profile"
VERSION = 1
_SKIP_ATTRS = ("name", "dtype", "out_types", "params")


def _jsonable(v):
    return [_jsonable(x) for x in v] if isinstance(v, (tuple, list)) else v


def op_key(op: str, attrs: Mapping[str, Any], shapes: Sequence[Sequence[int]], dtype: str) -> str:
    """The lookup key of one operator application (a JSON string).

    >>> op_key("conv2d", {"stride": (1, 1)}, [(1, 3, 8, 8), (4, 3, 3, 3)], "float32")
    '["conv2d", {"stride": [1, 1]}, [[1, 3, 8, 8], [4, 3, 3, 3]], "float32"]'
    """
    clean = {k: _jsonable(v) for k, v in sorted(dict(attrs).items()) if k not in _SKIP_ATTRS}
    return json.dumps([op, clean, [list(map(int, s)) for s in shapes], dtype])


@dataclass
class ProfileEntry:
    """One measured operator application; times in microseconds."""

    op: str
    attrs: dict
    inputs: list
    dtype: str
    eager_us: float
    graph_us: float | None = None
    models: list = field(default_factory=list)

    def __post_init__(self):
        self.attrs = {k: _jsonable(v) for k, v in dict(self.attrs).items() if k not in _SKIP_ATTRS}
        self.inputs = [list(map(int, s)) for s in self.inputs]

    @property
    def key(self) -> str:
        return op_key(self.op, self.attrs, self.inputs, self.dtype)


@dataclass
class Profile:
    """Measured times of one device (see the module docstring)."""

    device: str
    device_name: str = ""
    torch_version: str = ""
    dtype: str = "float32"
    launch_overhead_us: float | None = None
    settings: dict = field(default_factory=dict)
    entries: dict = field(default_factory=dict)

    def add(self, entry: ProfileEntry) -> None:
        self.entries[entry.key] = entry

    def lookup(self, op: str, attrs: Mapping, in_types: Sequence[TensorType]) -> ProfileEntry | None:
        dtype = in_types[0].dtype if in_types else self.dtype
        return self.entries.get(op_key(op, attrs, [t.shape for t in in_types], dtype))

    def to_json(self) -> dict:
        head = {k: v for k, v in asdict(self).items() if k != "entries"}
        body = [asdict(e) for e in sorted(self.entries.values(), key=lambda e: e.key)]
        return {"format": FORMAT, "version": VERSION, **head, "entries": body}

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON: the header indented, one line per entry."""
        doc = self.to_json()
        entries = doc.pop("entries")
        head = json.dumps(doc, indent=1)[:-2]
        lines = ",\n  ".join(json.dumps(e, sort_keys=True) for e in entries)
        from ..fileio import write_text  # atomic: a failed write never leaves half a profile
        write_text(path, f'{head},\n "entries": [\n  {lines}\n ]\n}}\n')

    @staticmethod
    def from_json(doc: Any, where: str = "profile") -> "Profile":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ProfileError(f"{where}: not a superopt profile (missing \"format\": \"{FORMAT}\")")
        if doc.get("version") != VERSION:
            raise ProfileError(f"{where}: profile format version {doc.get('version')!r} is not supported "
                               f"(this superopt reads {VERSION}); measure it again with `superopt profile`")
        try:
            head = {k: doc[k] for k in ("device_name", "torch_version", "dtype", "launch_overhead_us", "settings")
                    if k in doc}
            prof = Profile(device=doc["device"], **head)
            for e in doc.get("entries", []):
                prof.add(ProfileEntry(**e))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{where}: corrupt profile ({type(e).__name__}: {e})") from None
        return prof


def load_profile(path: str | Path, device: str | None = None) -> Profile:
    """Read a profile; with ``device`` given, refuse one measured on another device."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise ProfileError(f"cannot read profile {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ProfileError(f"profile {path} is not a text (JSON) file; give a file written by `superopt profile`") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"profile {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    prof = Profile.from_json(doc, str(path))
    if device is not None and prof.device != device:
        raise ProfileError(f"profile {path} was measured on {prof.device!r} ({prof.device_name or 'no name'}), "
                           f"but costs are asked for {device!r}; pass --device {prof.device} or a profile "
                           f"measured on {device}")
    return prof
