"""What the generator enumerates over: operator sets, input tensors, attribute choices.

Operators come from the registry (``superopt.ir``); nothing here is per-operator code except
the choice of attribute values that depend on shapes (conv padding "same" or "valid", split
into halves, the kernel size ``enlarge`` pads to, ...). Attributes with a ``domain`` in their
declaration take every value of it; others take a derived value or their default. Variadic
operators (concat) take exactly two inputs. Inputs are small named tensors with concrete
shapes (TASO's: 2x4 data, 4x4 weights, a 2x4x5x5 image, 3x3 / 1x3 / 3x1 conv kernels, a
depthwise kernel, a scalar); all of them are graph ``input`` nodes.

Each input is *data* or a *weight*; a value computed from weights (and constants) only is a
weight too. A few operator inputs take only one kind (``ROLES``): a convolution's image is data
and its kernel a weight, pooling reads data, ``enlarge`` pads a weight. This keeps kernels from
being convolved as images, which the optimizer never needs, and cuts the space about in half.
Elementwise operators with two inputs take two inputs of one type (no broadcasting; a scalar
scale is ``smul``); ``RANKS`` limits the ranks some operators take (matmul: matrices, or
batches of them, never kernels); and no operator takes the same value twice (``x + x`` and
``concat(x, x)`` only give instances of rules over distinct tensors, and many of them).

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

__all__ = ["InputSpec", "ROLES", "RANKS", "OP_PRESETS", "INPUT_SETS", "parse_ops", "parse_inputs", "default_inputs",
           "supported_ops", "OpTable", "Instance", "VARIADIC_ARITY", "MAX_INPUTS"]

#: how many inputs a variadic operator (concat) takes in generated graphs
VARIADIC_ARITY = 2
#: operators with more inputs are not enumerated (every combination of inputs is tried)
MAX_INPUTS = 3


@dataclass(frozen=True)
class InputSpec:
    """One input tensor of the generated graphs."""

    name: str
    shape: tuple[int, ...]
    weight: bool = False

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape)


def _inputs(*items) -> tuple[InputSpec, ...]:
    """``(name, shape)`` for data, ``(name, shape, True)`` for a weight."""
    return tuple(InputSpec(it[0], tuple(it[1]), *it[2:]) for it in items)


_TASO_INPUTS = _inputs(("x0", (2, 4)), ("x1", (2, 4)), ("x2", (2, 4)), ("w0", (4, 4), True), ("w1", (4, 4), True),
                       ("i0", (2, 4, 5, 5)), ("k0", (4, 4, 3, 3), True), ("k1", (4, 4, 3, 3), True),
                       ("k2", (4, 4, 1, 3), True), ("k3", (4, 4, 3, 1), True), ("d0", (4, 1, 3, 3), True),
                       ("s0", (), True))

#: named input sets; ``--inputs`` takes one of these names or an explicit list
INPUT_SETS: dict[str, tuple[InputSpec, ...]] = {
    "taso": _TASO_INPUTS,
    "transformer": _inputs(("x0", (2, 4)), ("x1", (2, 4)), ("x2", (2, 4)), ("w0", (4, 4), True),
                           ("w1", (4, 4), True)),
    "all": _TASO_INPUTS,
}

#: operator inputs that take only data (``"data"``) or only weights (``"weight"``); None: either
ROLES: dict[str, tuple] = {
    "conv2d": ("data", "weight"),
    "avgpool2d": ("data",),
    "maxpool2d": ("data",),
    "enlarge": ("weight",),
}

#: the ranks an operator's inputs may have in generated graphs (others: any rank)
RANKS: dict[str, tuple[int, ...]] = {"matmul": (2, 3)}

#: named operator sets; ``--ops`` takes one of these names or a comma list
OP_PRESETS: dict[str, tuple[str, ...]] = {
    "taso": ("conv2d", "matmul", "add", "mul", "smul", "relu", "transpose", "concat", "split", "avgpool2d",
             "maxpool2d", "enlarge", "identity_matrix", "identity_conv", "pool_kernel"),
    "transformer": ("matmul", "add", "mul", "gelu", "softmax", "layernorm", "transpose", "reshape", "concat",
                    "split"),
}


# ---- attribute values that depend on shapes ------------------------------------------------

@dataclass(frozen=True)
class _Context:
    """Sizes read off the input set: square matrix sizes, image channels, odd kernel sizes."""

    squares: tuple[int, ...]
    channels: tuple[int, ...]
    kernels: tuple[tuple[int, int], ...]
    shapes: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(inputs) -> "_Context":
        shapes = sorted({s.shape for s in inputs})
        squares = sorted({s[0] for s in shapes if len(s) == 2 and s[0] == s[1]})
        channels = sorted({s[1] for s in shapes if len(s) == 4 and s[1] > 1})
        kernels = sorted({s[2:] for s in shapes if len(s) == 4 and max(s[2:]) <= 3 and s[2] % 2 and s[3] % 2})
        return _Context(tuple(squares), tuple(channels), tuple(kernels), tuple(shapes))

    @property
    def pool_kernel(self) -> tuple[int, int]:
        squares = [k for k in self.kernels if k[0] == k[1]]
        return max(squares) if squares else (3, 3)


def _padding(op, types, chosen, ctx):
    kh, kw = types[1].shape[2:] if op == "conv2d" else chosen["kernel"]
    return tuple(dict.fromkeys([(kh // 2, kw // 2), (0, 0)]))


def _groups(op, types, chosen, ctx):
    if op == "identity_conv":
        return tuple(dict.fromkeys([1, chosen["channels"]]))
    c, ci = types[0].shape[1], types[1].shape[1]
    return (c // ci,) if ci and c % ci == 0 else ()


def _sizes(op, types, chosen, ctx):
    d = types[0].shape[chosen["axis"]] if chosen["axis"] < types[0].rank else 0
    return ((d // 2, d // 2),) if d >= 2 and d % 2 == 0 else ()


def _kernel(op, types, chosen, ctx):
    if op == "enlarge":
        kh, kw = types[0].shape[2:]
        return tuple(k for k in ctx.kernels if k[0] == k[1] and k[0] >= kh and k[1] >= kw and k != (kh, kw))
    if op == "identity_conv":
        return ctx.kernels
    return (ctx.pool_kernel,)


def _reshape_shape(op, types, chosen, ctx):
    if op == "ones":
        return ctx.shapes
    (t,) = types
    flat = [(t.numel,)] if t.rank != 1 else []
    same = [s for s in ctx.shapes if s != t.shape and len(s) >= 2 and _numel(s) == t.numel]
    swapped = [t.shape[::-1]] if t.rank == 2 and t.shape[0] != t.shape[1] else []
    return tuple(dict.fromkeys(flat + swapped + same))


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
    "axis": lambda op, types, chosen, ctx: (types[0].rank - 1,) if types and types[0].rank else (),
    "n": lambda op, types, chosen, ctx: ctx.squares,
    "channels": lambda op, types, chosen, ctx: ctx.channels,
}


def _attr_values(attr, op, types, chosen, ctx):
    if attr.domain:
        return attr.domain
    if attr.name in _DERIVED:
        try:
            return _DERIVED[attr.name](op, types, chosen, ctx)
        except (ValueError, IndexError, KeyError, TypeError):
            return ()  # input types the operator cannot take
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

    def __init__(self, ops, inputs):
        self.ops = tuple(ops)
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
        if opdef.elementwise and len(types) == 2 and types[0] != types[1]:
            return
        if op in RANKS and any(t.rank not in RANKS[op] for t in types):
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
        """Whether inputs that are weights (True) or data (False) fit the operator's ``ROLES``."""
        return not any(r and (r == "weight") != w for r, w in zip(ROLES.get(op, ()), weights))
