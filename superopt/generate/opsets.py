"""What the generator enumerates over: operator sets, input tensors, attribute choices.

Operators come from the registry (``superopt.ir``); nothing here is per-operator code. Attribute
values that depend on shapes are derived from the input types and the registry's flags (conv
padding "same" or "valid" from the window of the operator's weight input, split into halves or
into pieces the size of an input's axis, the kernel ``enlarge`` pads to, the axes concat, split
and softmax use at each rank, the permutations transpose tries at each rank). Attributes with a
``domain`` in their declaration take every value of it; others take their default. Variadic
operators (concat) take exactly two inputs. Inputs are small named tensors with concrete shapes,
all graph ``input`` nodes; the named sets live in :mod:`superopt.generate.families`.

Each input is *data* or a *weight*; a value computed from weights (and constants) only is a
weight too. An operator's ``roles`` (registry) say which kind each input takes where models use
it: a convolution's image is data and its kernel a weight, pooling reads data, ``enlarge`` pads
a weight. A run may also name ``weight_ops`` that take weights only (a family that reshapes
scale vectors, never activations). Elementwise operators with two inputs take two inputs of
one type, or a tensor and an operand that broadcasts into it without growing it (a bias
``[C,1,1]`` or ``[C]``, a per-channel scale); no operator takes the same value twice (``x + x``
and ``concat(x, x)`` only give instances of rules over distinct tensors, and many of them).

>>> parse_ops("matmul,relu")
('matmul', 'relu')
>>> [(s.name, s.weight) for s in parse_inputs("x=2x4,k=4x4x3x3:w,s=scalar:w")]
[('x', False), ('k', True), ('s', True)]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ..errors import ShapeError, SuperoptError
from ..ir import REGISTRY, TensorType, get_op
from ..ir.ops import REQUIRED, normalize_attrs
from .errors import GenerateError
from .families import INPUT_SETS, OP_PRESETS, InputSpec

__all__ = ["InputSpec", "OP_PRESETS", "INPUT_SETS", "AXES", "PERMS", "parse_ops", "parse_inputs", "default_inputs",
           "supported_ops", "OpTable", "Instance", "VARIADIC_ARITY", "MAX_INPUTS", "broadcast_ok"]

#: how many inputs a variadic operator (concat) takes in generated graphs
VARIADIC_ARITY = 2
#: operators with more inputs are not enumerated (every combination of inputs is tried)
MAX_INPUTS = 3


#: the axes concat and split take at each rank: both axes of a matrix, the sequence and the
#: feature (last) axis of a [B,S,D] sequence and the channel axis of a [C,1,1] bias, the output-
#: and input-channel axes of an image or a kernel; softmax takes the last axis only
AXES: dict[int, tuple[int, ...]] = {1: (0,), 2: (0, 1), 3: (0, 1, 2), 4: (0, 1)}
#: the permutations transpose takes at each rank (matrix transpose; swap the last two axes;
#: NCHW <-> NHWC and the attention head shuffle at rank 4)
PERMS: dict[int, tuple[tuple[int, ...], ...]] = {
    2: ((1, 0),), 3: ((0, 2, 1),), 4: ((0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 1, 3), (0, 1, 3, 2))}

# ---- attribute values that depend on shapes ------------------------------------------------

@dataclass(frozen=True)
class _Context:
    """Sizes read off the input set: square matrix sizes, image channels, odd kernel sizes."""

    squares: tuple[int, ...]
    channels: tuple[int, ...]
    kernels: tuple[tuple[int, int], ...]
    shapes: tuple[tuple[int, ...], ...]
    axis_dims: frozenset = frozenset()  # (rank, axis, size) of every input

    @staticmethod
    def of(inputs) -> "_Context":
        shapes = sorted({s.shape for s in inputs})
        squares = sorted({s[0] for s in shapes if len(s) == 2 and s[0] == s[1]})
        channels = sorted({s[1] for s in shapes if len(s) == 4 and s[1] > 1})
        kernels = sorted({s[2:] for s in shapes if len(s) == 4 and max(s[2:]) <= 3 and s[2] % 2 and s[3] % 2})
        axis_dims = frozenset((len(s), a, d) for s in shapes for a, d in enumerate(s))
        return _Context(tuple(squares), tuple(channels), tuple(kernels), tuple(shapes), axis_dims)

    @property
    def pool_kernel(self) -> tuple[int, int]:
        squares = [k for k in self.kernels if k[0] == k[1]]
        return max(squares) if squares else (3, 3)


def _window(op, types, chosen) -> tuple[int, int]:
    """The window an operator slides: its ``kernel`` attribute, or the last two axes of its
    weight input (a convolution's kernel)."""
    if "kernel" in chosen:
        return tuple(chosen["kernel"])
    return tuple(types[get_op(op).roles.index("weight")].shape[2:])


def _padding(op, types, chosen, ctx):
    kh, kw = _window(op, types, chosen)
    return tuple(dict.fromkeys([(kh // 2, kw // 2), (0, 0)]))


def _groups(op, types, chosen, ctx):
    if "channels" in chosen:  # a constant kernel: plain or depthwise
        return tuple(dict.fromkeys([1, chosen["channels"]]))
    c, ci = types[0].shape[1], types[1].shape[1]
    return (c // ci,) if ci and c % ci == 0 else ()


def _sizes(op, types, chosen, ctx):
    """Halves, and pieces the sizes of two inputs' same axis (an unequal concat undone)."""
    ax, r = chosen["axis"], types[0].rank
    d = types[0].shape[ax] if ax < r else 0
    out = [(d // 2, d // 2)] if d >= 2 and d % 2 == 0 else []
    out += sorted((a, d - a) for rr, aa, a in ctx.axis_dims if (rr, aa) == (r, ax) and 0 < a < d
                  and (r, ax, d - a) in ctx.axis_dims)
    return tuple(dict.fromkeys(out))


def _kernel(op, types, chosen, ctx):
    roles = get_op(op).roles
    if roles == ("weight",):  # pads a kernel to a larger one
        kh, kw = types[0].shape[2:]
        return tuple(k for k in ctx.kernels if k[0] == k[1] and k[0] >= kh and k[1] >= kw and k != (kh, kw))
    if not types:  # a constant kernel
        return ctx.kernels
    return (ctx.pool_kernel,)


def _axis(op, types, chosen, ctx):
    if not types or not types[0].rank:
        return ()
    if get_op(op).attr_index["axis"].domain:  # concat, split: the axes models use at this rank
        return AXES.get(types[0].rank, (0, types[0].rank - 1))
    return (types[0].rank - 1,)


def _perm(op, types, chosen, ctx):
    return PERMS.get(types[0].rank, ()) if types else ()


def _reshape_shape(op, types, chosen, ctx):
    if op == "ones":
        return ctx.shapes
    (t,) = types
    flat = [(t.numel,)] if t.rank != 1 else []
    same = [s for s in ctx.shapes if s != t.shape and len(s) >= 2 and _numel(s) == t.numel]
    swapped = [t.shape[::-1]] if t.rank == 2 and t.shape[0] != t.shape[1] else []
    ones = [t.shape + (1,)] if 1 <= t.rank < 4 else []  # a vector as a column, a [C,1,1] scale as [C,1,1,1]
    return tuple(dict.fromkeys(flat + swapped + same + ones))


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


_DERIVED: dict[str, Callable] = {
    "padding": _padding,
    "stride": lambda op, types, chosen, ctx: ((1, 1), (2, 2)),
    "groups": _groups,
    "sizes": _sizes,
    "kernel": _kernel,
    "shape": _reshape_shape,
    "axis": _axis,
    "perm": _perm,
    "n": lambda op, types, chosen, ctx: ctx.squares,
    "channels": lambda op, types, chosen, ctx: ctx.channels,
}


def _attr_values(attr, op, types, chosen, ctx):
    """Derived values first (they depend on the input types), then the declared domain."""
    if attr.name in _DERIVED:
        try:
            return _DERIVED[attr.name](op, types, chosen, ctx)
        except (ValueError, IndexError, KeyError, TypeError):
            return ()  # input types the operator cannot take
    if attr.domain:
        return attr.domain
    return (attr.default,)


def _attr_choices(op: str, types, ctx) -> list[dict]:
    """Every attribute assignment to try for ``op`` on inputs of ``types``."""
    out = [{}]
    for attr in get_op(op).attrs:
        out = [dict(c, **{attr.name: v}) for c in out for v in _attr_values(attr, op, types, c, ctx)]
    return out


# ---- operator sets -------------------------------------------------------------------------

def supported_ops() -> tuple[str, ...]:
    """Operators the generator can enumerate: compute or constant, with fingerprint semantics,
    at most ``MAX_INPUTS`` inputs, and every required attribute either in a domain or derivable
    from shapes. (Batch norm has five inputs: trying every input combination for it costs more
    than it finds, and folding it into a convolution needs operators the registry lacks.)"""
    from ..semantics import Field
    table = Field(0).table
    ok = []
    for name, op in REGISTRY.items():
        if op.kind not in ("compute", "constant") or name not in table or len(op.inputs) > MAX_INPUTS:
            continue
        if all(a.domain or a.name in _DERIVED or a.default is not REQUIRED for a in op.attrs):
            ok.append(name)
    return tuple(sorted(ok))


def parse_ops(text: str) -> tuple[str, ...]:
    """A preset name (``taso``, ``transformer``, ``all``) or a comma list of operator names."""
    text = (text or "").strip()
    if text == "all":
        return supported_ops()
    if text in OP_PRESETS:
        return OP_PRESETS[text]
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise GenerateError(f"--ops is empty; give a preset ({', '.join([*OP_PRESETS, 'all'])}) or a comma list")
    supported = supported_ops()
    for n in names:
        get_op(n)  # unknown names: UnknownOperatorError listing the known ones
        if n not in supported:
            raise GenerateError(f"operator {n!r} cannot be enumerated by the generator; "
                                f"it can enumerate: {', '.join(supported)}")
    return tuple(sorted(set(names), key=names.index))


def _parse_shape(name: str, text: str) -> tuple[int, ...]:
    text = text.strip()
    if text in ("scalar", "()", ""):
        return ()
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise GenerateError(f"input {name!r}: shape {text!r} is not like 2x4 (positive sizes) or 'scalar'")
    return dims


def parse_inputs(text: str) -> tuple[InputSpec, ...]:
    """An input-set name or a comma list ``name=2x4,k=4x4x3x3:w,s=scalar:w`` (``:w``: a weight)."""
    text = (text or "").strip()
    if text in INPUT_SETS:
        return INPUT_SETS[text]
    specs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, eq, shape = item.partition("=")
        if not eq or not name.strip().isidentifier():
            raise GenerateError(f"--inputs: {item!r} is not NAME=SHAPE (e.g. x=2x4) and "
                                f"not one of the sets {', '.join(INPUT_SETS)}")
        shape, colon, role = shape.partition(":")
        if colon and role.strip() not in ("w", "weight"):
            raise GenerateError(f"--inputs: {item!r}: the only role suffix is ':w' (a weight)")
        specs.append(InputSpec(name.strip(), _parse_shape(name, shape), bool(colon)))
    names = [s.name for s in specs]
    if not specs or len(set(names)) != len(names):
        raise GenerateError("--inputs needs at least one input, each with a distinct name")
    return tuple(specs)


def broadcast_ok(a: TensorType, b: TensorType) -> bool:
    """Two operands an elementwise operator takes: equal types, or one (of rank >= 1: a scalar
    scale is ``smul``) that broadcasts into the other without growing it (a bias, a scale).

    >>> broadcast_ok(TensorType((2, 6, 5, 7)), TensorType((6, 1, 1)))
    True
    >>> broadcast_ok(TensorType((2, 1)), TensorType((1, 3)))  # an outer sum: not a bias
    False
    """
    if a == b:
        return True
    if a.dtype != b.dtype or min(a.rank, b.rank) < 1:
        return False
    big, small = (a, b) if (a.rank, a.numel) >= (b.rank, b.numel) else (b, a)
    tail = big.shape[big.rank - small.rank:]
    return all(s in (1, d) for s, d in zip(small.shape, tail)) and small.numel < big.numel


def default_inputs(ops) -> tuple[InputSpec, ...]:
    """The input set of the smallest preset that holds all of ``ops``."""
    for preset in ("transformer", "taso"):
        if set(ops) <= set(OP_PRESETS[preset]):
            return INPUT_SETS[preset]
    return INPUT_SETS["all"]


# ---- instances: an operator with its attributes, checked against input types ----------------

@dataclass(frozen=True)
class Instance:
    """An operator with concrete attributes; ``key`` is a stable 64-bit id of it."""

    op: str
    attrs: tuple
    key: int
    commutative: bool

    @cached_property
    def attr(self) -> dict:
        return dict(self.attrs)


def _instance_key(op: str, attrs: tuple) -> int:
    d = hashlib.blake2b(repr((op, attrs)).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little")


class OpTable:
    """The generator's view of an operator set: which instances apply to which input types.

    ``apply(op, types)`` lists ``(instance, output types)`` for every attribute choice valid on
    inputs of ``types``; answers are cached, so each type signature is checked once.
    """

    def __init__(self, ops, inputs, weight_ops=()):
        self.ops = tuple(ops)
        self.weight_ops = frozenset(weight_ops)
        self.ctx = _Context.of(inputs)
        self.arity = {op: (VARIADIC_ARITY if get_op(op).variadic else len(get_op(op).inputs)) for op in self.ops}
        self._cache: dict[tuple, tuple] = {}
        self.instances: dict[int, Instance] = {}

    @property
    def max_arity(self) -> int:
        return max(self.arity.values(), default=1)

    def apply(self, op: str, types: tuple[TensorType, ...]) -> tuple[tuple[Instance, tuple], ...]:
        key = (op, types)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = tuple(self._build(op, types))
        return hit

    def _build(self, op, types):
        opdef = get_op(op)
        if opdef.elementwise and len(types) == 2 and not broadcast_ok(*types):
            return
        for choice in _attr_choices(op, list(types), self.ctx):
            try:
                attrs = normalize_attrs(opdef, choice)
                out = tuple(opdef.infer(dict(attrs), list(types)))
            except (SuperoptError, ShapeError):
                continue
            inst = self.instance(op, attrs)
            yield inst, out

    def instance(self, op: str, attrs: tuple) -> Instance:
        key = _instance_key(op, attrs)
        inst = self.instances.get(key)
        if inst is None:
            inst = self.instances[key] = Instance(op, attrs, key, get_op(op).commutative)
        return inst

    def out_types(self, inst: Instance, types: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
        """Output types of ``inst`` on inputs of ``types`` (which it must accept)."""
        key = (inst.key, types)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = tuple(get_op(inst.op).infer(inst.attr, list(types)))
        return hit

    def roles_allow(self, op: str, weights: tuple[bool, ...]) -> bool:
        """Whether inputs that are weights (True) or data (False) fit the operator's ``roles``
        (and the run's ``weight_ops``, which take weights only)."""
        if op in self.weight_ops and not all(weights):
            return False
        return not any(r and (r == "weight") != w for r, w in zip(get_op(op).roles, weights))
