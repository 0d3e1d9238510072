"""Importing torch programs: a ``.pt2`` file, an ``ExportedProgram``, an ``nn.Module`` or an FX
``GraphModule`` (the last two are exported with ``torch.export`` first).

Graph inputs are named after the program's user inputs, weights after the parameters,
buffers and constants they come from (dots become underscores); output order is kept.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import time
import zipfile
import zlib
from pathlib import Path
from typing import Sequence

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from ..ir.graph import Graph
from .aten import HANDLERS
from .context import Const, ImportContext, type_of_tensor
from .errors import ModelImportError
from .signature import Signature, StateBuffer, import_pytree_types
from .stats import ImportReport, make_report

try:  # torch.fx's lazy graph modules (Inductor's own setting): see fewer_recompiles
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
except ImportError:
    _use_lazy_graph_module = None

__all__ = ["load_pt2", "from_exported_program", "from_module", "prepare_program", "import_program", "mutated_inputs",
           "export_module", "fewer_recompiles"]


@contextlib.contextmanager
def _quiet_torch_export():
    """torch.export.load logs a traceback before raising; the CLI prints one line instead."""
    log = logging.getLogger("torch.export")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    """Load a file written by ``torch.export.save``, or raise ModelImportError saying what is wrong.
    The libraries of pytree types the program names (a Hugging Face ``ModelOutput``) are imported
    first when installed; the archive's checksums are checked so a damaged weight is refused."""
    p = Path(path)
    if not p.exists():
        raise ModelImportError(f"{p}: no such file")
    if not p.is_file():
        raise ModelImportError(f"{p}: not a file")
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
            bad = z.testzip()
            specs = "".join(z.read(n).decode("utf-8", "replace") for n in names
                            if n.endswith(".json") and "/models/" in f"/{n}")
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError, NotImplementedError) as e:
        raise ModelImportError(f"{p}: not a .pt2 archive or truncated ({e}); write it with torch.export.save "
                               f"or `superopt zoo export`") from None
    if bad is not None:
        raise ModelImportError(f"{p}: damaged archive (bad checksum in {bad}); export the model again")
    if not any(n.endswith("archive_format") for n in names):
        raise ModelImportError(f"{p}: a zip file but not a torch.export program (torch.save checkpoint?); "
                               f"export the model with torch.export.export and torch.export.save")
    unknown = import_pytree_types(specs)
    try:
        with _quiet_torch_export():
            return torch.export.load(str(p))
    except Exception as e:  # torch raises RuntimeError, KeyError, pickle errors... for damaged files
        if unknown:
            raise ModelImportError(f"{p}: the program takes or returns {', '.join(unknown)}, a type its library "
                                   f"registers with torch; install that library (it is not importable here)") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelImportError(f"{p}: cannot load the exported program ({first[:200]}); the file may be damaged "
                               f"or written by an incompatible torch") from None


def from_module(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                source: str = "module", kwargs: dict | None = None) -> tuple[Graph, ImportReport]:
    """Export an ``nn.Module`` or FX ``GraphModule`` at the shapes of ``example_inputs`` and import it."""
    return from_exported_program(export_module(module, example_inputs, kwargs), source)


def fewer_recompiles():
    """``torch.export`` with the graph modules it traces compiled to Python only when run.
    ``torch.export``'s passes regenerate and ``compile`` the Python code of the whole traced
    graph after each of them (placeholder names, runtime asserts, the autocast and grad-mode
    passes: 6-8 times an export), and nothing runs that code before the program is built;
    ``torch.compile`` traces the same way (``torch.fx._lazy_graph_module``). The graph, and so
    the program and the bytes saved, are the same (NASNet-A's export, CPU seconds: the model's
    2.0 -> 1.8, the written program's 1.3 -> 1.1). A no-op for a torch without it."""
    return contextlib.nullcontext() if _use_lazy_graph_module is None else _use_lazy_graph_module(True)


def export_module(module: torch.nn.Module, args: Sequence, kwargs: dict | None = None):
    """``torch.export.export`` (:func:`fewer_recompiles`) with its failures as ModelImportError."""
    try:
        with fewer_recompiles():
            return torch.export.export(module, tuple(args), kwargs or {})
    except Exception as e:  # export failures are many kinds of torch errors
        raise ModelImportError(f"torch.export.export failed: {str(e).strip().splitlines()[0][:300]}") from None


def _mutates(ep) -> bool:
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in ep.graph.nodes if n.op == "call_function")


def _dynamic(ep) -> list[str]:
    return [n.name for n in ep.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
            and any(isinstance(d, torch.SymInt) for d in n.meta["val"].shape)]


def _specialize(ep):
    """Re-export a program with dynamic shapes at its example sizes (or the sizes it was traced at)."""
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
    else:
        def concrete(node):
            v = node.meta["val"]
            shape = [d.node.hint if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
            if any(d is None for d in shape):
                raise ModelImportError(f"input {node.name} has a dynamic size with no example value; export the "
                                       f"model without dynamic_shapes")
            return torch.zeros(shape, dtype=v.dtype)
        users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        args, kwargs = pytree.tree_unflatten([concrete(nodes[u]) for u in users], ep.call_spec.in_spec)
    return export_module(ep.module(), args, kwargs)


def prepare_program(ep: torch.export.ExportedProgram, specialize: bool = False) -> torch.export.ExportedProgram:
    """The program as the importer wants it: functional (a training-IR program with in-place
    operators goes through ``run_decompositions``) and with static shapes (a program with
    dynamic shapes is refused, or re-exported at its example sizes when ``specialize``)."""
    dyn = _dynamic(ep)
    if dyn:
        if not specialize:
            raise ModelImportError(f"inputs {', '.join(dyn)} have dynamic sizes; superopt optimizes one static "
                                   f"shape: pass --specialize to use the example sizes, or export without "
                                   f"dynamic_shapes")
        ep = _specialize(ep)
    if _mutates(ep):
        try:
            ep = ep.run_decompositions({})
        except Exception as e:  # torch raises many kinds
            raise ModelImportError(f"cannot functionalize the program's in-place operators: "
                                   f"{str(e).strip().splitlines()[0][:200]}") from None
    return ep


def import_program(ep: torch.export.ExportedProgram, source: str = "exported program", fmt: str = "torch.export",
                   specialize: bool = False) -> tuple[Graph, ImportReport, Signature]:
    """Like :func:`from_exported_program`, also returning the program's :class:`Signature`."""
    ep = prepare_program(ep, specialize)
    graph, report = _import(ep, source, fmt)
    state = _state(ep)
    names = [n for n in graph.input_names if n not in {s.name for s in state}]
    return graph, report, Signature.of_program(ep, names, mutated_inputs(ep), state)


def from_exported_program(ep: torch.export.ExportedProgram, source: str = "exported program",
                          fmt: str = "torch.export", specialize: bool = False) -> tuple[Graph, ImportReport]:
    """Map an exported program to an IR graph; returns the graph and an import report.
    A program that updates inputs in place gets their new values as graph outputs after its
    own (:func:`import_program` also says which inputs they are).

    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> g, report = from_exported_program(torch.export.export(m, (torch.randn(2, 4),)))
    >>> [n.op for n in g.nodes]
    ['input', 'weight', 'matmul', 'weight', 'add', 'relu']
    >>> report.opaque
    {}
    """
    return _import(prepare_program(ep, specialize), source, fmt)


def _import(ep, source: str, fmt: str) -> tuple[Graph, ImportReport]:
    start = time.perf_counter()
    ctx = ImportContext(HANDLERS)
    env: dict[torch.fx.Node, object] = {}
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    for s in ep.graph_signature.input_specs:  # user inputs keep their names
        if s.kind == InputKind.USER_INPUT:
            ctx.names.add(s.arg.name)
    outputs = None
    state = {s.arg.name for s in _state_specs(ep)}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    for node in sorted(placeholders, key=lambda n: n.name in state):  # the state's inputs after the caller's
        spec = specs.get(node.name)                                   # (where a cache passed in is)
        env[node] = ctx.input(node.name, type_of_tensor(_data(ep, spec))) if node.name in state \
            else _placeholder(ctx, ep, spec, node)
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "call_function":
            env[node] = _call(ctx, node, env)
        elif node.op == "output":
            outputs = _outputs(ep, node, env)
        else:
            raise ModelImportError(f"node {node.name} ({node.op} {node.target}): control flow and submodules "
                                   f"are not supported; export a model without torch.cond/map")
    graph = ctx.finish(outputs)
    return graph, make_report(graph, ctx, source, fmt, time.perf_counter() - start)


def _placeholder(ctx: ImportContext, ep, spec, node):
    if spec is None:
        raise ModelImportError(f"placeholder {node.name} is not in the program's signature")
    if spec.kind == InputKind.USER_INPUT:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ModelImportError(f"input {node.name} is not a tensor ({type(val).__name__}); "
                                   f"superopt imports programs over tensors only")
        ctx.names.discard(node.name)
        return ctx.input(node.name, type_of_tensor(val))
    if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
        return Const(_data(ep, spec), spec.target)
    raise ModelImportError(f"input {node.name} of kind {spec.kind.name} is not supported")


def _data(ep, spec) -> torch.Tensor:
    table = ep.state_dict if spec.target in ep.state_dict else ep.constants
    if spec.target not in table:
        raise ModelImportError(f"{spec.kind.name.lower()} {spec.target} has no data in the program")
    return table[spec.target].detach()


#: buffers that only a model in training mode updates (batch norm's running statistics)
_TRAINING_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _state_specs(ep) -> list:
    """The input specs of the buffers the program updates in place."""
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    return [s for s in ep.graph_signature.input_specs if s.kind == InputKind.BUFFER and s.target in mutated]


def _state(ep) -> tuple[StateBuffer, ...]:
    """The buffers the program updates in place, as IR inputs the written module holds."""
    return tuple(StateBuffer(s.arg.name, s.target, _data(ep, s).clone()) for s in _state_specs(ep))


def _call(ctx: ImportContext, node, env):
    args = torch.fx.node.map_arg(node.args, env.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
    if node.target is operator.getitem:
        return args[0][args[1]]
    if not isinstance(node.target, torch._ops.OpOverload):
        raise ModelImportError(f"node {node.name} calls {node.target}, which is not an ATen operator; "
                               f"superopt imports torch.export programs of ATen operators")
    schema = node.target._schema
    if schema.is_mutable:
        raise ModelImportError(f"node {node.name} ({node.target}) updates a tensor in place; superopt imports "
                               f"inference programs: call model.eval() before torch.export.export")
    val = node.meta.get("val")
    if val is None and not schema.returns:
        ctx.dropped += 1  # runtime assertions
        return None
    expected = _expected(node, val)
    needed = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}  # read, not just unpacked
    return ctx.call(node.target, args, kwargs, expected, node.name, needed)


def _expected(node, val):
    if isinstance(val, torch.Tensor):
        return type_of_tensor(val)
    if isinstance(val, (list, tuple)):
        return type(val)(type_of_tensor(v) if isinstance(v, torch.Tensor) else None for v in val)
    raise ModelImportError(f"node {node.name} ({node.target}) has no tensor type recorded; "
                           f"superopt needs a program from torch.export with static shapes")


def _outputs(ep, node, env):
    """The graph's outputs: the program's own, then the new values of inputs and buffers it
    updates in place (:attr:`Signature.mutated`, read back by :func:`mutated_inputs`)."""
    outs, updates = [], []
    kept = (OutputKind.USER_OUTPUT, OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)
    for spec, arg in zip(ep.graph_signature.output_specs, node.args[0]):
        if spec.kind not in kept or (spec.kind == OutputKind.BUFFER_MUTATION
                                     and spec.target.rsplit(".", 1)[-1] in _TRAINING_BUFFERS):
            raise ModelImportError(f"the program updates {spec.target} in place ({spec.kind.name}), as a model in "
                                   f"training mode does; superopt imports inference programs: call model.eval() "
                                   f"before torch.export.export")
        v = env.get(arg) if isinstance(arg, torch.fx.Node) else arg
        if v is None or isinstance(v, (int, float, bool, str)):
            raise ModelImportError(f"output {arg} is not a tensor; superopt imports programs with tensor outputs")
        (outs if spec.kind == OutputKind.USER_OUTPUT else updates).append(v)
    return outs + updates


def mutated_inputs(ep) -> tuple[str, ...]:
    """The IR inputs a (functionalized) program updates in place, in its output order: user
    inputs (by name) and buffers (by their placeholder's name, the IR input of the buffer)."""
    buffers = {s.target: s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.BUFFER}
    return tuple(s.target if s.kind == OutputKind.USER_INPUT_MUTATION else buffers[s.target]
                 for s in ep.graph_signature.output_specs
                 if s.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION))
