"""The operator registry: one declaration per operator.

An :class:`OpDef` holds everything the rest of superopt needs to know about an operator
without knowing the operator itself: its inputs, its typed attributes with their domains, its
shape function and its algebraic flags. Semantics (fingerprint, float64 reference, torch
lowering) live in ``superopt.semantics`` and are looked up by the operator's name, so adding an
operator means one declaration here plus one entry per semantics table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..errors import AttributeValueError, ShapeError, UnknownOperatorError
from .types import TensorType

__all__ = ["Attr", "OpDef", "REGISTRY", "register", "get_op", "REQUIRED", "normalize_attrs", "canonical_attrs",
           "nonnegative_axis", "CARRIES", "attrs_carrying", "CostFacts", "declare_cost"]

REQUIRED = object()

#: what an attribute's value may stand for (see :class:`Attr`)
CARRIES = ("", "size", "kernel", "axis", "perm", "real", "window")

#: attribute kinds and how a value of each kind is normalized (JSON lists become tuples)
_KINDS: dict[str, Callable[[Any], Any]] = {
    "int": lambda v: _int(v),
    "ints": lambda v: tuple(_int(x) for x in v),
    "float": lambda v: float(v),
    "str": lambda v: _str(v),
    "types": lambda v: tuple(v if isinstance(v, TensorType) else TensorType(tuple(v[0]), v[1]) for v in v),
}


def _int(v):
    if isinstance(v, bool) or not isinstance(v, (int,)) and not hasattr(v, "__index__"):
        raise TypeError(f"expected an integer, got {v!r}")
    return int(v)


def _str(v):
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


@dataclass(frozen=True)
class Attr:
    """A typed attribute of an operator.

    ``choices`` restricts the allowed values; ``domain`` lists the small set of values the rule
    generator enumerates (empty: the generator does not vary it). ``carries`` says what the
    value stands for, so that matching, instantiation and the cross-check treat it alike:
    ``size`` (integers that are sizes of the tensors: they follow the shapes of a match or of
    a rescaling), ``kernel`` (kernel extents: sizes, but never rescaled), ``axis`` (an axis
    index), ``perm`` (a permutation of axes), ``real`` (a real-valued parameter such as eps),
    ``window`` (how a sliding window or a grouping is laid out: stride, padding, groups, a pool's
    kernel; models
    vary them, so a rule takes them as parameters like ``real``), or ``""`` (a plain choice: must
    be equal to match).
    """

    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple = ()
    domain: tuple = ()
    doc: str = ""
    carries: str = ""

    def __post_init__(self):
        if self.carries not in CARRIES:
            raise ValueError(f"attribute {self.name!r}: carries={self.carries!r}, expected one of {CARRIES}")
        if self.kind == "float" and self.carries != "real":
            object.__setattr__(self, "carries", "real")  # every real-valued attribute is a parameter

    def normalize(self, value):
        try:
            v = _KINDS[self.kind](value)
        except (TypeError, ValueError) as e:
            raise AttributeValueError(f"attribute {self.name!r}: {e}") from None
        if self.choices and v not in self.choices:
            raise AttributeValueError(f"attribute {self.name!r} is {v!r}; allowed: {', '.join(map(repr, self.choices))}")
        return v


@dataclass(frozen=True)
class OpDef:
    """One operator.

    ``infer(attrs, input_types)`` returns the output types (several for split) or raises
    :class:`ShapeError` saying what is wrong. ``linear_in`` names the inputs in which the
    operator is linear when the others are held fixed (a callable of the attributes where that
    depends on them, as for conv2d's fused activation). ``kind`` is ``source`` (graph input,
    weight), ``constant`` (computed from attributes alone), ``compute`` or ``opaque``.
    ``batch_axes``: extra leading axes of the inputs are batch axes the operator maps through
    (axis and permutation attributes shift with them), so a rule over rank r may match values
    of a higher rank; elementwise operators always do (see :attr:`lifts`).
    ``roles`` says, per input, what models pass there: ``"data"`` (an activation), ``"weight"``
    (a compile-time constant such as a conv kernel, whose last two axes are the window) or
    None (either); the rule generator enumerates only those uses.
    """

    name: str
    inputs: tuple[str, ...]
    attrs: tuple[Attr, ...]
    infer: Callable[[dict, list[TensorType]], tuple[TensorType, ...]]
    variadic: bool = False
    commutative: bool = False
    elementwise: bool = False
    linear_in: tuple[int, ...] | Callable[[dict], tuple[int, ...]] = ()
    kind: str = "compute"
    positive_inputs: tuple[int, ...] = ()
    roles: tuple[str | None, ...] = ()
    canonicalize: Callable[[dict, list[TensorType]], dict] | None = None
    doc: str = ""
    batch_axes: bool = False
    cost: "CostFacts | None" = None
    attr_index: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        self.attr_index.update({a.name: a for a in self.attrs})

    @property
    def lifts(self) -> bool:
        """Whether extra leading batch axes pass through (``batch_axes`` or elementwise)."""
        return self.batch_axes or self.elementwise

    def linear_inputs(self, attrs: dict) -> tuple[int, ...]:
        return self.linear_in(attrs) if callable(self.linear_in) else self.linear_in

    def check_arity(self, n: int) -> None:
        k = len(self.inputs)
        if (n < k) if self.variadic else (n != k):
            want = f"at least {k}" if self.variadic else str(k)
            raise ShapeError(f"{self.name} takes {want} input(s) ({', '.join(self.inputs)}), got {n}")


@dataclass(frozen=True)
class CostFacts:
    """What one application of an operator costs, for the cost model (``superopt.cost``).

    ``flops(attrs, ins, outs)``: floating-point operations (multiply-add = 2), run at the
    device's ``rate`` (``matmul``, ``conv`` or ``vector``). ``bytes(attrs, ins, outs, itemsize)``:
    memory traffic (None: every input read once, every output written once). ``view(attrs, ins)``:
    true when torch runs it as a view (no kernel). ``fusion`` says what Inductor makes of it:
    ``pointwise`` (fuses with its neighbours), ``reduction`` (one kernel, pointwise neighbours
    fused in), ``extern`` (a library kernel, matmul/conv, that takes pointwise epilogues),
    ``view`` (no kernel), ``opaque`` (a kernel of its own, nothing fused).
    """

    flops: Callable[[dict, list, list], float]
    rate: str = "vector"
    bytes: Callable[[dict, list, list, int], float] | None = None
    view: Callable[[dict, list], bool] | None = None
    fusion: str = "pointwise"


REGISTRY: dict[str, OpDef] = {}
_PENDING_COSTS: dict[str, CostFacts] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"operator {op.name} declared twice")
    if op.cost is None and op.name in _PENDING_COSTS:
        op = replace(op, cost=_PENDING_COSTS.pop(op.name))
    REGISTRY[op.name] = op
    return op


def declare_cost(name: str, facts: CostFacts) -> None:
    """Attach cost facts to an operator, declared before or after it (an operator declared
    later picks them up when it registers)."""
    if name in REGISTRY:
        REGISTRY[name] = replace(REGISTRY[name], cost=facts)
    else:
        _PENDING_COSTS[name] = facts


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise UnknownOperatorError(f"unknown operator {name!r}; known operators: {known}") from None


def attrs_carrying(op: str, *what: str) -> tuple[str, ...]:
    """Names of ``op``'s attributes that carry one of ``what`` (declaration order).

    >>> attrs_carrying("split", "size"), attrs_carrying("layernorm", "real")
    (('sizes',), ('eps',))
    """
    return tuple(a.name for a in get_op(op).attrs if a.carries in what)


def normalize_attrs(op: OpDef, attrs: dict) -> tuple[tuple[str, Any], ...]:
    """Check attribute names, fill defaults, normalize values; sorted ``(name, value)`` pairs."""
    unknown = set(attrs) - set(op.attr_index)
    if unknown:
        raise AttributeValueError(
            f"{op.name} has no attribute {', '.join(sorted(map(repr, unknown)))}; "
            f"its attributes: {', '.join(a.name for a in op.attrs) or 'none'}")
    out = []
    for a in op.attrs:
        if a.name in attrs:
            out.append((a.name, a.normalize(attrs[a.name])))
        elif a.default is REQUIRED:
            raise AttributeValueError(f"{op.name} needs attribute {a.name!r} ({a.kind})")
        else:
            out.append((a.name, a.normalize(a.default) if a.default is not None else None))
    return tuple(sorted(out))


def canonical_attrs(op: OpDef, attrs: tuple, input_types) -> tuple:
    """``attrs`` (normalized pairs) in the operator's canonical spelling for these input types."""
    if op.canonicalize is None or not input_types:
        return attrs
    return tuple(sorted(op.canonicalize(dict(attrs), list(input_types)).items()))


def nonnegative_axis(attrs: dict, types) -> dict:
    """``axis`` counted from the front (-1 becomes rank-1); out-of-range values are left for
    the shape function to report."""
    rank = types[0].rank
    if -rank <= attrs["axis"] < 0:
        attrs["axis"] += rank
    return attrs
