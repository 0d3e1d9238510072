"""Operators of LLM blocks written the way Hugging Face writes them (issue 23).

Declared here, registered when :mod:`superopt.ir.opdefs` is imported (it imports this module
last). What each imported ATen call becomes (see :mod:`superopt.frontend.aten`):

* ``mean``, ``sum``: a reduction over one axis, ``keepdim`` 0/1 (RMSNorm's
  ``x.pow(2).mean(-1, keepdim=True)``; several axes become a chain, last axis first).
* ``rsqrt``, ``silu``, ``gelu_tanh``, ``cos``, ``sin``: elementwise (RMSNorm's ``torch.rsqrt``, SwiGLU's
  ``F.silu``, ``F.gelu(approximate="tanh")``; GPT-2's written-out tanh-GELU imports as the
  ``pow``/``smul``/``add``/``tanh``/``mul`` it is written with; cos and sin of the rotary tables
  when they are computed from position ids in the graph).
* ``expand``: numpy's ``broadcast_to`` (``x.expand(...)``): new leading axes and axes of size 1
  stretched. Inductor materializes it when a reshape follows (grouped-query attention's
  ``repeat_kv``), so it is priced as a pointwise kernel writing its output.
  ``repeat_interleave(x, r, dim=d)`` imports as exactly that: ``reshape`` (a new axis of 1 after
  ``d``), ``expand`` (to ``r``), ``reshape`` (merged into ``d``), so both ways of writing
  ``repeat_kv`` reach one graph and one rule.
* ``slice``: ``x[start:end:step]`` along an axis, for ``step > 1`` (a step-1 slice imports as a
  piece of ``split``, which the layout axioms already cover).
* ``clamp``: ``min(max(x, lo), hi)`` with finite constant bounds: ReLU6 and ``hardtanh``; MobileNet v3's
  ``hardsigmoid`` and ``hardswish`` import as the ``add``/``clamp``/``smul``/``mul`` that define them.
  No axiom moves it yet (a random function in the field, as ``silu`` is); kernel regions stop at it.
* ``cast``: a dtype conversion to a float dtype, from a float or int64 (RMSNorm's float32 upcast
  and the cast back, rotary's ``position_ids.float()``). Exact in the
  float64 reference and in the field: it changes precision, not the value computed.
* ``index_copy``: ``x`` with the slices ``index[i]`` of axis ``axis`` replaced by the slices
  ``i`` of ``src`` (a static KV cache written at the decode position); the index is an int64
  input, its values distinct and in range.

* ``compare``, ``logical``, ``mask_bias``: an attention mask built in the graph from positions
  (transformers' decode export: ``kv_index <= cache_position``, combined with ``&`` for a sliding
  window) and handed to attention as its additive form (0 / -inf). The rule generator does not
  enumerate them (their attributes have no domain): they stay around attention as written.

``neg`` is ``smul`` by -1 (linear, so the scalar axioms move it), and ``sdpa`` takes grouped
key-value heads with ``gqa=1`` (declared in :mod:`superopt.ir.opdefs`).
"""

from __future__ import annotations

import math

from .opdefs import broadcast_shapes
from .ops import Attr, CostFacts, OpDef, declare_cost, nonnegative_axis, register
from .types import DTYPES, TensorType
from ..errors import ShapeError

__all__ = ["FLOAT_DTYPES", "COMPARISONS", "slice_length"]

#: dtypes ``cast`` converts between
FLOAT_DTYPES = tuple(d for d in DTYPES if d.startswith(("float", "bfloat")))


def _fail(msg):
    raise ShapeError(msg)


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        _fail(f"{what} axis {axis} is out of range for rank {rank}")
    return axis % rank


# ---- reductions --------------------------------------------------------------------------

def _reduce(attrs, types):
    (x,) = types
    ax = _axis(attrs["axis"], x.rank, "reduction")
    shape = x.shape[:ax] + ((1,) if attrs["keepdim"] else ()) + x.shape[ax + 1:]
    return (TensorType(shape, x.dtype),)


_REDUCE_ATTRS = (Attr("axis", "int", domain=(0, 1), carries="axis"), Attr("keepdim", "int", 1, choices=(0, 1)))
register(OpDef("mean", ("x",), _REDUCE_ATTRS, _reduce, linear_in=(0,), batch_axes=True, canonicalize=nonnegative_axis,
               doc="Mean over one axis (kept as size 1 when keepdim=1)."))
register(OpDef("sum", ("x",), _REDUCE_ATTRS, _reduce, linear_in=(0,), batch_axes=True, canonicalize=nonnegative_axis,
               doc="Sum over one axis (kept as size 1 when keepdim=1)."))

# ---- elementwise -------------------------------------------------------------------------


def _unary(attrs, types):
    return (types[0],)


register(OpDef("rsqrt", ("x",), (), _unary, elementwise=True, positive_inputs=(0,),
               doc="Elementwise 1/sqrt(x) (inputs sampled positive)."))
register(OpDef("silu", ("x",), (), _unary, elementwise=True, doc="Elementwise x*sigmoid(x) (SiLU, swish)."))
register(OpDef("cos", ("x",), (), _unary, elementwise=True, doc="Elementwise cosine (rotary tables)."))
register(OpDef("sin", ("x",), (), _unary, elementwise=True, doc="Elementwise sine (rotary tables)."))
register(OpDef("gelu_tanh", ("x",), (), _unary, elementwise=True,
               doc="Elementwise tanh-approximate GELU 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3))) "
                   "(torch's approximate='tanh')."))


def _clamp(attrs, types):
    lo, hi = attrs["lo"], attrs["hi"]
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        _fail(f"clamp takes finite bounds lo <= hi, got lo={lo}, hi={hi}")
    if types[0].dtype not in FLOAT_DTYPES:
        _fail(f"clamp takes a float tensor, got {types[0]!r}")
    return (types[0],)


register(OpDef("clamp", ("x",), (Attr("lo", "float"), Attr("hi", "float")), _clamp, elementwise=True,
               doc="Elementwise min(max(x, lo), hi) for finite constant bounds (ReLU6 and hardtanh; "
                   "hardsigmoid and hardswish import through it)."))


def _cast(attrs, types):
    if types[0].dtype not in FLOAT_DTYPES + ("int64",):
        _fail(f"cast converts floats and int64 to a float dtype, got {types[0]!r}")
    return (TensorType(types[0].shape, attrs["dtype"]),)


register(OpDef("cast", ("x",), (Attr("dtype", "str", choices=FLOAT_DTYPES),), _cast, linear_in=(0,), batch_axes=True,
               doc="Convert a float or int64 tensor to a float dtype (the value is unchanged in the reference "
                   "semantics: RMSNorm's upcast, rotary's positions.float())."))

# ---- layout ------------------------------------------------------------------------------


def _expand(attrs, types):
    (x,), shape = types, tuple(attrs["shape"])
    if len(shape) < x.rank or any(d != s and d != 1 for d, s in zip(x.shape[::-1], shape[::-1])):
        _fail(f"cannot expand {x!r} to {list(shape)}: only new leading axes and axes of size 1 grow")
    if any(s < 0 for s in shape):
        _fail(f"negative size in expand to {list(shape)}")
    return (TensorType(shape, x.dtype),)


register(OpDef("expand", ("x",), (Attr("shape", "ints", carries="size"),), _expand, linear_in=(0,),
               doc="Broadcast to a larger shape (torch's expand, numpy's broadcast_to)."))


def slice_length(n: int, start: int, end: int, step: int) -> int:
    """How many elements ``range(n)[start:end:step]`` has.

    >>> slice_length(8, 0, 8, 2), slice_length(7, 1, 7, 3)
    (4, 2)
    """
    return len(range(n)[start:end:step])


def _slice(attrs, types):
    (x,) = types
    ax = _axis(attrs["axis"], x.rank, "slice")
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    if step < 1 or not 0 <= start < end <= x.shape[ax]:
        _fail(f"slice {start}:{end}:{step} of axis {ax} of {x!r}: need 0 <= start < end <= {x.shape[ax]}, step >= 1")
    return (TensorType(x.shape[:ax] + (slice_length(x.shape[ax], start, end, step),) + x.shape[ax + 1:], x.dtype),)


register(OpDef("slice", ("x",), (Attr("axis", "int", carries="axis"), Attr("start", "int"), Attr("end", "int"),
                                 Attr("step", "int", 1)),
               _slice, linear_in=(0,), batch_axes=True, canonicalize=nonnegative_axis,
               doc="Elements start:end:step of one axis (0 <= start < end <= size)."))


def _index_copy(attrs, types):
    x, index, src = types
    ax = _axis(attrs["axis"], x.rank, "index_copy")
    if index.rank != 1 or index.dtype != "int64":
        _fail(f"index_copy's index must be a 1-D int64 tensor, got {index!r}")
    want = x.shape[:ax] + (index.shape[0],) + x.shape[ax + 1:]
    if src.shape != want or src.dtype != x.dtype:
        _fail(f"index_copy of {src!r} into {x!r} on axis {ax} with {index.shape[0]} indices needs a source "
              f"{list(want)}")
    return (x,)


register(OpDef("index_copy", ("x", "index", "src"), (Attr("axis", "int", carries="axis"),), _index_copy,
               linear_in=(), batch_axes=True, canonicalize=nonnegative_axis,
               doc="x with slices index[i] of an axis replaced by slices i of src (distinct indices): "
                   "a KV cache written at the decode position."))

# ---- attention masks built in the graph ----------------------------------------------------

#: the comparisons ``compare`` makes (torch's ``aten.lt``, ``le``, ...)
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def _compare(attrs, types):
    a, b = types
    if a.dtype != b.dtype or a.dtype == "bool":
        _fail(f"compare takes two tensors of one numeric dtype, got {a!r} and {b!r}")
    return (TensorType(broadcast_shapes(a.shape, b.shape), "bool"),)


def _logical(attrs, types):
    a, b = types
    if a.dtype != "bool" or b.dtype != "bool":
        _fail(f"logical takes two boolean tensors, got {a!r} and {b!r}")
    return (TensorType(broadcast_shapes(a.shape, b.shape), "bool"),)


def _mask_bias(attrs, types):
    if types[0].dtype != "bool":
        _fail(f"mask_bias takes a boolean mask, got {types[0]!r}")
    return (TensorType(types[0].shape, attrs["dtype"]),)


register(OpDef("compare", ("a", "b"), (Attr("cmp", "str", choices=COMPARISONS),), _compare,
               doc="Elementwise comparison a <cmp> b with numpy broadcasting, a boolean result (an attention "
                   "mask built from positions: key index <= query position)."))
register(OpDef("logical", ("a", "b"), (Attr("fn", "str", choices=("and", "or")),), _logical,
               doc="Elementwise and / or of two boolean tensors with numpy broadcasting (masks combined)."))
register(OpDef("mask_bias", ("mask",), (Attr("dtype", "str", choices=FLOAT_DTYPES),), _mask_bias,
               doc="A boolean attention mask as the additive mask attention takes: 0 where true, -inf where "
                   "false (what scaled_dot_product_attention does with a boolean mask)."))

# ---- cost facts ----------------------------------------------------------------------------


def _in_elems(k):
    return lambda a, ins, outs: float(k * ins[0].numel)


def _out_elems(k):
    return lambda a, ins, outs: float(k * sum(t.numel for t in outs))


def _expand_bytes(a, ins, outs, itemsize):  # reads its input once, writes the broadcast output
    return float((ins[0].numel + outs[0].numel) * itemsize)


def _index_copy_bytes(a, ins, outs, itemsize):  # out of place: the whole tensor is copied
    return float((ins[0].numel + outs[0].numel + ins[2].numel) * itemsize + ins[1].numel * 8)


for _name in ("mean", "sum"):
    declare_cost(_name, CostFacts(_in_elems(1), fusion="reduction"))
for _name, _k in (("rsqrt", 2), ("silu", 5), ("gelu_tanh", 10), ("cast", 0), ("cos", 4), ("sin", 4), ("clamp", 2)):
    declare_cost(_name, CostFacts(_out_elems(_k)))
declare_cost("expand", CostFacts(_out_elems(0), bytes=_expand_bytes))
declare_cost("slice", CostFacts(_out_elems(0), view=lambda a, ins: True, fusion="view"))
declare_cost("index_copy", CostFacts(_out_elems(0), bytes=_index_copy_bytes))
for _name in ("compare", "logical", "mask_bias"):
    declare_cost(_name, CostFacts(_out_elems(1)))
