"""``optimize``: import -> fold -> search -> keep if cheaper -> kernels -> layout and library
calls -> output check, one pipeline behind the CLI, the Python API and the ``torch.compile``
backend (:mod:`.passes` holds the list; code generation comes after, by the caller: the CLI
writes a program, the backend hands a module to Inductor).

The output check has two parts. The region check (:mod:`.regions`) runs each region the
saturation rewrote against the original's computation of the same values, on the random input
sets asked for (``input_sets`` - 1: a normal draw by default), drawn at the regions' own
boundaries; then the whole-model check (:mod:`.outcheck`) runs the original program and the
code that will be written once, on the examples, called exactly as the original is, and
compares every output (the rules are proven; the whole-model run is the safety net for the
generated code and the constant folding around the search, which the regions do not cover). Where the region check cannot cover the graph (the backtracking search, a
kernel pass that rewrote it, a program at half precision: the regions run in float32, so they
say nothing of the program's own rounding), the whole model runs on every input set asked for
instead.
When either fails nothing is written: with the backtracking search the rewrites are replayed
in float64 to find the first that changes the outputs; with saturation the rules the extracted
graph used are named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from ..codegen import to_fx, to_module
from ..codegen.half import at_precision
from ..cost.model import CostModel
from ..errors import NumericMismatchError
from ..ir.graph import Graph
from ..search.fold import fold_constants
from ..search.state import State
from ..semantics.torch_lowering import run as run_graph
from .model import LoadedModel, program_dtype
from .options import DEFAULT_TOLERANCE, Options
from .outcheck import INPUT_SETS, OutputMismatch, check_outputs, make_input_sets
from .passes import PASSES, CodePlan, Pass, Run, run_passes
from .regions import RegionMismatch, check_rewrites

__all__ = ["OptimizeReport", "Optimized", "optimize", "relative_error", "candidate_module", "named_inputs",
           "mismatch_error", "whole_model_sets"]

#: the keyword names ``optimize`` took before :class:`Options` (mapped onto its fields)
_LEGACY = {"method": "search", "limits": None, "profile_name": None, "gate": None, "dtype": None}


@dataclass
class OptimizeReport:
    """What ``optimize`` did: the passes run and their times, the search report, the code
    choices and the output check."""

    model: str
    device: str
    profile: str | None
    nodes_before: int = 0
    nodes_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    max_relative_error: float | None = None
    output_check: dict = field(default_factory=dict)
    region_check: dict = field(default_factory=dict)  # the rewritten regions' check (regions.RegionCheck)
    tolerance: float = DEFAULT_TOLERANCE
    output: str | None = None
    search: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    cpu_seconds: dict = field(default_factory=dict)  # the same phases' CPU seconds in this process (threads included)
    rewritten: bool = True  # False: the original program is what gets written (nothing cheaper, or under min_gain)
    kept_original: str = ""  # why the original is written though a rewrite was kept: a device verdict (superopt tune)
    min_gain: float = 0.0  # the least share of the cost a rewrite had to save to be kept
    cost_found: float | None = None  # the search's best graph's cost, kept or not
    passes: list = field(default_factory=list)
    layout: dict = field(default_factory=dict)  # the layout / library-call choice and whether it was kept
    kernels: object = None  # the kernel choice's report, where the kernel level ran
    custom_ops: list = field(default_factory=list)  # superopt ops in the written code: loading needs `import superopt`
    imported_as: str = ""  # a half-precision program: imported as its float32 form, or as it is and why
    cpu_s: dict = field(default_factory=dict)  # CPU seconds of this process and of the work done beside it (the CLI)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Optimized:
    """``optimize``'s result: the graph, how to emit it, the report, the search result;
    unpacks as ``best, report, result`` like the tuple it replaces."""

    graph: Graph
    plan: CodePlan
    report: OptimizeReport
    result: object
    model: LoadedModel

    def __iter__(self):
        return iter((self.graph, self.report, self.result))

    @property
    def unchanged(self) -> bool:
        """Nothing rewritten and no layout or kernel choice: the original program is the answer."""
        return not self.report.rewritten and not self.plan.choices

    def module(self) -> torch.nn.Module:
        """The chosen graph as a torch module called like the original model."""
        return candidate_module(self.model, self.graph, self.plan)


def _options(options: Options | None, kw: dict) -> tuple[Options, dict]:
    extra = {k: kw.pop(k) for k in list(kw) if k in _LEGACY}
    if "method" in extra:
        kw["search"] = extra.pop("method")
    limits = extra.pop("limits", None)
    if limits is not None:
        kw.update(iterations=limits.iterations, nodes=limits.nodes, time_limit=limits.seconds)
    opts = replace(options or Options(), **kw) if kw else (options or Options())
    return opts.check(), extra


def optimize(model: LoadedModel, rules, cost: CostModel, options: Options | None = None,
             passes: Sequence[Pass] | None = None, **kw) -> Optimized:
    """Run the passes (:data:`.passes.PASSES`) on ``model``; raises NumericMismatchError naming
    the bad rewrite when the output check fails. ``options`` (or its fields as keywords) set
    the search, the gain a change must bring and the check; ``dtype`` the precision the model
    will run at (default the cost model's), ``profile_name`` the line naming the cost model,
    ``gate`` the saturation's proof gate. The model's own graph is kept unless the best found
    is priced ``min_gain`` cheaper."""
    opts, extra = _options(options, kw)
    rep = OptimizeReport(model.name, cost.device.name, extra.get("profile_name"), tolerance=opts.tolerance,
                         min_gain=opts.min_gain, imported_as=model.imported_as)
    rep.seconds["import"] = round(model.seconds, 3)
    rep.cpu_seconds["import"] = round(model.cpu_seconds, 3)
    run = Run(model, rules, cost, opts, extra.get("dtype") or cost.precision, rep, gate=extra.get("gate"),
              check=_check, check_regions=_check_regions)
    run_passes(run, list(PASSES if passes is None else passes))
    if run.best is None:  # a pass list without the search: the model as it is
        run.best = model.graph
    return Optimized(run.best, run.plan, rep, run.result, model)


def relative_error(got: Sequence, want: Sequence) -> float:
    """Largest over outputs of max |got - want| / max |want|."""
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale if b.size else 0.0)
    return worst


def candidate_module(model: LoadedModel, g: Graph, plan: CodePlan | None = None):
    """``g`` as a torch module called like the original model (inputs bound by name), emitted
    as ``plan`` says; the float32 form of a half-precision program cast back to its precision."""
    fx = plan.fx_options() if plan is not None else {}
    if model.signature is not None:
        module = to_module(g, model.signature, **fx)
        return at_precision(module, model.half_dtype, model.inputs, model.kwargs) if model.half else module
    gm, names = to_fx(g, **fx), g.input_names
    order = model.graph.input_names  # the original's positional order

    def call(*args):
        named = dict(zip(order, args))
        return gm(*[named[n] for n in names])
    return call


def whole_model_sets(report: OptimizeReport, input_sets: int) -> int:
    """Input sets of the whole-model check: the examples where the region check covered the
    random sets, else every set asked for."""
    return 1 if report.region_check.get("covered") else input_sets


def _check_regions(r: Run) -> None:
    """The region check of the graph to be written (see the module docstring)."""
    model, o = r.model, r.options
    old, new = r.result.source, r.result.graph
    cls_old, cls_new = r.result.classes()
    res = check_rewrites(old, new, cls_old, cls_new, named_inputs(model, model.inputs, model.kwargs), o.tolerance,
                         INPUT_SETS[:o.input_sets - 1])
    if isinstance(res, RegionMismatch):
        raise NumericMismatchError(f"{model.name}: a rewritten region computes something else than the original: "
                                   f"{res.describe()}, tolerance {o.tolerance:.0e}; "
                                   f"{_culprit(r.result, {}, o.tolerance)}; nothing was written")
    # the regions run in float32: they cover the random sets only for a program computed in float32
    # (a bf16 program's rewrite may round differently, and its softmax can carry that far: found by
    # scripts/fuzz.py --dtype bf16 at the inputs scaled by 30)
    r.report.region_check = {**res.to_json(), "covered": program_dtype(model) == "fp32"}


def _check(r: Run) -> None:
    """The output check of the code that will be written (see the module docstring)."""
    model, o = r.model, r.options
    sets = make_input_sets(model.inputs, model.kwargs, whole_model_sets(r.report, o.input_sets))
    result = check_outputs(model.reference, candidate_module(model, r.best, r.plan), sets, o.tolerance, model.memo,
                           model.state)
    if isinstance(result, OutputMismatch):
        raise mismatch_error(model, r.result, result, o.tolerance)
    r.report.max_relative_error, r.report.output_check = result.worst, result.sets


def mismatch_error(model: LoadedModel, search_result, mismatch: OutputMismatch, tolerance: float,
                   what: str = "the optimized model's outputs differ from the original's") -> NumericMismatchError:
    """The refusal of a program whose outputs differ, naming the rewrite or rules to blame."""
    env = named_inputs(model, mismatch.args, mismatch.kwargs)
    return NumericMismatchError(f"{model.name}: {what}: {mismatch.describe()}, tolerance {tolerance:.0e}; "
                                f"{_culprit(search_result, env, tolerance)}; nothing was written")


def named_inputs(model: LoadedModel, args, kwargs) -> dict:
    """The model's call bound to its graph's input names."""
    if model.signature is not None:
        return model.signature.named_inputs(args, kwargs)
    return dict(zip(model.graph.input_names, args))


def _culprit(res, env: dict, tolerance: float) -> str:
    """The first rewrite of the best graph's history after which the outputs change (float64,
    inputs bound by name); with saturation (no history), the rules the extracted graph used."""
    if res is None:
        return "no rewrite was applied: the difference is in the generated code"
    if not hasattr(res, "state"):  # saturation: the rules whose nodes were extracted, else those that fired
        used = sorted(res.report.rules_applied) or sorted(k for k, v in res.report.by_rule.items() if v)
        if not used:
            return "no rule was applied: the difference is in the generated code"
        return ("the graph was rewritten by " + ", ".join(f"rule {u}" for u in used[:8]) +
                "; leave them out one at a time: " + ", ".join(f"--exclude-rule {u}" for u in used[:8]))
    chain: list[State] = []
    s = res.state
    while s is not None:
        chain.append(s)
        s = s.parent
    chain.reverse()
    g0 = res.first.to_graph()

    def bad(k: int) -> bool:
        g = fold_constants(chain[k].to_graph())
        got = [t.numpy() for t in run_graph(g, {n: env[n] for n in g.input_names}, dtype=torch.float64)]
        return relative_error(got, want) > tolerance

    want = [t.numpy() for t in run_graph(g0, {n: env[n] for n in g0.input_names}, dtype=torch.float64)]
    lo, hi = 0, len(chain) - 1
    if hi == 0 or not bad(hi):
        return "every rewrite keeps the outputs in float64: the difference is float32 rounding"
    while hi - lo > 1:  # chain[lo] is good, chain[hi] is bad
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if not bad(mid) else (lo, mid)
    step = chain[hi].step
    rule = res.rewriter.rules.patterns[step.pattern].rule
    name = res.report.labels.get(step.rule_id, step.rule_id)
    return (f"the first rewrite that changes them is step {hi} of {len(chain) - 1}: rule {name} "
            f"({rule.text()}) at {step.where}; leave it out with --exclude-rule {name}")

