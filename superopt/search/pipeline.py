"""The ``optimize`` pipeline, as a flat list of named passes:

import -> fold weights -> merge duplicates -> search -> fold weights -> merge duplicates ->
numeric check -> export.

The numeric check runs the original model and the optimized graph on random inputs (the
model's example inputs and a second seeded draw) and requires a relative error
(max |a - b| / max |b|, per output) under ``tolerance``. When it fails nothing is written:
the rewrites of the best graph are replayed in float64 to find the first one that changes the
outputs, and the error names its rule and place. (Code generation is the stage after the
search; this orchestrator imports it lazily, only to export and to check what it exports.)
"""

from __future__ import annotations

import sys

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..rules.cli import default_db_path
from ..cost.model import CostModel
from ..ir.graph import Graph
from ..ir.rule import Rule
from .backtrack import SearchResult, search
from .cse import eliminate_common_subexpressions
from .errors import ModelError, NumericMismatchError, RulesError
from .fold import fold_constants
from .pattern import RuleSet
from .state import State

__all__ = ["LoadedModel", "OptimizeReport", "RuleList", "load_model", "load_rules", "optimize", "relative_error",
           "write_model", "DEFAULT_RULES", "DEFAULT_TOLERANCE"]

DEFAULT_RULES = str(default_db_path())  # the shipped database, wherever the command runs from
DEFAULT_TOLERANCE = 1e-4


@dataclass
class LoadedModel:
    """A model to optimize: its graph, a torch callable computing the original, example inputs."""

    name: str
    graph: Graph
    reference: Callable
    inputs: tuple
    seconds: float = 0.0


def _check_not_all_opaque(name: str, g: Graph) -> None:
    ops = [g.nodes[i].op for i in g.compute_nodes()]
    if ops and all(op == "opaque" for op in ops):
        raise ModelError(f"{name}: all {len(ops)} operators are opaque (unknown to superopt), so no rule can "
                         f"apply; nothing to optimize")
    if not ops:
        raise ModelError(f"{name}: the model computes nothing (no operators); nothing to optimize")


def load_model(path: str | None = None, zoo: str | None = None, batch_size: int = 1, seed: int = 0) -> LoadedModel:
    """Import a ``.pt2`` file or a zoo model (exactly one of ``path``, ``zoo``)."""
    from ..frontend import from_exported_program, from_module, load_pt2
    if (path is None) == (zoo is None):
        raise ModelError("give a MODEL.pt2 or --zoo NAME (exactly one)")
    t0 = time.perf_counter()
    if zoo is not None:
        from ..models import build
        module, inputs = build(zoo, batch_size=batch_size, seed=seed)
        graph, _ = from_module(module, inputs, source=f"zoo:{zoo}")
        name, ref = zoo, module
    else:
        from ..codegen import example_inputs
        ep = load_pt2(path)
        graph, _ = from_exported_program(ep, source=str(path))
        name, ref, inputs = Path(path).stem, ep.module(), example_inputs(graph, seed)
    _check_not_all_opaque(name, graph)
    return LoadedModel(name, graph, ref, tuple(inputs), time.perf_counter() - t0)


class RuleList(list):
    """Rules to apply, with ``labels``: rule id -> how reports name it (a reversed rule as the
    database id of the rule it reverses, followed by ``~``)."""

    def __init__(self, rules=(), labels=None):
        super().__init__(rules)
        self.labels = dict(labels or {})


def load_rules(path: str | None = DEFAULT_RULES, examples: bool = False, both_ways: bool = True,
               exclude: Sequence[str] = ()) -> RuleList:
    """Proven rules of a rule database (or the hand-written examples), in both directions (except
    reversals whose left side would need a constant operator). ``exclude`` takes database ids
    (both directions go) and labels (``ID~``: the reversal only)."""
    if examples:
        from ..verify import verify_rules
        from ..rules.curated import example_rules
        candidates = example_rules()
        results = verify_rules(candidates, progress=False)
        rules = [r for r, v in zip(candidates, results) if v.applicable]
        if len(rules) < len(candidates):
            print(f"superopt: {len(candidates) - len(rules)} example rule(s) not proven; they are not applied",
                  file=sys.stderr)
    else:
        from ..rules import RuleDB
        if not Path(path).exists():
            raise RulesError(f"no rule database at {path}; generate one with `superopt generate`, pass --rules PATH, "
                             f"or try the built-in examples with --example-rules")
        with RuleDB.open(path) as db:
            rules = db.proven_rules()
        if not rules:
            raise RulesError(f"{path} holds no proven, cross-checked rule; nothing to apply")
    labels = {r.id: r.id for r in rules}
    if both_ways:
        back = [r.reversed() for r in rules if not _has_constants(r.rhs)]
        labels.update({b.id: f"{r.id}~" for r, b in zip([r for r in rules if not _has_constants(r.rhs)], back)})
        rules = rules + back
    dropped = set(exclude)
    keep = [r for r in rules if labels[r.id] not in dropped and labels[r.id].rstrip("~") not in dropped]
    return RuleList(keep, labels)


def _has_constants(g: Graph) -> bool:
    """Constants (ones, identity kernels...) appear in a graph only where a rule put them (the
    input is folded), so a rule whose left side needs one mostly undoes another rule."""
    return any(n.opdef.kind == "constant" for n in g.nodes)


@dataclass
class OptimizeReport:
    """What ``optimize`` did: passes and their times, the search report, the numeric check."""

    model: str
    device: str
    profile: str | None
    nodes_before: int = 0
    nodes_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    max_relative_error: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    output: str | None = None
    search: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


def _running_ops(g: Graph) -> int:
    from ..cost.model import constant_nodes
    const = constant_nodes(g)
    return sum(1 for i in g.compute_nodes() if i not in const)


def optimize(model: LoadedModel, rules: Sequence[Rule] | RuleSet, cost: CostModel, alpha: float = 1.05,
             budget: int = 1000, time_limit: float = 60.0, tolerance: float = DEFAULT_TOLERANCE,
             progress: bool = True, profile_name: str | None = None,
             input_sets: int = 2, method: str = "backtrack", limits=None,
             gate=None) -> tuple[Graph, OptimizeReport, SearchResult]:
    """Run the passes up to the numeric check (on ``input_sets`` draws of inputs, the first being
    the model's examples); raises NumericMismatchError naming the bad rewrite. ``method``
    ``saturate`` runs equality saturation with ``limits`` (a saturate.Limits) and the proof
    ``gate`` (default: saturate.ProveInstances) instead of the backtracking search."""
    rep = OptimizeReport(model.name, cost.device.name, profile_name, tolerance=tolerance)
    rep.seconds["import"] = round(model.seconds, 3)
    g, t = model.graph, time.perf_counter()
    g = eliminate_common_subexpressions(fold_constants(g))
    rep.seconds["fold + merge duplicates"] = round(time.perf_counter() - t, 3)
    rep.nodes_before, rep.cost_before = _running_ops(g), cost.graph_cost(g)
    if method == "saturate":
        from .saturate import Limits, ProveInstances, saturate
        res = saturate(g, rules, cost, gate if gate is not None else ProveInstances(),
                       limits if limits is not None else Limits(seconds=time_limit),
                       labels=getattr(rules, "labels", None))
    else:
        res = search(g, rules, cost, alpha, budget, time_limit, progress, labels=getattr(rules, "labels", None))
    rep.search = res.report.to_json()
    rep.seconds["search"] = round(res.report.seconds["total"], 3)
    t = time.perf_counter()
    best = eliminate_common_subexpressions(fold_constants(res.graph))
    rep.seconds["fold + merge duplicates (after)"] = round(time.perf_counter() - t, 3)
    rep.nodes_after, rep.cost_after = _running_ops(best), cost.graph_cost(best)
    t = time.perf_counter()
    rep.max_relative_error = _check(model, best, tolerance, res, input_sets)
    rep.seconds["numeric check"] = round(time.perf_counter() - t, 3)
    return best, rep, res


def relative_error(got: Sequence, want: Sequence) -> float:
    """Largest over outputs of max |got - want| / max |want|."""
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale if b.size else 0.0)
    return worst


def _outputs(fn, inputs) -> list:
    import torch
    with torch.no_grad():
        out = fn(*inputs)
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.detach().numpy() for o in out]


def _input_sets(model: LoadedModel, count: int) -> list[tuple]:
    """The model's example inputs, then standard-normal draws (integer inputs kept)."""
    import torch
    gen = torch.Generator().manual_seed(1234)
    sets = [model.inputs]
    while len(sets) < count:
        sets.append(tuple(torch.randn(x.shape, generator=gen).to(x.dtype) if x.is_floating_point() else x
                          for x in model.inputs))
    return sets


def _check(model: LoadedModel, best: Graph, tolerance: float, res: SearchResult, input_sets: int) -> float:
    from ..codegen import to_fx
    module = to_fx(best)
    err = max(relative_error(_outputs(module, xs), _outputs(model.reference, xs))
              for xs in _input_sets(model, input_sets))
    if not err <= tolerance:
        raise NumericMismatchError(f"{model.name}: the optimized model's outputs differ from the original's "
                                   f"(relative error {err:.2e} > {tolerance:.0e}); {_culprit(res, model.inputs, tolerance)}; "
                                   f"nothing was written")
    return err


def _culprit(res: SearchResult, inputs, tolerance: float) -> str:
    """The first rewrite of the best graph's history after which the outputs change (float64)."""
    if not hasattr(res, "state"):  # equality saturation: no history to replay
        used = ", ".join(sorted(res.report.rules_applied)) or "none"
        return f"the extracted graph uses rules {used}; leave one out with --exclude-rule ID"
    import torch
    from ..semantics.torch_lowering import run
    chain: list[State] = []
    s = res.state
    while s is not None:
        chain.append(s)
        s = s.parent
    chain.reverse()
    g0 = res.first.to_graph()
    env = {name: x for name, x in zip(g0.input_names, inputs)}

    def bad(k: int) -> bool:
        g = fold_constants(chain[k].to_graph())
        got = [t.numpy() for t in run(g, env, dtype=torch.float64)]
        return relative_error(got, want) > tolerance

    want = [t.numpy() for t in run(g0, env, dtype=torch.float64)]
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


def write_model(best: Graph, path: str | Path, model: LoadedModel, tolerance: float = DEFAULT_TOLERANCE) -> Path:
    """Export ``best`` as ``.pt2`` and check that the file, loaded back, computes the original."""
    import torch
    from ..codegen import export_pt2
    path = Path(path)
    export_pt2(best, path, model.inputs)
    loaded = torch.export.load(str(path)).module()
    err = relative_error(_outputs(loaded, model.inputs), _outputs(model.reference, model.inputs))
    if not err <= tolerance:
        path.unlink(missing_ok=True)
        raise NumericMismatchError(f"{path}: the exported program computes something else than the original "
                                   f"(relative error {err:.2e}); the file was removed")
    return path
