"""The output check on the rewritten regions: the graph the search started from and the graph
it extracted, compared where a rule changed how a value is computed, on random input sets
drawn at each region's boundary.

The saturation proves values equal by putting them in one e-class; every value of the
extracted graph whose class also holds a value of the original claims the two equal. A claim
made by the same operator with the same attributes on inputs of the same classes follows from
the claims below it; any other is a *region output*: its value in each graph is computed from
the nearest values below it whose classes both graphs hold (the region's *boundary*), and the
two are compared on values drawn for the boundary (the same draw for one class on both sides).
If every region output holds, every claim holds (by induction from the inputs), the model's
outputs among them. Each class stands for one value of the original (the first it computes):
two values of the original the search put in one class are not taken as equal (a region starts
from the one of them, and computes the other through). Values known at compile time (made from weights alone) are computed from
the real weights, never drawn (a folded weight is right for the real weights only), and integer
or boolean values come from the model's example inputs (token ids drawn at random could fall
out of range). The original side runs in float64 and float32, the rewritten side in float32,
compared as the whole-model check compares outputs (:func:`~superopt.driver.outcheck.output_error`).

Where a region output differs with its boundary drawn at random, the regions are run again from
the graph inputs (a rewrite may hold only for the values the model computes at its boundary);
what differs then is a rewrite that changes the model's values. A region is small, so it runs
on several input sets for a fraction of a run of the model; the one whole-model run on the
examples that follows is the safety net for the generated code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..cost.model import constant_nodes
from ..ir.graph import Graph, GraphBuilder, Ref
from ..semantics.torch_lowering import run as run_graph
from .outcheck import INPUT_SETS, output_error

__all__ = ["Regions", "rewritten_regions", "RegionCheck", "RegionMismatch", "check_regions", "check_rewrites"]

_FLOATS = ("float32", "float64", "float16", "bfloat16")


@dataclass
class Regions:
    """The region outputs (rewritten value, original value) and the graphs computing them from
    the boundary inputs ``b0, b1, ...`` (graph inputs of an integer type keep their names)."""

    pairs: list[tuple[Ref, Ref]]
    new: Graph | None = None
    old: Graph | None = None
    nodes: int = 0  # operators of the rewritten side of the regions
    boundary: int = 0


@dataclass
class RegionCheck:
    """Per input set, the largest relative error over region outputs; ``worst`` over all."""

    outputs: int = 0
    nodes: int = 0
    worst: float = 0.0
    sets: dict = field(default_factory=dict)
    from_inputs: bool = False  # the regions were run from the graph inputs

    def to_json(self) -> dict:
        return {"region_outputs": self.outputs, "operators": self.nodes, "worst": self.worst, "sets": self.sets,
                "from_graph_inputs": self.from_inputs}


@dataclass
class RegionMismatch:
    """A region output that differs: input set, which one, the operators, relative error."""

    input_set: str
    output: int
    outputs: int
    ops: tuple[str, str]
    error: float

    def describe(self) -> str:
        return (f"rewritten region output {self.output} of {self.outputs} ({self.ops[1]} in the original, "
                f"{self.ops[0]} after the rewrite) on input set '{self.input_set}' (relative error {self.error:.2e})")


def rewritten_regions(old: Graph, new: Graph, cls_old: dict, cls_new: dict, from_inputs: bool = False) -> Regions:
    """The regions where ``new`` computes a value of ``old`` another way (see the module
    docstring); ``cls_*``: the e-class of each value (``Ref -> class or None``)."""
    rep_old: dict = {}
    for r, c in cls_old.items():
        if c is not None:
            rep_old.setdefault(c, r)
    rep_new: dict = {}
    pairs = []
    for r1, c in cls_new.items():
        if c is None or c not in rep_old:
            continue
        rep_new.setdefault(c, r1)
        r0 = rep_old[c]
        n1, n0 = new.nodes[r1.node], old.nodes[r0.node]
        if n1.op in ("input", "weight") and n1.op == n0.op:
            continue
        if (n1.op == n0.op and n1.attrs == n0.attrs and r1.index == r0.index and len(n1.inputs) == len(n0.inputs)
                and all(cls_new[a] is not None and cls_new[a] == cls_old[b] and rep_old[cls_old[b]] == b
                        for a, b in zip(n1.inputs, n0.inputs))):
            continue  # the same step on values of the same classes (the original's own, not others it holds)
        pairs.append((r1, r0))
    if not pairs:
        return Regions([])
    allowed = set(rep_new)
    inputs = {c for r, c in cls_old.items() if old.nodes[r.node].op == "input"}
    while True:  # both sides start from the same classes: not one from a value the other computes
        can_new = _cuttable(new, cls_new, allowed, from_inputs)
        can_old = {r: c for r, c in _cuttable(old, cls_old, allowed, from_inputs).items() if rep_old[c] == r}
        cut_new, cut_old = _boundary(new, can_new, [p[0] for p in pairs]), _boundary(old, can_old, [p[1] for p in pairs])
        apart = (cut_new ^ cut_old) - inputs
        if not apart:
            break
        allowed -= apart
    cut = cut_new | cut_old
    order = {c: k for k, c in enumerate(sorted(cut))}
    sub_new = _subgraph(new, [p[0] for p in pairs], can_new, order, rep_new)
    sub_old = _subgraph(old, [p[1] for p in pairs], can_old, order, rep_old)
    return Regions(pairs, sub_new, sub_old, sum(1 for n in sub_new.nodes if n.op not in ("input", "weight")),
                   len(order))


def _subgraph(g: Graph, tops: list[Ref], can: dict, order: dict, rep: dict) -> Graph:
    """The graph computing ``tops`` from the boundary (inputs ``b0, b1, ...``, one per class in
    ``order``; every value of a boundary class that ``can`` be cut reads it). Unlike
    :meth:`Graph.subgraph`, a top that is also on the boundary (of another region) is computed
    from its own inputs, not passed through."""
    b = GraphBuilder()
    inputs = {c: b.input(f"b{k}", g.type_of(rep[c]).shape, g.type_of(rep[c]).dtype)
              for c, k in sorted(order.items(), key=lambda ck: ck[1])}
    given = {r: inputs[c] for r, c in can.items() if c in inputs}
    needed: set = set()
    stack = [r.node for r in tops]
    while stack:
        i = stack.pop()
        if i not in needed:
            needed.add(i)
            stack.extend(r.node for r in g.nodes[i].inputs if r not in given)
    made: dict = {}
    for i in sorted(needed):  # node order is topological
        n = g.nodes[i]
        if n.op == "weight":
            made[i] = (b.weight(n.name, n.types[0].shape, g.data.get(n.name), n.types[0].dtype),)
        elif n.op == "input":
            made[i] = (b.input(n.name, n.types[0].shape, n.types[0].dtype),)
        else:
            made[i] = b.add(n.op, [given[r] if r in given else made[r.node][r.index] for r in n.inputs], n.attr)
    return b.build([made[r.node][r.index] for r in tops])


def _cuttable(g: Graph, cls: dict, common: set, from_inputs: bool) -> dict:
    """``Ref -> class`` of the values a region may start from: of a class both graphs hold,
    computed from a graph input, of a floating type (``from_inputs``: graph inputs only)."""
    const = constant_nodes(g)
    return {r: c for r, c in cls.items() if c in common and r.node not in const
            and g.nodes[r.node].types[r.index].dtype in _FLOATS and (not from_inputs or g.nodes[r.node].op == "input")}


def _boundary(g: Graph, can: dict, tops: list[Ref]) -> set:
    """The classes the regions above ``tops`` start from: the nearest values below them (not
    the tops themselves) that ``can`` start one."""
    cut: set = set()
    seen: set = set()
    stack = [r for t in tops for r in g.nodes[t.node].inputs]
    while stack:
        r = stack.pop()
        if r in seen:
            continue
        seen.add(r)
        if r in can:
            cut.add(can[r])
            continue
        stack.extend(g.nodes[r.node].inputs)
    return cut


def check_rewrites(old: Graph, new: Graph, cls_old: dict, cls_new: dict, examples: dict, tolerance: float,
                   sets=INPUT_SETS) -> RegionCheck | RegionMismatch:
    """The region check of ``new`` against ``old`` on ``sets``; where a region output differs
    with the boundary drawn, again from the graph inputs (see the module docstring)."""
    res = check_regions(rewritten_regions(old, new, cls_old, cls_new), examples, tolerance, sets)
    if isinstance(res, RegionMismatch):
        res = check_regions(rewritten_regions(old, new, cls_old, cls_new, True), examples, tolerance, sets)
        if isinstance(res, RegionCheck):
            res.from_inputs = True
    return res


def check_regions(regions: Regions, examples: dict, tolerance: float, sets=INPUT_SETS,
                  seed: int = 1234) -> RegionCheck | RegionMismatch:
    """Run the regions of both graphs on ``sets`` (``(name, scale or "integers")``, drawn at the
    boundary) and compare every region output; ``examples``: the model's inputs by name."""
    rep = RegionCheck(len(regions.pairs), regions.nodes)
    if not regions.pairs:
        return rep
    gen = torch.Generator().manual_seed(seed)
    for name, scale in sets:
        env = _draw(regions, gen, scale, examples)
        want64 = _numpy(run_graph(regions.old, env, dtype=torch.float64))
        want32 = _numpy(run_graph(regions.old, env, dtype=torch.float32))
        got = _numpy(run_graph(regions.new, env, dtype=torch.float32))
        worst = 0.0
        for k, (g, w32, w64) in enumerate(zip(got, want32, want64)):
            rel, ok = output_error(g, w32, w64, tolerance)
            if not ok:
                return RegionMismatch(name, k, len(got), (_op_of(regions.new, k), _op_of(regions.old, k)), rel)
            worst = max(worst, rel)
        rep.sets[name] = worst
        rep.worst = max(rep.worst, worst)
    return rep


def _draw(regions: Regions, gen: torch.Generator, scale, examples: dict) -> dict:
    """Values for the regions' inputs: the boundary (``b*``) drawn, graph inputs of an integer
    type as in the examples. Normal draws are made in float32 and held in float64: torch draws
    float64 normals without its vectorized path (1x256x56x56: 62 ms against 3 ms; ResNet-50's
    48 boundaries took a fifth of its region check), and values that float32 holds exactly give
    the original's float64 and float32 runs, and the rewritten one, the very same inputs."""
    env = dict(examples)
    types = {regions.new.nodes[i].name: regions.new.nodes[i].types[0] for i in regions.new.inputs}
    for k in range(regions.boundary):
        ty = types[f"b{k}"]
        if scale == "integers":
            env[f"b{k}"] = torch.randint(-3, 4, ty.shape, generator=gen).to(torch.float64)
        else:
            env[f"b{k}"] = (torch.randn(ty.shape, generator=gen) * scale).to(torch.float64)
    return env


def _op_of(g: Graph, k: int) -> str:
    return g.nodes[g.outputs[k].node].op


def _numpy(values) -> list[np.ndarray]:
    return [v.detach().to(torch.float64).numpy() if isinstance(v, torch.Tensor) else np.asarray(v, np.float64)
            for v in values]
