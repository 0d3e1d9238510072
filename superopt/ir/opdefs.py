"""Declarations of superopt's operators (see :mod:`superopt.ir.ops`).

Layout conventions follow torch: images are NCHW, conv kernels are [out, in/groups, kh, kw],
matmul contracts the last axis of the left input with the second-to-last of the right one and
broadcasts batch axes. Bias addition as models do it is ``add`` with numpy broadcasting
(a [C,1,1] vector on an NCHW image, a [F] vector on [..., F] features).
"""

from __future__ import annotations

from .ops import Attr, CostFacts, OpDef, declare_cost, nonnegative_axis, register
from .types import TensorType
from ..errors import ShapeError

__all__ = ["broadcast_shapes", "conv_out_size"]


def _fail(msg):
    raise ShapeError(msg)


def broadcast_shapes(a: tuple, b: tuple) -> tuple:
    """Numpy broadcasting of two shapes, or a ShapeError."""
    n = max(len(a), len(b))
    a2, b2 = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a2, b2):
        if x != y and 1 not in (x, y):
            _fail(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


def conv_out_size(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


def _same_dtype(types):
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        _fail(f"inputs have different dtypes {sorted(dts)}")
    return types[0].dtype


def _rank(t: TensorType, r: int, what: str):
    if t.rank != r:
        _fail(f"{what} must have rank {r}, got {t!r}")


# ---- sources and constants -----------------------------------------------------------

def _source(attrs, types):
    if any(d < 0 for d in attrs["shape"]):
        _fail(f"negative dimension in {list(attrs['shape'])}")
    return (TensorType(attrs["shape"], attrs["dtype"]),)


_SRC_ATTRS = (Attr("name", "str"), Attr("shape", "ints"), Attr("dtype", "str", "float32"))
register(OpDef("input", (), _SRC_ATTRS, _source, kind="source", doc="A named graph input."))
register(OpDef("weight", (), _SRC_ATTRS, _source, kind="source",
               doc="A named constant known at compile time (its data may be absent)."))


def _identity_matrix(attrs, types):
    return (TensorType((attrs["n"], attrs["n"])),)


def _identity_conv(attrs, types):
    kh, kw = attrs["kernel"]
    if kh % 2 == 0 or kw % 2 == 0:
        _fail(f"identity_conv needs an odd kernel, got {kh}x{kw}")
    return (TensorType((attrs["channels"], attrs["channels"] // attrs["groups"], kh, kw)),)


def _pool_kernel(attrs, types):
    kh, kw = attrs["kernel"]
    return (TensorType((attrs["channels"], 1, kh, kw)),)


register(OpDef("identity_matrix", (), (Attr("n", "int", carries="size"),), _identity_matrix, kind="constant",
               doc="The n×n identity matrix (TASO's Imm)."))
register(OpDef("identity_conv", (), (Attr("channels", "int", carries="size"), Attr("kernel", "ints", carries="kernel"),
                                    Attr("groups", "int", 1)),
               _identity_conv, kind="constant",
               doc="A conv kernel that maps each channel to itself: 1 at the centre (TASO's Iconv)."))
register(OpDef("ones", (), (Attr("shape", "ints", carries="size"),), lambda a, t: (TensorType(a["shape"]),), kind="constant",
               doc="A tensor of ones (TASO's Ione)."))
register(OpDef("zeros", (), (Attr("shape", "ints", carries="size"),), lambda a, t: (TensorType(a["shape"]),), kind="constant",
               doc="A tensor of zeros (lets axioms state shifts such as batch norm's without tricks)."))
register(OpDef("pool_kernel", (), (Attr("channels", "int", carries="size"), Attr("kernel", "ints", carries="kernel")),
               _pool_kernel,
               kind="constant",
               doc="A depthwise kernel [C,1,kh,kw] of 1/(kh*kw): conv with it and groups=C is average "
                   "pooling (TASO's Cpool)."))

# ---- elementwise -----------------------------------------------------------------------


def _binary(attrs, types):
    return (TensorType(broadcast_shapes(types[0].shape, types[1].shape), _same_dtype(types)),)


def _unary(attrs, types):
    return (types[0],)


register(OpDef("add", ("a", "b"), (), _binary, commutative=True, elementwise=True,
               doc="Elementwise sum with numpy broadcasting."))
register(OpDef("mul", ("a", "b"), (), _binary, commutative=True, elementwise=True, linear_in=(0, 1),
               doc="Elementwise product with numpy broadcasting."))


def _smul(attrs, types):
    if types[1].rank != 0:
        _fail(f"smul's scale must be a scalar (rank 0), got {types[1]!r}")
    return (TensorType(types[0].shape, _same_dtype(types)),)


register(OpDef("smul", ("x", "scale"), (), _smul, linear_in=(0, 1), batch_axes=True,
               doc="Multiply a tensor by a scalar tensor (rank 0)."))
for _name in ("relu", "sigmoid", "tanh", "gelu"):
    register(OpDef(_name, ("x",), (), _unary, elementwise=True, doc=f"Elementwise {_name}."))

# ---- linear algebra ----------------------------------------------------------------------


def _matmul(attrs, types):
    a, b = types
    if a.rank < 2 or b.rank < 2:
        _fail(f"matmul needs inputs of rank >= 2, got {a!r} and {b!r}")
    if a.shape[-1] != b.shape[-2]:
        _fail(f"matmul contracts {a.shape[-1]} with {b.shape[-2]}: {a!r} @ {b!r}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (TensorType(batch + (a.shape[-2], b.shape[-1]), _same_dtype(types)),)


register(OpDef("matmul", ("a", "b"), (), _matmul, linear_in=(0, 1), batch_axes=True,
               doc="Matrix product, 2-D or batched (batch axes broadcast as in torch.matmul)."))


def _conv2d(attrs, types):
    x, w = types
    _rank(x, 4, "conv2d's input"), _rank(w, 4, "conv2d's kernel")
    g = attrs["groups"]
    (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    if g < 1 or c % g or o % g or ci * g != c:
        _fail(f"conv2d with groups={g}: input has {c} channels, kernel {w!r} wants {ci}×{g}; "
              f"both channel counts must be divisible by groups")
    if min(sh, sw) < 1 or min(ph, pw) < 0:
        _fail(f"conv2d stride must be >= 1 and padding >= 0, got stride={attrs['stride']} padding={attrs['padding']}")
    oh, ow = conv_out_size(h, kh, sh, ph), conv_out_size(wd, kw, sw, pw)
    if oh < 1 or ow < 1:
        _fail(f"conv2d kernel {kh}x{kw} does not fit input {h}x{wd} with padding {ph},{pw}")
    return (TensorType((n, o, oh, ow), _same_dtype(types)),)


_CONV_ATTRS = (
    Attr("stride", "ints", (1, 1), domain=((1, 1), (2, 2)), carries="window"),
    Attr("padding", "ints", (0, 0), carries="window"),
    Attr("groups", "int", 1, carries="window"),
    Attr("activation", "str", "none", choices=("none", "relu"), domain=("none", "relu")),
)
register(OpDef("conv2d", ("x", "w"), _CONV_ATTRS, _conv2d,
               linear_in=lambda a: (0, 1) if a["activation"] == "none" else (), roles=("data", "weight"),
               doc="2-D convolution (cross-correlation as in torch), no bias, with an optional fused relu."))


def _conv2d_bias(attrs, types):
    x, w, b = types
    (y,) = _conv2d(attrs, [x, w])
    if b.shape != (w.shape[0],):
        _fail(f"conv2d_bias's bias must be [{w.shape[0]}] (one value per output channel of kernel {w!r}), got {b!r}")
    return (TensorType(y.shape, _same_dtype(types)),)


register(OpDef("conv2d_bias", ("x", "w", "b"), _CONV_ATTRS, _conv2d_bias,
               roles=("data", "weight", "weight"),
               doc="2-D convolution plus a bias of one value per output channel (torch's F.conv2d(x, w, b)), "
                   "with an optional fused relu after the bias: one kernel (cuDNN's "
                   "ConvolutionBiasActivationForward). Affine, not linear, in (x, b) and in (w, b) jointly."))


def _enlarge(attrs, types):
    (w,) = types
    _rank(w, 4, "enlarge's kernel")
    kh, kw = w.shape[2:]
    KH, KW = attrs["kernel"]
    if KH < kh or KW < kw or (KH - kh) % 2 or (KW - kw) % 2:
        _fail(f"enlarge pads a {kh}x{kw} kernel to {KH}x{KW}: the target must be larger by an even amount")
    return (TensorType(w.shape[:2] + (KH, KW), w.dtype),)


register(OpDef("enlarge", ("w",), (Attr("kernel", "ints", carries="kernel"),), _enlarge, linear_in=(0,), roles=("weight",),
               doc="Pad a conv kernel with zeros, centred, to a larger size."))

# ---- layout --------------------------------------------------------------------------


def _transpose(attrs, types):
    (x,), perm = types, attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        _fail(f"transpose perm {list(perm)} is not a permutation of the {x.rank} axes of {x!r}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


def _reshape(attrs, types):
    (x,), shape = types, attrs["shape"]
    n = 1
    for d in shape:
        n *= d
    if n != x.numel or any(d < 0 for d in shape):
        _fail(f"cannot reshape {x!r} ({x.numel} elements) to {list(shape)}")
    return (TensorType(shape, x.dtype),)


def _axis(axis, rank, what):
    if not -rank <= axis < rank:
        _fail(f"{what} axis {axis} is out of range for rank {rank}")
    return axis % rank


def _concat(attrs, types):
    r = types[0].rank
    ax = _axis(attrs["axis"], r, "concat")
    for t in types[1:]:
        if t.rank != r or any(a != b for i, (a, b) in enumerate(zip(t.shape, types[0].shape)) if i != ax):
            _fail(f"concat on axis {ax} needs equal shapes off that axis: " + ", ".join(map(repr, types)))
    shape = list(types[0].shape)
    shape[ax] = sum(t.shape[ax] for t in types)
    return (TensorType(tuple(shape), _same_dtype(types)),)


def _split(attrs, types):
    (x,) = types
    ax = _axis(attrs["axis"], x.rank, "split")
    sizes = attrs["sizes"]
    if sum(sizes) != x.shape[ax] or any(s <= 0 for s in sizes) or len(sizes) < 1:
        _fail(f"split sizes {list(sizes)} do not add up to axis {ax} of {x!r}")
    return tuple(TensorType(x.shape[:ax] + (s,) + x.shape[ax + 1:], x.dtype) for s in sizes)


register(OpDef("transpose", ("x",), (Attr("perm", "ints", domain=((1, 0),), carries="perm"),), _transpose, linear_in=(0,),
               batch_axes=True,
               doc="Permute the axes."))
register(OpDef("reshape", ("x",), (Attr("shape", "ints", carries="size"),), _reshape, linear_in=(0,),
               doc="Reinterpret the elements (row-major) under a new shape."))
register(OpDef("concat", ("x",), (Attr("axis", "int", domain=(0, 1), carries="axis"),), _concat, variadic=True, batch_axes=True,
               canonicalize=nonnegative_axis,
               doc="Concatenate along an axis (two or more inputs)."))
register(OpDef("split", ("x",), (Attr("axis", "int", domain=(0, 1), carries="axis"),
                                     Attr("sizes", "ints", carries="size")), _split,
               canonicalize=nonnegative_axis, batch_axes=True,
               linear_in=(0,), doc="Split along an axis into pieces of the given sizes: one output each."))

# ---- pooling and normalization -----------------------------------------------------------


def _pool(attrs, types):
    (x,) = types
    _rank(x, 4, "pooling's input")
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["padding"]
    if ph * 2 > kh or pw * 2 > kw:
        _fail(f"pool padding {ph},{pw} must be at most half the kernel {kh}x{kw}")
    oh, ow = conv_out_size(x.shape[2], kh, sh, ph), conv_out_size(x.shape[3], kw, sw, pw)
    if oh < 1 or ow < 1:
        _fail(f"pool kernel {kh}x{kw} does not fit input {x!r}")
    return (TensorType(x.shape[:2] + (oh, ow), x.dtype),)


_POOL_ATTRS = (Attr("kernel", "ints", carries="window"), Attr("stride", "ints", (1, 1), carries="window"),
               Attr("padding", "ints", (0, 0), carries="window"))
register(OpDef("avgpool2d", ("x",), _POOL_ATTRS, _pool, linear_in=(0,), roles=("data",),
               doc="Average pooling; padded zeros count in the average (torch's count_include_pad)."))
register(OpDef("maxpool2d", ("x",), _POOL_ATTRS, _pool, roles=("data",), doc="Max pooling; padding never wins."))


def _batchnorm(attrs, types):
    x, *vecs = types
    if x.rank < 2:
        _fail(f"batchnorm needs an input of rank >= 2 (channels on axis 1), got {x!r}")
    for name, v in zip(("scale", "bias", "mean", "var"), vecs):
        if v.shape != (x.shape[1],):
            _fail(f"batchnorm {name} must be [{x.shape[1]}] for input {x!r}, got {v!r}")
    return (x,)


register(OpDef("batchnorm", ("x", "scale", "bias", "mean", "var"), (Attr("eps", "float", 1e-5, carries="real"),), _batchnorm,
               positive_inputs=(4,),
               doc="Batch norm in inference form: (x-mean)/sqrt(var+eps)*scale+bias per channel (axis 1)."))


def _softmax(attrs, types):
    _axis(attrs["axis"], types[0].rank, "softmax")
    return (types[0],)


def _layernorm(attrs, types):
    if not 1 <= attrs["ndim"] <= types[0].rank:
        _fail(f"layernorm over the last {attrs['ndim']} axes of {types[0]!r}")
    return (types[0],)


register(OpDef("softmax", ("x",), (Attr("axis", "int", carries="axis"),), _softmax, canonicalize=nonnegative_axis, batch_axes=True,
               doc="Softmax along an axis."))
register(OpDef("layernorm", ("x",), (Attr("ndim", "int", 1), Attr("eps", "float", 1e-5, carries="real")), _layernorm, batch_axes=True,
               doc="Normalize over the last ndim axes to mean 0, variance 1 (no affine part: "
                   "models apply it with mul and add)."))

# ---- cost facts (superopt.cost prices operators from these; an operator without them is an error) ----


def _out_elems(k):
    return lambda a, ins, outs: float(k * sum(t.numel for t in outs))


def _matmul_flops(a, ins, outs):
    return 2.0 * outs[0].numel * ins[0].shape[-1]


def _conv_flops(a, ins, outs):
    o, ci, kh, kw = ins[1].shape
    return 2.0 * outs[0].numel * ci * kh * kw + (outs[0].numel if a["activation"] == "relu" else 0)


def _conv_bias_flops(a, ins, outs):  # the convolution's, plus one add per output element
    return _conv_flops(a, ins[:2], outs) + outs[0].numel


def _pool_flops(a, ins, outs):
    return float(outs[0].numel * a["kernel"][0] * a["kernel"][1])


def _transpose_is_view(a, ins):
    moved = [p for p in a["perm"] if ins[0].shape[p] != 1]
    return moved == sorted(moved)


def _sdpa_flops(a, ins, outs):  # q [.., L, E], k [.., S, E], v [.., S, F]: two matmuls and a softmax over S
    q, k, v = ins[0].shape, ins[1].shape, ins[2].shape
    lead = 1
    for d in q[:-2]:
        lead *= d
    return 2.0 * lead * q[-2] * k[-2] * (q[-1] + v[-1]) + 5.0 * lead * q[-2] * k[-2]


def _gather_bytes(a, ins, outs, itemsize):  # embedding: the ids and the rows they pick
    return float(ins[1].numel * 8 + outs[0].numel * itemsize)


_NONE = CostFacts(lambda a, ins, outs: 0.0, view=lambda a, ins: True, fusion="view")
for _name in ("input", "weight", "identity_matrix", "identity_conv", "ones", "zeros", "pool_kernel"):
    declare_cost(_name, _NONE)  # sources and constants: folded at compile time
for _name, _k in (("add", 1), ("mul", 1), ("smul", 1), ("relu", 1), ("sigmoid", 4), ("tanh", 4), ("gelu", 8),
                  ("batchnorm", 2), ("pow", 2), ("enlarge", 0), ("concat", 0)):
    declare_cost(_name, CostFacts(_out_elems(_k)))
declare_cost("matmul", CostFacts(_matmul_flops, rate="matmul", fusion="extern"))
declare_cost("conv2d", CostFacts(_conv_flops, rate="conv", fusion="extern"))
declare_cost("conv2d_bias", CostFacts(_conv_bias_flops, rate="conv", fusion="extern"))
declare_cost("avgpool2d", CostFacts(_pool_flops, fusion="reduction"))
declare_cost("maxpool2d", CostFacts(_pool_flops, fusion="reduction"))
declare_cost("softmax", CostFacts(_out_elems(5), fusion="reduction"))
declare_cost("layernorm", CostFacts(_out_elems(6), fusion="reduction"))
declare_cost("transpose", CostFacts(_out_elems(0), view=_transpose_is_view))
declare_cost("reshape", CostFacts(_out_elems(0), view=lambda a, ins: True, fusion="view"))
declare_cost("split", CostFacts(_out_elems(0), view=lambda a, ins: True, fusion="view"))
declare_cost("opaque", CostFacts(_out_elems(1), fusion="opaque"))
declare_cost("sdpa", CostFacts(_sdpa_flops, rate="matmul", fusion="extern"))
declare_cost("embedding", CostFacts(_out_elems(0), bytes=_gather_bytes, fusion="pointwise"))

# ---- opaque -------------------------------------------------------------------------------


def _opaque(attrs, types):
    return attrs["out_types"]


register(OpDef("opaque", (), (Attr("target", "str"), Attr("params", "str", "{}"), Attr("out_types", "types")),
               _opaque, variadic=True, kind="opaque",
               doc="An operator superopt does not know: its call (target and JSON params) and output types "
                   "are kept so that it survives export; it is never rewritten."))

# ---- attention, embedding, power (issue 11) -------------------------------------------------

#: inputs that index another input: (index input, indexed input, indexed axis or the name of the
#: attribute holding it, distinct); the samplers draw such sources as integers in range (all
#: different where ``distinct``), and they are never linear
INDEX_INPUTS = {"embedding": (1, 0, 0, False), "index_copy": (1, 0, "axis", True)}


def _sdpa(attrs, types):
    if len(types) not in (3, 4):
        _fail(f"sdpa takes q, k, v and an optional additive mask, got {len(types)} inputs")
    q, k, v = types[:3]
    if min(q.rank, k.rank, v.rank) < 2 or not q.rank == k.rank == v.rank:
        _fail(f"sdpa needs q, k, v of one rank >= 2, got {q!r}, {k!r}, {v!r}")
    _sdpa_heads(attrs, q, k, v)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        _fail(f"sdpa: q·k contracts {q.shape[-1]} with {k.shape[-1]}, attention over {k.shape[-2]} keys "
              f"and {v.shape[-2]} values")
    scores = q.shape[:-1] + (k.shape[-2],)
    if len(types) == 4:
        if attrs["causal"]:
            _fail("sdpa with both an attention mask and causal=1 (torch forbids it too)")
        if broadcast_shapes(types[3].shape, scores) != scores:
            _fail(f"sdpa mask {types[3]!r} does not broadcast to the scores {list(scores)}")
    return (TensorType(q.shape[:-1] + (v.shape[-1],), _same_dtype(types)),)


def _sdpa_heads(attrs, q, k, v):
    """Batch axes equal; with gqa=1 the head axis (-3) of k and v may divide q's."""
    if k.shape[:-2] != v.shape[:-2]:
        _fail(f"sdpa needs equal batch axes on k and v: {k!r}, {v!r}")
    if not attrs["gqa"]:
        if q.shape[:-2] != k.shape[:-2]:
            _fail(f"sdpa needs equal batch axes: {q!r}, {k!r}, {v!r} (grouped key-value heads need gqa=1)")
        return
    if q.rank < 3 or q.shape[:-3] != k.shape[:-3] or k.shape[-3] < 1 or q.shape[-3] % k.shape[-3]:
        _fail(f"sdpa with gqa=1 needs q, k, v of rank >= 3 with equal batch axes and a number of key-value heads "
              f"(axis -3) that divides q's: {q!r}, {k!r}, {v!r}")


register(OpDef("sdpa", ("q", "k", "v"), (
    Attr("scale", "float"),
    Attr("causal", "int", 0, choices=(0, 1)),
    Attr("gqa", "int", 0, choices=(0, 1)),
), _sdpa, variadic=True, linear_in=(2,),
    doc="Scaled dot-product attention softmax(q·kᵀ·scale + mask)·v over the last two axes (a fourth "
        "input is an additive mask broadcast to the scores; causal=1 masks keys after the query, "
        "top-left aligned as torch's is_causal). No dropout. gqa=1 is torch's enable_gqa: k and v may have "
        "fewer heads (axis -3) than q, a divisor of them; query head h reads key-value head h // (Hq/Hkv)."))


def _embedding(attrs, types):
    w, ids = types
    _rank(w, 2, "embedding's table")
    if ids.dtype not in ("int64", "int32"):
        _fail(f"embedding's indices must be integers, got {ids!r}")
    return (TensorType(ids.shape + (w.shape[1],), w.dtype),)


register(OpDef("embedding", ("w", "ids"), (), _embedding, linear_in=(0,),
               doc="Rows of the table w [V, D] picked by integer ids [...]: output [..., D] (a gather)."))


def _pow_linear(attrs):
    return (0,) if attrs["exponent"] == 1.0 else ()


register(OpDef("pow", ("x",), (Attr("exponent", "float"),), _unary, elementwise=True, linear_in=_pow_linear,
               doc="Elementwise x ** exponent for a constant exponent (GPT-2's gelu uses 3)."))

from . import opdefs_llm  # noqa: E402,F401  (registers the LLM operators: mean, sum, rsqrt, silu, ...)

# ---- fused kernels (issue 23: superopt.kernel) ---------------------------------------------


def _kernel(attrs, types):
    return attrs["out_types"]


register(OpDef("kernel", (), (Attr("program", "str"), Attr("config", "str", ""), Attr("reference", "str"),
                              Attr("out_types", "types"), Attr("us", "float", 0.0)), _kernel, variadic=True, kind="opaque",
               doc="One fused GPU kernel chosen by superopt.kernel for a region of the graph: its program text, "
                   "tile configuration (JSON, '' for the first default) and the region graph it was proven equal "
                   "to (JSON, weights as inputs; the inputs are that graph's, in order), and its time measured on the "
                   "device in microseconds (what the cost model prices it at; 0: not measured). Like an opaque node it is "
                   "never rewritten; it runs as the custom op superopt::kernel (superopt.kernel.torch_op)."))
declare_cost("kernel", CostFacts(_out_elems(1), fusion="opaque"))
