"""Which memory layout Inductor gives a graph's convolutions.

Inductor decides once per graph whether to run its convolutions in channels-last memory (its
"layout optimization", on by default). For inference it weighs each convolution's FLOPs by
how much channels-last changed such convolutions in its own benchmarks, by kind: grouped with
more than one input channel per group 1.358 (slower), small (at most 64 input and output
channels) 0.783, fewer output than half the input channels with a kernel wider than 1x1
0.725, any other 0.823, and goes channels-last when the weighted sum is at most the plain
one. A graph with no convolution, or with at least 300 nodes per convolution, stays as it is.
(Those are the rules and constants of ``GraphLowering.decide_layout_opt`` in torch 2.11-2.13.)

This matters to the cost model because one rewrite can flip the decision for the whole graph:
on NASNet-A in bf16 at batch 1, merging two convolutions into a grouped one added enough
"grouped" FLOPs to keep every convolution in the graph in NCHW, where cuDNN's bf16 kernels
transform their operands first (H100: 14 transform kernels, 0.9x the original's speed).
:class:`~superopt.cost.CostModel` prices a convolution at its channels-last time
(``nhwc_us`` in the profile) when this says Inductor will lay the graph out so.

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (1, 128, 16, 16))
>>> g = b.build([b.op("conv2d", x, b.weight("w", (128, 128, 3, 3)), padding=(1, 1))])
>>> inductor_channels_last(g)
True
>>> g = b.build([b.op("conv2d", x, b.weight("v", (128, 64, 3, 3)), padding=(1, 1), groups=2)])
>>> inductor_channels_last(g)  # grouped, 64 input channels per group: slower channels-last
False
"""

from __future__ import annotations

from ..ir.graph import Graph

__all__ = ["inductor_channels_last", "conv_kind", "CONV_OPS"]

#: the operators Inductor runs as a cuDNN convolution (``conv2d_bias``: F.conv2d with its bias)
CONV_OPS = ("conv2d", "conv2d_bias")

#: Inductor's measured channels-last time factor per kind of convolution (inference)
MULTIPLIER = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
NODES_PER_CONV = 300


def conv_kind(weight_shape: tuple, groups: int) -> str:
    """The kind Inductor's heuristic puts a convolution in (checked in this order)."""
    cout, cin = weight_shape[0], weight_shape[1]
    if groups > 1 and cin > 1:
        return "grouped"
    if cout <= 64 and cin <= 64:
        return "small"
    if cout * 2 <= cin and weight_shape[2] > 1:
        return "in_out"
    return "default"


def _flops(out_shape: tuple, weight_shape: tuple) -> int:
    n = 2
    for d in out_shape:
        n *= d
    for d in weight_shape[1:]:
        n *= d
    return n


def inductor_channels_last(graph: Graph, skip: frozenset[int] | set[int] = frozenset()) -> bool:
    """Whether Inductor runs ``graph``'s convolutions channels-last (module docstring);
    ``skip``: nodes folded at compile time (a convolution of weights alone never runs)."""
    convs = [i for i in graph.compute_nodes() if graph.nodes[i].op in CONV_OPS and i not in skip]
    if not convs or len(graph.nodes) >= NODES_PER_CONV * len(convs):
        return False
    plain = weighted = 0.0
    for i in convs:
        n = graph.nodes[i]
        w = graph.type_of(n.inputs[1]).shape
        if len(w) != 4:
            return False  # not a 2-d convolution Inductor's rule knows
        f = _flops(n.types[0].shape, w)
        plain += f
        weighted += f * MULTIPLIER[conv_kind(w, int(n.attr.get("groups", 1) or 1))]
    return weighted <= plain
