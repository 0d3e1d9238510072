"""One entry point for every model source: ``import_model``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


from ..ir.graph import Graph
from .errors import ModelImportError
from .stats import ImportReport

__all__ = ["import_model", "FORMATS", "detect_format"]

#: file formats ``import_model`` reads
FORMATS = ("pt2", "onnx")


def detect_format(path: str | Path) -> str:
    """``pt2`` or ``onnx`` from the file name, else from the first bytes (a .pt2 is a zip)."""
    p = Path(path)
    if p.suffix.lower() in (".pt2", ".onnx"):
        return p.suffix.lower()[1:]
    if not p.is_file():
        raise ModelImportError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    with open(p, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        return "pt2"
    raise ModelImportError(f"{p}: cannot tell the model format from the name; pass --format pt2 or --format onnx")


def import_model(model, fmt: str | None = None, example_inputs: Sequence | None = None,
                 batch_size: int = 1) -> tuple[Graph, ImportReport]:
    """Import a model into the IR: a ``.pt2``/``.onnx`` path, an ``ExportedProgram``, or an
    ``nn.Module``/``GraphModule`` with ``example_inputs``. Returns the graph and a report.

    ``batch_size`` fills symbolic batch dimensions of ONNX inputs.
    """
    from .torch_import import from_exported_program, from_module, load_pt2
    if isinstance(model, (str, Path)):
        fmt = fmt or detect_format(model)
        if fmt == "pt2":
            return from_exported_program(load_pt2(model), str(model), "pt2")
        if fmt == "onnx":
            from .onnx_import import from_onnx
            return from_onnx(model, batch_size=batch_size)
        raise ModelImportError(f"unknown model format {fmt!r}; known: {', '.join(FORMATS)}")
    import torch  # here, not at the top: `superopt --help` must not wait for torch

    if isinstance(model, torch.export.ExportedProgram):
        return from_exported_program(model)
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ModelImportError("importing a module needs example_inputs (their shapes fix the graph's)")
        return from_module(model, example_inputs, type(model).__name__)
    raise ModelImportError(f"cannot import a {type(model).__name__}: give a .pt2/.onnx path, an ExportedProgram "
                           f"or an nn.Module with example inputs")
