"""Common-subexpression elimination: one node per distinct (operator, attributes, inputs).

Models often compute the same value twice (NASNet applies ``relu`` to one tensor in several
branches); merging the copies never costs more and lets rules see that the branches share an
input. Opaque nodes are left alone (their calls may not be pure).

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (2, 4))
>>> g = b.build([b.op("add", b.op("relu", x), b.op("relu", x))])
>>> [n.op for n in eliminate_common_subexpressions(g).nodes]
['input', 'relu', 'add']
"""

from __future__ import annotations

from ..ir.graph import Graph, GraphBuilder, Node, Ref

__all__ = ["eliminate_common_subexpressions"]


def eliminate_common_subexpressions(g: Graph) -> Graph:
    """``g`` with duplicate operators merged (commutative ones in either argument order)."""
    remap: dict[Ref, Ref] = {}
    seen: dict[tuple, int] = {}
    b = GraphBuilder()
    for i, n in enumerate(g.nodes):
        ins = tuple(remap[r] for r in n.inputs)
        key = None
        if n.name is None and n.opdef.kind != "opaque":
            args = tuple(sorted(ins)) if n.opdef.commutative else ins
            key = (n.op, n.attrs, args)
            if key in seen:
                remap.update({Ref(i, k): Ref(seen[key], k) for k in range(len(n.types))})
                continue
        if n.name is not None and n.name in g.data:
            b.data[n.name] = g.data[n.name]
        b.nodes.append(Node(n.op, ins, n.attrs, n.types))
        j = len(b.nodes) - 1
        if key is not None:
            seen[key] = j
        remap.update({Ref(i, k): Ref(j, k) for k in range(len(n.types))})
    if len(b.nodes) == len(g.nodes):
        return g
    return b.build([remap[r] for r in g.outputs])
