"""Declarations of superopt's operators (see :mod:`superopt.ir.ops`).

Layout conventions follow torch: images are NCHW, conv kernels are [out, in/groups, kh, kw],
matmul contracts the last axis of the left input with the second-to-last of the right one and
broadcasts batch axes. Bias addition as models do it is ``add`` with numpy broadcasting
(a [C,1,1] vector on an NCHW image, a [F] vector on [..., F] features).
"""

from __future__ import annotations

from .ops import Attr, OpDef, nonnegative_axis, register
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


register(OpDef("identity_matrix", (), (Attr("n", "int"),), _identity_matrix, kind="constant",
               doc="The n×n identity matrix (TASO's Imm)."))
register(OpDef("identity_conv", (), (Attr("channels", "int"), Attr("kernel", "ints"), Attr("groups", "int", 1)),
               _identity_conv, kind="constant",
               doc="A conv kernel that maps each channel to itself: 1 at the centre (TASO's Iconv)."))
register(OpDef("ones", (), (Attr("shape", "ints"),), lambda a, t: (TensorType(a["shape"]),), kind="constant",
               doc="A tensor of ones (TASO's Ione)."))
register(OpDef("zeros", (), (Attr("shape", "ints"),), lambda a, t: (TensorType(a["shape"]),), kind="constant",
               doc="A tensor of zeros (lets axioms state shifts such as batch norm's without tricks)."))
register(OpDef("pool_kernel", (), (Attr("channels", "int"), Attr("kernel", "ints")), _pool_kernel,
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


register(OpDef("smul", ("x", "scale"), (), _smul, linear_in=(0, 1),
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


register(OpDef("matmul", ("a", "b"), (), _matmul, linear_in=(0, 1),
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


register(OpDef("conv2d", ("x", "w"), (
    Attr("stride", "ints", (1, 1), domain=((1, 1), (2, 2))),
    Attr("padding", "ints", (0, 0)),
    Attr("groups", "int", 1),
    Attr("activation", "str", "none", choices=("none", "relu"), domain=("none", "relu")),
), _conv2d, linear_in=lambda a: (0, 1) if a["activation"] == "none" else (), roles=("data", "weight"),
    doc="2-D convolution (cross-correlation as in torch), no bias, with an optional fused relu."))


def _enlarge(attrs, types):
    (w,) = types
    _rank(w, 4, "enlarge's kernel")
    kh, kw = w.shape[2:]
    KH, KW = attrs["kernel"]
    if KH < kh or KW < kw or (KH - kh) % 2 or (KW - kw) % 2:
        _fail(f"enlarge pads a {kh}x{kw} kernel to {KH}x{KW}: the target must be larger by an even amount")
    return (TensorType(w.shape[:2] + (KH, KW), w.dtype),)


register(OpDef("enlarge", ("w",), (Attr("kernel", "ints"),), _enlarge, linear_in=(0,), roles=("weight",),
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


register(OpDef("transpose", ("x",), (Attr("perm", "ints", domain=((1, 0),)),), _transpose, linear_in=(0,),
               doc="Permute the axes."))
register(OpDef("reshape", ("x",), (Attr("shape", "ints"),), _reshape, linear_in=(0,),
               doc="Reinterpret the elements (row-major) under a new shape."))
register(OpDef("concat", ("x",), (Attr("axis", "int", domain=(0, 1)),), _concat, variadic=True,
               canonicalize=nonnegative_axis,
               doc="Concatenate along an axis (two or more inputs)."))
register(OpDef("split", ("x",), (Attr("axis", "int", domain=(0, 1)), Attr("sizes", "ints")), _split,
               canonicalize=nonnegative_axis,
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


_POOL_ATTRS = (Attr("kernel", "ints"), Attr("stride", "ints", (1, 1)), Attr("padding", "ints", (0, 0)))
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


register(OpDef("batchnorm", ("x", "scale", "bias", "mean", "var"), (Attr("eps", "float", 1e-5),), _batchnorm,
               positive_inputs=(4,),
               doc="Batch norm in inference form: (x-mean)/sqrt(var+eps)*scale+bias per channel (axis 1)."))


def _softmax(attrs, types):
    _axis(attrs["axis"], types[0].rank, "softmax")
    return (types[0],)


def _layernorm(attrs, types):
    if not 1 <= attrs["ndim"] <= types[0].rank:
        _fail(f"layernorm over the last {attrs['ndim']} axes of {types[0]!r}")
    return (types[0],)


register(OpDef("softmax", ("x",), (Attr("axis", "int"),), _softmax, canonicalize=nonnegative_axis,
               doc="Softmax along an axis."))
register(OpDef("layernorm", ("x",), (Attr("ndim", "int", 1), Attr("eps", "float", 1e-5)), _layernorm,
               doc="Normalize over the last ndim axes to mean 0, variance 1 (no affine part: "
                   "models apply it with mul and add)."))

# ---- opaque -------------------------------------------------------------------------------


def _opaque(attrs, types):
    return attrs["out_types"]


register(OpDef("opaque", (), (Attr("target", "str"), Attr("params", "str", "{}"), Attr("out_types", "types")),
               _opaque, variadic=True, kind="opaque",
               doc="An operator superopt does not know: its call (target and JSON params) and output types "
                   "are kept so that it survives export; it is never rewritten."))
