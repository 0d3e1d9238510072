"""Counting what a graph holds: operators, opaque calls, weights, FLOPs; and the import report.

FLOPs follow the zoo's convention (``superopt.models.count_flops``): 2 x the multiply-adds of
convolutions and matrix products; everything else, opaque calls included, counts zero.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..ir.graph import Graph

__all__ = ["flops", "op_counts", "opaque_counts", "num_parameters", "ImportReport", "make_report"]


def _node_macs(g: Graph, i: int) -> int:
    n = g.nodes[i]
    if n.op in ("conv2d", "conv2d_bias"):
        w = g.type_of(n.inputs[1]).shape
        return n.types[0].numel * w[1] * w[2] * w[3]
    if n.op == "matmul":
        return n.types[0].numel * g.type_of(n.inputs[0]).shape[-1]
    return 0


def flops(g: Graph) -> int:
    """2 x the multiply-adds of the graph's conv2d and matmul nodes.

    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (2, 3)); w = b.weight("w", (3, 4))
    >>> flops(b.build([b.op("matmul", x, w)]))  # 2 x (2*4 outputs x 3 products)
    48
    """
    return 2 * sum(_node_macs(g, i) for i in g.compute_nodes())


def op_counts(g: Graph) -> dict[str, int]:
    """How many nodes of each operator (inputs and weights left out), most frequent first."""
    return dict(Counter(g.nodes[i].op for i in g.compute_nodes()).most_common())


def opaque_counts(g: Graph) -> dict[str, int]:
    """Opaque nodes by call target, most frequent first."""
    return dict(Counter(g.nodes[i].attr["target"] for i in g.compute_nodes()
                        if g.nodes[i].op == "opaque").most_common())


def num_parameters(g: Graph) -> int:
    """Elements in all weights (parameters, buffers and folded constants)."""
    return sum(math.prod(g.nodes[i].types[0].shape) for i in g.weights)


@dataclass
class ImportReport:
    """What an import produced; ``to_table()`` for people, ``to_dict()`` for ``--json``."""

    source: str
    format: str
    inputs: dict[str, str]
    outputs: list[str]
    nodes: int
    operators: dict[str, int]
    opaque: dict[str, int]
    weights: int
    parameters: int
    flops: int
    folded: int
    dropped: int
    seconds: float
    declined: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_table(self) -> str:
        rows = [("source", f"{self.source} ({self.format})"),
                ("inputs", ", ".join(f"{k}: {v}" for k, v in self.inputs.items())),
                ("outputs", ", ".join(self.outputs)),
                ("operator nodes", f"{self.nodes}"),
                ("opaque nodes", f"{sum(self.opaque.values())}"),
                ("weights", f"{self.weights} tensors, {self.parameters:,} elements"),
                ("FLOPs", f"{self.flops:,} ({self.flops / 1e9:.3f} G, 2 x conv/matmul multiply-adds)"),
                ("folded at import", f"{self.folded} calls on constants"),
                ("dropped", f"{self.dropped} no-op calls (eval dropout, clone, same-dtype copy)"),
                ("import time", f"{self.seconds:.2f} s")]
        w = max(len(k) for k, _ in rows)
        lines = [f"{k:<{w}}  {v}" for k, v in rows]
        lines += ["", "operator        count"] + [f"{k:<15} {v:>5}" for k, v in self.operators.items()]
        if self.opaque:
            lines += ["", "opaque call                                count"]
            lines += [f"{k:<42} {v:>5}" for k, v in self.opaque.items()]
        if self.declined:
            lines += ["", "kept opaque because"] + [f"  {v} x {k}" for k, v in self.declined.items()]
        return "\n".join(lines)


def make_report(g: Graph, ctx, source: str, fmt: str, seconds: float) -> ImportReport:
    """The report of an import that built ``g`` with the import context ``ctx``."""
    return ImportReport(
        source=source, format=fmt,
        inputs={g.nodes[i].name: repr(g.nodes[i].types[0]) for i in g.inputs},
        outputs=[repr(g.type_of(r)) for r in g.outputs],
        nodes=sum(1 for _ in g.compute_nodes()), operators=op_counts(g), opaque=opaque_counts(g),
        weights=len(g.weights), parameters=num_parameters(g), flops=flops(g),
        folded=ctx.folded, dropped=ctx.dropped, seconds=round(seconds, 3), declined=dict(ctx.declined))
