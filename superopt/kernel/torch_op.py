"""``superopt::kernel``: one of superopt's fused kernels as a torch custom operator.

The call carries everything it needs as strings, so a saved ``.pt2`` is self-contained and
loading it needs only ``import superopt`` (which registers this operator when torch is
imported first; ``import superopt.kernel.torch_op`` registers it in any case):

- ``program``: the kernel program's text (:func:`superopt.kernel.parse_program` reads it);
- ``config``: its tile configuration as JSON (``""``: the program's first default config);
- ``reference``: the region graph the program was proven equal to, as graph JSON with its
  weights turned into inputs; the call's tensors are that graph's inputs, in order.

On a CUDA device (or on the CPU under ``TRITON_INTERPRET=1``) the program is compiled to Triton
once per (program, config) and launched; elsewhere, or without Triton, the reference graph runs
as plain torch ops, so an exported program runs anywhere torch does. The fake implementation
gives the outputs' shapes and dtypes from the reference graph, so dynamo, ``torch.export`` and
Inductor see one opaque call (an extern kernel to Inductor, captured in CUDA graphs like any
other launch).

>>> import torch
>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (2, 3)); w = b.input("w", (3, 4))
>>> ref = b.build([b.op("relu", b.op("matmul", x, w))])
>>> out = kernel([torch.ones(2, 3), torch.ones(3, 4)], "", "", reference_text(ref))
>>> out[0]
tensor([[3., 3., 3., 3.],
        [3., 3., 3., 3.]])
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Sequence

import numpy as np
import torch

from ..errors import SuperoptError
from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.serialize import graph_from_json
from ..semantics.torch_lowering import run as run_torch
from .compile import compile_program
from .program import parse_program
from .regions import reference_text
from .configs import default_configs
from .textform import to_text
from .tune import bake_constants, extra_inputs, parse_config

__all__ = ["kernel", "kernel_emitter", "op_program", "run_reference", "triton_available", "KernelCallError"]


class KernelCallError(SuperoptError):
    """A ``superopt::kernel`` call cannot run as given (inputs that do not match its reference)."""


def kernel_emitter(program: str, config: str, region: Graph, extras: dict | None = None, tag: str = "k",
                   names: dict | None = None, us: float = 0.0):
    """An ``emit`` for :func:`superopt.kernel.regions.replace_region`: one ``kernel`` node
    over the boundary values, the region's weights (the graph's own weight of that name, or
    ``names[name]`` for a canonical region, else added with their data) and ``extras``
    (name -> array, in the program's order of :func:`superopt.kernel.tune.extra_inputs`: new
    weights named ``{tag}_{name}``); ``us``: its measured time, which the cost model prices it at."""
    names = names or {}
    program, baked = _baked(program, region)
    text = reference_text(region, baked)
    out_types = [region.type_of(r) for r in region.outputs]
    program = op_program(program)

    def emit(b: GraphBuilder, ins: list) -> list:
        ws = []
        for i in region.weights:
            n = region.nodes[i]
            if n.name in baked:
                continue
            name = names.get(n.name, n.name)
            have = [j for j, m in enumerate(b.nodes) if m.name == name]
            ws.append(Ref(have[0], 0) if have else
                      b.weight(name, n.types[0].shape, region.data.get(n.name), n.types[0].dtype))
        ws += [b.weight(f"{tag}_{name}", arr.shape, arr, "float32") for name, arr in (extras or {}).items()]
        attrs = {"program": program, "config": config, "reference": text, "out_types": out_types, "us": float(us)}
        return list(b.add("kernel", list(ins) + ws, attrs))
    return emit


def _baked(program: str, region: Graph) -> tuple[str, frozenset]:
    """``program`` with the region's one-element weights of known data read as numbers
    (:func:`~superopt.kernel.tune.bake_constants`, each rounded to the dtype the program reads it
    in), and the names baked: the call then neither takes them nor makes Inductor fill them."""
    if not program:
        return program, frozenset()
    prog = parse_program(program.replace(_NEWLINE, "\n"))
    declared = {t.name: t for t in prog.inputs}
    values = {}
    for i in region.weights:
        n = region.nodes[i]
        t = declared.get(n.name)
        if t is not None and n.name in region.data and math.prod(n.types[0].shape) == 1:   # bake_constants checks t
            held = torch.tensor(float(np.asarray(region.data[n.name]).reshape(-1)[0]), dtype=getattr(torch, t.dtype))
            values[n.name] = float(held.float())
    baked_prog = bake_constants(prog, values)
    done = frozenset(values) - {t.name for t in baked_prog.inputs}
    return (to_text(baked_prog) if done else program), done


@functools.lru_cache(maxsize=256)
def _reference(text: str) -> Graph:
    return graph_from_json(json.loads(text))


def triton_available() -> bool:
    try:
        import triton  # noqa: F401  (optional: the kernels extra)
    except ImportError:
        return False
    return True


def _use_triton(xs: Sequence[torch.Tensor]) -> bool:
    if not triton_available():
        return False
    if xs and xs[0].is_cuda:
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _launcher(program: str, config: str):
    """The compiled program (cached per process; compile_program also caches its source). Never
    evicted: a split schedule's launcher owns its ticket counters, whose address a captured CUDA
    graph keeps; dropping the launcher would free memory the graph's replays still write (a
    bounded cache of 256 could, in a process with more kernels than that)."""
    prog = parse_program(program)
    cfg = parse_config(config) if config else default_configs(prog)[0]
    return prog, compile_program(prog, cfg)


def _triton(xs: Sequence[torch.Tensor], program: str, config: str, ref: Graph) -> list[torch.Tensor]:
    prog, launch = _launcher(program, config)
    by_name = dict(zip(ref.input_names, xs))
    extras = extra_inputs(prog, ref)
    if len(xs) != len(ref.inputs) + len(extras):
        raise KernelCallError(f"kernel {prog.name} reads {len(extras)} compile-time inputs ({', '.join(extras)}) "
                              f"after its {len(ref.inputs)} reference inputs; got {len(xs)} tensors in all")
    by_name.update(zip(extras, xs[len(ref.inputs):]))
    outs = launch(*(by_name[t.name] for t in prog.inputs))  # a program's tensors may be reshaped views
    return [o.reshape(ref.type_of(r).shape) for o, r in zip(outs, ref.outputs)]


def _fresh(out: torch.Tensor, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A custom op may not return an alias of an input."""
    out = out.contiguous()
    if any(out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in xs):
        out = out.clone()
    return out


def run_reference(xs: Sequence[torch.Tensor], ref: Graph) -> list[torch.Tensor]:
    """The reference graph as torch ops, in the inputs' dtype on their device."""
    env = dict(zip(ref.input_names, xs))
    dtype = xs[0].dtype if xs else torch.float32
    outs = run_torch(ref, env, device=xs[0].device if xs else "cpu", dtype=dtype)
    return [o.to(getattr(torch, t.dtype) if t.dtype != "float32" else dtype) for o, t in
            zip(outs, (ref.type_of(r) for r in ref.outputs))]


#: newlines of the program text as the call carries it: Inductor writes a call's arguments into
#: comments of the code it generates, and a line break there breaks that code
_NEWLINE = "|"


def op_program(text: str) -> str:
    """A program's text as the call's ``program`` argument (one line)."""
    if _NEWLINE in text:
        raise KernelCallError(f"a kernel program's text may not contain {_NEWLINE!r}")
    return text.strip("\n").replace("\n", _NEWLINE)


@torch.library.custom_op("superopt::kernel", mutates_args=())
def kernel(inputs: list[torch.Tensor], program: str, config: str, reference: str) -> list[torch.Tensor]:
    """Run one fused kernel (see the module docstring)."""
    ref = _reference(reference)
    if len(inputs) < len(ref.inputs):
        raise KernelCallError(f"superopt::kernel takes at least {len(ref.inputs)} tensors "
                              f"({', '.join(ref.input_names)}), got {len(inputs)}")
    program = program.replace(_NEWLINE, "\n")
    if program and _use_triton(inputs):
        outs = _triton(inputs, program, config, ref)
    else:  # the extra (compile-time) inputs are what the program reads instead of computing
        outs = run_reference(inputs[:len(ref.inputs)], ref)
    return [_fresh(o, inputs) for o in outs]


@kernel.register_fake
def _kernel_fake(inputs, program, config, reference):
    ref = _reference(reference)
    device = inputs[0].device if inputs else torch.device("cpu")
    dtype = inputs[0].dtype if inputs else torch.float32
    return [torch.empty(t.shape, dtype=dtype if t.dtype == "float32" else getattr(torch, t.dtype), device=device)
            for t in (ref.type_of(r) for r in ref.outputs)]
