"""ONNX operators -> ATen calls, for :mod:`superopt.frontend.onnx_import`.

Each translation ``fn(ctx, node, inputs)`` returns the value (or list of values) of the
node's outputs, built with ``ctx.call`` on ``torch.ops.aten`` overloads so that the ATen
handlers decide what becomes an IR operator. Inputs that ONNX passes as tensors but that are
really static arguments (Reshape's shape, Slice's starts, Split's sizes, ...) must be
constants; shape arithmetic (Shape, Gather, Concat on int64) folds to constants on the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .context import Const
from .errors import ModelImportError

__all__ = ["ONNX_OPS", "OnnxNode", "attributes", "onnx_dtype"]

aten = torch.ops.aten
ONNX_OPS: dict[str, Callable] = {}


@dataclass
class OnnxNode:
    """The parts of an ONNX node a translation needs."""

    op_type: str
    name: str
    attrs: dict[str, Any]
    opset: int
    num_outputs: int

    def get(self, key, default=None):
        return self.attrs.get(key, default)


def onnx_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype of an ONNX tensor element type."""
    from onnx import helper
    try:
        return torch.from_numpy(np.zeros(0, helper.tensor_dtype_to_np_dtype(elem_type))).dtype
    except (KeyError, TypeError, ValueError):
        raise ModelImportError(f"ONNX element type {elem_type} has no torch equivalent") from None


def attributes(node) -> dict[str, Any]:
    """A node's attributes as Python values (tensors as torch tensors, strings decoded)."""
    from onnx import helper, numpy_helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if hasattr(v, "dims") and hasattr(v, "data_type"):
            try:
                v = torch.from_numpy(numpy_helper.to_array(v).copy())
            except (TypeError, ValueError, KeyError) as e:  # a damaged tensor: wrong size, undefined type
                raise ModelImportError(f"ONNX node {node.name or node.op_type!r}: its tensor attribute {a.name!r} "
                                       f"cannot be read ({e}); the model is damaged") from None
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def onnx_op(*names: str):
    def deco(fn):
        for n in names:
            ONNX_OPS[n] = fn
        return fn
    return deco


def _ints(v, node: OnnxNode, what: str) -> list[int]:
    """A static integer list given as an ONNX tensor input (must be known at import time)."""
    if isinstance(v, Const):
        return [int(x) for x in v.data.reshape(-1).tolist()]
    raise ModelImportError(f"ONNX node {node.name} ({node.op_type}): its {what} is computed at run time; "
                           f"superopt needs it constant (export with static shapes)")


def _shape(ctx, v) -> tuple[int, ...]:
    return ctx.type_of(v).shape


def _call(ctx, target, *args, **kwargs):
    return ctx.call(target, args, kwargs)


# ---- elementwise ---------------------------------------------------------------------------

_BINARY = {"Add": aten.add.Tensor, "Sub": aten.sub.Tensor, "Mul": aten.mul.Tensor, "Pow": aten.pow.Tensor_Tensor,
           "Equal": aten.eq.Tensor, "Less": aten.lt.Tensor, "Greater": aten.gt.Tensor, "And": aten.logical_and.default,
           "Or": aten.logical_or.default, "Max": aten.maximum.default, "Min": aten.minimum.default}
_UNARY = {"Relu": aten.relu.default, "Sigmoid": aten.sigmoid.default, "Tanh": aten.tanh.default,
          "Erf": aten.erf.default, "Exp": aten.exp.default, "Log": aten.log.default, "Sqrt": aten.sqrt.default,
          "Neg": aten.neg.default, "Abs": aten.abs.default, "Reciprocal": aten.reciprocal.default,
          "Floor": aten.floor.default, "Ceil": aten.ceil.default, "Not": aten.logical_not.default}


@onnx_op(*_BINARY)
def _binary(ctx, node, ins):
    return _call(ctx, _BINARY[node.op_type], ins[0], ins[1])


@onnx_op("Div")
def _div(ctx, node, ins):
    a, b = ins
    if not ctx.type_of(a).dtype.startswith(("float", "bfloat")):
        return _call(ctx, aten.div.Tensor_mode, a, b, rounding_mode="trunc")
    return _call(ctx, aten.div.Tensor, a, b)


@onnx_op(*_UNARY)
def _unary(ctx, node, ins):
    return _call(ctx, _UNARY[node.op_type], ins[0])


@onnx_op("Gelu")
def _gelu(ctx, node, ins):
    return _call(ctx, aten.gelu.default, ins[0], approximate=node.get("approximate", "none"))


@onnx_op("LeakyRelu")
def _leaky_relu(ctx, node, ins):
    return _call(ctx, aten.leaky_relu.default, ins[0], node.get("alpha", 0.01))


@onnx_op("Clip")
def _clip(ctx, node, ins):
    bound = [ins[k].data.item() if len(ins) > k and isinstance(ins[k], Const) else node.get(key)
             for k, key in ((1, "min"), (2, "max"))]
    if any(len(ins) > k and ins[k] is not None and not isinstance(ins[k], Const) for k in (1, 2)):
        raise ModelImportError(f"ONNX node {node.name}: Clip with run-time bounds is not supported")
    return _call(ctx, aten.clamp.default, ins[0], *bound)


@onnx_op("Where")
def _where(ctx, node, ins):
    return _call(ctx, aten.where.self, *ins)


@onnx_op("Identity", "Dropout")
def _identity(ctx, node, ins):
    ctx.dropped += 1
    if node.num_outputs > 1:
        raise ModelImportError(f"ONNX node {node.name}: Dropout's mask output is not supported")
    return ins[0]


@onnx_op("Cast")
def _cast(ctx, node, ins):
    return _call(ctx, aten._to_copy.default, ins[0], dtype=onnx_dtype(node.get("to")))


@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx, node, ins):
    x, op = ins[0], aten._softmax.default if node.op_type == "Softmax" else aten._log_softmax.default
    rank = len(_shape(ctx, x))
    axis = node.get("axis", -1 if node.opset >= 13 else 1) % rank
    if node.opset >= 13 or axis == rank - 1:
        return _call(ctx, op, x, axis, False)
    shape = _shape(ctx, x)  # before opset 13: softmax of the input flattened to 2-D at axis
    flat = _call(ctx, aten.reshape.default, x, [math.prod(shape[:axis]), math.prod(shape[axis:])])
    return _call(ctx, aten.reshape.default, _call(ctx, op, flat, 1, False), list(shape))


# ---- linear algebra -------------------------------------------------------------------------

@onnx_op("MatMul")
def _matmul(ctx, node, ins):
    return _call(ctx, aten.matmul.default, ins[0], ins[1])


@onnx_op("Gemm")
def _gemm(ctx, node, ins):
    a, b = ins[0], ins[1]
    if node.get("transA", 0):
        a = _call(ctx, aten.t.default, a)
    if node.get("transB", 0):
        b = _call(ctx, aten.t.default, b)
    y = _call(ctx, aten.mm.default, a, b)
    if node.get("alpha", 1.0) != 1.0:
        y = _call(ctx, aten.mul.Tensor, y, node.get("alpha"))
    if len(ins) > 2 and ins[2] is not None:
        c = ins[2] if node.get("beta", 1.0) == 1.0 else _call(ctx, aten.mul.Tensor, ins[2], node.get("beta"))
        y = _call(ctx, aten.add.Tensor, y, c)
    return y


def _spatial_pads(node, rank: int, what: str) -> list[int]:
    """ONNX begin/end pads of the spatial axes, as symmetric ones (asymmetric -> pre-padding)."""
    if node.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise ModelImportError(f"ONNX node {node.name}: {what} with auto_pad={node.get('auto_pad')} is not supported; "
                               f"export with explicit pads")
    return list(node.get("pads", [0] * (2 * rank))) if node.get("auto_pad", "NOTSET") == "NOTSET" else [0] * (2 * rank)


def _prepad(ctx, x, pads, value):
    """Split ONNX pads into a symmetric part and an explicit constant pad for the rest."""
    n = len(pads) // 2
    sym = [min(pads[i], pads[i + n]) for i in range(n)]
    extra = []
    for i in reversed(range(n)):
        extra += [pads[i] - sym[i], pads[i + n] - sym[i]]
    if any(extra):
        x = _call(ctx, aten.constant_pad_nd.default, x, extra, value)
    return x, sym


@onnx_op("Conv")
def _conv(ctx, node, ins):
    x, w = ins[0], ins[1]
    k = len(_shape(ctx, w)) - 2
    x, pads = _prepad(ctx, x, _spatial_pads(node, k, "Conv"), 0.0)
    bias = ins[2] if len(ins) > 2 else None
    return _call(ctx, aten.convolution.default, x, w, bias, list(node.get("strides", [1] * k)), pads,
                 list(node.get("dilations", [1] * k)), False, [0] * k, node.get("group", 1))


@onnx_op("MaxPool", "AveragePool")
def _pool(ctx, node, ins):
    x = ins[0]
    kernel = list(node.get("kernel_shape"))
    k = len(kernel)
    if k not in (1, 2, 3) or node.num_outputs > 1:
        raise ModelImportError(f"ONNX node {node.name}: {node.op_type} with indices or {k}-D is not supported")
    is_max = node.op_type == "MaxPool"
    x, pads = _prepad(ctx, x, _spatial_pads(node, k, node.op_type), -math.inf if is_max else 0.0)
    stride, ceil = list(node.get("strides", [1] * k)), bool(node.get("ceil_mode", 0))
    if is_max:
        dilation = list(node.get("dilations", [1] * k))
        if k == 3:
            out = ctx.call(aten.max_pool3d_with_indices.default, (x, kernel, stride, pads, dilation, ceil), {},
                           needed={0})
            return out[0]
        return _call(ctx, aten.max_pool2d.default if k == 2 else aten.max_pool1d.default, x, kernel, stride, pads,
                     dilation, ceil)
    pool = {1: aten.avg_pool1d.default, 2: aten.avg_pool2d.default, 3: aten.avg_pool3d.default}[k]
    return _call(ctx, pool, x, kernel, stride, pads, ceil, bool(node.get("count_include_pad", 0)))


@onnx_op("GlobalAveragePool")
def _global_avgpool(ctx, node, ins):
    rank = len(_shape(ctx, ins[0]))
    return _call(ctx, aten.mean.dim, ins[0], list(range(2, rank)), True)


@onnx_op("BatchNormalization")
def _batchnorm(ctx, node, ins):
    if node.get("training_mode", 0) or node.num_outputs > 1:
        raise ModelImportError(f"ONNX node {node.name}: BatchNormalization in training mode is not supported")
    out = ctx.call(aten._native_batch_norm_legit_no_training.default,
                   (*ins[:5], node.get("momentum", 0.9), node.get("epsilon", 1e-5)), {}, needed={0})
    return out[0]


@onnx_op("LayerNormalization")
def _layernorm(ctx, node, ins):
    x = ins[0]
    shape = _shape(ctx, x)
    axis = node.get("axis", -1) % len(shape)
    if node.num_outputs > 1:
        raise ModelImportError(f"ONNX node {node.name}: LayerNormalization's mean/inv-std outputs are not supported")
    bias = ins[2] if len(ins) > 2 else None
    return _call(ctx, aten.layer_norm.default, x, list(shape[axis:]), ins[1], bias, node.get("epsilon", 1e-5))


@onnx_op("LRN")
def _lrn(ctx, node, ins):
    kwargs = dict(size=node.get("size"), alpha=node.get("alpha", 1e-4), beta=node.get("beta", 0.75),
                  k=node.get("bias", 1.0))
    return ctx.call_function("torch.nn.functional.local_response_norm", (ins[0],), kwargs)
