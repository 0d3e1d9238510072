"""The cost model: graph cost = sum of operator costs, in microseconds.

An operator's cost comes from a profile where it has an entry, else from the analytic
roofline of the device (scaled, when a profile is given, by the median measured/estimated
ratio of that operator in the profile, so measured and estimated costs stay comparable). Nodes computed from weights and constants alone cost nothing: they
are folded at compile time (:func:`constant_nodes` says which). Costs are cached by
``(op, attrs, input types)``, so pricing a rewritten graph only prices its new nodes.

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (1, 64, 56, 56)); w = b.weight("w", (64, 64, 3, 3))
>>> g = b.build([b.op("relu", b.op("conv2d", x, b.op("transpose", w, perm=(1, 0, 2, 3)), padding=(1, 1)))])
>>> m = CostModel("h100")
>>> sorted(constant_nodes(g))  # the weight and its transpose
[1, 2]
>>> round(m.graph_cost(g), 1)  # conv (0.5 us of memory traffic + 4 us launch) and relu
9.0
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..ir.graph import Graph, Node, Ref, make_node
from ..ir.types import TensorType
from .analytic import analytic_time, op_bytes
from .devices import get_device
from .profile import Profile

__all__ = ["CostModel", "constant_nodes", "is_constant_op"]

_CONSTANT_KINDS = ("constant",)


def is_constant_op(node: Node) -> bool:
    """A weight or a constant (identity matrix, ones...): known at compile time."""
    return node.op == "weight" or node.opdef.kind in _CONSTANT_KINDS


def constant_nodes(graph: Graph) -> set[int]:
    """Indices of nodes whose value depends only on weights and constants (opaque nodes never)."""
    out: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if is_constant_op(n) or (n.inputs and n.opdef.kind == "compute" and all(r.node in out for r in n.inputs)):
            out.add(i)
    return out


def _calibrate(profile: Profile, model: "CostModel") -> dict[str, float]:
    """Measured / analytic time, median per operator (and over all, under ``*``): operators the
    profile lacks are priced as the analytic estimate times this, so that measured and estimated
    costs stay comparable."""
    import statistics
    from ..errors import SuperoptError
    ratios: dict[str, list] = {}
    for e in profile.entries.values():
        ins = [TensorType(tuple(s), e.dtype) for s in e.inputs]
        try:
            outs = make_node(e.op, [Ref(0, 0)] * len(ins), ins, e.attrs).types
        except SuperoptError:
            continue
        est = model.analytic_us(e.op, e.attrs, ins, outs)
        t = e.eager_us if model.mode == "eager" or e.graph_us is None else e.graph_us
        if est > 0 and t > 0:
            ratios.setdefault(e.op, []).append(t / est)
    out = {op: statistics.median(v) for op, v in ratios.items()}
    if ratios:
        out["*"] = statistics.median(r for v in ratios.values() for r in v)
    return out


class CostModel:
    """Prices operators on one device (see the module docstring).

    ``mode`` ``eager`` uses a profile's eager times (launch included) and adds the launch
    overhead to analytic estimates; ``graph`` uses CUDA-graph times and no launch overhead.
    """

    def __init__(self, device: str = "h100", profile: Profile | None = None, mode: str = "eager"):
        if mode not in ("eager", "graph"):
            raise ValueError(f"mode must be 'eager' or 'graph', got {mode!r}")
        self.device = get_device(device)
        self.profile = profile
        self.mode = mode
        self.launch_s = 0.0 if mode == "graph" else self.device.launch_s
        if profile is not None and profile.launch_overhead_us is not None and mode == "eager":
            self.launch_s = profile.launch_overhead_us * 1e-6
        self._cache: dict = {}
        self.profile_hits = 0
        self.analytic_hits = 0
        self.calibration = _calibrate(profile, self) if profile is not None else {}

    def node_time(self, op: str, attrs: tuple, in_types: Sequence[TensorType], out_types: Sequence[TensorType]) -> float:
        """Microseconds for one application; ``attrs`` is a node's normalized attribute tuple."""
        key = (op, attrs, tuple(in_types))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._price(op, dict(attrs), in_types, out_types)
        return hit

    def _price(self, op: str, attrs: Mapping, ins, outs) -> float:
        if self.profile is not None:
            e = self.profile.lookup(op, attrs, ins)
            if e is not None:
                t = e.eager_us if self.mode == "eager" or e.graph_us is None else e.graph_us
                self.profile_hits += 1
                return float(t)
        self.analytic_hits += 1
        scale = self.calibration.get(op, self.calibration.get("*", 1.0))
        return scale * self.analytic_us(op, attrs, ins, outs)

    def analytic_us(self, op: str, attrs: Mapping, ins, outs) -> float:
        """The roofline estimate in microseconds (opaque operators: their memory traffic)."""
        if op == "opaque":
            return 1e6 * (op_bytes(op, attrs, ins, outs) / self.device.bandwidth + self.launch_s)
        return 1e6 * analytic_time(op, attrs, ins, outs, self.device, self.launch_s)

    def cost_of(self, graph: Graph, i: int) -> float:
        n = graph.nodes[i]
        return self.node_time(n.op, n.attrs, [graph.type_of(r) for r in n.inputs], n.types)

    def graph_cost(self, graph: Graph) -> float:
        """Sum of the costs of the operators that run (sources and folded nodes excluded)."""
        const, live = constant_nodes(graph), graph.live()
        return sum(self.cost_of(graph, i) for i in graph.compute_nodes() if i not in const and i in live)

    def breakdown(self, graph: Graph) -> dict[str, tuple[int, float]]:
        """Per operator: (count, total microseconds) of the nodes that run."""
        const, live = constant_nodes(graph), graph.live()
        out: dict[str, list] = {}
        for i in graph.compute_nodes():
            if i in const or i not in live:
                continue
            acc = out.setdefault(graph.nodes[i].op, [0, 0.0])
            acc[0] += 1
            acc[1] += self.cost_of(graph, i)
        return {k: (c, t) for k, (c, t) in sorted(out.items())}
