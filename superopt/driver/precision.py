"""A half-precision program seen as its float32 form, so that every door sees one graph.

Rules are proven at float32 and kernels are measured for the graph a float32 model imports as.
A model exported in bf16 (as users export an LLM) names its precision in its graph: Hugging
Face's RMSNorm upcasts to float32 and casts back (``.to(torch.bfloat16)``), and those casts cut
the kernel regions differently from the float32 model's, so no measured kernel matched them
(Llama-3-8B decode b16 exported in bf16: 2.45x through ``superopt optimize`` against 2.80x
through the backend, which already imported the float32 form). :func:`as_float32` rewrites a
graph module's half-precision dtypes to float32; :func:`float32_form` exports and imports that
module, the graph a float32 export of the same model gives, and keeps it only where the code
generated from it at the program's precision (:func:`~superopt.codegen.half.at_precision`) gives the original's output dtypes and
shapes (:func:`runs_at_precision`): a value float32 by construction (a rotary table computed
from integer positions) meets half-precision values where the original cast it back, which the
float32 form no longer says, unless the code casts it back as the program did; and an output the
program upcast (``logits.float()``) is returned in the program's dtype (the signature's
``out_dtypes``). The written program is that code.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from ..codegen import to_module
from ..codegen.half import at_precision
from ..errors import SuperoptError
from ..frontend import import_program
from ..frontend.torch_import import export_module
from ..ir.graph import Graph
from .outcheck import tensors_swapped

__all__ = ["as_float32", "float32_form", "code_at_precision", "output_types", "dtypes_of", "runs_at_precision", "HALF"]

#: half-precision dtypes a graph may name (``x.to(torch.bfloat16)``), and their methods
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
_HALF_METHODS = ("bfloat16", "half")


def as_float32(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` (in place) as the same model in float32 would be traced: every half-precision
    dtype it names is float32. A bf16 model written as Hugging Face writes it casts back to its
    input dtype after a float32 RMSNorm (``.to(torch.bfloat16)``); imported in float32, that cast
    is nothing, as in the import of the float32 model, so the search and the kernel pass see the
    graph a float32 export gives (the same kernel regions, the same model verdict)."""
    half = tuple(HALF.values())

    def f32(a):
        return torch.float32 if isinstance(a, torch.dtype) and a in half else a
    for node in gm.graph.nodes:
        node.args = torch.fx.node.map_aggregate(node.args, f32)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, f32)
        if node.op == "call_method" and node.target in _HALF_METHODS:
            node.target = "float"
    gm.recompile()
    return gm


def _float32_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with float32 copies of its floating weights: the program's own graph and
    weights stay as they are (its module shares them), and a weight a run of the program made a
    non-leaf (a cache written under autograd) is copied all the same."""
    def fresh(t):
        t = t.detach()
        return t.to(torch.float32, copy=True) if t.is_floating_point() else t.clone()
    memo: dict = {id(p): torch.nn.Parameter(fresh(p), requires_grad=False) for p in gm.parameters()}
    memo.update({id(b): fresh(b) for b in gm.buffers()})
    return copy.deepcopy(gm, memo)


@contextlib.contextmanager
def _quiet():
    """Where the float32 form's code fails on fake inputs, torch logs the failed operator's
    traceback and a graph module prints its code: the report says why in one line instead."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        log.setLevel(level)


def _float32(x):
    return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def float32_form(program: torch.export.ExportedProgram, args: tuple, kwargs: dict, half: str,
                 source: str) -> tuple[Graph, object, str]:
    """(graph, signature, "") of ``program`` (exported at ``half``, called as ``args``/``kwargs``)
    in its float32 form, or (None, None, why) where that form does not run at ``half`` as the
    program does, or cannot be exported."""
    original = program.module()
    try:
        gm = as_float32(_float32_copy(original))
        ep = export_module(gm, pytree.tree_map(_float32, tuple(args)), pytree.tree_map(_float32, dict(kwargs)))
        graph, _, sig = import_program(ep, source=source)
        want = output_types(original, args, kwargs)
        sig = dataclasses.replace(sig, out_dtypes=dtypes_of(want))
    except (SuperoptError, RuntimeError, TypeError, ValueError) as e:
        return None, None, f"its float32 form does not import ({str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__})"
    code, why = code_at_precision(to_module(graph, sig), HALF[half], args, kwargs)
    why = why or runs_at_precision(code, args, kwargs, want)
    return (graph, sig, "") if not why else (None, None, f"its float32 form does not run at {half}: {why}")


def code_at_precision(module: torch.nn.Module, dtype: torch.dtype, args, kwargs: dict | None = None,
                      outputs: tuple | None = None) -> tuple[torch.nn.Module | None, str]:
    """(:func:`~superopt.codegen.half.at_precision` of ``module``, "") or (None, why) where its code
    fails on fake inputs at ``dtype`` (a view of a half tensor's bits: the float32 form changes its
    shape)."""
    try:
        with _quiet():
            return at_precision(module, dtype, args, kwargs, outputs), ""
    except Exception as e:  # torch raises many kinds where the code meets a dtype or shape it cannot take
        return None, _why(e)


def dtypes_of(types: tuple) -> tuple:
    """The dtypes of :func:`output_types` (None: not a tensor), a signature's ``out_dtypes``."""
    return tuple(t[0] if t is not None else None for t in types)


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}" if str(e).strip() else type(e).__name__


def _fake_outputs(module, args, kwargs: dict) -> list:
    """The output leaves ``module`` returns on fake copies of the inputs, its parameters and its
    buffers (no data read or written: a program that updates a buffer in place, a cache or a
    running average, wrote into the real one under the fake mode, and the program written back
    unchanged then started from another state; found by ``scripts/fuzz.py --dtype bf16``)."""
    # no autograd: a program writing into its buffers (a cache) would leave them non-leaf tensors
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode, _quiet():
        fake = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        a, k = pytree.tree_map(fake, (tuple(args), dict(kwargs)))
        if not isinstance(module, torch.nn.Module):
            return pytree.tree_leaves(module(*a, **k))
        with tensors_swapped(module, fake):
            return pytree.tree_leaves(module(*a, **k))


def output_types(module, args, kwargs: dict | None = None) -> tuple:
    """The (dtype, shape) of each output leaf of ``module`` called as ``args``/``kwargs`` (None:
    not a tensor), found on fake inputs; raises where the module fails on them."""
    return tuple((t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else None
                 for t in _fake_outputs(module, args, kwargs or {}))


def runs_at_precision(module: torch.nn.Module, args, kwargs: dict | None, want: tuple) -> str:
    """Why ``module`` does not do at the inputs' precision what the original does, or "" where it
    does: it runs on fake copies of the inputs, and its outputs must have the dtypes and shapes
    ``want`` (the original's :func:`output_types`). A value float32 by construction (rotary
    tables computed from integer positions, as Hugging Face's models compute them) meets a bf16
    cache where the original cast it back with ``.to(x.dtype)``, which the float32 form dropped."""
    try:
        got = output_types(module, args, kwargs)
    except Exception as e:  # the module cannot run at this precision (a dtype mismatch)
        return _why(e)
    mine, ought = [t for t in got if t is not None], [t for t in want if t is not None]
    return "" if mine == ought else f"outputs {mine} where the original gives {ought}"
