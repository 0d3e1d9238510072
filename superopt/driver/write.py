"""Writing what ``optimize`` chose: a ``.pt2`` called like the original (or an ``.onnx`` for
an ONNX model), loaded back and checked against the original before it is put in place.

The program written is the program checked: ``superopt optimize`` makes the chosen graph's
program once (built from the generated graph without tracing where
:mod:`superopt.codegen.aten` can, else by ``torch.export``: the same program) and runs that
program against the original (the whole-model output check, on the input sets asked for)
before the file is put in place; the pipeline's own check of the generated
module is left to the Python API and the backend, which write nothing.

The written program is what the ``torch.compile`` backend runs: the rewritten graph, its
convolutions' weights and 4-d inputs in channels-last memory where that layout was chosen
(plain torch), and cuDNN's fused convolution epilogues as ``superopt::conv2d_relu`` calls
(every other convolution a ``superopt::conv2d`` call where the layout chosen is not the one
Inductor's own rule would pick, so that a user's ``torch.compile`` keeps it), which ``import
superopt`` registers (``portable``: none of those, nothing but torch). Where nothing changed,
the model's own program is written back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..codegen import save_program, to_exported_program, to_fx, to_onnx, write_program
from ..codegen.export import device_free
from ..fileio import atomic_path
from ..frontend.onnx_import import from_onnx
from ..ir.graph import Graph
from .aside import Aside, AsideFailed
from .model import LoadedModel, no_stack_traces
from .options import DEFAULT_TOLERANCE
from .outcheck import OutputMismatch, check_outputs, make_input_sets
from .pipeline import Optimized, mismatch_error, named_inputs, whole_model_sets

__all__ = ["write_model", "write_onnx", "custom_ops", "CUSTOM_OPS"]

#: superopt's own operators a written program may call: cuDNN's fused epilogues (the plan's
#: ``conv_relu``) and superopt's kernels (``kernel`` nodes of the graph)
CUSTOM_OPS = {"conv_relu": "superopt::conv2d_relu", "conv": "superopt::conv2d", "kernel": "superopt::kernel"}


def custom_ops(result: Optimized) -> list[str]:
    """The superopt operators the written program calls (loading it needs ``import superopt``)."""
    ops = [CUSTOM_OPS["conv_relu"]] if result.plan.conv_relu else []
    convs = any(n.op in ("conv2d", "conv2d_bias") for n in result.graph.nodes)   # both pinned as superopt::conv2d
    ops += [CUSTOM_OPS["conv"]] if result.plan.pin_layout and convs else []
    return ops + ([CUSTOM_OPS["kernel"]] if any(n.op == "kernel" for n in result.graph.nodes) else [])


def write_model(result: Optimized, path: str | Path, tolerance: float = DEFAULT_TOLERANCE,
                input_sets: int = 1, before_check: Callable[[], None] | None = None,
                saved: Callable[[Path], bool] | None = None,
                save_beside: bool | Callable[[], bool] = False) -> Path:
    """Export ``result`` as ``.pt2`` (called like the original: same inputs, same output
    structure), run the exported program against the original on ``input_sets`` input sets
    (the whole-model output check: the program checked is the one written, exported once; on
    the examples alone where the region check covered the random sets), and only then put it
    at ``path`` (atomically: a failure leaves no file and never a truncated one). The file is
    saved beside ``path`` before the check and renamed after it: ``before_check`` (the region
    check done beside this, joined) runs in between. Where nothing changed the model's own
    program is written, unchecked (it is the original), since regenerated code of the same
    graph is no faster and can be slower (SqueezeNet b16, H100: 2% in eager and in a CUDA
    graph, the in-place ReLUs gone); ``saved(path)`` puts it there where it was saved already
    (beside the search), False where it was not. ``save_beside``: the save runs in a forked
    process while this one checks the program (:class:`_Saving`; a core is idle); a callable is
    asked once the program is exported and the module it checks built (whether a core is idle
    then: the region check beside may have answered meanwhile), before ``before_check``, whose
    work may still be running beside."""
    model, path = result.model, Path(path)
    result.report.custom_ops = [] if result.unchanged else custom_ops(result)
    if result.unchanged and model.has_program():
        if before_check is not None:
            before_check()
        if saved is None or not saved(path):
            save_program(model.own_program(), path)  # atomic
        return path
    ep = device_free(_export(result))  # the program as saved (its device asserts dropped)
    module = ep.module()
    with atomic_path(path) as tmp:
        saving = _Saving(ep, tmp, path, save_beside() if callable(save_beside) else save_beside)
        try:
            if before_check is not None:
                before_check()
            call = module if model.signature is not None else _positional(module, model.graph, result.graph)
            sets = make_input_sets(model.inputs, model.kwargs, whole_model_sets(result.report, input_sets))
            check = check_outputs(model.reference, call, sets, tolerance, model.memo, model.state)
            if isinstance(check, OutputMismatch):
                raise mismatch_error(model, result.result, check, tolerance,
                                     f"the exported program for {path} computes something else than the original")
            saving.wait()
            _record(result, check)
        finally:
            saving.cancel()
    return path


class _Saving:
    """The program's save into ``tmp``: here and now, or (``beside``) in a forked process while
    this one checks the program (Llama-3-8B decode: the 0.9 GB save beside the whole-model check's
    float64 run), waited for before the file is put in place. The program is made device-free
    before the fork, so that the program checked here is the one the child writes; where the
    child gives no answer the save runs here."""

    def __init__(self, ep, tmp: Path, path: Path, beside: bool):
        self.ep, self.tmp, self.path, self._job = ep, tmp, path, None
        if beside:
            device_free(ep)
            self._job = Aside(lambda: write_program(ep, tmp, path))
        else:
            save_program(ep, tmp)

    def wait(self) -> None:
        """The save done; its refusal (a program that cannot be serialized) raised."""
        if self._job is None:
            return
        job, self._job = self._job, None
        try:
            job.result()
        except AsideFailed:
            save_program(self.ep, self.tmp)  # here, as without a spare core

    def cancel(self) -> None:
        """End the save if it was not waited for (the check refused the program)."""
        if self._job is not None:
            self._job.cancel()
            self._job = None


def _export(result: Optimized):
    """The chosen graph as a ``torch.export`` program called like the original (the float32
    form of a half-precision program at that precision)."""
    model, fx = result.model, result.plan.fx_options()
    with no_stack_traces():
        if model.signature is not None:
            return to_exported_program(result.graph, model.inputs, model.signature, model.kwargs,
                                       dtype=model.half_dtype, **fx)
        named = dict(zip(model.graph.input_names, model.inputs))
        return to_exported_program(result.graph, [named[n] for n in result.graph.input_names], **fx)


def _record(result: Optimized, check) -> None:
    """The check's figures in the report (the worst of this and an earlier check of the same model)."""
    rep = result.report
    rep.output_check = {**rep.output_check, **{k: max(v, rep.output_check.get(k, 0.0)) for k, v in check.sets.items()}}
    rep.max_relative_error = max(check.worst, rep.max_relative_error or 0.0)


def _positional(module, original: Graph, best: Graph):
    order = original.input_names
    return lambda *args: module(*[dict(zip(order, args))[n] for n in best.input_names])


def write_onnx(result: Optimized, path: str | Path, tolerance: float = DEFAULT_TOLERANCE,
               input_sets: int = 1, before_check: Callable[[], None] | None = None) -> Path:
    """Write the chosen graph as ONNX (plain operators: no layout or library-call choice), import
    the file back and check it against the original on ``input_sets`` input sets (after
    ``before_check``), and only then put it at ``path``."""
    model: LoadedModel = result.model
    best, path = result.graph, Path(path)
    named = named_inputs(model, model.inputs, model.kwargs)
    with atomic_path(path) as tmp:
        to_onnx(best, tmp, [named[n] for n in best.input_names])
        back, _ = from_onnx(tmp)
        if before_check is not None:
            before_check()
        check = check_outputs(model.reference, _positional(to_fx(back), model.graph, back),
                              make_input_sets(model.inputs, model.kwargs, whole_model_sets(result.report, input_sets)),
                              tolerance, model.memo, model.state)
        if isinstance(check, OutputMismatch):
            raise mismatch_error(model, result.result, check, tolerance,
                                 f"the ONNX model written to {path} computes something else than the original")
        _record(result, check)
    return path
