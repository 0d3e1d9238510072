"""Analytic operator costs: a roofline plus a launch overhead.

``time = max(flops / peak rate, bytes moved / bandwidth) + launch overhead``. Bytes moved are
every input read once and every output written once. FLOPs, bytes and which operators are views
come from each operator's cost facts in the registry (``OpDef.cost``, declared in
``superopt/ir/opdefs.py``); an operator without them is an error. What we treat as a view:

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

from ..ir.ops import CostFacts, get_op
from ..ir.types import TensorType
from .devices import Device
from .errors import CostError

__all__ = ["DTYPE_BYTES", "cost_facts", "op_flops", "op_bytes", "is_view", "analytic_time", "flop_kind"]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1}


def _nbytes(t: TensorType) -> int:
    return t.numel * DTYPE_BYTES.get(t.dtype, 4)


def cost_facts(op: str) -> CostFacts:
    """The operator's declared cost facts (``OpDef.cost``); an operator without them is an error,
    never silently priced at one FLOP per element."""
    facts = get_op(op).cost
    if facts is None:
        raise CostError(f"operator {op!r} declares no cost facts; add a declare_cost({op!r}, CostFacts(...)) "
                        f"next to its declaration in superopt/ir/opdefs.py")
    return facts


def _is_constant(op: str) -> bool:
    return get_op(op).kind in ("constant", "source")


def flop_kind(op: str) -> str:
    """Which peak rate an operator runs at: ``matmul``, ``conv`` or ``vector``."""
    return cost_facts(op).rate


def op_flops(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> float:
    """Floating-point operations of one application (multiply-add = 2)."""
    return float(cost_facts(op).flops(dict(attrs), list(ins), list(outs)))


def is_view(op: str, attrs: Mapping, ins: Sequence[TensorType]) -> bool:
    """True when torch runs the operator as a view of its input (no kernel, no copy)."""
    view = cost_facts(op).view
    return bool(view is not None and view(dict(attrs), list(ins)))


def op_bytes(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> float:
    """Bytes read and written, zero for views."""
    facts = cost_facts(op)
    if facts.view is not None and facts.view(dict(attrs), list(ins)):
        return 0.0
    if facts.bytes is not None:
        return float(facts.bytes(dict(attrs), list(ins), list(outs), DTYPE_BYTES.get(outs[0].dtype, 4)))
    return float(sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs))


def analytic_time(op: str, attrs: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType],
                  device: Device, launch_s: float | None = None, dtype: str | None = None) -> float:
    """Estimated seconds for one application on ``device`` (roofline + launch); ``dtype`` overrides
    the tensors' own (``tf32``, ``bfloat16``: the precision the model will run at)."""
    if _is_constant(op) or is_view(op, attrs, ins):
        return 0.0
    dtype = dtype or (outs[0].dtype if outs else "float32")
    compute = op_flops(op, attrs, ins, outs) / device.rate(flop_kind(op), dtype)
    memory = op_bytes(op, attrs, ins, outs) / device.bandwidth
    if dtype in ("bfloat16", "float16") and outs and outs[0].dtype == "float32":
        memory /= 2  # a float32 graph priced at half precision moves half the bytes
    return max(compute, memory) + (device.launch_s if launch_s is None else launch_s)
