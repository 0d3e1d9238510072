"""The state of one import, shared by the torch and the ONNX importers.

Both importers reduce a model to a sequence of ATen calls (``torch.ops.aten.*`` overloads with
their arguments) and hand each one to :meth:`ImportContext.call`, which

1. folds it into a new constant when every tensor it reads is known at import time
   (parameters, buffers, earlier folded values), by running it with torch;
2. otherwise maps it to IR operators with the handler registered for its target
   (:mod:`superopt.frontend.aten`);
3. otherwise (no handler, or the handler declines with :class:`Unsupported`) keeps it as an
   ``opaque`` node that records the call, so it survives export and runs as it came.

Values flowing between calls are IR :class:`Ref` s, :class:`Const` s (tensors whose weight node
is made on first use, so a parameter that is only folded or transposed never appears twice),
tuples of those (multi-output operators), or plain Python values (ints, lists, dtypes).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.types import TensorType
from ..semantics.torch_lowering import resolve_opaque
from .errors import ModelImportError

#: the view operators, folded on contiguous data (:meth:`Context._fold`)
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.view_copy.default)

__all__ = ["Const", "Unsupported", "ImportContext", "dtype_name", "torch_dtype", "type_of_tensor",
           "sanitize", "bind", "drop_dead"]


class Unsupported(Exception):
    """Raised by an operator handler: this call has no IR form; it is kept as an opaque node."""


@dataclass(eq=False)
class Const:
    """A tensor known at import time; ``ref`` is its weight node once something uses it."""

    data: torch.Tensor
    name: str
    ref: Ref | None = None


def dtype_name(dt: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the IR's dtype names follow torch's).

    >>> dtype_name(torch.int64)
    'int64'
    """
    return str(dt).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ModelImportError(f"dtype {name!r} is not a torch dtype")
    return dt


def type_of_tensor(t) -> TensorType:
    """The IR type of a (possibly fake or meta) tensor; symbolic sizes are refused."""
    if any(isinstance(d, torch.SymInt) for d in t.shape):
        raise ModelImportError(f"a tensor of shape {list(t.shape)} has symbolic sizes; superopt needs "
                               f"static shapes: export without dynamic_shapes")
    return TensorType(tuple(int(d) for d in t.shape), dtype_name(t.dtype))


def sanitize(name: str) -> str:
    """A name made of letters, digits and underscores, usable as an attribute.

    >>> sanitize("layer1.0.conv1.weight")
    'layer1_0_conv1_weight'
    """
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"v_{s}"


def bind(target, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments of an ATen call by schema name, defaults filled in."""
    out = {}
    for i, arg in enumerate(target._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            raise ModelImportError(f"{target}: argument {arg.name!r} is missing")
    return out


def _leaves(v):
    if isinstance(v, (list, tuple)) and not isinstance(v, Ref):
        for x in v:
            yield from _leaves(x)
    elif isinstance(v, Mapping):
        for x in v.values():
            yield from _leaves(x)
    else:
        yield v


def _map(v, fn):
    """Apply ``fn`` to every leaf of nested lists/tuples (keeping their kind)."""
    if isinstance(v, (list, tuple)) and not isinstance(v, Ref):
        return type(v)(_map(x, fn) for x in v)
    return fn(v)


def _weight_array(t: torch.Tensor) -> np.ndarray:
    """``t``'s values as the array of a weight: a view of ``t`` where its elements are dense in
    some order (a parameter, or a linear layer's transposed weight: 204 in BERT-base, whose
    copies took 0.38 s of its import, most of it the first touch of 0.34 GB), else a copy.

    The view is safe because neither side writes: the importer refuses a program that updates
    its parameters, buffers or constants in place (:mod:`superopt.frontend.torch_import`), and
    superopt never writes into a graph's data (graphs share it). A caller of the Python API who
    updates a module's parameters in place after importing it changes the graph's weights too.
    (A read-only view would make torch warn wherever a tensor is made of it without a copy.)
    The writer copies each weight it writes into C order (``codegen.fx``): the same bytes."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.numpy() if t.permute(order).is_contiguous() else t.contiguous().numpy()


def drop_dead(g: Graph) -> Graph:
    """Remove compute nodes and weights no output needs (inputs always stay, in order)."""
    return g.prune(keep_weights=False)


class ImportContext:
    """Builds one IR graph from a stream of ATen calls (see the module docstring)."""

    def __init__(self, handlers: Mapping[str, Callable]):
        self.b = GraphBuilder()
        self.handlers = handlers
        self.names: set[str] = set()
        self.folded = 0
        self.dropped = 0
        self.declined: Counter = Counter()  # handler reasons for opaque nodes

    # ---- names and sources -------------------------------------------------------------
    def reserve(self, name: str) -> str:
        """A fresh sanitized name (suffixed ``_1``, ``_2``... when taken)."""
        base = sanitize(name)
        new, k = base, 0
        while new in self.names:
            k += 1
            new = f"{base}_{k}"
        self.names.add(new)
        return new

    def input(self, name: str, ty: TensorType) -> Ref:
        return self.b.input(self.reserve(name), ty.shape, ty.dtype)

    def const(self, data, name: str) -> Const:
        """A constant; python numbers become rank-0 float32 tensors."""
        t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=torch.float32)
        return Const(t.detach(), name)

    def ref(self, v) -> Ref:
        """The IR value of ``v``, making the weight node of a constant on first use."""
        if isinstance(v, Ref):
            return v
        if isinstance(v, Const):
            if v.ref is None:
                t = v.data.to("cpu")
                arr = _weight_array(t.float() if t.dtype == torch.bfloat16 else t)
                v.ref = self.b.weight(self.reserve(v.name), tuple(t.shape), arr, dtype_name(t.dtype))
            return v.ref
        raise Unsupported(f"expected a tensor, got {type(v).__name__}")

    def type_of(self, v) -> TensorType:
        if isinstance(v, Const):
            return type_of_tensor(v.data)
        if isinstance(v, Ref):
            return self.b.type_of(v)
        raise Unsupported(f"expected a tensor, got {type(v).__name__}")

    def op(self, op: str, *inputs, **attrs):
        """Append an IR node on values (constants are materialized as weights)."""
        return self.b.op(op, *(self.ref(x) for x in inputs), **attrs)

    def add(self, op: str, inputs, **attrs) -> tuple[Ref, ...]:
        """Like :meth:`op`, always returning the tuple of outputs."""
        return self.b.add(op, [self.ref(x) for x in inputs], attrs)

    # ---- one call ----------------------------------------------------------------------
    def call(self, target, args: tuple, kwargs: Mapping[str, Any], expected=None, name: str = "",
             needed: set[int] | None = None):
        """Import one ATen call; ``expected`` are its output types (computed on meta tensors
        when not given), ``needed`` the output positions that something reads."""
        if expected is None:
            expected = self.meta_types(target, args, kwargs)
        bound = bind(target, args, kwargs)
        tensors = [v for v in _leaves(bound) if isinstance(v, (Ref, Const))]
        handler = self.handlers.get(str(target))
        consts_only = all(isinstance(v, Const) for v in tensors)
        if consts_only and not getattr(handler, "passthrough", False):
            return self._fold(target, args, kwargs, self._fold_name(target._opname, name, tensors))
        if handler is not None:
            try:
                out = handler(self, bound, expected)
                self._check(out, expected, needed, target)
                return out
            except (Unsupported, ShapeError) as e:
                self.declined[f"{target}: {e}"] += 1
        return self.opaque(str(target), args, kwargs, expected)

    def _check(self, out, expected, needed, target):
        if isinstance(expected, TensorType):
            got = self.type_of(out)
            if got != expected:  # e.g. tanh of an int tensor: torch promotes, the IR op does not
                raise Unsupported(f"the IR form gives {got!r} where torch gives {expected!r}")
            return
        for i, (o, e) in enumerate(zip(out, expected)):
            if o is None:
                if needed is None or i in needed:
                    raise Unsupported(f"output {i} has no IR form")
            elif e is not None:
                self._check(o, e, None, target)

    def call_function(self, target: str, args: tuple, kwargs: Mapping[str, Any]):
        """Import a call of a torch function (``"torch.nn.functional..."``) with no IR form:
        folded when its inputs are constants, else an opaque node calling it."""
        fn = resolve_opaque(target)
        if fn is None:
            raise ModelImportError(f"{target} is not a torch function")
        tensors = [v for v in _leaves((args, kwargs)) if isinstance(v, (Ref, Const))]
        if all(isinstance(v, Const) for v in tensors):
            return self._fold(fn, args, kwargs, self._fold_name(fn.__name__, "", tensors))
        return self.opaque(target, args, kwargs, self.meta_types(fn, args, kwargs))

    @staticmethod
    def _fold_name(op: str, name: str, tensors) -> str:
        return tensors[0].name if tensors else name or op

    def _fold(self, fn, args, kwargs, name):
        """Run ``fn`` on the constants' data. A view of a constant is taken of its contiguous data:
        a constant is a value, its layout an accident of how it was folded (a ``clone`` that made a
        permuted tensor contiguous is dropped), and the view's values do not depend on it."""
        if fn in _VIEWS:
            real = lambda v: v.data.contiguous() if isinstance(v, Const) else v  # noqa: E731
        else:
            real = lambda v: v.data if isinstance(v, Const) else v  # noqa: E731
        try:
            with torch.no_grad():
                out = fn(*_map(args, real), **{k: _map(v, real) for k, v in kwargs.items()})
        except Exception as e:  # torch raises many kinds; the message names the problem
            raise ModelImportError(f"{fn} cannot run on the constants it reads: "
                                   f"{str(e).strip().splitlines()[0][:200]}") from None
        self.folded += 1
        return _map(out, lambda t: Const(t, name) if isinstance(t, torch.Tensor) else t)

    def meta_types(self, target, args, kwargs):
        """Output types of a call, by running it on meta tensors."""
        def meta(v):
            if isinstance(v, (Ref, Const)):
                t = self.type_of(v)
                return torch.empty(t.shape, dtype=torch_dtype(t.dtype), device="meta")
            return v
        try:
            out = target(*_map(args, meta), **{k: _map(v, meta) for k, v in kwargs.items()})
        except Exception as e:  # torch raises many kinds; the message names the problem
            raise ModelImportError(f"{target} cannot run on its inputs: {str(e).splitlines()[0]}") from None
        return _map(out, lambda t: type_of_tensor(t) if isinstance(t, torch.Tensor) else None)

    # ---- opaque nodes ------------------------------------------------------------------
    def opaque(self, target: str, args, kwargs, expected):
        """Keep a call as it came: target, non-tensor arguments as JSON, output types."""
        inputs: list[Ref] = []

        def enc(v):
            if isinstance(v, (Ref, Const)):
                inputs.append(self.ref(v))
                return {"$t": len(inputs) - 1}
            if isinstance(v, (list, tuple)) and not isinstance(v, Ref):
                return [enc(x) for x in v]
            if isinstance(v, Mapping):
                return {k: enc(x) for k, x in v.items()}
            return encode_scalar(v, target)

        params = {"args": enc(list(args)), "kwargs": {k: enc(v) for k, v in kwargs.items()}}
        flat = list(_leaves(expected))
        if not flat or any(t is None for t in flat):
            raise ModelImportError(f"{target}: cannot keep a call whose outputs are not all tensors")
        refs = self.b.add("opaque", inputs, {"target": target, "params": json.dumps(params, sort_keys=True),
                                             "out_types": tuple(flat)})
        if isinstance(expected, TensorType):
            return refs[0]
        it = iter(refs)
        return _map(expected, lambda t: next(it))

    def finish(self, outputs) -> Graph:
        refs = [self.ref(v) for v in outputs]
        return drop_dead(self.b.build(refs))


def encode_scalar(v, target: str):
    """A non-tensor argument as JSON: numbers, strings, None, and tagged dtypes/layouts."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"$dtype": dtype_name(v)}
    if isinstance(v, (torch.memory_format, torch.layout)):
        return {"$" + type(v).__name__: str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return None  # run where the inputs are
    if isinstance(v, np.generic):
        return v.item()
    raise ModelImportError(f"{target}: cannot keep an argument of type {type(v).__name__} ({v!r})")
