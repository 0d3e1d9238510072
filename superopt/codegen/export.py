"""IR graph -> ``torch.export`` program and ``.pt2`` file; IR graph -> ONNX file.

``export_pt2`` writes a file that ``torch.export.load(path).module()`` runs anywhere torch
runs; it is what ``superopt optimize`` hands back to the user. ``to_onnx`` uses torch's ONNX
exporter on the same GraphModule and needs the ``onnx`` extra.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Sequence

import torch

from ..ir.graph import Graph
from .fx import CodegenError, _torch_dtype, to_fx

__all__ = ["example_inputs", "to_exported_program", "export_pt2", "to_onnx", "ONNX_OPSET"]

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


def to_exported_program(g: Graph, inputs: Sequence[torch.Tensor] | None = None) -> torch.export.ExportedProgram:
    """``torch.export.export`` of :func:`to_fx` at the graph's static shapes."""
    inputs = example_inputs(g) if inputs is None else _check_inputs(g, inputs)
    gm = to_fx(g)
    try:
        return torch.export.export(gm, inputs)
    except Exception as e:  # torch raises many kinds; the first line says which node
        raise CodegenError(f"torch.export failed on the generated module: {str(e).strip().splitlines()[0]}") from None


def export_pt2(g: Graph, path: str | Path, inputs: Sequence[torch.Tensor] | None = None) -> Path:
    """Write ``g`` as a ``.pt2`` file (``torch.export.save``); returns the path."""
    path = _writable(Path(path), ".pt2")
    ep = to_exported_program(g, inputs)
    try:
        torch.export.save(ep, str(path))
    except (OSError, RuntimeError) as e:
        raise CodegenError(f"cannot write {path}: {e}") from None
    return path


def _writable(path: Path, suffix: str) -> Path:
    if path.suffix != suffix:
        raise CodegenError(f"{path}: the output name must end in {suffix}")
    if not path.parent.is_dir():
        raise CodegenError(f"cannot write {path}: the folder {path.parent} does not exist")
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
            torch.onnx.export(gm, inputs, str(path), dynamo=False, opset_version=opset,
                              input_names=list(g.input_names), output_names=outputs)
    except OSError as e:
        raise CodegenError(f"cannot write {path}: {e.strerror or e}") from None
    except Exception as e:  # the exporter raises many kinds for operators it cannot write
        raise CodegenError(f"ONNX export failed: {str(e).strip().splitlines()[0]}") from None
    return path
