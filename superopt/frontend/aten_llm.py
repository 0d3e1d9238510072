"""ATen operators of LLM blocks -> IR operators (issue 23); merged into ``aten.HANDLERS``.

What Hugging Face's Llama and GPT-2 code exports to: ``mean.dim`` and ``sum.dim_IntList``
become ``mean``/``sum`` chains over one axis each (a mean over H and W of an image stays
``avgpool2d``, which the CNN rules know); ``rsqrt``, ``silu``, ``cos``, ``sin`` map one to one; ``neg`` is
``smul`` by -1 (linear: the scalar axioms move it, no new operator needed); ``repeat_interleave``
on an axis is ``reshape`` (a new axis of 1) + ``expand`` + ``reshape``, exactly HF's
``repeat_kv``, so both spellings reach one graph; ``index_copy`` maps one to one (a static KV
cache written at the decode position); ``slice_scatter`` with step 1 is a ``concat`` of the
source between two ``split`` pieces of the destination. An attention mask built in the graph from
positions, as transformers' decode export builds it, maps too: comparisons (``le``, ``gt``, ...
of tensors or with a number) become ``compare``, ``&`` / ``|`` of masks ``logical``,
``new_ones``/``new_zeros``/``new_full`` constants, and ``copy(dst, src)`` (a length counter set
from the cache position) ``src`` broadcast to ``dst``'s shape and dtype.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..ir.opdefs_llm import COMPARISONS
from ..ir.types import TensorType
from .context import Const, Unsupported

__all__ = ["LLM_HANDLERS"]

LLM_HANDLERS: dict[str, Callable] = {}


def _handles(*targets: str):
    def deco(fn):
        fn.passthrough = False
        for t in targets:
            LLM_HANDLERS[t] = fn
        return fn
    return deco


def _reshape_to(ctx, x, shape):
    return x if ctx.type_of(x).shape == tuple(shape) else ctx.op("reshape", x, shape=tuple(shape))


def _reduce(ctx, op: str, x, dims, keepdim: bool, expected: TensorType):
    """``op`` over each of ``dims`` (all axes when empty), the highest axis first so that the
    lower ones keep their numbers when they are dropped."""
    rank = ctx.type_of(x).rank
    axes = sorted({d % rank for d in dims} if dims else set(range(rank)), reverse=True)
    if rank == 0:
        return x
    for ax in axes:
        x = ctx.op(op, x, axis=ax, keepdim=int(keepdim))
    return _reshape_to(ctx, x, expected.shape)


@_handles("aten.mean.dim")
def _mean(ctx, a, expected):
    x = a["self"]
    t = ctx.type_of(x)
    if a["dtype"] is not None and str(a["dtype"]).removeprefix("torch.") != t.dtype:
        raise Unsupported("mean with a dtype change")
    dims = list(a["dim"] or ())
    if t.rank == 4 and sorted(d % 4 for d in dims) == [2, 3]:  # global average pooling of an image
        y = ctx.op("avgpool2d", x, kernel=t.shape[2:], stride=t.shape[2:])
        return _reshape_to(ctx, y, expected.shape)
    return _reduce(ctx, "mean", x, dims, a["keepdim"], expected)


@_handles("aten.sum.dim_IntList")
def _sum(ctx, a, expected):
    x = a["self"]
    if a["dtype"] is not None and str(a["dtype"]).removeprefix("torch.") != ctx.type_of(x).dtype:
        raise Unsupported("sum with a dtype change")
    if not ctx.type_of(x).dtype.startswith(("float", "bfloat")):
        raise Unsupported("sum of integers")
    return _reduce(ctx, "sum", x, list(a["dim"] or ()), a["keepdim"], expected)


def _float_unary(op: str):
    def handler(ctx, a, expected):
        if ctx.type_of(a["self"]).dtype != expected.dtype:
            raise Unsupported(f"{op} with type promotion")
        return ctx.op(op, a["self"])
    return handler


_handles("aten.rsqrt.default")(_float_unary("rsqrt"))
_handles("aten.silu.default")(_float_unary("silu"))
_handles("aten.cos.default")(_float_unary("cos"))
_handles("aten.sin.default")(_float_unary("sin"))


def _clamped(ctx, x, lo, hi, expected):
    """``clamp`` where both bounds are numbers; the operator's own check refuses the rest
    (infinite bounds, lo > hi, a non-float tensor), which then stays opaque."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (lo, hi)):
        raise Unsupported("clamp without two constant bounds")
    if ctx.type_of(x).dtype != expected.dtype:
        raise Unsupported("clamp with type promotion")
    return ctx.op("clamp", x, lo=float(lo), hi=float(hi))


@_handles("aten.hardtanh.default")
def _hardtanh(ctx, a, expected):
    return _clamped(ctx, a["self"], a["min_val"], a["max_val"], expected)


@_handles("aten.relu6.default")
def _relu6(ctx, a, expected):
    return _clamped(ctx, a["self"], 0.0, 6.0, expected)


@_handles("aten.clamp.default")
def _clamp(ctx, a, expected):
    return _clamped(ctx, a["self"], a["min"], a["max"], expected)


def _hard_sigmoid(ctx, x, expected):
    """clamp(x + 3, 0, 6) / 6, torch's definition (the division a multiplication by 1/6, as a
    division by a scalar imports)."""
    three = ctx.const(torch.tensor(3.0, dtype=getattr(torch, expected.dtype)), "three")
    sixth = ctx.const(torch.tensor(1 / 6, dtype=getattr(torch, expected.dtype)), "sixth")
    return ctx.op("smul", _clamped(ctx, ctx.op("add", x, three), 0.0, 6.0, expected), sixth)


@_handles("aten.hardsigmoid.default")
def _hardsigmoid(ctx, a, expected):
    return _hard_sigmoid(ctx, a["self"], expected)


@_handles("aten.hardswish.default")
def _hardswish(ctx, a, expected):
    return ctx.op("mul", a["self"], _hard_sigmoid(ctx, a["self"], expected))


@_handles("aten.neg.default")
def _neg(ctx, a, expected):
    x = a["self"]
    dtype = ctx.type_of(x).dtype
    if not dtype.startswith(("float", "bfloat")):
        raise Unsupported("negation of integers")
    return ctx.op("smul", x, ctx.const(torch.tensor(-1.0, dtype=getattr(torch, dtype)), "minus_one"))


@_handles("aten.repeat_interleave.self_int")
def _repeat_interleave(ctx, a, expected):
    x, r, dim = a["self"], a["repeats"], a["dim"]
    if dim is None or not isinstance(r, int):
        raise Unsupported("repeat_interleave of the flattened tensor or with per-element repeats")
    shape = ctx.type_of(x).shape
    d = dim % len(shape)
    unit = shape[:d + 1] + (1,) + shape[d + 1:]
    grown = shape[:d + 1] + (r,) + shape[d + 1:]
    y = ctx.op("expand", ctx.op("reshape", x, shape=unit), shape=grown)
    return ctx.op("reshape", y, shape=expected.shape)


@_handles("aten.index_copy.default")
def _index_copy(ctx, a, expected):
    x, index, src = a["self"], a["index"], a["source"]
    if ctx.type_of(index).dtype != "int64" or ctx.type_of(index).rank != 1:
        raise Unsupported("index_copy with an index that is not a 1-D int64 tensor")
    if ctx.type_of(src).dtype != ctx.type_of(x).dtype:
        raise Unsupported("index_copy with type promotion")
    return ctx.op("index_copy", x, index, src, axis=a["dim"])


@_handles("aten.slice_scatter.default")
def _slice_scatter(ctx, a, expected):
    x, src = a["self"], a["src"]
    t = ctx.type_of(x)
    d = a["dim"] % t.rank
    n = t.shape[d]
    r = range(n)[slice(a["start"], a["end"], a["step"])]
    if r.step != 1 or len(r) == 0 or ctx.type_of(src).dtype != t.dtype:
        raise Unsupported("strided or empty slice_scatter")
    sizes = [s for s in (r.start, len(r), n - r.stop) if s > 0]
    pieces = list(ctx.add("split", [x], axis=d, sizes=tuple(sizes))) if len(sizes) > 1 else [x]
    mid = 1 if r.start > 0 else 0
    pieces[mid] = src if not isinstance(src, Const) else ctx.ref(src)
    return pieces[0] if len(pieces) == 1 else ctx.op("concat", *pieces, axis=d)


# ---- attention masks built in the graph (transformers' decode export) ---------------------

def _operand(ctx, v, like):
    """A comparison's other operand as a tensor: a Python number becomes a constant of
    ``like``'s dtype (torch compares an int64 tensor with an int as int64)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        dt = getattr(torch, ctx.type_of(like).dtype)
        if not dt.is_floating_point and v != int(v):
            raise Unsupported("an integer tensor compared with a fraction")
        return ctx.const(torch.tensor(v, dtype=dt), "scalar")
    return v


def _comparison(op: str):
    def handler(ctx, a, expected):
        x = a["self"]
        y = _operand(ctx, a["other"], x)
        if ctx.type_of(x).dtype != ctx.type_of(y).dtype:
            raise Unsupported("a comparison of two dtypes")
        return ctx.op("compare", x, y, cmp=op)
    return handler


for _op in COMPARISONS:
    _handles(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar")(_comparison(_op))


def _logical_of(op: str):
    def handler(ctx, a, expected):
        x, y = a["self"], a["other"]
        if ctx.type_of(x).dtype != "bool" or ctx.type_of(y).dtype != "bool":
            raise Unsupported(f"bitwise {op} of integers")
        return ctx.op("logical", x, y, fn=op)
    return handler


_handles("aten.__and__.Tensor", "aten.bitwise_and.Tensor", "aten.logical_and.default")(_logical_of("and"))
_handles("aten.__or__.Tensor", "aten.bitwise_or.Tensor", "aten.logical_or.default")(_logical_of("or"))


def _filled(fill):
    def handler(ctx, a, expected):
        """A tensor that depends only on a size and a dtype: a constant (an empty one is zeros:
        whatever it holds is written before it is read)."""
        value = a["fill_value"] if fill is None else fill
        return ctx.const(torch.full(expected.shape, value, dtype=getattr(torch, expected.dtype)), "filled")
    return handler


_handles("aten.new_ones.default")(_filled(1))
_handles("aten.new_zeros.default", "aten.new_empty.default")(_filled(0))
_handles("aten.new_full.default")(_filled(None))


@_handles("aten.copy.default")
def _copy(ctx, a, expected):
    """``copy(self, src)``: ``src`` broadcast to ``self``'s shape in ``self``'s dtype (the values of
    ``self`` are not read): a length counter set from the cache position."""
    src = a["src"]
    t = ctx.type_of(src)
    if t.dtype != expected.dtype:
        if not expected.dtype.startswith(("float", "bfloat")):
            raise Unsupported(f"copy from {t.dtype} into {expected.dtype}")
        src = ctx.op("cast", src, dtype=expected.dtype)
    if t.shape == expected.shape:
        return src
    if t.numel == expected.numel:
        return _reshape_to(ctx, src, expected.shape)
    return ctx.op("expand", src, shape=expected.shape)


@_handles("aten.index.Tensor")
def _index(ctx, a, expected):
    """``x[i0, i1, ...]`` where every index is a constant that only counts along one axis of the
    result (``arange(n)`` viewed ``[B, 1, 1, 1]``, ``[1, 1, 1, S]``: transformers' padding mask
    read at ``[batch_idx, kv_idx]``): a reshape of ``x`` that puts its axes on those of the result,
    then an expand. Any other gather stays opaque."""
    x, indices = a["self"], list(a["indices"])
    t = ctx.type_of(x)
    if not indices or len(indices) > t.rank or any(not isinstance(i, Const) for i in indices):
        raise Unsupported("indexing with tensors computed at run time, or with slices between them")
    if any(i.data.dtype not in (torch.int64, torch.int32) for i in indices):
        raise Unsupported("indexing with a boolean mask")  # selects, does not gather: another operation
    shape = torch.broadcast_shapes(*(i.data.shape for i in indices))
    placed = []  # the result axis each indexed axis of x lands on (None: an axis of 1 read at 0)
    for k, idx in enumerate(indices):
        full = idx.data.long().expand(shape)
        axes = [d for d in range(len(shape)) if not bool((full == full.narrow(d, 0, 1)).all())]  # where it varies
        if not axes and t.shape[k] == 1 and not bool(full.any()):
            placed.append(None)
            continue
        if len(axes) != 1 or shape[axes[0]] != t.shape[k]:
            raise Unsupported("an index that is not one axis counted in full")
        ax = axes[0]
        line = full.movedim(ax, -1).reshape(-1, shape[ax])
        if not bool((line == torch.arange(shape[ax])).all()):
            raise Unsupported("an index that is not arange along its axis")
        placed.append(ax)
    axes = [ax for ax in placed if ax is not None]
    if axes != sorted(set(axes)):
        raise Unsupported("indexed axes that land out of order")
    rest = t.shape[len(indices):]
    grid = [1] * len(shape)
    for k, ax in enumerate(placed):
        if ax is not None:
            grid[ax] = t.shape[k]
    y = _reshape_to(ctx, x, tuple(grid) + rest)
    return y if tuple(grid) + rest == expected.shape else ctx.op("expand", y, shape=expected.shape)
