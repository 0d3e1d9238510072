"""A model's IR graph from one recorded forward pass, without ``torch.export``.

``torch.export`` traces a module through four Python modes and fake tensors: NASNet-A's 916
ATen calls took 1.7-1.9 s of CPU, after 1.2 s importing ``torch._dynamo``. Its program's calls
are, for the convolutional zoo models, the module's own torch calls one for one (a
``conv2d`` call is ``aten.conv2d``, ``x + y`` is ``aten.add.Tensor``, ``x[:, :, 1:]`` one
``aten.slice`` per sliced axis). :func:`record_module` runs the module once under a
``TorchFunctionMode`` that maps each call to that overload, with its arguments as the export
records them, and imports it with the same :class:`~.context.ImportContext` the exported program
goes through: the same graph (nodes, names, weights, as views of the module's tensors), checked
against the export on every zoo CNN (``tests/test_trace_import.py``), at 0.03-0.26 s. A call
outside the table, a tensor made inside the forward pass, an in-place call, a keyword the table
does not know: :class:`NotRecorded`, and the caller exports the module as before.

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
>>> g, sig = record_module(m, (torch.randn(1, 3, 8, 8),))
>>> [n.op for n in g.nodes]
['input', 'weight', 'conv2d', 'weight', 'add', 'relu']
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ..ir.graph import Graph
from .aten import HANDLERS
from .context import Const, ImportContext, type_of_tensor
from .signature import Signature

__all__ = ["record_module", "NotRecorded"]

aten = torch.ops.aten
#: the end of an open slice (``x[1:]``) as the dispatcher hands it on
_END = sys.maxsize


class NotRecorded(Exception):
    """The module calls something the recording does not map: export it instead."""


def _pair(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v, v]


def _conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        raise NotRecorded("conv2d with a padding mode")
    return aten.conv2d.default, (input, weight, bias, _pair(stride), _pair(padding), _pair(dilation), groups)


def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if training:
        raise NotRecorded("a batch norm in training mode (it updates its statistics)")
    return aten.batch_norm.default, (input, weight, bias, running_mean, running_var, training, momentum, eps,
                                     torch.backends.cudnn.enabled)


def _relu(input, inplace=False):
    if inplace:
        raise NotRecorded("an in-place relu")
    return aten.relu.default, (input,)


def _add(input, other, alpha=1):
    if not isinstance(other, torch.Tensor):
        raise NotRecorded("add of a number")
    return aten.add.Tensor, (input, other) if alpha == 1 else (input, other, alpha)


def _avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return aten.avg_pool2d.default, (input, _pair(kernel_size), [] if stride is None else _pair(stride),
                                     _pair(padding), ceil_mode, count_include_pad, divisor_override)


def _max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    if return_indices:
        raise NotRecorded("max_pool2d with indices")
    return aten.max_pool2d.default, (input, _pair(kernel_size), [] if stride is None else _pair(stride),
                                     _pair(padding), _pair(dilation), ceil_mode)


def _cat(tensors, dim=0):
    return aten.cat.default, (list(tensors), dim)


def _pad(input, pad, mode="constant", value=None):
    return aten.pad.default, (input, list(pad), mode, value)


def _adaptive_avg_pool2d(input, output_size):
    return aten.adaptive_avg_pool2d.default, (input, _pair(output_size))


def _flatten(input, start_dim=0, end_dim=-1):
    return aten.flatten.using_ints, (input, start_dim, end_dim)


def _dropout(input, p=0.5, training=True, inplace=False):
    if inplace or training:
        raise NotRecorded("a dropout in training mode or in place")
    return aten.dropout.default, (input, p, training)


def _linear(input, weight, bias=None):
    return aten.linear.default, (input, weight, bias)


#: torch functions (by name, as the mode sees them) -> (overload, arguments as exported)
CALLS = {"conv2d": _conv2d, "batch_norm": _batch_norm, "relu": _relu, "add": _add, "__add__": _add,
         "avg_pool2d": _avg_pool2d, "max_pool2d": _max_pool2d, "_max_pool2d": _max_pool2d, "cat": _cat,
         "pad": _pad, "_pad": _pad, "adaptive_avg_pool2d": _adaptive_avg_pool2d, "flatten": _flatten,
         "dropout": _dropout, "linear": _linear}
#: calls that make no tensor (shape questions): passed through
_QUESTIONS = {"dim", "size", "__get__"}


class _Recorder(TorchFunctionMode):
    """Each torch call run as it is and imported as the overload :data:`CALLS` maps it to."""

    def __init__(self, ctx: ImportContext, values: dict):
        super().__init__()
        self.ctx, self.values, self.keep, self.counts = ctx, values, [], {}

    def ir(self, v):
        if isinstance(v, torch.Tensor):
            if id(v) not in self.values:
                raise NotRecorded("a tensor made inside the forward pass")
            return self.values[id(v)]
        if isinstance(v, (list, tuple)):
            return type(v)(self.ir(x) for x in v)
        return v

    def put(self, target, args: tuple, out: torch.Tensor) -> None:
        self.keep.append(out)  # alive until the end: ids stay unique
        name = target._opname
        k = self.counts[name] = self.counts.get(name, -1) + 1
        self.values[id(out)] = self.ctx.call(target, self.ir(args), {}, type_of_tensor(out),
                                             name if not k else f"{name}_{k}")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _QUESTIONS and not isinstance(out, torch.Tensor):
            return out
        if not isinstance(out, torch.Tensor):
            raise NotRecorded(f"{name} returns {type(out).__name__}")
        if name == "__getitem__":
            self.slices(args[0], args[1], out)
        elif name in CALLS:
            try:
                target, exported = CALLS[name](*args, **kwargs)
            except TypeError as e:
                raise NotRecorded(f"{name}: {e}") from None
            self.put(target, exported, out)
        else:
            raise NotRecorded(f"{name} is not recorded")
        return out

    def slices(self, x: torch.Tensor, index, out: torch.Tensor) -> None:
        """``x[...]`` of plain slices: one ``aten.slice`` per axis that is not taken whole (the
        mode is off inside this handler, so the slices taken here are not recorded again)."""
        index = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(s, slice) for s in index):
            raise NotRecorded("indexing other than by slices")
        for dim, s in enumerate(index):
            if s == slice(None):
                continue
            part = x[(slice(None),) * dim + (s,)]
            self.put(aten.slice.Tensor, (x, dim, s.start or 0, _END if s.stop is None else s.stop, s.step or 1), part)
            x = part
        self.values[id(out)] = self.ir(x)
        self.keep.append(out)


def record_module(module: torch.nn.Module, inputs: tuple) -> tuple[Graph, Signature]:
    """The IR graph and signature ``torch.export`` and :func:`~.torch_import.import_program`
    give for ``module`` called on ``inputs`` (positional tensors; see the module docstring), or
    :class:`NotRecorded`."""
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise NotRecorded("an input that is not a tensor")
    ctx = ImportContext(HANDLERS)
    names = list(inspect.signature(module.forward).parameters)[:len(inputs)]
    if len(names) < len(inputs):
        raise NotRecorded("more inputs than the forward pass names")
    ctx.names.update(names)  # user inputs keep their names, as the exported program's do
    values: dict = {}
    for name, x in zip(names, inputs):
        ctx.names.discard(name)
        values[id(x)] = ctx.input(name, type_of_tensor(x))
    for key, t in [*module.named_parameters(), *module.named_buffers()]:
        values[id(t)] = Const(t.detach(), key)
    recorder = _Recorder(ctx, values)
    try:
        with torch.no_grad(), recorder:
            out = module(*inputs)
    except NotRecorded:
        raise
    except Exception as e:  # noqa: BLE001 (the export says what is wrong, as before)
        raise NotRecorded(f"the forward pass failed: {type(e).__name__}") from None
    if not isinstance(out, torch.Tensor) or id(out) not in values:
        raise NotRecorded("an output that is not one recorded tensor")
    graph = ctx.finish([values[id(out)]])
    in_spec = pytree.tree_flatten((tuple(inputs), {}))[1]
    return graph, Signature(in_spec, pytree.tree_flatten(out)[1], graph.input_names)
