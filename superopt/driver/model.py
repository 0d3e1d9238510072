"""Importing the model to optimize: a ``.pt2``, an ``.onnx`` or a zoo model, exported once,
with a torch callable computing the original and an example call.

Before any input is built the model's size is checked against memory: activations and weights
of a zoo model at the asked batch size are estimated from the model at batch 1, and a batch
that cannot fit is refused with the largest one that would.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.utils._pytree as pytree

from ..codegen import example_inputs, to_fx
from ..errors import ModelError, ResourceLimitError
from ..frontend import detect_format, import_program, load_pt2
from ..frontend.api import import_model
from ..frontend.torch_import import export_module
from ..frontend.trace_import import NotRecorded, record_module
from ..ir.graph import Graph
from ..models import build
from .outcheck import graph_bytes
from .precision import HALF, float32_form

__all__ = ["LoadedModel", "load_model", "program_dtype", "graph_bytes", "available_memory", "cgroup_headroom", "no_stack_traces"]


@dataclass
class LoadedModel:
    """A model to optimize: its graph, a torch callable computing the original, and an example
    call ``reference(*inputs, **kwargs)``; ``signature`` maps the call to the graph's inputs
    by name and rebuilds the output structure (None: positional inputs in graph order)."""

    name: str
    graph: Graph
    reference: Callable
    inputs: tuple
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the import's CPU seconds in this process
    kwargs: dict = field(default_factory=dict)
    signature: object = None
    format: str = "pt2"
    program: object = None  # the torch.export program as given (None for ONNX): written back when nothing changes
    memo: dict = field(default_factory=dict, repr=False)  # the original's outputs per input set (outcheck)
    export: Callable | None = field(default=None, repr=False)  # makes ``program`` where a second process made it
    #: "bf16"/"fp16": a program exported at that precision, whose graph is its float32 form
    #: (:mod:`~superopt.driver.precision`); the code written from it is cast back to it
    half: str | None = None
    imported_as: str = ""  # how a half-precision program was imported, and why (the report says it)

    @property
    def state(self) -> tuple[str, ...]:
        """The paths of the buffers the model updates in place (compared by the output check)."""
        return getattr(self.signature, "state_paths", ())

    @property
    def half_dtype(self) -> torch.dtype | None:
        """The torch dtype the written code is cast to (None: the graph's own types)."""
        return HALF[self.half] if self.half else None

    def has_program(self) -> bool:
        """Whether the model came as a ``torch.export`` program (written back when nothing changes)."""
        return self.program is not None or self.export is not None

    def own_program(self):
        """The model's own ``torch.export`` program: the one given, else (a zoo model exported
        in a second process, :class:`~superopt.driver.ahead.ExportedAhead`) exported here, once."""
        if self.program is None and self.export is not None:
            self.program = self.export()
        return self.program


def program_dtype(graph) -> str:
    """The precision a program runs at by its own types (``--dtype auto``): bf16 or fp16 where
    its floating inputs or weights are, else fp32 (a zoo model is built in float32: its
    precision is the user's ``--dtype``); a :class:`LoadedModel`: that of the program as given
    (its graph may be the float32 form of a bf16 program)."""
    if isinstance(graph, LoadedModel):
        return graph.half or program_dtype(graph.graph)
    dts = {graph.nodes[i].types[0].dtype for i in tuple(graph.inputs) + tuple(graph.weights)}
    for name, short in (("bfloat16", "bf16"), ("float16", "fp16")):
        if name in dts:
            return short
    return "fp32"


def load_model(path: str | None = None, zoo: str | None = None, batch_size: int = 1, seed: int = 0,
               specialize: bool = False, ahead=None) -> LoadedModel:
    """Import a ``.pt2``/``.onnx`` file or a zoo model (exactly one of ``path``, ``zoo``;
    ``ahead``: that zoo model being built already, a :class:`~superopt.driver.ahead.BuiltAhead`)."""
    if (path is None) == (zoo is None):
        raise ModelError("give a MODEL.pt2 / MODEL.onnx or --zoo NAME (exactly one)")
    t0, cpu = time.perf_counter(), time.process_time()
    with no_stack_traces():
        if zoo is not None:
            model = _load_zoo(zoo, batch_size, seed, ahead)
        elif _is_onnx(path):
            model = _load_onnx(path, batch_size, seed)
        else:
            model = _load_pt2(path, seed, specialize)
    _check_not_all_opaque(model.name, model.graph)
    model.seconds = time.perf_counter() - t0
    model.cpu_seconds = time.process_time() - cpu
    return model


@contextmanager
def no_stack_traces():
    """``torch.export`` without the Python stack trace of every traced operator (nothing here
    reads them, and symbolizing them took 20-25% of an export: NASNet-A 3.2 -> 2.6 s, BERT 1.15
    -> 0.89 s); the setting is put back after."""
    config = torch.fx.config
    before = getattr(config, "do_not_emit_stack_traces", None)
    if before is None:  # a torch without the setting
        yield
        return
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def available_memory() -> int:
    """Bytes this process may still allocate: the kernel's MemAvailable (Linux), else 8 GiB, and
    no more than is left under its cgroup's memory limit (in a container the kernel kills a
    process over that limit, with no message, where MemAvailable still shows the host's memory)."""
    free = 8 << 30
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    left = cgroup_headroom()
    return free if left is None else min(free, left)


def cgroup_headroom(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``; reclaimable page cache counted as free), None where there is no
    limit or none can be read."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        base = root if v2 else root / "memory"
        names = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        for d in (base / path.lstrip("/"), base):  # the process's own group, or a container's namespaced root
            try:
                limit, used = ((d / n).read_text().strip() for n in names)
                if limit == "max" or int(limit) >= 1 << 60:
                    return None
                stat = (d / "memory.stat").read_text() if (d / "memory.stat").exists() else ""
                cache = next((int(x.split()[1]) for x in stat.splitlines() if x.startswith("inactive_file ")), 0)
                return max(0, int(limit) - int(used) + cache)
            except (OSError, ValueError, IndexError):
                continue
    return None


#: the optimizer holds several copies of a run's values (reference, float64 copy, candidate)
_COPIES = 4


def _check_fits(zoo: str, batch_size: int, seed: int) -> None:
    """Refuse a batch whose activations (estimated at batch 1, times the batch) and weights do
    not fit the memory available, saying the largest batch that does."""
    if batch_size == 1:
        return
    weights, per_sample = _batch_one_bytes(zoo, seed)
    free = available_memory()
    need = _COPIES * per_sample * batch_size + 2 * weights
    if need > free:
        fits = max(0, (free - 2 * weights) // (_COPIES * max(per_sample, 1)))
        raise ResourceLimitError(f"--batch-size {batch_size}: {zoo} would need about {need / 2**30:.1f} GiB, "
                                 f"{free / 2**30:.1f} GiB are free; a batch of at most {fits} fits")


def _batch_one_bytes(zoo: str, seed: int) -> tuple[int, int]:
    """Bytes of the weights, and of the inputs and every intermediate value of one sample, from
    the model built on the meta device (sizes, no data: a Llama-3-8B layer's weights took 2.5-7 s
    to draw only to be counted), or for real where a model cannot run there."""
    for device in ("meta", "cpu"):
        try:
            with torch.device(device):
                module, inputs = build(zoo, batch_size=1, seed=seed)
            values = _forward_bytes(module, inputs)
            break
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            if device == "cpu":
                raise
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    return weights, values + sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))


def _forward_bytes(module: torch.nn.Module, inputs) -> int:
    """Bytes of every intermediate value of one forward pass (on the meta device: no data)."""
    total = 0

    def count(_mod, _args, out):
        nonlocal total
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    hooks = [m.register_forward_hook(count) for m in module.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return total


def _check_not_all_opaque(name: str, g: Graph) -> None:
    ops = [g.nodes[i].op for i in g.compute_nodes()]
    if ops and all(op == "opaque" for op in ops):
        raise ModelError(f"{name}: all {len(ops)} operators are opaque (unknown to superopt), so no rule can "
                         f"apply; nothing to optimize")
    if not ops:
        raise ModelError(f"{name}: the model computes nothing (no operators); nothing to optimize")


def _is_onnx(path) -> bool:
    suffix = Path(path).suffix.lower()
    return suffix == ".onnx" or (suffix != ".pt2" and detect_format(path) == "onnx")


def _load_zoo(zoo: str, batch_size: int, seed: int, ahead=None) -> LoadedModel:
    """The zoo model, recorded (:func:`~superopt.frontend.trace_import.record_module`: the graph
    the export gives, without it) where the recording maps every call, else exported and
    imported beside (``ahead``, :class:`~superopt.driver.ahead.ExportedAhead`) or here; where
    recorded or imported beside, its program is exported when asked for (``export``)."""
    if ahead is not None and ahead.key == (zoo, batch_size, seed):
        module, inputs = ahead.get()
    else:
        ahead = None
        _check_fits(zoo, batch_size, seed)
        module, inputs = build(zoo, batch_size=batch_size, seed=seed)
    try:
        done = record_module(module, tuple(inputs))
        if hasattr(ahead, "skip_graph"):
            ahead.skip_graph()
    except NotRecorded:
        done = ahead.imported() if hasattr(ahead, "imported") else None
    if done is not None:
        graph, sig = done
        return LoadedModel(zoo, graph, module, tuple(inputs), signature=sig,
                           export=lambda: _export_quietly(module, inputs))
    ep = export_module(module, inputs)
    graph, _, sig = import_program(ep, source=f"zoo:{zoo}")
    return LoadedModel(zoo, graph, module, tuple(inputs), signature=sig, program=ep)


def _export_quietly(module, inputs):
    with no_stack_traces():
        return export_module(module, inputs)


def _load_pt2(path: str, seed: int, specialize: bool) -> LoadedModel:
    """The program, imported; one exported at half precision as its float32 form where that form
    runs at the program's precision (:func:`~superopt.driver.precision.float32_form`: the graph
    a float32 export gives, whose rules and measured kernels every door uses), else as it is."""
    ep = load_pt2(path)
    graph, _, sig = import_program(ep, source=str(path), specialize=specialize)
    if ep.example_inputs is not None and _fits(graph, ep.example_inputs, sig.names):
        args, kwargs = ep.example_inputs
    else:
        drawn = dict(zip(graph.input_names, example_inputs(graph, seed)))
        args, kwargs = pytree.tree_unflatten([drawn[n] for n in sig.names], sig.in_spec)
    model = LoadedModel(_stem(path), graph, ep.module(), tuple(args), kwargs=dict(kwargs), signature=sig, program=ep)
    half = program_dtype(graph)
    if half in HALF:
        graph32, sig32, why = (None, None, "its sizes are dynamic") if _dynamic(ep) else \
            float32_form(ep, model.inputs, model.kwargs, half, str(path))
        if graph32 is not None:
            model.graph, model.signature, model.half = graph32, sig32, half
            model.imported_as = f"the float32 form of the {half} program (written back in {half})"
        else:
            model.imported_as = f"the {half} program as it is: {why}"
    return model


def _dynamic(ep) -> bool:
    """Whether the program has inputs of dynamic size (its float32 form would be exported at the
    example's sizes: only where the import specialized it already, which it did then)."""
    return any(isinstance(d, torch.SymInt) for n in ep.graph.nodes if n.op == "placeholder"
               for d in getattr(n.meta.get("val"), "shape", ()))


def _fits(graph: Graph, example, names) -> bool:
    """Whether the stored example inputs have the shapes of the graph's inputs ``names``."""
    shapes = [tuple(t.shape) for t in pytree.tree_leaves(example) if hasattr(t, "shape")]
    types = dict(zip(graph.input_names, (graph.nodes[i].types[0].shape for i in graph.inputs)))
    return shapes == [types[n] for n in names]


def _load_onnx(path: str, batch_size: int, seed: int) -> LoadedModel:
    """An ONNX model: the reference is the imported graph itself (superopt runs no ONNX runtime)."""
    graph, _ = import_model(path, "onnx", batch_size=batch_size)
    return LoadedModel(_stem(path), graph, to_fx(graph), example_inputs(graph, seed), format="onnx")


def _stem(path) -> str:
    name = Path(path).name
    for suffix in (".pt2", ".onnx"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return Path(path).stem
