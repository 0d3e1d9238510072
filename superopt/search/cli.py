"""``superopt optimize``: import a model, search for a cheaper equal graph, check it, export it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .backtrack import DEFAULT_ALPHA, DEFAULT_BUDGET, DEFAULT_TIME_LIMIT, check_limits
from .errors import ModelError
from .pipeline import DEFAULT_RULES, DEFAULT_TOLERANCE
from .saturate import DEFAULT_LIMITS, Limits

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("optimize", help="optimize a model (.pt2 or --zoo NAME) with the proven rules",
                       description="Import a model, search for the cheapest equal graph under the proven rules "
                                   "(TASO's backtracking search), check its outputs against the original's, and "
                                   "write it as a .pt2 that torch.export.load(...).module() runs.")
    p.add_argument("model", nargs="?", help="a torch.export program (.pt2)")
    p.add_argument("--zoo", metavar="NAME", help="optimize a built-in model instead (see `superopt zoo list`)")
    p.add_argument("--batch-size", type=int, default=1, help="batch size of a --zoo model (default 1)")
    p.add_argument("-o", "--output", help="where to write the optimized .pt2 (default MODEL.opt.pt2)")
    p.add_argument("--rules", default=DEFAULT_RULES, help=f"rule database (default {DEFAULT_RULES})")
    p.add_argument("--example-rules", action="store_true", help="use the small hand-written rule set instead")
    p.add_argument("--one-way", action="store_true", help="apply rules left to right only (default: both ways)")
    p.add_argument("--exclude-rule", action="append", default=[], metavar="ID", help="leave a rule out (repeatable)")
    p.add_argument("--profile", help="measured operator times: a file from `superopt profile`, or h100 for the "
                                     "shipped H100 profile (default: analytic estimates only)")
    p.add_argument("--device", default="h100", help="device whose costs are modelled (h100, h200, cpu; default h100)")
    p.add_argument("--search", choices=("saturate", "backtrack"), default="saturate",
                   help="equality saturation with optimal extraction (default) or TASO's backtracking search")
    p.add_argument("--iter-limit", type=int, default=DEFAULT_LIMITS.iterations,
                   help=f"saturate: rounds of rule application (default {DEFAULT_LIMITS.iterations})")
    p.add_argument("--node-limit", type=int, default=DEFAULT_LIMITS.nodes,
                   help=f"saturate: e-nodes at most (default {DEFAULT_LIMITS.nodes})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"queue graphs costing under alpha x the best so far (default {DEFAULT_ALPHA})")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help=f"graphs to expand (default {DEFAULT_BUDGET})")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT,
                   help=f"seconds of search (default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest relative output error accepted (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--report", help="also write the full report as JSON to this file")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_optimize)


def _output_path(args) -> Path:
    if args.output:
        return Path(args.output)
    if args.zoo:
        return Path(f"{args.zoo}.opt.pt2")
    src = Path(args.model)
    return src.with_name(src.name[:-4] + ".opt.pt2" if src.name.endswith(".pt2") else src.name + ".opt.pt2")


def _cost_model(args):
    """The device's analytic model, with a profile file or a shipped profile by name (h100)."""
    from ..cost import CostModel, open_profile
    return CostModel(args.device, open_profile(args.profile, args.device) if args.profile else None)


def _optimize(args) -> int:
    from .pipeline import load_model, load_rules, optimize, write_model
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 or --zoo NAME (exactly one)")
    check_limits(args.alpha, args.budget, args.time_limit)
    limits = Limits(iterations=args.iter_limit, nodes=args.node_limit, seconds=args.time_limit)
    limits.check()
    cost = _cost_model(args)
    rules = load_rules(args.rules, args.example_rules, not args.one_way, args.exclude_rule)
    model = load_model(args.model, args.zoo, args.batch_size)
    best, rep, res = optimize(model, rules, cost, args.alpha, args.budget, args.time_limit, args.tolerance,
                              progress=not args.no_progress and sys.stderr.isatty(), profile_name=args.profile,
                              method=args.search, limits=limits)
    out = write_model(best, _output_path(args), model, args.tolerance)
    rep.output = str(out)
    if args.report:
        Path(args.report).write_text(json.dumps(rep.to_json(), indent=2, default=str) + "\n")
    if args.json:
        from ..cli import print_json
        print_json(rep.to_json())
    else:
        print(_summary(rep, res))
    return 0


def _summary(rep, res) -> str:
    from .report import format_table
    s = rep.search
    rows = [
        ("model", f"{rep.model} -> {rep.output}"),
        ("cost model", f"{rep.device}" + (f" + profile {rep.profile}" if rep.profile else " (analytic)")),
        ("operators", f"{rep.nodes_before} -> {rep.nodes_after}"),
        ("cost (us)", f"{rep.cost_before:.2f} -> {rep.cost_after:.2f} "
                      f"({100 * (1 - rep.cost_after / rep.cost_before) if rep.cost_before else 0:.2f}% less)"),
        ("graphs explored", f"{s['explored']} (stopped by {s['stop_reason']}; {s['candidates']} candidates)")
        if "explored" in s else
        ("e-graph", f"{s['enodes']} e-nodes, {s['eclasses']} classes, {s['iterations']} iterations (stopped by "
                    f"{s['stop_reason']}); extracted by {s['extraction']} ({s['ilp_status']})"),
        ("rules applied", ", ".join(f"{k} x{v}" for k, v in sorted(s["rules_applied"].items(),
                                                                 key=lambda kv: -kv[1])) or "none"),
        ("output check", f"max relative error {rep.max_relative_error:.1e} (tolerance {rep.tolerance:g})"),
        ("time (s)", ", ".join(f"{k} {v:.2f}" for k, v in rep.seconds.items())),
    ]
    return format_table(rows)
