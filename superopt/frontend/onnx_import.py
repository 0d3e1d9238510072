"""Importing ONNX models (needs the ``onnx`` extra: ``pip install superopt[onnx]``).

Each ONNX node is translated to the ATen call(s) computing the same thing
(:mod:`superopt.frontend.onnx_ops`) and handed to the same :class:`ImportContext` as torch
programs, so the mapping to IR operators, constant folding (shape arithmetic, ``Constant``,
``Shape``, weight transposes) and opaque nodes work the same way. An ONNX operator with no
translation becomes an opaque node ``onnx.<OpType>`` with its attributes: it is kept and
counted, but torch cannot run it (export of such a graph fails with a message naming it).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Mapping, Sequence

import torch

from ..ir.graph import Graph, Ref
from ..ir.types import TensorType
from .aten import HANDLERS
from .context import Const, ImportContext, Unsupported, dtype_name
from .errors import ModelImportError
from . import onnx_layout  # noqa: F401  (registers the layout translations)
from .onnx_ops import ONNX_OPS, OnnxNode, attributes, onnx_dtype
from .stats import ImportReport, make_report

__all__ = ["from_onnx", "load_onnx", "require_onnx"]


def require_onnx():
    """The ``onnx`` module, or a ModelImportError telling how to install it."""
    try:
        return importlib.import_module("onnx")
    except ImportError:
        raise ModelImportError("reading ONNX models needs the onnx package: pip install superopt[onnx]") from None


def load_onnx(path: str | Path):
    """Read and check an ONNX model file."""
    p = Path(path)
    if not p.is_file():
        raise ModelImportError(f"{p}: no such file" if not p.exists() else f"{p}: not a file")
    onnx = require_onnx()
    try:
        model = onnx.load(str(p))
    except Exception as e:  # protobuf raises DecodeError, onnx its own kinds
        raise ModelImportError(f"{p}: not an ONNX model ({type(e).__name__}); "
                               f"write it with torch.onnx.export") from None
    if model.ir_version <= 0 or not model.graph.node:
        raise ModelImportError(f"{p}: not an ONNX model (no graph nodes); write it with torch.onnx.export")
    try:  # the path form also checks models over 2 GB, whose weights live in other files
        onnx.checker.check_model(str(p))
    except Exception as e:  # ValidationError, or what a damaged file makes the checker raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelImportError(f"{p}: the ONNX checker refuses it ({first}); the file is damaged or not valid ONNX") from None
    return model


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _input_type(vi, shapes: Mapping[str, Sequence[int]], batch_size: int) -> TensorType:
    if vi.name in shapes:
        return TensorType(tuple(shapes[vi.name]), dtype_name(onnx_dtype(vi.type.tensor_type.elem_type)))
    dims = []
    for k, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif k == 0:
            dims.append(batch_size)
        else:
            raise ModelImportError(f"ONNX input {vi.name!r} has a symbolic dimension {d.dim_param or '?'} on axis {k}; "
                                   f"give its shape (input_shapes={{{vi.name!r}: (...)}})")
    return TensorType(tuple(dims), dtype_name(onnx_dtype(vi.type.tensor_type.elem_type)))


def _inferred_types(model, inputs: Mapping[str, TensorType]) -> dict[str, TensorType]:
    """ONNX shape inference at the chosen input shapes: types of values with no translation."""
    onnx = require_onnx()
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in inputs:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in inputs[vi.name].shape:
                dims.add().dim_value = d
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # inference is best effort: the values it could not type stay unknown
        return {}
    out = {}
    for vi in list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if tt.shape.dim and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = TensorType(tuple(d.dim_value for d in tt.shape.dim), dtype_name(onnx_dtype(tt.elem_type)))
    return out


def from_onnx(model_or_path, input_shapes: Mapping[str, Sequence[int]] | None = None,
              batch_size: int = 1) -> tuple[Graph, ImportReport]:
    """Import an ONNX model (a path or a loaded ``ModelProto``).

    Symbolic batch dimensions become ``batch_size``; other symbolic dimensions need
    ``input_shapes``.
    """
    start = time.perf_counter()
    source = str(model_or_path) if isinstance(model_or_path, (str, Path)) else "ONNX model"
    model = load_onnx(model_or_path) if isinstance(model_or_path, (str, Path)) else model_or_path
    onnx = require_onnx()
    ctx = ImportContext(HANDLERS)
    env: dict[str, object] = {}
    for init in model.graph.initializer:
        env[init.name] = Const(_initializer(onnx, init), init.name)
    types = {}
    for vi in model.graph.input:
        if vi.name not in env:
            types[vi.name] = _input_type(vi, input_shapes or {}, batch_size)
            env[vi.name] = ctx.input(vi.name, types[vi.name])
    opset = _opset(model)
    _Walker(ctx, model, types, opset).run(model.graph.node, env)
    missing = [o.name for o in model.graph.output if o.name not in env]
    if missing:
        raise ModelImportError(f"ONNX outputs {missing} are not computed by any node")
    graph = ctx.finish([env[o.name] for o in model.graph.output])
    return graph, make_report(graph, ctx, source, f"onnx (opset {opset})", time.perf_counter() - start)


def _initializer(onnx, init) -> torch.Tensor:
    try:
        return torch.from_numpy(onnx.numpy_helper.to_array(init).copy())
    except (TypeError, ValueError, KeyError) as e:  # what the onnx helper raises for damaged tensors
        raise ModelImportError(f"ONNX initializer {init.name!r} cannot be read ({e}); the model is damaged") from None


class _Walker:
    """Translates ONNX nodes in order; ``If`` on a constant condition inlines the branch taken."""

    def __init__(self, ctx: ImportContext, model, input_types, opset: int):
        self.ctx, self.model, self.input_types, self.opset = ctx, model, input_types, opset
        self.inferred: dict[str, TensorType] | None = None

    def run(self, nodes, env: dict) -> None:
        for node in nodes:
            missing = [i for i in node.input if i and i not in env]
            if missing:
                raise ModelImportError(f"ONNX node {node.name or node.output[0]!r} ({node.op_type}) reads {missing[0]!r}, "
                                       f"which nothing defines before it; the model is damaged or not sorted")
            ins = [env[i] if i else None for i in node.input]
            onode = OnnxNode(node.op_type, node.name or node.output[0], attributes(node), self.opset, len(node.output))
            outs = self.node(node, onode, ins, env)
            outs = list(outs) if isinstance(outs, (list, tuple)) and not isinstance(outs, Ref) else [outs]
            for name, v in zip(node.output, outs):
                if name:
                    env[name] = v

    def node(self, node, onode: OnnxNode, ins, env):
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "If" and isinstance(ins[0], Const):
            branch = onode.attrs["then_branch" if bool(ins[0].data.reshape(-1)[0]) else "else_branch"]
            self.ctx.folded += 1
            self.run(branch.node, env)
            return [env[o.name] for o in branch.output]
        fn = ONNX_OPS.get(node.op_type) if standard else None
        if fn is not None:
            try:
                return fn(self.ctx, onode, ins)
            except (Unsupported, TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, AttributeError,
                    RuntimeError) as e:
                # a damaged or hand-edited file: attributes of the wrong type or out of range
                raise ModelImportError(f"ONNX node {onode.name} ({node.op_type}): its attributes or inputs are "
                                       f"malformed ({type(e).__name__}: {e}); the model may be damaged") from None
        if self.inferred is None:
            self.inferred = _inferred_types(self.model, self.input_types)
        return _onnx_opaque(self.ctx, onode, ins, [self.inferred.get(o) for o in node.output])


def _onnx_opaque(ctx: ImportContext, node: OnnxNode, ins, types):
    if any(t is None for t in types):
        raise ModelImportError(f"ONNX node {node.name} ({node.op_type}) has no translation and ONNX shape "
                               f"inference cannot type its outputs")
    attrs = {k: v for k, v in node.attrs.items() if isinstance(v, (int, float, str, list))}
    out = ctx.opaque(f"onnx.{node.op_type}", [x for x in ins if x is not None], {"attrs": attrs},
                     types[0] if len(types) == 1 else tuple(types))
    return [out] if isinstance(out, Ref) else list(out)
