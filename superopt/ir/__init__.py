"""superopt's intermediate representation: operators, types and graphs (see DESIGN.md)."""

from .types import TensorType, DTYPES
from .ops import Attr, OpDef, REGISTRY, get_op, register
from .graph import Graph, GraphBuilder, Node, Ref, make_node
from .hashing import canonicalize, named_hash, structural_hash
from .serialize import graph_from_json, graph_to_json, load_graph, save_graph
from .printing import to_text, to_expr
from .rule import Rule

__all__ = [
    "TensorType", "DTYPES", "Attr", "OpDef", "REGISTRY", "get_op", "register",
    "Graph", "GraphBuilder", "Node", "Ref", "make_node",
    "canonicalize", "named_hash", "structural_hash",
    "graph_from_json", "graph_to_json", "load_graph", "save_graph", "to_text", "to_expr", "Rule",
]
