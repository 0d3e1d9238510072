"""IR graph -> ``torch.export`` program and ``.pt2`` file; IR graph -> ONNX file.

``export_pt2`` writes a file that ``torch.export.load(path).module()`` runs anywhere torch
runs; it is what ``superopt optimize`` hands back to the user. The program is the one
``torch.export.export`` makes of the generated module, built without tracing where
:mod:`.aten` can (the zoo's CNNs). ``to_onnx`` uses torch's ONNX
exporter on the same GraphModule and needs the ``onnx`` extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import warnings
from pathlib import Path
from typing import Sequence

import torch

from ..errors import SuperoptError
from ..fileio import WriteError, atomic_path, check_writable
from ..frontend.signature import signature_module
from ..frontend.torch_import import fewer_recompiles
from ..ir.graph import Graph
from .aten import exported_program
from .half import at_precision
from .fx import CodegenError, _torch_dtype, to_fx

try:  # what torch.export.save runs (imported by it anyway): see no_canonical_self_test
    from torch._export.serde import serialize as _serde
except ImportError:
    _serde = None

__all__ = ["example_inputs", "to_module", "to_exported_program", "export_pt2", "save_program", "write_program",
           "no_canonical_self_test", "device_free", "to_onnx", "ONNX_OPSET"]

#: ONNX opset written by :func:`to_onnx` (17 has LayerNormalization)
ONNX_OPSET = 17


def example_inputs(g: Graph, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random tensors for the graph's inputs, in order: standard normal floats, zeros otherwise.

    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (2, 3))
    >>> [t.shape for t in example_inputs(b.build([b.op("relu", x)]))]
    [torch.Size([2, 3])]
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in g.inputs:
        ty = g.nodes[i].types[0]
        dt = _torch_dtype(ty.dtype)
        if dt.is_floating_point:
            out.append(torch.randn(ty.shape, generator=gen).to(dt))
        else:
            out.append(torch.zeros(ty.shape, dtype=dt))
    return tuple(out)


def _check_inputs(g: Graph, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    inputs = tuple(inputs)
    if len(inputs) != len(g.inputs):
        raise CodegenError(f"the graph has {len(g.inputs)} inputs ({', '.join(g.input_names)}), "
                           f"{len(inputs)} example inputs were given")
    for name, i, t in zip(g.input_names, g.inputs, inputs):
        ty = g.nodes[i].types[0]
        if tuple(t.shape) != ty.shape:
            raise CodegenError(f"example input {name} has shape {list(t.shape)}, the graph wants {ty!r}")
    return inputs


def to_module(g: Graph, signature=None, **fx) -> torch.nn.Module:
    """The graph as a torch module: :func:`to_fx` (inputs in the graph's order; ``fx``: its
    options), or, given the original program's :class:`~superopt.frontend.signature.Signature`,
    a module called exactly as the original (same positional and keyword inputs, bound to graph
    inputs by name, and the same output structure)."""
    gm = to_fx(g, **fx)
    if signature is None:
        return gm
    return signature_module(gm, signature, g.input_names)


def to_exported_program(g: Graph, inputs: Sequence[torch.Tensor] | None = None, signature=None,
                        kwargs: dict | None = None, dtype: torch.dtype | None = None,
                        **fx) -> torch.export.ExportedProgram:
    """``torch.export.export`` of :func:`to_module` at the graph's static shapes (its graph
    modules compiled only when run: :func:`~superopt.frontend.torch_import.fewer_recompiles`); with a
    ``signature``, ``inputs``/``kwargs`` are the original program's call (``fx``: the options
    of :func:`~superopt.codegen.fx.to_fx`). Where the module is one that
    :func:`~superopt.codegen.aten.exported_program` builds (a signature, positional tensors, the
    calls it knows: the zoo's CNNs), the same program is built from the graph without tracing
    (NASNet-A: 0.4 s of CPU against 0.9-1.4 s), else ``torch.export`` traces it. ``dtype``: the
    module's code run at that precision (:func:`~superopt.codegen.half.at_precision`: the float32
    form of a program exported in bf16, written back in bf16; ``inputs`` are then the program's own)."""
    if signature is None:
        inputs = example_inputs(g) if inputs is None else _check_inputs(g, inputs)
    if dtype is not None:
        module = at_precision(to_module(g, signature, **fx), dtype, inputs, kwargs)
    elif signature is not None and not kwargs:
        with fewer_recompiles():  # the generated module compiled only if run (where torch.export traces it)
            module = to_module(g, signature, **fx)
            ep = exported_program(module.flat, module, inputs, signature)
        if ep is not None:
            return ep
    else:  # traced as it is: a lazy module's forward would show torch.export no parameter names
        module = to_module(g, signature, **fx)
    try:
        with fewer_recompiles():
            return torch.export.export(module, tuple(inputs), kwargs or {})
    except Exception as e:  # torch raises many kinds; the first line says which node
        raise CodegenError(f"torch.export failed on the generated module: {str(e).strip().splitlines()[0]}") from None


def export_pt2(g: Graph, path: str | Path, inputs: Sequence[torch.Tensor] | None = None, signature=None,
               kwargs: dict | None = None) -> Path:
    """Write ``g`` as a ``.pt2`` file (``torch.export.save``), atomically; returns the path."""
    path = _writable(Path(path), ".pt2")
    ep = to_exported_program(g, inputs, signature, kwargs)
    save_program(ep, path)
    return path


def device_free(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` with the device dropped from its metadata asserts (in place).

    ``torch.export`` records an ``aten._assert_tensor_metadata`` (dtype, device, layout) for a
    ``.to(dtype)`` call, with the device the program was traced on: an HF-style model exported
    on the CPU (RMSNorm's float32 upcast) then fails on the GPU it was optimized for. The dtype
    and layout checks stay."""
    changed = False
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default \
                and node.kwargs.get("device") is not None:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
            changed = True
    if changed:
        ep.graph_module.recompile()
    return ep


def save_program(ep: torch.export.ExportedProgram, path: str | Path) -> None:
    """``torch.export.save`` straight into a temporary file next to ``path``, flushed to disk,
    then renamed over it: a full disk or an interrupt never leaves a truncated ``.pt2``. The
    program is made to run on any device (:func:`device_free`). The bytes are those
    ``torch.export.save`` writes to a file object (:func:`no_canonical_self_test`)."""
    with atomic_path(path) as tmp:
        write_program(ep, tmp, path)


def write_program(ep: torch.export.ExportedProgram, file: str | Path, path: str | Path | None = None) -> None:
    """What :func:`save_program` writes, written straight into ``file`` (no rename), flushed to
    disk: for a caller that keeps the file in its own temporary place (``path``: the name
    errors give)."""
    device_free(ep)
    _check_room(ep, file, path)
    with open(file, "wb") as f:
        try:
            with no_canonical_self_test(), warnings.catch_warnings():
                # torch takes a weight that is not contiguous (a channels-last convolution kernel,
                # alone in its storage) for a slice of a larger one and warns on each; its bytes
                # are saved whole and load back equal (the output check runs the loaded program)
                warnings.filterwarnings("ignore", message="No complete tensor found in the group")
                torch.export.save(ep, f)
        except RuntimeError as e:
            raise CodegenError(f"cannot serialize the program for {path or file}: "
                               f"{str(e).strip().splitlines()[0]}") from None
        f.flush()
        os.fsync(f.fileno())


def program_bytes(ep: torch.export.ExportedProgram) -> int:
    """The bytes of the program's weights, buffers and constants: most of what its ``.pt2`` holds."""
    seen, n = set(), 0
    for t in list(ep.state_dict.values()) + list(ep.constants.values()):
        if isinstance(t, torch.Tensor) and not t.is_meta:
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                n += key[1]
    return n


def _check_room(ep: torch.export.ExportedProgram, file: str | Path, path: str | Path | None) -> None:
    """A clear error where the disk cannot hold the program: torch's archive writer, when a write
    fails part way, raises and then aborts the process from its destructor (a C++ traceback, not an
    error message; seen with a full ``/tmp`` and a 1.7 GB Llama layer)."""
    need = program_bytes(ep) + (1 << 20)   # and the graph, its schema and the archive's records
    try:
        free = shutil.disk_usage(Path(file).resolve().parent).free
    except OSError:
        return
    if free < need:
        raise WriteError(f"cannot write {path or file}: the program needs about {need / 2**20:,.0f} MiB and "
                         f"{free / 2**20:,.0f} MiB are free there; nothing was written")


@contextlib.contextmanager
def no_canonical_self_test():
    """``torch.export.save`` without its test of the canonical form: the serializer
    canonicalizes a deep copy of the program it just serialized ("Test canonical form is well
    defined", ``torch/_export/serde/serialize.py``) and discards the result, so the bytes
    written are the same (``tests/test_codegen.py`` checks it); the deep copy was 40-50% of
    saving NASNet-A (2.4 -> 1.3 s). The function is put back after, and left as it is where a
    torch has none."""
    canonicalize = getattr(_serde, "canonicalize", None)
    if canonicalize is None:  # a torch without it: nothing to skip
        yield
        return
    _serde.canonicalize = _unchanged
    try:
        yield
    finally:
        _serde.canonicalize = canonicalize


def _unchanged(program, constants=None):
    """The program as given (stands in for ``canonicalize`` whose result the serializer discards)."""
    return program


def _writable(path: Path, suffix: str) -> Path:
    if path.suffix != suffix:
        raise CodegenError(f"{path}: the output name must end in {suffix}")
    check_writable(path)
    return path


def to_onnx(g: Graph, path: str | Path, inputs: Sequence[torch.Tensor] | None = None,
            opset: int = ONNX_OPSET) -> Path:
    """Write ``g`` as an ONNX model (needs ``pip install superopt[onnx]``); returns the path.

    Uses torch's TorchScript-based exporter, which needs only the ``onnx`` package (the newer
    ``dynamo=True`` exporter also needs ``onnxscript``). Opaque calls export as torch exports
    the operator they keep.
    """
    if importlib.util.find_spec("onnx") is None:
        raise CodegenError("ONNX export needs the onnx package: pip install superopt[onnx]")
    path = _writable(Path(path), ".onnx")
    inputs = example_inputs(g) if inputs is None else _check_inputs(g, inputs)
    gm = to_fx(g)
    outputs = [f"output_{k}" for k in range(len(g.outputs))]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with atomic_path(path) as tmp:
                torch.onnx.export(gm, inputs, str(tmp), dynamo=False, opset_version=opset,
                                  input_names=list(g.input_names), output_names=outputs)
    except OSError as e:
        raise CodegenError(f"cannot write {path}: {e.strerror or e}") from None
    except SuperoptError:
        raise
    except Exception as e:  # the exporter raises many kinds for operators it cannot write
        raise CodegenError(f"ONNX export failed: {str(e).strip().splitlines()[0]}") from None
    return path
