"""Profiles: measured operator times, keyed by operator, attributes, input shapes and dtype.

A profile is a JSON file measured on one machine (``superopt profile``) and usable on any
other: it records the device it was measured on, the torch and CUDA versions, the precision
(``fp32`` with TF32 off, ``tf32``, ``bf16``, ``fp16``) and the settings. Each entry holds the
median eager time (what one operator call costs in a torch program, launch included) and the
median time inside a CUDA graph (the kernel alone); their difference is the launch overhead.
A convolution's entry also holds its kernel time in channels-last memory (``nhwc_us``), the
layout Inductor gives convolutional graphs, and the time of one cuDNN call that also adds a bias
and applies a ReLU after it (``relu_us``, ``nhwc_relu_us``: :mod:`superopt.codegen.cudnn`).
The entry of a matmul by a matrix also holds its time as one ``F.linear`` call with a bias
(``linear_us``), the call the generated code makes of a matmul and its bias add.
A CUDA profile's convolution times inside a graph are taken with the weights cold
(``settings.conv_weights``; :mod:`superopt.cost.measure` says why), its eager time hot.

A shape that was not measured is interpolated from entries of the same operator, attributes
and dtype whose inputs differ only in their batch axis (the first input's leading axis, and
that of the other inputs with the same leading size): linearly in the number of
elements between the two that bracket it, past the largest along the line through the last two,
below the smallest at its time (:meth:`Profile.nearby`); past the only one measured, not at all
(the cost model estimates it).
A convolution of other channels or image sizes is priced from the measured convolution
nearest to it as a matrix multiply, scaled by their FLOPs (:meth:`Profile.nearest_conv`):
cuDNN's speed varies too much between shapes (fp32, H100, batch 1: a 384-channel 3x3 on 8x8
pixels ran at 2 TFLOP/s, a 64-channel one on 56x56 at 10) for one device-wide factor to
price a shape the profile lacks, and a rewrite that makes such a shape must not look cheap.

>>> from superopt.ir import TensorType
>>> p = Profile(device="cpu", device_name="test cpu")
>>> p.add(ProfileEntry("relu", {}, [[2, 4]], "float32", eager_us=3.0, graph_us=1.0))
>>> p.lookup("relu", {}, [TensorType((2, 4))]).eager_us
3.0
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..ir.opdefs import conv_out_size
from ..ir.types import TensorType
from .errors import ProfileError

__all__ = ["FORMAT", "VERSION", "PRECISIONS", "ProfileEntry", "Profile", "op_key", "load_profile",
           "precision_dtype"]

FORMAT = "superopt.profile"
VERSION = 5  # 3: convolutions' channels-last time (nhwc_us); 4: fused conv+bias+ReLU (relu_us, nhwc_relu_us);
# 5: a matmul as F.linear with a bias (linear_us), graph times without the graph's launch
#: precision -> the tensor dtype it runs in (tf32: float32 tensors, TF32 tensor-core math)
PRECISIONS = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def precision_dtype(precision: str) -> str:
    """The tensor dtype of a precision name.

    >>> precision_dtype("bf16")
    'bfloat16'
    """
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ProfileError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}") from None
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
    nhwc_us: float | None = None  # conv2d: kernel time with input and kernel channels-last
    relu_us: float | None = None  # conv2d: cuDNN's conv + bias + ReLU as one call (NCHW)
    nhwc_relu_us: float | None = None  # the same, channels-last
    linear_us: float | None = None  # matmul by a matrix: one F.linear call with a bias, inside a CUDA graph

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
    precision: str = "fp32"
    cuda_version: str = ""

    def __post_init__(self):
        self._by_op: dict | None = None
        self._convs: dict | None = None
        self._sizes: dict | None = None

    def add(self, entry: ProfileEntry) -> None:
        self.entries[entry.key] = entry
        self._by_op = self._convs = self._sizes = None

    def lookup(self, op: str, attrs: Mapping, in_types: Sequence[TensorType]) -> ProfileEntry | None:
        """The entry measured at exactly these shapes (in the profile's dtype), or None."""
        return self.entries.get(op_key(op, attrs, [t.shape for t in in_types], self.dtype))

    def nearby(self, op: str, attrs: Mapping, in_types: Sequence[TensorType]) -> tuple[float, float | None] | None:
        """(eager, graph) microseconds interpolated along the batch axis (module docstring), or None."""
        near = self._bracket(op, attrs, in_types, lambda e: True)
        if near is None:
            return None
        a, b, w = near
        return a.eager_us + w * (b.eager_us - a.eager_us), _mix(a.graph_us, b.graph_us, w)

    def nearby_nhwc(self, op: str, attrs: Mapping, in_types: Sequence[TensorType]) -> float | None:
        """A convolution's channels-last time interpolated as :meth:`nearby` does, or None."""
        return self.nearby_field(op, attrs, in_types, "nhwc_us")

    def nearby_field(self, op: str, attrs: Mapping, in_types: Sequence[TensorType], name: str) -> float | None:
        """An entry's optional time ``name`` (``nhwc_us``, ``linear_us``, ...): measured at these
        shapes, else interpolated as :meth:`nearby` does between entries that have it, else None."""
        e = self.lookup(op, attrs, in_types)
        if e is not None and getattr(e, name) is not None:
            return float(getattr(e, name))
        near = self._bracket(op, attrs, in_types, lambda e: getattr(e, name) is not None)
        return None if near is None else _mix(getattr(near[0], name), getattr(near[1], name), near[2])

    def _bracket(self, op, attrs, in_types, usable) -> tuple[ProfileEntry, ProfileEntry, float] | None:
        """The two entries to interpolate between and the weight of the second: those that
        bracket the size, past the largest the last two (the line extended), below the
        smallest the smallest alone. None past a single smaller entry: one point gives no
        slope (its time alone had priced a b16 matmul at its b1 time, 9x too cheap, and the
        search merged matmuls for it); the caller estimates instead."""
        shapes = [tuple(t.shape) for t in in_types]
        if not shapes or not shapes[0]:
            return None
        pts = sorted((e for e in self._index().get(_batch_free(op, attrs, self.dtype, shapes), []) if usable(e)),
                     key=lambda e: _numel(e.inputs))
        if not pts:
            return None
        n = _numel(shapes)
        lo = [e for e in pts if _numel(e.inputs) <= n]
        hi = [e for e in pts if _numel(e.inputs) >= n]
        if lo and hi:
            a, b = lo[-1], hi[0]
        elif len(lo) > 1:
            a, b = lo[-2], lo[-1]
        elif lo:
            return None
        else:
            a = b = hi[0]
        if a is b or _numel(a.inputs) == _numel(b.inputs):
            return b, b, 0.0
        return a, b, (n - _numel(a.inputs)) / (_numel(b.inputs) - _numel(a.inputs))

    def nearest_conv(self, attrs: Mapping, in_types: Sequence[TensorType],
                     usable=lambda e: True) -> tuple[ProfileEntry, float] | None:
        """The measured convolution (one ``usable`` says yes to) with the same stride,
        activation and grouping (none, depthwise, other) that is nearest to this one as a
        matrix multiply (output pixels x output channels x reduction length, each compared on
        a log scale), and this one's FLOPs over its FLOPs; None when there is none."""
        dims = _conv_dims(attrs, [tuple(t.shape) for t in in_types])
        if dims is None:
            return None
        family, m, n, k = dims
        if self._convs is None:
            self._convs = {}
            for e in self.entries.values():
                d = _conv_dims(e.attrs, e.inputs) if e.op == "conv2d" else None
                if d is not None:
                    self._convs.setdefault((e.dtype, d[0]), []).append((d[1], d[2], d[3], e))
        best, far = None, math.inf
        for em, en, ek, e in self._convs.get((self.dtype, family), []):
            gap = abs(math.log(m / em)) + abs(math.log(n / en)) + abs(math.log(k / ek))
            if gap < far and usable(e):
                best, far = (e, m * n * k / (em * en * ek)), gap
        return best

    def contained(self, op: str, attrs: Mapping, in_types: Sequence[TensorType]) -> list[ProfileEntry]:
        """The measured applications whose work this one does all of: the same operator and
        attributes, no size larger (:func:`_work_sizes`). Their times are a floor for a shape
        the profile lacks: a rewrite that makes a larger operator than any measured must not
        look cheaper than a measured smaller one."""
        mine = _work_sizes(op, attrs, [tuple(t.shape) for t in in_types], self.dtype)
        if mine is None:
            return []
        if self._sizes is None:
            self._sizes = {}
            for e in self.entries.values():
                d = _work_sizes(e.op, e.attrs, e.inputs, e.dtype)
                if d is not None:
                    self._sizes.setdefault(d[0], []).append((d[1], e))
        key, sizes = mine
        return [e for s, e in self._sizes.get(key, []) if all(a <= b for a, b in zip(s, sizes))]

    def _index(self) -> dict:
        if self._by_op is None:
            self._by_op = {}
            for e in self.entries.values():
                if e.inputs and e.inputs[0]:
                    rest = _batch_free(e.op, e.attrs, e.dtype, e.inputs)
                    self._by_op.setdefault(rest, []).append(e)
        return self._by_op

    def to_json(self) -> dict:
        head = {k: v for k, v in asdict(self).items() if k != "entries" and not k.startswith("_")}
        body = [{k: v for k, v in asdict(e).items() if v is not None or k not in _OPTIONAL}
                for e in sorted(self.entries.values(), key=lambda e: e.key)]
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
        if doc.get("version") not in (1, 2, 3, 4, VERSION):
            raise ProfileError(f"{where}: profile format version {doc.get('version')!r} is not supported "
                               f"(this superopt reads {VERSION}); measure it again with `superopt profile`")
        try:
            head = {k: doc[k] for k in ("device_name", "torch_version", "dtype", "launch_overhead_us", "settings",
                                        "precision", "cuda_version") if k in doc}
            prof = Profile(device=doc["device"], **head)
            for e in doc.get("entries", []):
                prof.add(ProfileEntry(**e))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{where}: corrupt profile ({type(e).__name__}: {e})") from None
        return prof


#: entry fields that only some operators have: left out of the file where there is none
_OPTIONAL = ("nhwc_us", "relu_us", "nhwc_relu_us", "linear_us")


def _batch_free(op, attrs, dtype, shapes) -> str:
    """The interpolation key: the shapes without the batch axis, which is the first input's
    leading axis and that of every input whose leading size equals it (a convolution's
    kernel keeps its output channels: entries that differ there are not the same operator)."""
    lead = shapes[0][0]
    return json.dumps([op, op_key(op, attrs, [], dtype),
                       [["b", *s[1:]] if s and s[0] == lead else list(s) for s in shapes]])


def _work_sizes(op: str, attrs: Mapping, shapes, dtype: str) -> tuple[str, tuple] | None:
    """(what must match, sizes that must not be larger) for :meth:`Profile.contained`. A 2-d
    convolution: same stride and activation; batch, output pixels, output channels, input
    channels per group, kernel window and number of groups (a grouped convolution does the
    multiply-adds of a plain one with all its output channels over one group's inputs, and
    reads more: measured, H100 fp32, a 2-group 3x3 of 384 output channels took 28 us, the plain
    one over 48 input channels 21). Any other operator: same attributes and ranks, each axis."""
    shapes = [tuple(int(d) for d in s) for s in shapes]
    if op == "conv2d":
        geo = _conv_geometry(attrs, shapes)
        if geo is None:
            return None
        b, c, oh, ow, o, ci, kh, kw = geo
        rest = {k: v for k, v in attrs.items() if k not in ("groups", "padding")}
        return (json.dumps([op, op_key(op, rest, [], dtype), len(shapes)]),
                (b, oh, ow, o, ci, max(c // ci, 1) if ci else 1, kh, kw))
    return (json.dumps([op, op_key(op, attrs, [], dtype), [len(s) for s in shapes]]),
            tuple(d for s in shapes for d in s))


def _conv_geometry(attrs: Mapping, shapes) -> tuple | None:
    """(batch, input channels, output rows, output columns, output channels, input channels per
    group, kernel rows, kernel columns) of a 2-d convolution, or None if the shapes are not one."""
    if len(shapes) < 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4:
        return None
    (b, c, h, w), (o, ci, kh, kw) = shapes[0], shapes[1]
    sh, sw = attrs.get("stride", (1, 1))
    ph, pw = attrs.get("padding", (0, 0))
    return b, c, conv_out_size(h, kh, sh, ph), conv_out_size(w, kw, sw, pw), o, ci, kh, kw


def _conv_dims(attrs: Mapping, shapes) -> tuple | None:
    """(family, output pixels, output channels, reduction length) of a 2-d convolution."""
    geo = _conv_geometry(attrs, shapes)
    if geo is None:
        return None
    b, c, oh, ow, o, ci, kh, kw = geo
    if min(b, oh, ow, o, ci * kh * kw) < 1:
        return None
    grouping = "plain" if ci == c else ("depthwise" if ci == 1 else "grouped")
    return (json.dumps([list(map(int, attrs.get("stride", (1, 1)))), attrs.get("activation", "none"), grouping]),
            b * oh * ow, o, ci * kh * kw)


def _numel(shapes) -> int:
    total = 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        total += n
    return total


def _mix(a, b, w):
    return None if a is None or b is None else a + w * (b - a)


def load_profile(path: str | Path, device: str | None = None, precision: str | None = None) -> Profile:
    """Read a profile; with ``device`` (``precision``) given, refuse one measured on another
    device (at another precision)."""
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
    if precision is not None and prof.precision != precision:
        raise ProfileError(f"profile {path} was measured at {prof.precision} ({prof.dtype}), but costs are asked "
                           f"for {precision}; pass --dtype {prof.precision} or a profile measured at {precision}")
    return prof
