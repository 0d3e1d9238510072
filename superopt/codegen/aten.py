"""The written program built without tracing: :func:`to_fx`'s graph turned into the ATen-level
``ExportedProgram`` that ``torch.export.export`` makes of it, node for node.

``torch.export`` runs the generated module's forward under its pre-dispatch tracer (fake tensors,
proxies, a Python mode at every call): on NASNet-A's written program (1,159 nodes) 1.0-1.4 s of
CPU, the largest step after the search (built here: 0.35-0.46 s, the generated module included). The generated module is already a graph of torch calls,
one ATen operator each (a split: one operator and its ``getitem``\\ s), so the program is built
here from that graph: each call mapped to the overload the tracer records, with its arguments
as the dispatcher hands them over (trailing defaults left out), its fake value computed by the
operator's own fake implementation, and the metadata, names, signature and call graph
``torch.export`` gives (:data:`CALLS`; the tests compare the serialized bytes with
``torch.export.save`` of ``torch.export.export``'s program, model by model and operator by
operator).

Only graphs of the calls in :data:`CALLS`, with a program signature of tensors passed
positionally and no input updated in place, are built here; :func:`exported_program` returns
None for any other (``torch.export`` then traces it, as before). The program is checked as
before: ``superopt optimize`` runs the written program against the original.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec,
                                          TensorArgument)
from torch.fx.experimental.symbolic_shapes import ShapeEnv

try:  # torch.export's own helpers (private): a torch without them traces every program
    from torch._export.verifier import TrainingIRVerifier
    from torch.export._trace import _get_forward_arg_names
    from torch.fx.passes.shape_prop import _extract_tensor_metadata
except ImportError:
    TrainingIRVerifier = _get_forward_arg_names = _extract_tensor_metadata = None

from . import cudnn

__all__ = ["exported_program", "CALLS"]

aten = torch.ops.aten


def _ints(v) -> list:
    """An ``int[2]`` argument as the dispatcher hands it over: a list (one int repeated)."""
    return [v, v] if isinstance(v, int) else list(v)


def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return aten.avg_pool2d.default, (x, _ints(kernel_size), [] if stride is None else _ints(stride), _ints(padding),
                                     ceil_mode, count_include_pad, divisor_override), {}


def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    if return_indices:
        return None
    return aten.max_pool2d.default, (x, _ints(kernel_size), [] if stride is None else _ints(stride), _ints(padding),
                                     _ints(dilation), ceil_mode), {}


def _batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    # cudnn_enabled: False, as torch.export traces with the backends' flags off (_ignore_backend_decomps)
    return aten.batch_norm.default, (x, weight, bias, running_mean, running_var, training, momentum, eps, False), {}


def _split(x, sizes, dim=0):
    if isinstance(sizes, int):
        return None
    return aten.split_with_sizes.default, (x, list(sizes), dim), {}


def _reshape(x, *shape):
    shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
    return aten.reshape.default, (x, list(shape)), {}


def _tensors(op):
    def call(a, b):
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            return None
        return op, (a, b), {}
    return call


def _conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        return None
    return aten.conv2d.default, (x, weight, bias, _ints(stride), _ints(padding), _ints(dilation), groups), {}


def _contiguous(x, memory_format=torch.contiguous_format):
    kwargs = {} if memory_format == torch.contiguous_format else {"memory_format": memory_format}
    return aten.contiguous.default, (x,), kwargs


def _cat(tensors, dim=0):
    return aten.cat.default, (list(tensors), dim), {}


def _same(op):
    return lambda *args: (op, args, {})


def _custom(name: str):
    def call(*args):
        return getattr(torch.ops.superopt, name).default, args, {}
    return call


#: FX call target (the torch function :func:`~superopt.codegen.fx.to_fx` calls; a method by
#: name) -> its ATen call: ``(overload, args, kwargs)`` as the tracer records it, or None
#: where this form is not handled here
CALLS = {
    torch.add: _tensors(aten.add.Tensor),
    torch.mul: _tensors(aten.mul.Tensor),
    torch.relu: _same(aten.relu.default),
    torch.cat: _cat,
    F.linear: _same(aten.linear.default),
    F.conv2d: _conv2d,
    F.avg_pool2d: _avg_pool2d,
    F.max_pool2d: _max_pool2d,
    F.batch_norm: _batch_norm,
    torch.split: _split,
    "reshape": _reshape,
    "contiguous": _contiguous,
}


def _calls() -> dict:
    """:data:`CALLS` and superopt's own convolutions (:mod:`.cudnn`)."""
    ops = torch.ops.superopt
    return {**CALLS, ops.conv2d: _custom("conv2d"), ops.conv2d_relu: _custom("conv2d_relu")}


def _fakes() -> dict:
    """Overload -> the fake implementation the fake tensor mode would call for it: superopt's
    convolutions, whose call through the dispatcher (their autograd kernel, then the fake mode's
    cache) took 0.4 of 0.8 s of CPU building NASNet-A's program under cProfile."""
    return {torch.ops.superopt.conv2d.default: cudnn._conv2d_fake,
            torch.ops.superopt.conv2d_relu.default: cudnn._conv2d_relu_fake}


def _trim(op, args: tuple) -> tuple:
    """The positional arguments as the dispatcher hands them to a Python mode: up to the last
    that differs from its default."""
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    args = list(args)
    while args and len(args) <= len(positional):
        a = positional[len(args) - 1]
        if not a.has_default_value() or not _equal(args[-1], a.default_value):
            break
        args.pop()
    return tuple(args)


def _equal(value, default) -> bool:
    if isinstance(value, torch.fx.Node) or isinstance(default, torch.fx.Node):
        return False
    if isinstance(value, (list, tuple)) or isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)) and list(value) == list(default)
    return type(value) is type(default) and value == default


def exported_program(gm: torch.fx.GraphModule, module: torch.nn.Module, args: Sequence,
                     signature) -> ExportedProgram | None:
    """The program ``torch.export.export(module, tuple(args))`` makes, where ``module`` is
    :func:`~superopt.frontend.signature.signature_module` of ``gm`` (a graph of :func:`to_fx`)
    and ``signature`` its :class:`~superopt.frontend.signature.Signature`, built without
    tracing; None where a call, an input or an output is not one handled here."""
    args = tuple(args)
    if _get_forward_arg_names is None or signature is None or signature.mutated:
        return None
    if getattr(module, "flat", None) is not gm or not all(isinstance(a, torch.Tensor) for a in args) \
            or pytree.tree_flatten((args, {}))[1] != signature.in_spec:
        return None
    try:
        return _Builder(gm, module, args, signature).build()
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError):  # a call in a form not handled here
        return None  # torch.export traces it (and says what is wrong, if anything is)


class _Builder:
    """One program: the lifted buffers, the user inputs, then the calls in ``gm``'s order."""

    def __init__(self, gm, module, args, signature):
        self.gm, self.module, self.args, self.sig = gm, module, args, signature
        self.fake = FakeTensorMode(shape_env=ShapeEnv())
        self.calls, self.fakes = _calls(), _fakes()
        self.graph = torch.fx.Graph()
        self.counts: dict = {}  # torch function -> its calls so far (the tracer's torch_fn counter)
        self.items: dict = {}  # a split's node -> its getitem nodes
        cls = type(module)
        self.stack = {"L__self__": ("", f"{cls.__module__}.{cls.__qualname__}")}

    def placeholder(self, name: str, t: torch.Tensor):
        node = self.graph.placeholder(name)
        node.meta["val"] = val = self.fake.from_tensor(t, static_shapes=True)
        node.meta["tensor_meta"] = _extract_tensor_metadata(val)
        return node

    def build(self) -> ExportedProgram | None:
        buffers = dict(self.module.named_buffers())
        if len({t.untyped_storage().data_ptr() for t in buffers.values()}) < len(buffers):
            return None  # shared storage: torch.export lifts such buffers its own way
        specs, env, lifted = [], {}, {}
        for fqn, t in buffers.items():  # the module's state first, in its order, as torch.export lifts it
            lifted[fqn] = node = self.placeholder("b_" + fqn.replace(".", "_"), t)
            specs.append(InputSpec(InputKind.BUFFER, TensorArgument(node.name), fqn, True))
        names = _get_forward_arg_names(self.module, self.args, {})
        users = [self.placeholder(name, t) for name, t in zip(names, self.args)]
        specs += [InputSpec(InputKind.USER_INPUT, TensorArgument(u.name), None, None) for u in users]
        leaf = dict(zip(self.sig.names, users))
        order = iter(self.module.input_order)
        outs = None
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = leaf[next(order)]
            elif n.op == "get_attr":
                env[n] = lifted.get(f"flat.{n.target}")
            elif n.op in ("call_function", "call_method"):
                env[n] = self.call(n, env)
            elif n.op == "output":
                outs = n.args[0]
            if env.get(n, True) is None:
                return None
        outs = [env[o] for o in (outs if isinstance(outs, (tuple, list)) else [outs])]
        if any(o.op == "placeholder" for o in outs) or len(set(outs)) < len(outs):
            return None  # an input or weight returned as it is, or one value twice: torch.export's own cases
        self.graph.output(tuple(outs))
        signature = ExportGraphSignature(specs, [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(o.name), None)
                                                 for o in outs])
        calls = [ModuleCallEntry("", ModuleCallSignature([], [], self.sig.in_spec, self.sig.out_spec,
                                                          forward_arg_names=names))]
        calls += [ModuleCallEntry(fqn, None) for fqn, _ in self.module.named_modules() if fqn]
        ep = ExportedProgram(root=torch.nn.Module(), graph=self.graph, graph_signature=signature,
                             state_dict=self.module.state_dict(keep_vars=True), range_constraints={},
                             module_call_graph=calls, example_inputs=(self.args, {}), constants={},
                             verifiers=[TrainingIRVerifier])
        ep.graph_module.meta["inline_constraints"] = {}  # as torch.export leaves it (no unbacked sizes)
        return ep

    def call(self, n, env):
        """The ATen node for one call of ``gm`` (None: not handled here)."""
        if n.op == "call_function" and n.target is operator.getitem:
            items = self.items.get(env[n.args[0]])
            return None if items is None else items[n.args[1]]
        fn = self.calls.get(n.target)
        made = None if fn is None else fn(*torch.fx.node.map_arg(n.args, env.__getitem__),
                                          **torch.fx.node.map_arg(n.kwargs, env.__getitem__))
        if made is None:
            return None
        op, args, kwargs = made
        args = _trim(op, args)
        func = getattr(torch.Tensor, n.target) if n.op == "call_method" else n.target
        self.counts[func] = self.counts.get(func, 0) + 1
        meta = {"nn_module_stack": self.stack,
                "torch_fn": (f"{func.__name__}_{self.counts[func]}", f"{type(func).__name__}.{func.__name__}")}
        with self.fake:
            val = self.fakes.get(op, op)(*torch.fx.node.map_arg(args, lambda x: x.meta["val"]),
                                         **torch.fx.node.map_arg(kwargs, lambda x: x.meta["val"]))
        node = self._node(op, (args, kwargs), self.graph._target_to_str(op.overloadpacket.__name__), meta, val)
        if not isinstance(val, torch.Tensor):  # a list: one getitem per item, made at once as the tracer does
            self.items[node] = [self._node(operator.getitem, ((node, k), {}), "getitem", meta, v)
                                for k, v in enumerate(val)]
        return node

    def _node(self, target, call, name: str, meta: dict, val):
        node = self.graph.create_node("call_function", target, call[0], call[1], name=name)
        node.meta.update({"nn_module_stack": dict(meta["nn_module_stack"]), "torch_fn": meta["torch_fn"], "val": val})
        if isinstance(val, torch.Tensor):
            node.meta["tensor_meta"] = _extract_tensor_metadata(val)
        return node
