"""ONNX layout, shape and constant operators -> ATen calls (see :mod:`superopt.frontend.onnx_ops`).

Registered into :data:`ONNX_OPS` on import. Reshape-like operators compute the output shape
here and become one ``aten.reshape``; ``Shape`` and ``Constant`` produce constants, so the
shape arithmetic exporters emit folds away at import time.
"""

from __future__ import annotations

import math

import torch

from .context import Const
from .errors import ModelImportError
from .onnx_ops import _call, _ints, _shape, aten, onnx_op

__all__: list[str] = []


def _reshape(ctx, x, shape):
    return _call(ctx, aten.reshape.default, x, [int(d) for d in shape])


def _axes(node, ins, position: int, rank: int, default=None) -> list[int] | None:
    """Axes given as an attribute (older opsets) or as input ``position`` (newer ones)."""
    if len(ins) > position and ins[position] is not None:
        axes = _ints(ins[position], node, "axes")
    else:
        axes = node.get("axes", default)
    return None if axes is None else sorted(a % rank for a in axes)


@onnx_op("Reshape")
def _reshape_op(ctx, node, ins):
    x, shape = ins[0], _ints(ins[1], node, "target shape")
    old = _shape(ctx, x)
    if not node.get("allowzero", 0):
        shape = [old[i] if d == 0 else d for i, d in enumerate(shape)]
    return _reshape(ctx, x, shape)


@onnx_op("Flatten")
def _flatten(ctx, node, ins):
    shape = _shape(ctx, ins[0])
    axis = node.get("axis", 1) % (len(shape) + 1) if shape else 0
    return _reshape(ctx, ins[0], [math.prod(shape[:axis]), math.prod(shape[axis:])])


@onnx_op("Squeeze")
def _squeeze(ctx, node, ins):
    shape = _shape(ctx, ins[0])
    axes = _axes(node, ins, 1, len(shape))
    keep = [d for i, d in enumerate(shape) if not (d == 1 and (axes is None or i in axes))]
    return _reshape(ctx, ins[0], keep)


@onnx_op("Unsqueeze")
def _unsqueeze(ctx, node, ins):
    shape = list(_shape(ctx, ins[0]))
    given = _ints(ins[1], node, "axes") if len(ins) > 1 and ins[1] is not None else list(node.get("axes"))
    for a in sorted(a % (len(shape) + len(given)) for a in given):
        shape.insert(a, 1)
    return _reshape(ctx, ins[0], shape)


@onnx_op("Transpose")
def _transpose(ctx, node, ins):
    rank = len(_shape(ctx, ins[0]))
    return _call(ctx, aten.permute.default, ins[0], list(node.get("perm", range(rank - 1, -1, -1))))


@onnx_op("Concat")
def _concat(ctx, node, ins):
    return _call(ctx, aten.cat.default, [x for x in ins if x is not None], node.get("axis"))


@onnx_op("Split")
def _split(ctx, node, ins):
    x = ins[0]
    shape = _shape(ctx, x)
    axis = node.get("axis", 0) % len(shape)
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1], node, "split sizes")
    elif node.get("split") is not None:
        sizes = list(node.get("split"))
    else:
        n = node.get("num_outputs", node.num_outputs)
        each = -(-shape[axis] // n)
        sizes = [min(each, shape[axis] - k * each) for k in range(n)]
    return list(_call(ctx, aten.split_with_sizes.default, x, sizes, axis))


@onnx_op("Slice")
def _slice(ctx, node, ins):
    x = ins[0]
    rank = len(_shape(ctx, x))
    starts, ends = _ints(ins[1], node, "starts"), _ints(ins[2], node, "ends")
    axes = _ints(ins[3], node, "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4], node, "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if isinstance(x, Const):  # constants may use any step, negative ones included
        index = [slice(None)] * rank
        for a, s, e, st in zip(axes, starts, ends, steps):
            index[a % rank] = slice(s, e, st)
        return Const(torch.from_numpy(x.data.numpy()[tuple(index)].copy()), x.name)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st < 0:
            raise ModelImportError(f"ONNX node {node.name}: Slice with a negative step is not supported")
        n = _shape(ctx, x)[a % rank]
        x = _call(ctx, aten.slice.Tensor, x, a % rank, max(min(s, n), -n), max(min(e, n), -n - 1), st)
    return x


@onnx_op("Gather")
def _gather(ctx, node, ins):
    data, idx = ins
    axis = node.get("axis", 0) % len(_shape(ctx, data))
    if isinstance(data, Const) and not isinstance(idx, Const) and axis == 0 and len(_shape(ctx, data)) == 2:
        return _call(ctx, aten.embedding.default, data, idx)  # a lookup table: the IR's embedding
    if not isinstance(idx, Const):
        raise ModelImportError(f"ONNX node {node.name}: Gather with run-time indices is not supported")
    if idx.data.dim() == 0:
        return _call(ctx, aten.select.int, data, axis, int(idx.data))
    flat = _call(ctx, aten.index_select.default, data, axis, Const(idx.data.reshape(-1).long(), "indices"))
    shape = _shape(ctx, data)
    return _reshape(ctx, flat, list(shape[:axis]) + list(idx.data.shape) + list(shape[axis + 1:]))


@onnx_op("Pad")
def _pad(ctx, node, ins):
    x = ins[0]
    rank = len(_shape(ctx, x))
    pads = _ints(ins[1], node, "pads") if len(ins) > 1 else list(node.get("pads"))
    value = float(ins[2].data) if len(ins) > 2 and isinstance(ins[2], Const) else node.get("value", 0.0)
    axes = _axes(node, ins, 3, rank, list(range(rank)))
    full = [0] * (2 * rank)
    for k, a in enumerate(axes):
        full[a], full[a + rank] = pads[k], pads[k + len(axes)]
    torch_pads = []
    for a in reversed(range(rank)):
        torch_pads += [full[a], full[a + rank]]
    mode = node.get("mode", "constant")
    if mode != "constant":
        return _call(ctx, aten.pad.default, x, torch_pads, {"reflect": "reflect", "edge": "replicate"}.get(mode, mode))
    return _call(ctx, aten.constant_pad_nd.default, x, torch_pads, value)


@onnx_op("Expand")
def _expand(ctx, node, ins):
    shape = _ints(ins[1], node, "shape")
    old = _shape(ctx, ins[0])
    n = max(len(shape), len(old))
    a, b = [1] * (n - len(old)) + list(old), [1] * (n - len(shape)) + shape
    out = [max(x, y) if 1 in (x, y) else x for x, y in zip(a, b)]
    return _call(ctx, aten.expand.default, _reshape(ctx, ins[0], a), out)


@onnx_op("ReduceMean", "ReduceSum")
def _reduce(ctx, node, ins):
    rank = len(_shape(ctx, ins[0]))
    axes = _axes(node, ins, 1, rank) or list(range(rank))
    keep = bool(node.get("keepdims", 1))
    if node.op_type == "ReduceMean":
        return _call(ctx, aten.mean.dim, ins[0], axes, keep)
    return _call(ctx, aten.sum.dim_IntList, ins[0], axes, keep)


@onnx_op("Shape")
def _shape_op(ctx, node, ins):
    shape = list(_shape(ctx, ins[0]))
    return Const(torch.tensor(shape[node.get("start", 0):node.get("end", len(shape))], dtype=torch.int64), "shape")


@onnx_op("Constant")
def _constant(ctx, node, ins):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in node.attrs:
            v = node.attrs[key]
            return Const(v if isinstance(v, torch.Tensor) else torch.tensor(v), node.name)
    raise ModelImportError(f"ONNX node {node.name}: Constant without a numeric value")


@onnx_op("ConstantOfShape")
def _constant_of_shape(ctx, node, ins):
    value = node.get("value", torch.zeros(1, dtype=torch.float32))
    return Const(torch.full(_ints(ins[0], node, "shape"), value.reshape(-1)[0].item(), dtype=value.dtype), "filled")


@onnx_op("Range")
def _range(ctx, node, ins):
    start, limit, delta = (x.data.item() if isinstance(x, Const) else None for x in ins)
    if None in (start, limit, delta):
        raise ModelImportError(f"ONNX node {node.name}: Range with run-time bounds is not supported")
    return Const(torch.arange(start, limit, delta, dtype=ins[0].data.dtype), "range")

