"""The graph: superopt's one representation of a tensor program.

A :class:`Graph` is an immutable DAG. Its ``nodes`` are a tuple in topological order; each
:class:`Node` names its operator, its inputs as :class:`Ref` (node index, output index), its
normalized attributes, and its inferred output types. Graph inputs and weights are nodes too
(ops ``input`` and ``weight``, named by their ``name`` attribute); weight data, where known,
lives in ``Graph.data`` keyed by weight name. Operators with several outputs (split) have
several types, and a ``Ref`` picks one.

Graphs are values: a rewrite builds a new graph with a :class:`GraphBuilder` and never touches
the old one, so the search can keep thousands alive and share their unchanged nodes.

>>> b = GraphBuilder()
>>> x = b.input("x", (2, 4)); w = b.weight("w", (4, 4))
>>> y = b.op("relu", b.op("matmul", x, w))
>>> g = b.build([y])
>>> [n.op for n in g.nodes]
['input', 'weight', 'matmul', 'relu']
>>> g.type_of(g.outputs[0])
f32[2,4]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import GraphError, ShapeError, SuperoptError
from . import opdefs  # noqa: F401  (registers the operators)
from .ops import OpDef, canonical_attrs, get_op, normalize_attrs
from .types import TensorType

__all__ = ["Ref", "Node", "Graph", "GraphBuilder", "make_node"]


class Ref(NamedTuple):
    """One value of a graph: output ``index`` of node ``node``."""

    node: int
    index: int = 0

    def __repr__(self):
        return f"%{self.node}" + (f".{self.index}" if self.index else "")


@dataclass(frozen=True)
class Node:
    """One operator application: ``op`` on ``inputs`` with ``attrs``, giving values of ``types``."""

    op: str
    inputs: tuple[Ref, ...]
    attrs: tuple[tuple[str, Any], ...]
    types: tuple[TensorType, ...]

    @cached_property
    def attr(self) -> Mapping[str, Any]:
        return MappingProxyType(dict(self.attrs))

    @property
    def opdef(self) -> OpDef:
        return get_op(self.op)

    @property
    def name(self) -> str | None:
        """The name of an input or weight node, else None."""
        return self.attr.get("name") if self.op in ("input", "weight") else None


def make_node(op: str, inputs: Sequence[Ref], input_types: Sequence[TensorType], attrs: Mapping[str, Any],
              where: str = "") -> Node:
    """Check and type one node; errors name the operator and the input types."""
    opdef = get_op(op)
    try:
        opdef.check_arity(len(inputs))
        norm = canonical_attrs(opdef, normalize_attrs(opdef, dict(attrs)), input_types)
        types = tuple(opdef.infer(dict(norm), list(input_types)))
    except SuperoptError as e:
        shown = ", ".join(map(repr, input_types))
        raise type(e)(f"{where or op}: {e} (inputs: {shown or 'none'})") from None
    return Node(op, tuple(Ref(*r) for r in inputs), norm, types)


class Graph:
    """An immutable tensor program (see the module docstring)."""

    __slots__ = ("nodes", "outputs", "data", "__dict__")

    def __init__(self, nodes: Sequence[Node], outputs: Sequence[Ref], data: Mapping[str, np.ndarray] | None = None):
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.outputs: tuple[Ref, ...] = tuple(Ref(*r) for r in outputs)
        self.data: Mapping[str, np.ndarray] = MappingProxyType(dict(data or {}))
        self._check_refs()

    # ---- structure -------------------------------------------------------------------------
    def _check_refs(self):
        for i, n in enumerate(self.nodes):
            for r in n.inputs:
                if not (0 <= r.node < i and 0 <= r.index < len(self.nodes[r.node].types)):
                    raise GraphError(f"node %{i} ({n.op}) uses {r!r}, which is not an earlier value; "
                                     f"nodes must be in topological order")
        for r in self.outputs:
            if not (0 <= r.node < len(self.nodes) and 0 <= r.index < len(self.nodes[r.node].types)):
                raise GraphError(f"graph output {r!r} does not exist")

    def __len__(self):
        return len(self.nodes)

    def type_of(self, ref: Ref) -> TensorType:
        return self.nodes[ref.node].types[ref.index]

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        """Indices of the graph-input nodes, in node order."""
        return tuple(i for i, n in enumerate(self.nodes) if n.op == "input")

    @cached_property
    def weights(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.nodes) if n.op == "weight")

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.nodes[i].name for i in self.inputs)

    @cached_property
    def by_name(self) -> Mapping[str, int]:
        """Input and weight nodes by name."""
        return {n.name: i for i, n in enumerate(self.nodes) if n.name is not None}

    @cached_property
    def users(self) -> Mapping[Ref, tuple[tuple[int, int], ...]]:
        """For each used value, its users as ``(node index, argument position)`` pairs."""
        acc: dict[Ref, list] = {}
        for i, n in enumerate(self.nodes):
            for pos, r in enumerate(n.inputs):
                acc.setdefault(r, []).append((i, pos))
        return {r: tuple(v) for r, v in acc.items()}

    def compute_nodes(self) -> Iterable[int]:
        return (i for i, n in enumerate(self.nodes) if n.op not in ("input", "weight"))

    def live(self, keep_weights: bool = True) -> frozenset[int]:
        """Nodes that some output depends on (inputs always count, weights unless told not to)."""
        seen = set(self.inputs) | (set(self.weights) if keep_weights else set())
        stack = [r.node for r in self.outputs]
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(r.node for r in self.nodes[i].inputs)
        return frozenset(seen)

    def check(self) -> None:
        """Re-infer every node's types from scratch; raises naming the first bad node."""
        names = set()
        for i, n in enumerate(self.nodes):
            if n.name is not None:
                if n.name in names:
                    raise GraphError(f"node %{i}: the name {n.name!r} is used twice; inputs and weights need unique names")
                names.add(n.name)
            fresh = make_node(n.op, n.inputs, [self.type_of(r) for r in n.inputs], n.attr, where=f"node %{i} ({n.op})")
            if fresh.types != n.types:
                raise ShapeError(f"node %{i} ({n.op}) records types {n.types} but its inputs give {fresh.types}")
        for name, arr in self.data.items():
            i = self.by_name.get(name)
            if i is None or self.nodes[i].op != "weight":
                raise GraphError(f"data given for {name!r}, which is not a weight of the graph")
            if tuple(arr.shape) != self.nodes[i].types[0].shape:
                raise ShapeError(f"weight {name!r} is {self.nodes[i].types[0]!r} but its data has shape {list(arr.shape)}")

    # ---- derived graphs -------------------------------------------------------------------
    def subgraph(self, outputs: Sequence[Ref], boundary: Sequence[Ref] = ()) -> "Graph":
        """The graph computing ``outputs``; values in ``boundary`` become inputs ``b0, b1, ...``.

        Inputs and weights that the outputs need are kept under their own names.
        """
        b = GraphBuilder()
        mapping: dict[Ref, Ref] = {}
        for k, r in enumerate(boundary):
            mapping[Ref(*r)] = b.input(f"b{k}", self.type_of(r).shape, self.type_of(r).dtype)

        def visit(r: Ref) -> Ref:
            if r in mapping:
                return mapping[r]
            n = self.nodes[r.node]
            if n.op == "weight":
                res = b.weight(n.name, n.types[0].shape, self.data.get(n.name), n.types[0].dtype)
                out = (res,)
            else:
                out = b.add(n.op, [visit(x) for x in n.inputs], n.attr)
            for k, o in enumerate(out):
                mapping[Ref(r.node, k)] = o
            return mapping[r]

        return b.build([visit(Ref(*r)) for r in outputs])

    def with_outputs(self, outputs: Sequence[Ref]) -> "Graph":
        return Graph(self.nodes, outputs, self.data)

    def prune(self, keep_weights: bool = True) -> "Graph":
        """The same graph without nodes no output depends on (inputs stay; weights too, unless
        ``keep_weights`` is False, as after an import folded some of them away)."""
        live = self.live(keep_weights)
        if len(live) == len(self.nodes):
            return self
        b = GraphBuilder()
        remap = b.copy_nodes(self, sorted(live))
        return b.build([remap[r] for r in self.outputs])

    # ---- identity ---------------------------------------------------------------------------
    def key(self) -> str:
        """A hash of the graph that ignores node order but not input names (see ir.hashing)."""
        from .hashing import named_hash
        return named_hash(self)

    def __eq__(self, other):
        return isinstance(other, Graph) and self.key() == other.key() and self._same_data(other)

    def _same_data(self, other):
        return self.data.keys() == other.data.keys() and all(
            np.array_equal(v, other.data[k]) for k, v in self.data.items())

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        from .printing import to_text
        return to_text(self)


class GraphBuilder:
    """Builds a graph node by node, inferring types as it goes (the only way nodes are made)."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.data: dict[str, np.ndarray] = {}
        self._names: set[str] = set()

    def type_of(self, ref: Ref) -> TensorType:
        return self.nodes[ref.node].types[ref.index]

    def _source(self, op, name, shape, dtype) -> Ref:
        if name in self._names:
            raise GraphError(f"the name {name!r} is used twice; inputs and weights need unique names")
        self._names.add(name)
        return self.add(op, [], {"name": name, "shape": tuple(shape), "dtype": dtype})[0]

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Ref:
        return self._source("input", name, shape, dtype)

    def weight(self, name: str, shape: Sequence[int] | None = None, data=None, dtype: str = "float32") -> Ref:
        """A weight; with ``data`` (array-like) its shape may be left out."""
        if data is not None:
            data = np.asarray(data)
            shape = data.shape if shape is None else shape
            if tuple(data.shape) != tuple(shape):
                raise ShapeError(f"weight {name!r}: data has shape {list(data.shape)}, declared {list(shape)}")
            self.data[name] = data
        if shape is None:
            raise GraphError(f"weight {name!r} needs a shape or data")
        return self._source("weight", name, shape, dtype)

    def add(self, op: str, inputs: Sequence[Ref], attrs: Mapping[str, Any] | None = None) -> tuple[Ref, ...]:
        """Append a node; returns all its outputs."""
        for r in inputs:
            if not (0 <= r[0] < len(self.nodes) and 0 <= r[1] < len(self.nodes[r[0]].types)):
                raise GraphError(f"{op}: input {r!r} is not a value of this graph")
        node = make_node(op, inputs, [self.type_of(Ref(*r)) for r in inputs], attrs or {},
                         where=f"node %{len(self.nodes)} ({op})")
        self.nodes.append(node)
        i = len(self.nodes) - 1
        return tuple(Ref(i, k) for k in range(len(node.types)))

    def op(self, op: str, *inputs: Ref, **attrs) -> Ref | tuple[Ref, ...]:
        """Append a node; returns its output, or the tuple of outputs when there are several."""
        out = self.add(op, inputs, attrs)
        return out[0] if len(out) == 1 else out

    def append(self, node: Node, inputs: Sequence[Ref] = (), data=None) -> tuple[Ref, ...]:
        """Append a node made elsewhere and already checked for inputs of these types (a copied
        node, an extraction's memoized one) over ``inputs``; returns all its outputs. A source's
        name must be new here (as :meth:`input` and :meth:`weight` require), its ``data`` is kept."""
        if node.name is not None:
            if node.name in self._names:
                raise GraphError(f"the name {node.name!r} is used twice; inputs and weights need unique names")
            self._names.add(node.name)
            if data is not None:
                self.data[node.name] = data
        self.nodes.append(Node(node.op, tuple(inputs), node.attrs, node.types) if inputs or node.inputs else node)
        i = len(self.nodes) - 1
        return tuple(Ref(i, k) for k in range(len(node.types)))

    def copy_nodes(self, graph: Graph, indices: Iterable[int], remap: dict | None = None) -> dict[Ref, Ref]:
        """Copy nodes of another graph (in the given topological order) without re-inferring types."""
        remap = {} if remap is None else remap
        for i in indices:
            n = graph.nodes[i]
            out = self.append(n, [remap[r] for r in n.inputs], graph.data.get(n.name) if n.name is not None else None)
            remap.update({Ref(i, k): r for k, r in enumerate(out)})
        return remap

    def build(self, outputs: Sequence[Ref]) -> Graph:
        outs = [outputs] if isinstance(outputs, Ref) else outputs
        return Graph(self.nodes, outs, self.data)
