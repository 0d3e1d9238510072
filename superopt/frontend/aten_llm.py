"""ATen operators of LLM blocks -> IR operators (issue 23); merged into ``aten.HANDLERS``.

What Hugging Face's Llama and GPT-2 code exports to: ``mean.dim`` and ``sum.dim_IntList``
become ``mean``/``sum`` chains over one axis each (a mean over H and W of an image stays
``avgpool2d``, which the CNN rules know); ``rsqrt``, ``silu``, ``cos``, ``sin`` map one to one; ``neg`` is
``smul`` by -1 (linear: the scalar axioms move it, no new operator needed); ``repeat_interleave``
on an axis is ``reshape`` (a new axis of 1) + ``expand`` + ``reshape``, exactly HF's
``repeat_kv``, so both spellings reach one graph; ``index_copy`` maps one to one (a static KV
cache written at the decode position); ``slice_scatter`` with step 1 is a ``concat`` of the
source between two ``split`` pieces of the destination.
"""

from __future__ import annotations

from typing import Callable

import torch

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
