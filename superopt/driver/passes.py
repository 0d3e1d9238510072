"""The passes of ``optimize``, as data: a flat list of named steps over one :class:`Run`.

Each pass reads and updates the run (the working graph, the search result, the code plan);
:func:`superopt.driver.pipeline.optimize` runs them in order, times each and the report lists
them. Adding a pass is one line in :data:`PASSES`. A pass with ``when`` runs only where that
holds (the kernel choice: where :mod:`superopt.kernel` is installed and asked for).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from ..cost.model import CostModel, constant_nodes
from ..ir.graph import Graph
from ..ir.hashing import named_hash
from ..rules.load import HALF_DTYPES, at_dtypes
from ..search.backtrack import search
from ..search.cse import eliminate_common_subexpressions
from ..search.fold import fold_constants
from ..search.instance_proofs import InstanceProofs
from ..search.saturate import saturate
from .aside import raise_if_terminated
from .options import Options

try:  # the kernel level (superopt.kernel) is optional: its pass runs only where it is installed
    from ..kernel import choose_kernels
    from ..kernel.choose import model_signature
    from ..kernel.profile import default_profile
except ImportError:
    choose_kernels = default_profile = model_signature = None

__all__ = ["Pass", "Run", "CodePlan", "PASSES", "running_ops"]


@dataclass
class CodePlan:
    """How the chosen graph is emitted: convolutions in channels-last memory (None: Inductor's
    own rule decides), the convolution chains run as one cuDNN call each (by relu node),
    attention as one ``scaled_dot_product_attention`` call."""

    channels_last: bool | None = None
    conv_relu: dict = field(default_factory=dict)
    attention: bool = False
    pin_layout: bool = False  # the choice differs from Inductor's own rule: every convolution a superopt call

    @property
    def choices(self) -> bool:
        """Whether a layout or library-call choice was made (else Inductor gets its own)."""
        return self.channels_last is not None or bool(self.conv_relu)

    def fx_options(self) -> dict:
        return {"attention": self.attention, "conv_relu": self.conv_relu,
                "channels_last": bool(self.channels_last), "pin_layout": self.pin_layout}


@dataclass
class Run:
    """One ``optimize`` call's state as the passes see it."""

    model: object  # a LoadedModel
    rules: object
    cost: CostModel
    options: Options
    dtype: str
    report: object  # the OptimizeReport being filled
    gate: object = None
    graph: Graph | None = None  # the model's graph, folded and merged
    result: object = None  # the search's result
    best: Graph | None = None  # what will be written
    plan: CodePlan = field(default_factory=CodePlan)
    check: Callable | None = None  # the output check (set by the pipeline)
    check_regions: Callable | None = None  # the region check (set by the pipeline)
    found: Graph | None = None  # the search's graph as kept (folded and merged), if it was


@dataclass(frozen=True)
class Pass:
    """A named step of ``optimize``: ``run(state)``, only ``when(state)`` holds."""

    name: str
    run: Callable[[Run], None]
    when: Callable[[Run], bool] = lambda r: True


def running_ops(g: Graph) -> int:
    """Operators that run (not folded at compile time)."""
    const = constant_nodes(g)
    return sum(1 for i in g.compute_nodes() if i not in const)


def _fold(r: Run) -> None:
    r.graph = eliminate_common_subexpressions(fold_constants(r.model.graph))
    r.report.nodes_before, r.report.cost_before = running_ops(r.model.graph), r.cost.graph_cost(r.model.graph)


def _search(r: Run) -> None:
    o = r.options
    rules = _at_the_graphs_dtypes(r.rules, r.graph)
    labels = getattr(rules, "labels", None)
    if o.search == "saturate":
        gate = r.gate if r.gate is not None else InstanceProofs.for_rules(getattr(r.rules, "source", None))
        r.result = saturate(r.graph, rules, r.cost, gate, o.limits(), labels=labels)
        gate.flush()
        r.result.report.instance_proofs = gate.counts()
    else:
        r.result = search(r.graph, rules, r.cost, o.alpha, o.budget, o.time_limit, o.progress, labels=labels)
    r.report.search = r.result.report.to_json()


def _at_the_graphs_dtypes(rules, g: Graph):
    """``rules`` also at the half-precision dtypes the graph computes in (a model exported in bf16:
    :func:`~superopt.rules.load.at_dtypes`); as they are for a float32 graph."""
    half = {t.dtype for i in g.compute_nodes() for t in g.nodes[i].types if t.dtype in HALF_DTYPES}
    return at_dtypes(rules, half) if half and hasattr(rules, "labels") else rules


def _keep_if_cheaper(r: Run) -> None:
    """Fold and merge the found graph; keep it only where it saves ``min_gain`` of the cost."""
    rep = r.report
    found = eliminate_common_subexpressions(fold_constants(r.result.graph))
    rep.cost_found, best = min(((r.cost.graph_cost(found), found), (r.cost.graph_cost(r.graph), r.graph)),
                               key=lambda cg: cg[0])
    saved = rep.cost_before - rep.cost_found
    if saved > 0 and saved >= r.options.min_gain * rep.cost_before:
        r.best, rep.cost_after = best, rep.cost_found
        r.found = best if best is found else None
    else:  # never slower, nor a gain within the model's error
        r.best, rep.cost_after = r.model.graph, rep.cost_before
    rep.rewritten = named_hash(r.best) != named_hash(r.model.graph)
    rep.nodes_after = running_ops(r.best)


def _kernels(r: Run) -> None:
    """superopt's measured kernels for regions of the graph (the kernel level decides where)."""
    profile = default_profile(r.options.kernel_profile)
    graph, kreport = choose_kernels(r.best, r.cost, r.cost.device.name, r.dtype, profile)
    why = (getattr(kreport, "verdict", None) or {}).get("original")
    if why:  # `superopt tune` timed the original faster than the rewrite on the device: written as it was timed
        _keep_original(r, why)
    elif named_hash(graph) != named_hash(r.best):
        v = getattr(kreport, "verdict", None)
        # where the whole model was timed, its measured ratio is the estimate: the kernels' own
        # times against the cost model's price of the regions they replace are not comparable
        # (the GPT-2 block read 25.8 -> 41.5 us although it ran 40.7 -> 39.6 us)
        r.report.cost_after = (r.cost.graph_cost(r.best) * v["us"] / v["inductor_us"] if v and v["inductor_us"] > 0
                               else r.cost.graph_cost(graph))
        r.best, r.report.rewritten = graph, True
    r.report.kernels = kreport.to_json() if hasattr(kreport, "to_json") else str(kreport)


def _keep_original(r: Run, why: str) -> None:
    r.best, r.found, r.report.rewritten, r.report.kept_original = r.model.graph, None, False, why
    r.report.cost_after, r.report.nodes_after = r.report.cost_before, r.report.nodes_before


def _verdict(r: Run) -> None:
    """Where the kernel pass does not run (``--portable``, kernels off), the whole-model verdict
    ``superopt tune`` measured still decides between the rewrite and the original: where the
    device timed the searched graph (with its kernels and without) slower than the original, the
    original is written, as with kernels on (superopt is never slower than what it hands back to)."""
    if not r.report.rewritten:
        return
    profile = default_profile(r.options.kernel_profile)
    v = profile.lookup_model(model_signature(r.best), r.dtype, r.cost.device.name) if profile.models else None
    if v is not None and v.original:
        _keep_original(r, v.why_original)


def _layout(r: Run) -> None:
    """The convolution layout and cuDNN's fused epilogues, kept only where the profile prices
    them ``min_gain`` of the cost cheaper than what Inductor does on its own."""
    cost, g, o = r.cost, r.best, r.options
    if r.report.kept_original:  # the original program as the device timed it: no choice of layout either
        return
    r.plan.attention = r.dtype in ("bf16", "fp16")  # a flash kernel; in float32 the ops ran faster
    if cost.mode != "inductor":
        return
    fused = not o.portable and cost.conv_relu
    layout = "choose" if cost.layout == "choose" and o.layout == "choose" else "inductor"
    own_nhwc = cost.channels_last_for(g, layout="inductor")
    # Inductor converts the 4-d inputs itself where its rule picks channels-last: priced alike
    own = cost.graph_cost(g, layout="inductor", conv_relu=False) + (cost._conversions_us(g) if own_nhwc else 0.0)
    chosen = cost.graph_cost(g, layout=layout, conv_relu=fused)
    nhwc = cost.channels_last_for(g, layout=layout, conv_relu=fused)
    if layout == "inductor" and nhwc:
        chosen += cost._conversions_us(g)
    fusions = cost.conv_relu_fusions(g, layout=layout) if fused else {}
    differs = nhwc != own_nhwc or bool(fusions)
    r.report.layout = {"channels_last": nhwc, "conv_relu_fused": len(fusions), "cost_inductor_rule_us": round(own, 2),
                       "cost_chosen_us": round(chosen, 2), "kept": False}
    if differs and own - chosen > o.min_gain * own:
        r.plan.channels_last = nhwc if layout == "choose" else None
        r.plan.conv_relu = fusions
        # a user's torch.compile of the written program applies Inductor's rule to what is left
        # as aten.convolution (ResNeXt-50 fp32 on an H100: NCHW chosen, the rule's channels-last
        # around the fused calls ran 1.03x where the backend, which sets the layout, ran 1.32x)
        r.plan.pin_layout = not o.portable and r.plan.channels_last is not None and nhwc != own_nhwc
        r.report.layout["kept"] = True
        r.report.layout["pinned"] = r.plan.pin_layout


def _check(r: Run) -> None:
    r.check(r)


def _check_regions(r: Run) -> None:
    r.check_regions(r)


def _regions_apply(r: Run) -> bool:
    """The region check covers the graph to be written: the extracted graph, folded and merged
    (no later pass rewrote it), of a search that records e-classes, and random input sets asked."""
    return (r.options.input_sets > 1 and r.found is not None and r.best is r.found and r.check_regions is not None
            and callable(getattr(r.result, "classes", None)))


#: the passes of ``optimize``, in order (the report lists them with their times)
PASSES: list[Pass] = [
    Pass("fold + merge duplicates", _fold),
    Pass("search", _search),
    Pass("keep if cheaper", _keep_if_cheaper),
    Pass("kernels", _kernels, when=lambda r: choose_kernels is not None and r.options.kernels and not r.options.portable),
    Pass("device verdict", _verdict,
         when=lambda r: default_profile is not None and (not r.options.kernels or r.options.portable)),
    Pass("layout + library calls", _layout),
    Pass("region check", _check_regions, when=_regions_apply),
    Pass("output check", _check),
]


def run_passes(r: Run, passes: list[Pass]) -> None:
    """Run ``passes`` in order, timing each into the report (skipped ones are listed too); with
    ``progress`` (a terminal), a bar over the passes names the one running."""
    bar = tqdm(total=len(passes), unit="pass", file=sys.stderr, leave=False) if r.options.progress else None
    for p in passes:
        raise_if_terminated()  # a SIGTERM whose interrupt a lazy import swallowed (superopt optimize)
        if bar is not None:
            bar.set_description(f"superopt: {p.name}")
        if not p.when(r):
            r.report.passes.append(f"{p.name} (skipped)")
        else:
            t, cpu = time.perf_counter(), time.process_time()
            p.run(r)
            r.report.seconds[p.name] = round(time.perf_counter() - t, 3)
            r.report.cpu_seconds[p.name] = round(time.process_time() - cpu, 3)
            r.report.passes.append(p.name)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
