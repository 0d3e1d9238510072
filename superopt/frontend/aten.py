"""ATen operators -> IR operators: one handler per family, keyed by overload name.

A handler ``fn(ctx, a, expected)`` gets the call's arguments by schema name (``a``) and the
output types torch recorded (``expected``), builds IR nodes through ``ctx`` and returns the
value(s); it raises :class:`Unsupported` (before building anything, where it can) for a case
the IR has no operator for, and the call becomes an opaque node instead. Handlers cover both
the pre-dispatch ATen that ``torch.export.export`` gives (conv2d, linear, batch_norm, ...) and
the core ATen after ``run_decompositions()`` (convolution, addmm, _native_batch_norm_...).

Mappings (see the importer's design notes): a conv/linear bias becomes ``add`` of a weight
reshaped at import time; ``linear``'s matrix is transposed at import time; scalar multiply and
divide become ``smul`` by a rank-0 weight; ``layer_norm``'s affine part becomes ``mul`` and
``add``; view-like operators become ``reshape``, axis permutations ``transpose``; slicing with
step 1 and ``select`` become a ``split`` piece; zero padding becomes ``concat`` with constant
weights; eval-mode dropout, clones and same-dtype copies are dropped. Attention (the public
``scaled_dot_product_attention`` and the CPU/flash/efficient/math variants) becomes ``sdpa`` with
its scale made explicit and a boolean mask turned additive (a constant one at import, one built
in the graph through ``mask_bias``); ``embedding`` and ``pow``
with a constant scalar exponent map one to one. The operators of LLM blocks (RMSNorm's mean
and rsqrt, SiLU, rotary's negation, grouped-query attention's expand or repeat_interleave, a
KV cache's index_copy) are in :mod:`.aten_llm`; a tanh-approximate gelu becomes ``gelu_tanh``,
a float dtype conversion ``cast``, a strided slice ``slice``, an expand that copies ``expand``,
and attention with ``enable_gqa`` over fewer key-value heads ``sdpa`` with ``gqa=1``.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..ir.opdefs import conv_out_size
from ..ir.types import TensorType
from .aten_llm import LLM_HANDLERS
from .context import Const, ImportContext, Unsupported
from .errors import ModelImportError

__all__ = ["HANDLERS", "handles"]

HANDLERS: dict[str, Callable] = {}


def handles(*targets: str, passthrough: bool = False):
    """Register a handler for ATen overloads; ``passthrough`` handlers run even on constants."""
    def deco(fn):
        fn.passthrough = passthrough
        for t in targets:
            HANDLERS[t] = fn
        return fn
    return deco


def _pair(v) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise Unsupported(f"expected one or two values, got {v}")
    return int(v[0]), int(v[1])


def _is_tensor(v) -> bool:
    from ..ir.graph import Ref
    return isinstance(v, (Ref, Const))


def _rank(ctx, x, r: int, what: str):
    if ctx.type_of(x).rank != r:
        raise Unsupported(f"{what} of rank {ctx.type_of(x).rank}")


def _same_dtype(ctx, expected: TensorType, *xs):
    for x in xs:
        if ctx.type_of(x).dtype != expected.dtype:
            raise Unsupported(f"type promotion {ctx.type_of(x).dtype} -> {expected.dtype}")


def _scalar(ctx: ImportContext, v, dtype: str, name: str) -> Const:
    """A rank-0 constant of ``dtype`` from a Python number or a rank-0 constant."""
    data = v.data if isinstance(v, Const) else torch.tensor(v)
    return ctx.const(data.reshape(()).to(getattr(torch, dtype)), name)


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, Const) and v.data.dim() == 0


def _reshape_to(ctx, x, shape):
    return x if ctx.type_of(x).shape == tuple(shape) else ctx.op("reshape", x, shape=tuple(shape))


# ---- convolution and matrix products -----------------------------------------------------

def _bias(ctx, y, bias, shape):
    """``y + bias`` with the bias viewed as ``shape`` (reshaped at import time when constant)."""
    if bias is None:
        return y
    if isinstance(bias, Const):
        return ctx.op("add", y, ctx.const(bias.data.reshape(shape), bias.name))
    return ctx.op("add", y, ctx.op("reshape", bias, shape=shape))


def _conv_padding(ctx, a):
    pad = a["padding"]
    if pad == "valid":
        return 0, 0
    if pad == "same":
        kh, kw = ctx.type_of(a["weight"]).shape[2:]
        if kh % 2 == 0 or kw % 2 == 0:
            raise Unsupported("padding='same' with an even kernel is asymmetric")
        return kh // 2, kw // 2
    return _pair(pad)


@handles("aten.conv2d.default", "aten.conv2d.padding", "aten.convolution.default")
def _conv(ctx, a, expected):
    x, w = a["input"], a["weight"]
    _rank(ctx, x, 4, "convolution input")
    if a.get("transposed"):
        raise Unsupported("transposed convolution")
    if _pair(a["dilation"]) != (1, 1):
        raise Unsupported("dilated convolution")
    attrs = dict(stride=_pair(a["stride"]), padding=_conv_padding(ctx, a), groups=a["groups"])
    if a["bias"] is not None and CONV_BIAS_IMPORT:
        return ctx.op("conv2d_bias", x, w, a["bias"], **attrs)
    y = ctx.op("conv2d", x, w, **attrs)
    return _bias(ctx, y, a["bias"], (ctx.type_of(w).shape[0], 1, 1))


#: a convolution with a bias imports as one ``conv2d_bias`` node (True) or as ``conv2d`` and the
#: ``add`` of the bias viewed as [C, 1, 1] (False, the default): the ``cnn_bias`` rules make the
#: second into the first, not a conv2d_bias of a plain [C] weight back into the second, so with
#: False the search has both forms (SqueezeNet 1.1 searched to 74.73% less under the analytic model
#: against 40.14% with True; docs/search.md, "Round 6")
CONV_BIAS_IMPORT = False


@handles("aten.linear.default")
def _linear(ctx, a, expected):
    x, w = a["input"], a["weight"]
    if ctx.type_of(x).rank < 1 or ctx.type_of(w).rank != 2:
        raise Unsupported("linear on a scalar, or with a weight that is not a matrix")
    vector = ctx.type_of(x).rank == 1  # (D,) is computed as a (1, D) row and reshaped back
    if vector:
        x = ctx.op("reshape", x, shape=(1,) + ctx.type_of(x).shape)
    wt = ctx.const(w.data.t(), w.name) if isinstance(w, Const) else ctx.op("transpose", w, perm=(1, 0))
    y = ctx.op("matmul", x, wt)
    y = y if a["bias"] is None else ctx.op("add", y, a["bias"])
    return ctx.op("reshape", y, shape=ctx.type_of(y).shape[1:]) if vector else y


@handles("aten.addmm.default")
def _addmm(ctx, a, expected):
    if a["beta"] != 1 or a["alpha"] != 1:
        raise Unsupported("addmm with alpha or beta != 1")
    return ctx.op("add", ctx.op("matmul", a["mat1"], a["mat2"]), a["self"])


@handles("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx, a, expected):
    x, y = a["self"], a.get("mat2", a.get("other"))
    if ctx.type_of(x).rank < 2 or ctx.type_of(y).rank < 2:
        raise Unsupported("matmul with a vector")
    return ctx.op("matmul", x, y)


# ---- elementwise -------------------------------------------------------------------------

def _add_with(sign: int):
    """add (sign 1) or sub (sign -1): ``x + sign * alpha * y``."""
    def handler(ctx, a, expected):
        x, y, alpha = a["self"], a["other"], sign * a.get("alpha", 1)
        _same_dtype(ctx, expected, x)
        if _is_scalar(y):
            value = (y.data.item() if isinstance(y, Const) else y) * alpha
            return ctx.op("add", x, _scalar(ctx, value, expected.dtype, "scalar"))
        _same_dtype(ctx, expected, y)
        if alpha != 1:
            y = ctx.op("smul", y, _scalar(ctx, alpha, expected.dtype, "alpha"))
        return ctx.op("add", x, y)
    return handler


handles("aten.add.Tensor", "aten.add.Scalar")(_add_with(1))
handles("aten.sub.Tensor", "aten.sub.Scalar")(_add_with(-1))


@handles("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(ctx, a, expected):
    x, y = a["self"], a["other"]
    if _is_scalar(x) and _is_tensor(y):
        x, y = y, x
    _same_dtype(ctx, expected, x)
    if _is_scalar(y):
        return ctx.op("smul", x, _scalar(ctx, y, expected.dtype, "scale"))
    _same_dtype(ctx, expected, y)
    return ctx.op("mul", x, y)


@handles("aten.div.Tensor", "aten.div.Scalar")
def _div(ctx, a, expected):
    x, y = a["self"], a["other"]
    _same_dtype(ctx, expected, x)
    if _is_scalar(y):
        value = y.data.item() if isinstance(y, Const) else y
        if value == 0:
            raise Unsupported("division by zero")
        return ctx.op("smul", x, _scalar(ctx, 1.0 / value, expected.dtype, "scale"))
    if isinstance(y, Const) and y.data.is_floating_point():
        _same_dtype(ctx, expected, y)
        return ctx.op("mul", x, ctx.const(1.0 / y.data, f"{y.name}_reciprocal"))
    raise Unsupported("division by a tensor computed at run time")


def _unary(op: str):
    return lambda ctx, a, expected: ctx.op(op, a["self"])


for _op in ("relu", "sigmoid", "tanh"):
    handles(f"aten.{_op}.default")(_unary(_op))


@handles("aten.gelu.default")
def _gelu(ctx, a, expected):
    if a["approximate"] not in ("none", "tanh"):
        raise Unsupported(f"gelu with approximate={a['approximate']!r}")
    return ctx.op("gelu" if a["approximate"] == "none" else "gelu_tanh", a["self"])


@handles("aten.softmax.int", "aten._softmax.default")
def _softmax(ctx, a, expected):
    if a.get("dtype") is not None or a.get("half_to_float"):
        raise Unsupported("softmax with a dtype change")
    return ctx.op("softmax", a["self"], axis=a["dim"])


# ---- layout ------------------------------------------------------------------------------

@handles("aten.cat.default", "aten.concat.default")
def _cat(ctx, a, expected):
    xs = list(a["tensors"])
    _same_dtype(ctx, expected, *xs)
    dim = a["dim"] % ctx.type_of(xs[0]).rank
    # a piece empty along the axis adds nothing (Phi-3's rotary pass-through q[..., rotary_dim:]
    # when the rotation covers the whole head): leave it out, and its slice unused
    xs = [x for x in xs if ctx.type_of(x).shape[dim] != 0] or xs[:1]
    return xs[0] if len(xs) == 1 else ctx.op("concat", *xs, axis=dim)


@handles("aten.split.Tensor", "aten.split_with_sizes.default", "aten.unsafe_split.Tensor",
         "aten.split_with_sizes_copy.default", "aten.chunk.default")
def _split(ctx, a, expected):
    x, dim = a["self"], a["dim"]
    dim %= ctx.type_of(x).rank
    sizes = tuple(t.shape[dim] for t in expected)
    if len(sizes) == 1:
        return (x,)
    return tuple(ctx.add("split", [x], axis=dim, sizes=sizes))


def _take(ctx, x, dim: int, start: int, length: int):
    """Elements ``start:start+length`` of axis ``dim``, as one piece of a split."""
    n = ctx.type_of(x).shape[dim]
    if length == n:
        return x
    if length <= 0:
        raise Unsupported("empty slice")
    pieces = [s for s in (start, length, n - start - length) if s > 0]
    return ctx.add("split", [x], axis=dim, sizes=tuple(pieces))[1 if start > 0 else 0]


@handles("aten.slice.Tensor", "aten.narrow.default")
def _slice(ctx, a, expected):
    x = a["self"]
    rank = ctx.type_of(x).rank
    dim = a["dim"] % rank
    n = ctx.type_of(x).shape[dim]
    if "length" in a:
        start = a["start"] % n if a["start"] < 0 else a["start"]
        return _take(ctx, x, dim, start, a["length"])
    r = range(n)[slice(a["start"], a["end"], a["step"])]
    if r.step == 1 or len(r) == 1:
        return _take(ctx, x, dim, r.start, len(r))
    if len(r) == 0:
        raise Unsupported("empty slice")
    return ctx.op("slice", x, axis=dim, start=r.start, end=r[-1] + 1, step=r.step)


@handles("aten.select.int")
def _select(ctx, a, expected):
    x = a["self"]
    dim = a["dim"] % ctx.type_of(x).rank
    index = a["index"] % ctx.type_of(x).shape[dim]
    return _reshape_to(ctx, _take(ctx, x, dim, index, 1), expected.shape)


@handles("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.view_copy.default",
         "aten.flatten.using_ints", "aten.unsqueeze.default", "aten.squeeze.default", "aten.squeeze.dim",
         "aten.squeeze.dims", "aten.unflatten.int")
def _reshape(ctx, a, expected):
    return _reshape_to(ctx, a["self"], expected.shape)


@handles("aten.expand.default", "aten.expand_copy.default")
def _expand(ctx, a, expected):
    if ctx.type_of(a["self"]).numel == expected.numel:
        return _reshape_to(ctx, a["self"], expected.shape)
    return ctx.op("expand", a["self"], shape=expected.shape)


def _transpose_to(ctx, x, perm):
    perm = tuple(p % len(perm) for p in perm)
    return x if perm == tuple(range(len(perm))) else ctx.op("transpose", x, perm=perm)


@handles("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx, a, expected):
    return _transpose_to(ctx, a["self"], a["dims"])


@handles("aten.transpose.int", "aten.t.default")
def _transpose(ctx, a, expected):
    x = a["self"]
    rank = ctx.type_of(x).rank
    if rank < 2:
        return x
    d0, d1 = (a["dim0"] % rank, a["dim1"] % rank) if "dim0" in a else (0, 1)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _transpose_to(ctx, x, perm)


def _pass(ctx, x):
    ctx.dropped += 1
    return x


@handles("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default",
         "aten.contiguous.default", passthrough=True)
def _identity(ctx, a, expected):
    return _pass(ctx, a["self"])


@handles("aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
         "aten.feature_alpha_dropout.default", passthrough=True)
def _dropout(ctx, a, expected):
    if a["train"] and a["p"] > 0:
        raise Unsupported("dropout in training mode")
    return _pass(ctx, a["input"])


@handles("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.type_as.default",
         passthrough=True)
def _to(ctx, a, expected):
    x = a["self"]
    if ctx.type_of(x).dtype == expected.dtype:
        return _pass(ctx, x)
    if expected.dtype == "bool":  # a mask from an integer one (transformers' padding mask): x != 0
        if isinstance(x, Const):
            ctx.folded += 1
            return Const(x.data.to(torch.bool), x.name)
        zero = ctx.const(torch.zeros((), dtype=getattr(torch, ctx.type_of(x).dtype)), "zero")
        return ctx.op("compare", x, zero, cmp="ne")
    if not expected.dtype.startswith(("float", "bfloat")) or ctx.type_of(x).dtype not in (
            "int64", "float16", "bfloat16", "float32", "float64"):
        raise Unsupported(f"dtype conversion from {ctx.type_of(x).dtype} to {expected.dtype}")
    if isinstance(x, Const):  # a constant converted once, at import time
        ctx.folded += 1
        return Const(x.data.to(getattr(torch, expected.dtype)), x.name)
    return ctx.op("cast", x, dtype=expected.dtype)


# ---- padding -----------------------------------------------------------------------------

@handles("aten.constant_pad_nd.default", "aten.pad.default")
def _pad(ctx, a, expected):
    x, pads = a["self"], list(a["pad"])
    value = a["value"] or 0.0
    if a.get("mode", "constant") != "constant" or any(p < 0 for p in pads):
        raise Unsupported("padding that is not constant or that crops")
    t = ctx.type_of(x)
    shape = list(t.shape)
    for k in range(len(pads) // 2):
        d, before, after = t.rank - 1 - k, pads[2 * k], pads[2 * k + 1]
        parts = []
        for width in (before, after):
            side = shape[:d] + [width] + shape[d + 1:]
            fill = torch.full(side, float(value), dtype=getattr(torch, t.dtype))
            parts.append(ctx.const(fill, "pad") if width else None)
        if before or after:
            x = ctx.op("concat", *[p for p in (parts[0], x, parts[1]) if p is not None], axis=d)
            shape[d] += before + after
    return x


# ---- pooling and normalization -----------------------------------------------------------

def _pool_attrs(ctx, a, expected):
    """kernel, stride, padding of a 2-D pool whose output has the floor-mode size."""
    x = a["self"]
    _rank(ctx, x, 4, "pooling input")
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"]) if a["stride"] else kernel
    padding = _pair(a["padding"])
    if "dilation" in a and _pair(a["dilation"]) != (1, 1):
        raise Unsupported("dilated pooling")
    h, w = ctx.type_of(x).shape[2:]
    floor = tuple(conv_out_size(s, k, st, p) for s, k, st, p in zip((h, w), kernel, stride, padding))
    if floor != tuple(expected.shape[2:]):
        raise Unsupported("ceil_mode changes the output size")
    return dict(kernel=kernel, stride=stride, padding=padding)


@handles("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
def _maxpool(ctx, a, expected):
    single = isinstance(expected, TensorType)
    y = ctx.op("maxpool2d", a["self"], **_pool_attrs(ctx, a, expected if single else expected[0]))
    return y if single else (y, None)


@handles("aten.avg_pool2d.default")
def _avgpool(ctx, a, expected):
    if a["divisor_override"] is not None or not a["count_include_pad"] and any(_pair(a["padding"])):
        raise Unsupported("average pool that does not count padded zeros")
    return ctx.op("avgpool2d", a["self"], **_pool_attrs(ctx, a, expected))


@handles("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
def _adaptive_avgpool(ctx, a, expected):
    x = a["self"]
    _rank(ctx, x, 4, "pooling input")
    (h, w), (oh, ow) = ctx.type_of(x).shape[2:], expected.shape[2:]
    if h % oh or w % ow:
        raise Unsupported("adaptive pool with uneven windows")
    k = (h // oh, w // ow)
    return ctx.op("avgpool2d", x, kernel=k, stride=k)


def _ones_like_channels(ctx, x, v, value, name):
    if v is not None:
        return v
    c = ctx.type_of(x).shape[1]
    return ctx.const(torch.full((c,), value, dtype=getattr(torch, ctx.type_of(x).dtype)), name)


@handles("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
         "aten.native_batch_norm.default")
def _batchnorm(ctx, a, expected):
    x = a["input"]
    if a.get("training"):
        raise ModelImportError("batch norm in training mode: call model.eval() before torch.export.export")
    if a["running_mean"] is None or a["running_var"] is None:
        raise Unsupported("batch norm without running statistics")
    scale = _ones_like_channels(ctx, x, a["weight"], 1.0, "bn_scale")
    shift = _ones_like_channels(ctx, x, a["bias"], 0.0, "bn_bias")
    y = ctx.op("batchnorm", x, scale, shift, a["running_mean"], a["running_var"], eps=a["eps"])
    return y if isinstance(expected, TensorType) else (y, None, None)


@handles("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layernorm(ctx, a, expected):
    x, shape = a["input"], tuple(a["normalized_shape"])
    if ctx.type_of(x).shape[len(ctx.type_of(x).shape) - len(shape):] != shape:
        raise Unsupported("normalized_shape does not end the input shape")
    y = ctx.op("layernorm", x, ndim=len(shape), eps=a["eps"])
    if a["weight"] is not None:
        y = ctx.op("mul", y, a["weight"])
    if a["bias"] is not None:
        y = ctx.op("add", y, a["bias"])
    return y if isinstance(expected, TensorType) else (y, None, None)


# ---- attention, embedding, power -----------------------------------------------------------

def _attention_mask(ctx, mask, like):
    """A float additive mask; a boolean constant (True = may attend) becomes 0 / -inf."""
    t = ctx.type_of(mask)
    if t.dtype == "bool":
        if not isinstance(mask, Const):  # built in the graph (from positions): its additive form
            return ctx.op("mask_bias", mask, dtype=like.dtype)
        zero = torch.zeros((), dtype=getattr(torch, like.dtype))
        return ctx.const(torch.where(mask.data, zero, torch.tensor(float("-inf"), dtype=zero.dtype)), mask.name)
    if t.dtype != like.dtype:
        raise Unsupported(f"attention mask of dtype {t.dtype} on {like.dtype} inputs")
    return mask


@handles("aten.scaled_dot_product_attention.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
         "aten._scaled_dot_product_efficient_attention.default", "aten._scaled_dot_product_flash_attention.default",
         "aten._scaled_dot_product_attention_math.default")
def _sdpa(ctx, a, expected):
    q, k, v = a["query"], a["key"], a["value"]
    mask = a.get("attn_mask", a.get("attn_bias"))
    tq, tk, tv = (ctx.type_of(x) for x in (q, k, v))
    if a.get("dropout_p", 0.0):
        raise Unsupported("attention with dropout")
    if a.get("return_debug_mask") or a.get("dropout_mask") is not None:
        raise Unsupported("attention with a debug or dropout mask")
    gqa = int(bool(a.get("enable_gqa")) and tq.rank >= 3 and tq.shape[-3] != tk.shape[-3])
    if tk.shape[:-2] != tv.shape[:-2] or (tq.shape[:-3] if gqa else tq.shape[:-2]) != tk.shape[:-3 if gqa else -2]:
        raise Unsupported("attention with broadcast heads")
    if mask is not None and a.get("is_causal"):
        raise Unsupported("attention with both a mask and is_causal")
    scale = a.get("scale")
    scale = 1.0 / tq.shape[-1] ** 0.5 if scale is None else scale
    attrs = dict(scale=float(scale), causal=int(bool(a.get("is_causal"))), gqa=gqa)
    inputs = (q, k, v) if mask is None else (q, k, v, _attention_mask(ctx, mask, tq))
    y = ctx.op("sdpa", *inputs, **attrs)
    return y if isinstance(expected, TensorType) else (y,) + (None,) * (len(expected) - 1)


@handles("aten.embedding.default")
def _embedding(ctx, a, expected):
    w, ids = a["weight"], a["indices"]
    if ctx.type_of(w).rank != 2 or ctx.type_of(ids).dtype not in ("int64", "int32"):
        raise Unsupported("embedding of a table that is not 2-D or with indices that are not integers")
    return ctx.op("embedding", w, ids)  # padding_idx, scale_grad_by_freq, sparse only change gradients


@handles("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor")
def _pow(ctx, a, expected):
    x, e = a["self"], a["exponent"]
    if isinstance(e, Const):
        if e.data.numel() != 1 or expected.shape != ctx.type_of(x).shape:
            raise Unsupported("pow with a tensor exponent")
        e = e.data.item()
    if not isinstance(e, (int, float)) or isinstance(e, bool) or not _is_tensor(x):
        raise Unsupported("pow with an exponent computed at run time")
    _same_dtype(ctx, expected, x)
    if not expected.dtype.startswith(("float", "bfloat")):
        raise Unsupported("pow of integers")
    return ctx.op("pow", x, exponent=float(e))


HANDLERS.update(LLM_HANDLERS)  # mean, sum, rsqrt, silu, neg, repeat_interleave, index_copy, slice_scatter
