"""Analytic operator costs: a roofline plus a launch overhead.

``time = max(flops / peak rate, bytes moved / bandwidth) + launch overhead``. Bytes moved are
every input read once and every output written once. Layout-only operators that torch runs
as views cost nothing; what we treat as a view:

* ``reshape`` (our producers write contiguous tensors, so torch's ``reshape`` is a view),
* ``split`` (``torch.split`` returns views, whatever the axis),
* ``transpose`` that only moves axes of size 1 (the data order does not change).

Any other ``transpose`` is charged as a copy (read + write + launch): its consumers
(convolutions, reshapes) make it contiguous. ``concat`` and ``enlarge`` are copies.
Constants (``identity_matrix``, ``ones``, ``zeros``...) and anything computed from weights alone are
folded at compile time and are priced at zero by :mod:`superopt.cost.model`, not here.

>>> from superopt.ir import TensorType
>>> from superopt.cost.devices import get_device
>>> t = analytic_time("relu", {}, [TensorType((1, 64, 56, 56))], [TensorType((1, 64, 56, 56))], get_device("h100"))
>>> round(t * 1e6, 2)  # microseconds: 1.6 MB over 3.35 TB/s, plus 4 us launch
4.48
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..ir.ops import get_op
from ..ir.types import TensorType
from .devices import Device

__all__ = ["DTYPE_BYTES", "op_flops", "op_bytes", "is_view", "analytic_time", "flop_kind"]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1}

#: FLOPs per output element of elementwise and normalization operators (rough, documented)
_PER_ELEMENT = {"add": 1, "mul": 1, "smul": 1, "relu": 1, "sigmoid": 4, "tanh": 4, "gelu": 8,
                "batchnorm": 2, "softmax": 5, "layernorm": 6, "enlarge": 0, "concat": 0,
                "transpose": 0, "reshape": 0, "split": 0}


def _nbytes(t: TensorType) -> int:
    return t.numel * DTYPE_BYTES.get(t.dtype, 4)


def _is_constant(op: str) -> bool:
    return get_op(op).kind == "constant"


def flop_kind(op: str) -> str:
    """Which peak rate an operator runs at: ``matmul``, ``conv`` or ``vector``."""
    return {"matmul": "matmul", "conv2d": "conv"}.get(op, "vector")


def op_flops(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> float:
    """Floating-point operations of one application (multiply-add = 2)."""
    if op == "matmul":
        return 2.0 * outs[0].numel * ins[0].shape[-1]
    if op == "conv2d":
        w = ins[1].shape
        macs = outs[0].numel * w[1] * w[2] * w[3]
        return 2.0 * macs + (outs[0].numel if attrs.get("activation") == "relu" else 0)
    if op in ("avgpool2d", "maxpool2d"):
        kh, kw = attrs["kernel"]
        return float(outs[0].numel * kh * kw)
    if _is_constant(op):
        return 0.0
    return float(_PER_ELEMENT.get(op, 1) * sum(t.numel for t in outs))


def is_view(op: str, attrs: Mapping, ins: Sequence[TensorType]) -> bool:
    """True when torch runs the operator as a view of its input (no kernel, no copy)."""
    if op in ("reshape", "split"):
        return True
    if op == "transpose":
        moved = [p for p in attrs["perm"] if ins[0].shape[p] != 1]
        return moved == sorted(moved)
    return False


def op_bytes(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> float:
    """Bytes read and written, zero for views."""
    if is_view(op, attrs, ins):
        return 0.0
    return float(sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs))


def analytic_time(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType],
                  device: Device, launch_s: float | None = None) -> float:
    """Estimated seconds for one application on ``device`` (roofline + launch)."""
    if is_view(op, attrs, ins) or _is_constant(op):
        return 0.0
    dtype = outs[0].dtype if outs else "float32"
    compute = op_flops(op, attrs, ins, outs) / device.rate(flop_kind(op), dtype)
    memory = op_bytes(op, attrs, ins, outs) / device.bandwidth
    return max(compute, memory) + (device.launch_s if launch_s is None else launch_s)
