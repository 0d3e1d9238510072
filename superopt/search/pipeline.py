"""The ``optimize`` pipeline, as a flat list of named passes:

import -> fold weights -> merge duplicates -> search -> fold weights -> merge duplicates ->
numeric check -> export.

The numeric check (:mod:`.outcheck`) runs the original program and the optimized graph on
several input sets, called exactly as the original is (same positional and keyword inputs,
bound to the graph's inputs by name), and compares every output separately. When it fails
nothing is written: the rewrites of the best graph are replayed in float64 to find the first one
that changes the outputs, and the error names its rule and place. (Code generation is the stage
after the search; this orchestrator imports it lazily, only to export and to check what it
exports.)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..rules.paths import default_db_path
from ..cost.model import CostModel
from ..ir.graph import Graph
from ..ir.hashing import named_hash
from ..ir.rule import Rule
from .backtrack import SearchResult, search
from .cse import eliminate_common_subexpressions
from .errors import ModelError, NumericMismatchError, RulesError, SearchError
from .fold import fold_constants
from .pattern import RuleSet
from .state import State

__all__ = ["LoadedModel", "OptimizeReport", "RuleList", "load_model", "load_rules", "optimize", "relative_error",
           "write_model", "write_onnx", "check_min_gain", "DEFAULT_MIN_GAIN", "DEFAULT_RULES", "DEFAULT_TOLERANCE"]

DEFAULT_RULES = str(default_db_path())  # the shipped database, wherever the command runs from
DEFAULT_TOLERANCE = 1e-4
#: a rewritten graph replaces the model only when priced at least this much cheaper (a share of its
#: cost): the H100 models were within 4% of the measured speedups, and where a gain under 2% was
#: predicted, Inductor ran the result 2-3% slower (ResNet-50 / ResNeXt-50 b16 bf16: 0.970, 0.976)
DEFAULT_MIN_GAIN = 0.02


def check_min_gain(min_gain: float) -> None:
    if not 0.0 <= min_gain < 1.0:
        raise SearchError(f"--min-gain {min_gain:g}: give a share of the cost from 0 (keep any gain) to below 1")


@dataclass
class LoadedModel:
    """A model to optimize: its graph, a torch callable computing the original, and an example
    call ``reference(*inputs, **kwargs)``; ``signature`` maps the call to the graph's inputs
    by name and rebuilds the output structure (None: positional inputs in graph order)."""

    name: str
    graph: Graph
    reference: Callable
    inputs: tuple
    seconds: float = 0.0
    kwargs: dict = field(default_factory=dict)
    signature: object = None
    format: str = "pt2"
    program: object = None  # the torch.export program as given (None for ONNX): written back when nothing is rewritten


def _check_not_all_opaque(name: str, g: Graph) -> None:
    ops = [g.nodes[i].op for i in g.compute_nodes()]
    if ops and all(op == "opaque" for op in ops):
        raise ModelError(f"{name}: all {len(ops)} operators are opaque (unknown to superopt), so no rule can "
                         f"apply; nothing to optimize")
    if not ops:
        raise ModelError(f"{name}: the model computes nothing (no operators); nothing to optimize")


def load_model(path: str | None = None, zoo: str | None = None, batch_size: int = 1, seed: int = 0,
               specialize: bool = False) -> LoadedModel:
    """Import a ``.pt2``/``.onnx`` file or a zoo model (exactly one of ``path``, ``zoo``)."""
    if (path is None) == (zoo is None):
        raise ModelError("give a MODEL.pt2 / MODEL.onnx or --zoo NAME (exactly one)")
    t0 = time.perf_counter()
    if zoo is not None:
        model = _load_zoo(zoo, batch_size, seed)
    elif _is_onnx(path):
        model = _load_onnx(path, batch_size, seed)
    else:
        model = _load_pt2(path, seed, specialize)
    _check_not_all_opaque(model.name, model.graph)
    model.seconds = time.perf_counter() - t0
    return model


def _is_onnx(path) -> bool:
    from ..frontend import detect_format
    return Path(path).suffix.lower() == ".onnx" or (Path(path).suffix.lower() != ".pt2" and detect_format(path) == "onnx")


def _load_zoo(zoo: str, batch_size: int, seed: int) -> LoadedModel:
    from ..frontend import import_program
    from ..frontend.torch_import import export_module
    from ..models import build
    module, inputs = build(zoo, batch_size=batch_size, seed=seed)
    ep = export_module(module, inputs)
    graph, _, sig = import_program(ep, source=f"zoo:{zoo}")
    return LoadedModel(zoo, graph, module, tuple(inputs), signature=sig, program=ep)


def _load_pt2(path: str, seed: int, specialize: bool) -> LoadedModel:
    import torch.utils._pytree as pytree
    from ..codegen import example_inputs
    from ..frontend import import_program, load_pt2
    ep = load_pt2(path)
    graph, _, sig = import_program(ep, source=str(path), specialize=specialize)
    if ep.example_inputs is not None and _fits(graph, ep.example_inputs):
        args, kwargs = ep.example_inputs
    else:
        args, kwargs = pytree.tree_unflatten(list(example_inputs(graph, seed)), sig.in_spec)
    return LoadedModel(_stem(path), graph, ep.module(), tuple(args), kwargs=dict(kwargs), signature=sig, program=ep)


def _fits(graph: Graph, example) -> bool:
    """Whether the stored example inputs have the shapes of the graph's inputs."""
    import torch.utils._pytree as pytree
    shapes = [tuple(t.shape) for t in pytree.tree_leaves(example) if hasattr(t, "shape")]
    return shapes == [graph.nodes[i].types[0].shape for i in graph.inputs]


def _load_onnx(path: str, batch_size: int, seed: int) -> LoadedModel:
    """An ONNX model: the reference is the imported graph itself (superopt runs no ONNX runtime)."""
    from ..codegen import example_inputs, to_fx
    from ..frontend.api import import_model
    graph, _ = import_model(path, "onnx", batch_size=batch_size)
    return LoadedModel(_stem(path), graph, to_fx(graph), example_inputs(graph, seed), format="onnx")


def _stem(path) -> str:
    name = Path(path).name
    for suffix in (".pt2", ".onnx"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return Path(path).stem


class RuleList(list):
    """Rules to apply, with ``labels``: rule id -> how reports name it (a reversed rule as the
    database id of the rule it reverses, followed by ``~``) and ``source``: the database they
    came from (its instance proofs are kept there), None for the examples."""

    def __init__(self, rules=(), labels=None, source=None):
        super().__init__(rules)
        self.labels = dict(labels or {})
        self.source = source


def load_rules(path: str | None = DEFAULT_RULES, examples: bool = False, both_ways: bool = True,
               exclude: Sequence[str] = ()) -> RuleList:
    """Proven rules of a rule database (or the hand-written examples), in both directions (except
    reversals whose left side would need a constant operator). ``exclude`` takes database ids
    (both directions go) and labels (``ID~``: the reversal only)."""
    if examples:
        from ..verify import verify_rules
        from ..rules.examples import example_rules
        candidates = example_rules()
        results = verify_rules(candidates, progress=False)
        rules = [r for r, v in zip(candidates, results) if v.applicable]
        if len(rules) < len(candidates):
            print(f"superopt: {len(candidates) - len(rules)} example rule(s) not proven; they are not applied",
                  file=sys.stderr)
        rules, labels = _both_ways(rules, both_ways)
    else:
        rules, labels = _db_rules(path, both_ways)
    dropped = set(exclude)
    unknown = sorted(x for x in dropped if x not in labels.values() and x.rstrip("~") not in labels.values())
    if unknown:
        raise RulesError(f"--exclude-rule: no rule {', '.join(unknown)} among the {len(labels)} rules loaded; "
                         f"ids are listed by `superopt rules list`")
    keep = [r for r in rules if labels[r.id] not in dropped and labels[r.id].rstrip("~") not in dropped]
    return RuleList(keep, labels, None if examples else path)


_DB_CACHE: dict = {}


def _db_rules(path, both_ways: bool) -> tuple[list, dict]:
    """The proven rules of a database and their labels; the last database read is kept in
    memory (keyed by its path, size and modification time), since computing the ids of the
    reversed rules takes seconds and a process optimizing many models reads the same file."""
    from ..rules import RuleDB
    p = Path(path)
    if not p.exists():
        raise RulesError(f"no rule database at {path}; generate one with `superopt generate`, pass --db PATH, "
                         f"or try the built-in examples with --example-rules")
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, both_ways)
    if key not in _DB_CACHE:
        with RuleDB.open(path) as db:
            rules = db.proven_rules()
        if not rules:
            raise RulesError(f"{path} holds no proven, cross-checked rule; nothing to apply")
        _DB_CACHE.clear()
        _DB_CACHE[key] = _both_ways(rules, both_ways)
    rules, labels = _DB_CACHE[key]
    return list(rules), dict(labels)


def _both_ways(rules: list, both_ways: bool) -> tuple[list, dict]:
    """The rules and, when ``both_ways``, their reversals, with labels (``ID``, ``ID~``)."""
    labels = {r.id: r.id for r in rules}
    if both_ways:
        fwd = [r for r in rules if not _has_constants(r.rhs)]
        back = [r.reversed() for r in fwd]
        labels.update({b.id: f"{r.id}~" for r, b in zip(fwd, back)})
        rules = rules + back
    return rules, labels


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
    output_check: dict = field(default_factory=dict)
    tolerance: float = DEFAULT_TOLERANCE
    output: str | None = None
    search: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    rewritten: bool = True  # False: the original program is what gets written (nothing cheaper, or under min_gain)
    min_gain: float = 0.0  # the least share of the cost a rewrite had to save to be kept
    cost_found: float | None = None  # the search's best graph's cost, kept or not

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
             input_sets: int = 5, method: str = "backtrack", limits=None,
             gate=None, min_gain: float = DEFAULT_MIN_GAIN) -> tuple[Graph, OptimizeReport, SearchResult]:
    """Run the passes up to the numeric check (on ``input_sets`` input sets, the first being
    the model's examples: see :mod:`.outcheck`); raises NumericMismatchError naming the bad
    rewrite. ``method`` ``saturate`` runs equality saturation with ``limits`` (a
    saturate.Limits) and the proof ``gate`` instead of the backtracking search. The model's own
    graph is kept unless the best one found is priced ``min_gain`` (a share) cheaper: a smaller
    predicted gain is within the cost model's error, and never slower comes first."""
    check_min_gain(min_gain)
    rep = OptimizeReport(model.name, cost.device.name, profile_name, tolerance=tolerance, min_gain=min_gain)
    rep.seconds["import"] = round(model.seconds, 3)
    t = time.perf_counter()
    g = eliminate_common_subexpressions(fold_constants(model.graph))
    rep.seconds["fold + merge duplicates"] = round(time.perf_counter() - t, 3)
    rep.nodes_before, rep.cost_before = _running_ops(model.graph), cost.graph_cost(model.graph)
    if method == "saturate":
        from .instance_proofs import InstanceProofs
        from .saturate import Limits, saturate
        gate = gate if gate is not None else InstanceProofs.for_rules(getattr(rules, "source", None))
        res = saturate(g, rules, cost, gate,
                       limits if limits is not None else Limits(seconds=time_limit), labels=getattr(rules, "labels", None))
        gate.flush()
        res.report.instance_proofs = gate.counts()
    else:
        res = search(g, rules, cost, alpha, budget, time_limit, progress, labels=getattr(rules, "labels", None))
    rep.search = res.report.to_json()
    rep.seconds["search"] = round(res.report.seconds["total"], 3)
    t = time.perf_counter()
    found = eliminate_common_subexpressions(fold_constants(res.graph))
    rep.cost_found, best = min(((cost.graph_cost(found), found), (cost.graph_cost(g), g)), key=lambda cg: cg[0])
    saved = rep.cost_before - rep.cost_found
    if saved > 0 and saved >= min_gain * rep.cost_before:
        rep.cost_after = rep.cost_found
    else:  # never slower, nor a gain within the model's error
        best, rep.cost_after = model.graph, rep.cost_before
    rep.rewritten = named_hash(best) != named_hash(model.graph)
    rep.seconds["fold + merge duplicates (after)"] = round(time.perf_counter() - t, 3)
    rep.nodes_after = _running_ops(best)
    t = time.perf_counter()
    check = _check(model, best, tolerance, res, input_sets)
    rep.max_relative_error, rep.output_check = check.worst, check.sets
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


def candidate_module(model: LoadedModel, g: Graph):
    """``g`` as a torch module called like the original model (inputs bound by name)."""
    from ..codegen import to_fx, to_module
    if model.signature is not None:
        return to_module(g, model.signature)
    gm, names = to_fx(g), g.input_names
    order = model.graph.input_names  # the original's positional order

    def call(*args):
        named = dict(zip(order, args))
        return gm(*[named[n] for n in names])
    return call


def _check(model: LoadedModel, best: Graph, tolerance: float, res: SearchResult, input_sets: int):
    from .outcheck import OutputMismatch, check_outputs, make_input_sets
    sets = make_input_sets(model.inputs, model.kwargs, input_sets)
    result = check_outputs(model.reference, candidate_module(model, best), sets, tolerance)
    if isinstance(result, OutputMismatch):
        env = _named_inputs(model, result.args, result.kwargs)
        raise NumericMismatchError(f"{model.name}: the optimized model's outputs differ from the original's: "
                                   f"{result.describe()}, tolerance {tolerance:.0e}; "
                                   f"{_culprit(res, env, tolerance)}; nothing was written")
    return result


def _named_inputs(model: LoadedModel, args, kwargs) -> dict:
    if model.signature is not None:
        return model.signature.named_inputs(args, kwargs)
    return dict(zip(model.graph.input_names, args))


def _culprit(res: SearchResult, env: dict, tolerance: float) -> str:
    """The first rewrite of the best graph's history after which the outputs change (float64,
    inputs bound by name)."""
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

    def bad(k: int) -> bool:
        g = fold_constants(chain[k].to_graph())
        got = [t.numpy() for t in run(g, {n: env[n] for n in g.input_names}, dtype=torch.float64)]
        return relative_error(got, want) > tolerance

    want = [t.numpy() for t in run(g0, {n: env[n] for n in g0.input_names}, dtype=torch.float64)]
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


def write_model(best: Graph, path: str | Path, model: LoadedModel, tolerance: float = DEFAULT_TOLERANCE,
                original: bool = False) -> Path:
    """Export ``best`` as ``.pt2`` (called like the original: same inputs, same output
    structure), load the file back and check that it computes the original, and only then put
    it at ``path`` (atomically: a failure leaves no file and never a truncated one).
    ``original`` (nothing was rewritten): write the model's own program instead, where it has
    one, since regenerated code of the same graph is no faster and can be slower (SqueezeNet b16,
    H100: 2% in eager and in a CUDA graph, the in-place ReLUs gone)."""
    import torch
    from ..fileio import atomic_path
    from ..codegen import save_program, to_exported_program
    from .outcheck import OutputMismatch, check_outputs, make_input_sets
    path = Path(path)
    if original and model.program is not None:
        ep = model.program
    elif model.signature is not None:
        ep = to_exported_program(best, model.inputs, model.signature, model.kwargs)
    else:
        ep = to_exported_program(best, [dict(zip(model.graph.input_names, model.inputs))[n] for n in best.input_names])
    with atomic_path(path) as tmp:
        save_program(ep, tmp)
        loaded = torch.export.load(str(tmp)).module()
        call = loaded if model.signature is not None else _positional(loaded, model.graph, best)
        result = check_outputs(model.reference, call, make_input_sets(model.inputs, model.kwargs, 1), tolerance)
        if isinstance(result, OutputMismatch):
            raise NumericMismatchError(f"{path}: the exported program computes something else than the original "
                                       f"({result.describe()}); nothing was written")
    return path


def _positional(module, original: Graph, best: Graph):
    order = original.input_names
    return lambda *args: module(*[dict(zip(order, args))[n] for n in best.input_names])


def write_onnx(best: Graph, path: str | Path, model: LoadedModel, tolerance: float = DEFAULT_TOLERANCE) -> Path:
    """Write ``best`` as ONNX, import the file back and check it against the original, and only
    then put it at ``path`` (atomically)."""
    from ..codegen import to_fx, to_onnx
    from ..fileio import atomic_path
    from ..frontend.onnx_import import from_onnx
    from .outcheck import OutputMismatch, check_outputs, make_input_sets
    path = Path(path)
    named = _named_inputs(model, model.inputs, model.kwargs)
    with atomic_path(path) as tmp:
        to_onnx(best, tmp, [named[n] for n in best.input_names])
        back, _ = from_onnx(tmp)
        result = check_outputs(model.reference, _positional(to_fx(back), model.graph, back),
                               make_input_sets(model.inputs, model.kwargs, 1), tolerance)
        if isinstance(result, OutputMismatch):
            raise NumericMismatchError(f"{path}: the written ONNX model computes something else than the original "
                                       f"({result.describe()}); nothing was written")
    return path
