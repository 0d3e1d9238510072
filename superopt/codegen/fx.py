"""IR graph -> ``torch.fx.GraphModule``, the form every other export starts from.

The FX graph is built directly: a placeholder per graph input (same names, same order), a
``get_attr`` per weight at its first use (registered as a buffer of the module; constant
operators such as ``identity_conv`` are computed once here and registered the same way), a
bias or affine epilogue emitted with its matmul, convolution or layer norm as one call, and
attention written out op by op as one ``scaled_dot_product_attention`` (:mod:`.epilogue`: the
weights then stored in the layout that call takes), and for every other
node the operator's torch lowering (:data:`superopt.semantics.torch_lowering.LOWERING`)
called on FX proxies, so the lowering table stays the one source of what each operator
means. Proxies carry the IR's static types, so lowerings that read ``x.shape`` see numbers,
and operators with several outputs are unpacked through ``getitem``.

The module returns one tensor for a single-output graph and a tuple otherwise; it has no
Python control flow, runs on any device after ``.to(device)``, and ``torch.export.export``
takes it as it is.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.fx.proxy import GraphAppendingTracer, Proxy

try:  # torch.fx's lazy graph modules, where this torch has them
    from torch.fx._lazy_graph_module import _make_graph_module
except ImportError:
    _make_graph_module = torch.fx.GraphModule

from ..errors import SuperoptError
from ..ir.graph import Graph, Node, Ref
from ..ir.types import TensorType
from ..kernel import torch_op as _kernel_op  # registers torch.ops.superopt.kernel
from ..semantics.torch_lowering import LOWERING
from . import cudnn  # noqa: F401  (registers torch.ops.superopt.conv2d_relu)
from .epilogue import Fused, find_epilogues

__all__ = ["CodegenError", "to_fx", "weight_tensor"]


class CodegenError(SuperoptError):
    """A graph cannot be turned into torch code (a weight without data, an opaque call with no
    torch implementation, an unknown dtype)."""


class _TypedProxy(Proxy):
    """An FX proxy that knows the static type of the value it stands for (when it does)."""

    static_type: TensorType | None = None

    @property
    def shape(self):
        if self.static_type is None:
            return Proxy.__getattr__(self, "shape")
        return torch.Size(self.static_type.shape)

    def dim(self):
        if self.static_type is None:
            return Proxy.__getattr__(self, "dim")()
        return self.static_type.rank

    def size(self, dim=None):
        shape = self.shape
        return shape if dim is None else shape[dim]

    def __len__(self):
        return self.tracer.outputs_expected


class _Tracer(GraphAppendingTracer):
    """Records torch calls on proxies; iterating a result gives ``outputs_expected`` items."""

    outputs_expected = 1

    def proxy(self, node):
        return _TypedProxy(node, self)

    def iter(self, obj):
        return (obj[k] for k in range(self.outputs_expected))


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CodegenError(f"dtype {name!r} has no torch equivalent")
    return dt


def weight_tensor(g: Graph, node: Node) -> torch.Tensor:
    """The data of a weight node as a fresh torch tensor of the node's dtype."""
    data = g.data.get(node.name)
    if data is None:
        raise CodegenError(f"weight {node.name!r} has no data; only graphs whose weights are all known "
                           f"(imported models) can be exported")
    return _fresh(data).to(_torch_dtype(node.types[0].dtype))


def _fresh(data) -> torch.Tensor:
    """A contiguous copy of ``data`` as a torch tensor. Imported weights are often transposed views
    of the model's parameters (a linear's ``[out, in]`` read as ``[in, out]``); torch copies those
    2.5x faster than numpy (a 14336x4096 float32 transpose: 0.18 s against 0.47 s; writing the
    Llama-3-8B decode layer copies 0.9 GB of them)."""
    arr = np.asarray(data)
    try:
        with warnings.catch_warnings():   # a read-only view: torch warns of writes, and copies here anyway
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(arr).clone(memory_format=torch.contiguous_format)
    except (TypeError, ValueError, RuntimeError):   # negative strides, a dtype torch has no twin for
        return torch.from_numpy(np.array(arr, copy=True, order="C"))


class _Emitter:
    """Turns IR nodes into FX nodes one at a time (see the module docstring)."""

    def __init__(self, g: Graph, channels_last: bool = False, pin_layout: bool = False):
        self.g = g
        self.channels_last = channels_last  # the layout of cuDNN's fused calls
        self.pin_layout = pin_layout  # every convolution a superopt::conv2d call in that layout
        self.root = torch.nn.Module()
        self.fx = torch.fx.Graph()
        self.tracer = _Tracer(self.fx)
        self.attr_names: set[str] = set()
        self.alias: dict[int, _TypedProxy] = {}  # node -> the value a fused call gave it

    def typed(self, fx_node, ty: TensorType) -> _TypedProxy:
        p = _TypedProxy(fx_node, self.tracer)
        p.static_type = ty
        return p

    def buffer(self, name: str, tensor: torch.Tensor, ty: TensorType) -> _TypedProxy:
        attr, k = name, 0
        while attr in self.attr_names or hasattr(self.root, attr):
            k += 1
            attr = f"{name}_{k}"
        self.attr_names.add(attr)
        self.root.register_buffer(attr, tensor)
        return self.typed(self.fx.get_attr(attr), ty)

    def node(self, i: int, n: Node, ins: list) -> tuple:
        if n.op == "input":
            p = self.typed(self.fx.placeholder(n.name), n.types[0])
            if self.channels_last and n.types[0].rank == 4:  # traced in the layout the code runs in
                p = self.typed(p.contiguous(memory_format=torch.channels_last).node, n.types[0])
            return (p,)
        if n.op == "weight":
            t = weight_tensor(self.g, n)
            if self.channels_last and t.dim() == 4:  # convolution kernels, stored as the layout reads them
                t = t.contiguous(memory_format=torch.channels_last)
            return (self.buffer(_attr_name(n.name), t, n.types[0]),)
        if n.op == "kernel":
            return self.kernel(n, ins)
        if n.op in ("conv2d", "conv2d_bias") and self.pin_layout:
            bias = ins[2] if n.op == "conv2d_bias" else None
            return (self.typed(self.pinned_conv(ins[0], ins[1], bias, n.attr).node, n.types[0]),)
        fn = LOWERING.get(n.op)
        if fn is None:
            raise CodegenError(f"node %{i} ({n.op}) has no torch lowering")
        if n.opdef.kind == "constant":
            value = fn(n.attr).to(_torch_dtype(n.types[0].dtype))
            return (self.buffer(f"{n.op}_{i}", value, n.types[0]),)
        self.tracer.outputs_expected = len(n.types)
        try:
            out = fn(n.attr, *ins)
        except SuperoptError as e:
            raise CodegenError(f"node %{i} ({n.op}): {e}") from None
        outs = (out,) if len(n.types) == 1 else tuple(out)
        for p, ty in zip(outs, n.types):
            if not isinstance(p, Proxy):
                raise CodegenError(f"node %{i} ({n.op}): its lowering did not produce a traced value")
            p.static_type = ty if isinstance(p, _TypedProxy) else None
        return outs

    def pinned_conv(self, x, w, bias, a):
        """A convolution as one ``superopt::conv2d`` call in the chosen layout, then its
        activation (a ``conv2d`` node with ``activation='relu'``, as a rule fusing the ReLU
        makes it, still computes the ReLU: it was dropped here before)."""
        y = torch.ops.superopt.conv2d(x, w, bias, list(a["stride"]), list(a["padding"]), a["groups"],
                                      self.channels_last)
        return torch.relu(y) if a.get("activation", "none") == "relu" else y

    def kernel(self, n: Node, ins: list) -> tuple:
        """A fused-kernel node: one ``superopt::kernel`` call (:mod:`superopt.kernel.torch_op`)
        returning a list, unpacked per output."""
        a = n.attr
        self.tracer.outputs_expected = len(n.types)
        out = _kernel_op.kernel(list(ins), a["program"], a["config"], a["reference"])
        outs = tuple(self.typed(out[k].node, ty) for k, ty in enumerate(n.types))
        return outs

    def fused(self, f: Fused, ins_of, ty: TensorType) -> tuple:
        """One torch call for a node and its epilogue (see :mod:`.epilogue`); the weights go in
        the layout the call takes (a linear's matrix transposed, vectors flattened)."""
        F = torch.nn.functional

        def param(r: Ref | None, shape, transpose=False):
            if r is None:
                return None
            node = self.g.nodes[r.node]
            t = weight_tensor(self.g, node)
            t = (t.t() if transpose else t).contiguous().reshape(shape)
            return self.buffer(_attr_name(node.name), t, TensorType(tuple(shape), node.types[0].dtype))

        x = ins_of(f.x)
        if f.kind == "linear_pieces":  # one linear, its pieces given to the bias adds' users
            k, n = self.g.type_of(f.weight).shape
            dtype = self.g.nodes[f.weight.node].types[0].dtype
            bias = torch.cat([weight_tensor(self.g, self.g.nodes[b.node]).reshape(-1) for _, _, _, b in f.pieces])
            b = self.buffer(_attr_name(f"{self.g.nodes[f.weight.node].name}_bias"), bias, TensorType((n,), dtype))
            out = F.linear(x, param(f.weight, (n, k), transpose=True), b)
            for add, start, size, _ in f.pieces:
                piece = out.narrow(-1, start, size)
                piece.static_type = self.g.nodes[add].types[0]
                self.alias[add] = piece
            return ()
        if f.kind == "sdpa":
            k = ins_of(f.weight)
            k = k.transpose(-2, -1) if f.keys_transposed else k
            mask = None if f.mask is None else ins_of(f.mask)
            out = F.scaled_dot_product_attention(x, k, ins_of(f.bias), attn_mask=mask, scale=f.scale)
        elif f.kind == "linear":
            k, n = self.g.type_of(f.weight).shape
            out = F.linear(x, param(f.weight, (n, k), transpose=True), param(f.bias, (n,)))
        elif f.kind == "conv2d_relu":
            a = self.g.nodes[f.base].attr
            node = self.g.nodes[f.weight.node]
            if self.channels_last and node.op == "weight":  # stored as the call reads it
                w = self.buffer(_attr_name(node.name), weight_tensor(self.g, node).contiguous(
                    memory_format=torch.channels_last), node.types[0])
            else:
                w = ins_of(f.weight)
            b = None if f.bias is None else ins_of(f.bias).reshape(ty.shape[1])
            z = None if f.mask is None else ins_of(f.mask)
            out = torch.ops.superopt.conv2d_relu(x, w, b, z, list(a["stride"]), list(a["padding"]), a["groups"],
                                                 self.channels_last)
        elif f.kind == "conv2d":
            a = self.g.nodes[f.base].attr
            c = ty.shape[1]
            if self.pin_layout:
                out = self.pinned_conv(x, ins_of(f.weight), param(f.bias, (c,)), a)
            else:
                out = F.conv2d(x, ins_of(f.weight), param(f.bias, (c,)), a["stride"], a["padding"], 1, a["groups"])
        else:
            a = self.g.nodes[f.base].attr
            shape = ty.shape[len(ty.shape) - a["ndim"]:]
            out = F.layer_norm(x, shape, param(f.weight, shape), param(f.bias, shape), a["eps"])
        out.static_type = ty
        return (out,)


def _attr_name(name: str) -> str:
    s = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return s if s and not s[0].isdigit() else f"w_{s}"


def to_fx(g: Graph, attention: bool = True, conv_relu=None, channels_last: bool = False,
          pin_layout: bool = False) -> torch.fx.GraphModule:
    """A GraphModule computing ``g``: ``forward(*inputs)`` in the graph's input order.

    ``conv_relu``: convolution + ReLU chains (by their relu node, from
    :meth:`superopt.cost.CostModel.conv_relu_fusions`) emitted as one ``superopt::conv2d_relu``
    call each. ``channels_last``: 4-d inputs are made channels-last first and 4-d weights stored
    so (plain torch: the traced strides are the ones the code runs with). ``pin_layout``: every
    other convolution is a ``superopt::conv2d`` call in that layout too, so that Inductor's own
    layout rule (which looks only at ``aten.convolution``) cannot override the choice. Code with
    ``superopt::`` calls needs ``import superopt`` to run.

    ``attention``: emit attention written out op by op as one ``scaled_dot_product_attention``
    (a flash kernel in half precision); ``False`` keeps the ops (float32 on a GPU: H100, ViT-B/16
    at batch 1 ran 5% slower with the memory-efficient kernel than with the ops under Inductor).

    >>> from superopt.ir import GraphBuilder
    >>> import numpy as np
    >>> b = GraphBuilder(); x = b.input("x", (2, 3)); w = b.weight("w", data=np.ones((3, 4), np.float32))
    >>> gm = to_fx(b.build([b.op("relu", b.op("matmul", x, w))]))
    >>> gm(torch.ones(2, 3))
    tensor([[3., 3., 3., 3.],
            [3., 3., 3., 3.]])
    """
    em = _Emitter(g, channels_last, pin_layout)
    fused, folded = find_epilogues(g, attention, conv_relu)
    vals: list[tuple | None] = []

    def value(r: Ref):  # weights are emitted at their first use (a fused call may take them whole)
        if vals[r.node] is None:
            if g.nodes[r.node].op != "weight":  # internal invariant of find_epilogues
                raise AssertionError(f"node %{r.node} was folded into a fused call but is used elsewhere")
            vals[r.node] = em.node(r.node, g.nodes[r.node], [])
        return vals[r.node][r.index]

    for i, n in enumerate(g.nodes):
        if i in em.alias:
            vals.append((em.alias[i],))
        elif i in folded or n.op == "weight":
            vals.append(None)
        elif i in fused:
            vals.append(em.fused(fused[i], value, n.types[0]))
        else:
            vals.append(em.node(i, n, [value(r) for r in n.inputs]))
    outs = [value(r).node for r in g.outputs]
    em.fx.output(outs[0] if len(outs) == 1 else tuple(outs))
    em.fx.lint()
    # compiles its code (once; under fewer_recompiles, when first run)
    return _make_graph_module(em.root, em.fx, class_name="SuperoptModule")
