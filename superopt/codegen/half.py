"""The code of a float32 graph run at half precision, as a half-precision program computes.

A program exported in bf16 is optimized as its float32 form (:mod:`superopt.driver.precision`),
and its code is written back in bf16: the module's weights cast. That alone is not the program:
a value float32 by construction (``positions.float()``, the float32 tables a rotary embedding
computes from them, a mask made with ``dtype=torch.float32``) was cast back by the program where
it met the activations (``cos.to(x.dtype)``), and the float32 form no longer says so; cast only,
the module promotes the queries to float32 there, or fails where attention or a cache write
wants one dtype. :func:`at_precision` puts those casts back: it runs the module on fake inputs
and, at every call whose floating tensor arguments mix float32 and the half dtype, casts the
float32 ones to the half dtype where a half argument depends on the inputs (an activation, a
cache: the program's ``.to(x.dtype)``), and otherwise leaves torch's promotion to float32 (a
weight meeting float32 positions: the program's ``inv_freq.float()``), casting the half
weights up where the call does not promote (a matmul); and it casts each output to the dtype
the program returned it in (``logits.float()``). The output check judges the result.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["at_precision"]


class _Inputs(Exception):
    """Raised by the pre-hook that records the flat module's inputs."""

    def __init__(self, args):
        super().__init__("inputs recorded")
        self.args = args


def _flat_inputs(module: torch.nn.Module, flat: torch.fx.GraphModule, args, kwargs, mode) -> tuple:
    """The fake values ``module`` passes to its flat graph module when called with ``args``."""
    if flat is module:
        return tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)

    def record(_mod, inputs):
        raise _Inputs(inputs)
    hook = flat.register_forward_pre_hook(record)
    fake = pytree.tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, (tuple(args), kwargs))
    try:
        module(*fake[0], **fake[1])
    except _Inputs as got:
        return tuple(got.args)
    finally:
        hook.remove()
    raise RuntimeError("the module never called its flat graph")


def _tensor_args(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _promotes(node: torch.fx.Node) -> bool:
    """Whether the call takes operands of different floating dtypes and promotes (elementwise)."""
    name = getattr(node.target, "__name__", str(node.target))
    return name in {"add", "sub", "mul", "div", "true_divide", "where", "maximum", "minimum", "pow", "__add__",
                    "__sub__", "__mul__", "__truediv__", "masked_fill"}


class _Casting(torch.fx.Interpreter):
    """Runs the flat module on fake values, inserting the casts (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, half: torch.dtype):
        super().__init__(gm, garbage_collect_values=False)   # (the outputs' values: :meth:`cast_outputs`)
        self.half, self.live, self.casts = half, set(), 0

    def run_node(self, n: torch.fx.Node):
        if n.op == "placeholder":
            self.live.add(n)
        elif n.op in ("call_function", "call_method", "call_module"):
            if any(a in self.live for a in n.all_input_nodes):
                self.live.add(n)
            self._cast_args(n)
        return super().run_node(n)

    def _cast_args(self, n: torch.fx.Node) -> None:
        args = [a for a in n.all_input_nodes if isinstance(self.env.get(a), (torch.Tensor, list, tuple))]
        floats = {a: {t.dtype for t in _tensor_args(self.env[a])} for a in args}
        wide = [a for a, d in floats.items() if d == {torch.float32}]
        narrow = [a for a, d in floats.items() if d == {self.half}]
        if not wide or not narrow:
            return
        if any(a in self.live for a in narrow):      # the program cast its float32 value back here
            self._cast(n, wide, self.half)
        elif not _promotes(n):                        # a half weight the program read in float32
            self._cast(n, narrow, torch.float32)

    def _cast(self, n: torch.fx.Node, which: list, dtype: torch.dtype) -> None:
        graph = self.module.graph
        for a in which:
            if not isinstance(self.env[a], torch.Tensor):
                continue   # a list of tensors (concatenation, a kernel call's inputs): left as it is
            with graph.inserting_before(n):
                c = graph.call_method("to", (a, dtype))
            n.replace_input_with(a, c)
            self.env[c] = self.env[a].to(dtype)
            if a in self.live:
                self.live.add(c)
            self.casts += 1

    def cast_outputs(self, dtypes: tuple) -> None:
        """Casts the graph's first outputs to ``dtypes`` where they are floating tensors of
        another floating dtype (the program's ``logits.float()``: the float32 form says nothing
        of it, and its matmul at half precision returns half)."""
        out = next(n for n in self.module.graph.nodes if n.op == "output")
        values = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        new = list(values)
        for k, (v, want) in enumerate(zip(values, dtypes)):
            got = self.env.get(v) if isinstance(v, torch.fx.Node) else None
            if not isinstance(got, torch.Tensor) or not got.is_floating_point() or want is None \
                    or not want.is_floating_point or got.dtype == want:
                continue
            with self.module.graph.inserting_before(out):
                new[k] = self.module.graph.call_method("to", (v, want))
            self.casts += 1
        if new != list(values):
            out.args = (type(out.args[0])(new) if isinstance(out.args[0], (tuple, list)) else new[0],)


def at_precision(module: torch.nn.Module, dtype: torch.dtype, args, kwargs: dict | None = None,
                 outputs: tuple | None = None) -> torch.nn.Module:
    """``module`` (the code of a float32 graph: a graph module, or one calling its graph module as
    ``module.flat``) with its floating weights cast to ``dtype`` and the casts of the module
    docstring put into its graph (in place; returned). ``args``/``kwargs``: an example call (its
    values are not read). ``outputs``: the program's output dtypes, in the order of the graph
    module's outputs (default: ``module.sig.out_dtypes``, where ``module`` calls its graph
    through a :class:`~superopt.frontend.signature.Signature`); each output of another floating
    dtype is cast to its own, as the program cast it."""
    if outputs is None:
        outputs = getattr(getattr(module, "sig", None), "out_dtypes", ())
    module = module.to(dtype)
    flat = getattr(module, "flat", module)
    if not isinstance(flat, torch.fx.GraphModule):
        return module
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        inputs = _flat_inputs(module, flat, args, kwargs or {}, mode)
        casting = _Casting(flat, dtype)
        casting.run(*inputs)
        casting.cast_outputs(tuple(outputs))
    if casting.casts:
        flat.graph.lint()
        flat.recompile()
    return module
