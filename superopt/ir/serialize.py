"""JSON form of a graph: what the rule database stores and what files carry.

The format is versioned; loading re-infers every type, so a file that was edited by hand into
an ill-shaped graph is rejected with the node named. Weight data, when present, is stored as
base64 of the raw little-endian bytes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SerializationError, SuperoptError
from .graph import Graph, GraphBuilder, Ref
from .types import TensorType

__all__ = ["graph_to_json", "graph_from_json", "save_graph", "load_graph", "FORMAT", "VERSION"]

FORMAT = "superopt.graph"
VERSION = 1


def _attr_to_json(v):
    if isinstance(v, tuple):
        return [_attr_to_json(x) for x in v]
    if isinstance(v, TensorType):
        return [list(v.shape), v.dtype]
    return v


def graph_to_json(g: Graph, with_data: bool = True) -> dict[str, Any]:
    """A JSON-able dict; ``json.dumps`` of it is deterministic."""
    nodes = [{"op": n.op, "inputs": [list(r) for r in n.inputs],
              "attrs": {k: _attr_to_json(v) for k, v in n.attrs}} for n in g.nodes]
    doc = {"format": FORMAT, "version": VERSION, "nodes": nodes, "outputs": [list(r) for r in g.outputs]}
    if with_data and g.data:
        doc["data"] = {k: {"dtype": str(v.dtype), "shape": list(v.shape),
                           "b64": base64.b64encode(np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()).decode()}
                       for k, v in sorted(g.data.items())}
    return doc


def graph_from_json(doc: Any) -> Graph:
    """Rebuild a graph, re-inferring and checking every node."""
    try:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SerializationError("not a superopt graph (missing \"format\": \"superopt.graph\")")
        if doc.get("version") != VERSION:
            raise SerializationError(f"graph format version {doc.get('version')!r} is not supported (this superopt reads {VERSION})")
        data = {k: _decode(k, v) for k, v in doc.get("data", {}).items()}
        b = GraphBuilder()
        for i, n in enumerate(doc["nodes"]):
            ins = [Ref(*r) for r in n.get("inputs", [])]
            attrs = dict(n.get("attrs", {}))
            if n["op"] == "input":
                b.input(attrs["name"], attrs["shape"], attrs.get("dtype", "float32"))
            elif n["op"] == "weight":
                b.weight(attrs["name"], attrs["shape"], data.get(attrs["name"]), attrs.get("dtype", "float32"))
            else:
                b.add(n["op"], ins, attrs)
        return b.build([Ref(*r) for r in doc["outputs"]])
    except SuperoptError as e:
        if isinstance(e, SerializationError):
            raise
        raise SerializationError(f"invalid graph: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise SerializationError(f"corrupt graph JSON: {type(e).__name__}: {e}") from None


def _decode(name, v):
    arr = np.frombuffer(base64.b64decode(v["b64"]), dtype=np.dtype(v["dtype"]).newbyteorder("<"))
    return arr.astype(v["dtype"]).reshape(v["shape"])


def save_graph(g: Graph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(graph_to_json(g), sort_keys=True) + "\n")


def load_graph(path: str | Path) -> Graph:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SerializationError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SerializationError(f"{path} is not a text (JSON) file; give a graph written by `superopt import -o`") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SerializationError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    try:
        return graph_from_json(doc)
    except SerializationError as e:
        raise SerializationError(f"{path}: {e}") from None
