"""``superopt optimize``: import a model, search for a cheaper equal graph, check it, export it."""

from __future__ import annotations

import json
from pathlib import Path

from .backtrack import DEFAULT_ALPHA, DEFAULT_BUDGET, DEFAULT_TIME_LIMIT, check_limits
from ..cliargs import add_json, add_quiet, positive_int, print_json, show_progress
from .errors import ModelError
from .pipeline import DEFAULT_MIN_GAIN, DEFAULT_RULES, DEFAULT_TOLERANCE, check_min_gain
from .saturate import DEFAULT_LIMITS, Limits

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("optimize", help="optimize a model (.pt2, .onnx or --zoo NAME) with the proven rules",
                       description="Import a model, search for the cheapest equal graph under the proven rules "
                                   "(equality saturation, or TASO's backtracking search), check its outputs "
                                   "against the original's on several input sets, and write it: a .pt2 that "
                                   "torch.export.load(...).module() "
                                   "runs with the original's inputs, or an .onnx for an .onnx model.")
    p.add_argument("model", nargs="?", help="a torch.export program (.pt2) or an ONNX model (.onnx)")
    p.add_argument("--zoo", metavar="NAME", help="optimize a built-in model instead (see `superopt zoo list`)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="batch size of a --zoo model, or of an ONNX model's symbolic batch axis (default 1)")
    p.add_argument("-o", "--output", help="where to write the optimized model (default MODEL.opt.pt2 / .onnx)")
    p.add_argument("--pt2", metavar="OUT.pt2", help="for an ONNX model: also write a .pt2")
    p.add_argument("--db", "--rules", dest="db", default=DEFAULT_RULES,
                   help=f"rule database (default {DEFAULT_RULES}; --rules is the old name)")
    p.add_argument("--example-rules", action="store_true", help="use the small hand-written rule set instead")
    p.add_argument("--one-way", action="store_true", help="apply rules left to right only (default: both ways)")
    p.add_argument("--exclude-rule", action="append", default=[], metavar="ID", help="leave a rule out (repeatable)")
    p.add_argument("--specialize", action="store_true",
                   help="optimize a program with dynamic shapes at its example sizes (the result is static)")
    p.add_argument("--profile", help="measured operator times: a file from `superopt profile`, or h100 for the "
                                     "shipped H100 profile (default: analytic estimates only)")
    p.add_argument("--device", default="auto", help="device whose costs are modelled: auto (the visible GPU, else this "
                                                    "CPU), cuda, h100, h200, cpu (default auto)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"),
                   help="precision the model will run at; the written model keeps its own dtype (default fp32)")
    p.add_argument("--target", default="inductor", choices=("eager", "cudagraph", "inductor"),
                   help="what runs the result: eager torch, one CUDA graph, or torch.compile/Inductor "
                        "(fusion groups; default)")
    p.add_argument("--no-freezing", dest="freezing", action="store_false",
                   help="inductor target: the result is compiled without torch._inductor.config.freezing (then "
                        "Inductor does not merge sibling matmuls on constant weights itself, and superopt's merges count)")
    p.add_argument("--search", choices=("saturate", "backtrack"), default="saturate",
                   help="equality saturation with extraction by DAG cost (default) or TASO's backtracking search")
    p.add_argument("--iter-limit", type=int, default=DEFAULT_LIMITS.iterations,
                   help=f"saturate: rounds of rule application (default {DEFAULT_LIMITS.iterations})")
    p.add_argument("--node-limit", type=int, default=DEFAULT_LIMITS.nodes,
                   help=f"saturate: e-nodes at most (default {DEFAULT_LIMITS.nodes})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"queue graphs costing under alpha x the best so far (default {DEFAULT_ALPHA})")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help=f"graphs to expand (default {DEFAULT_BUDGET})")
    p.add_argument("--time-limit", "--timeout", dest="time_limit", type=float, default=DEFAULT_TIME_LIMIT,
                   help=f"seconds of search (default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--min-gain", type=float, default=DEFAULT_MIN_GAIN, metavar="SHARE",
                   help="keep the model unchanged unless the optimized graph is priced this share cheaper "
                        f"(default {DEFAULT_MIN_GAIN:g}: smaller predicted gains are within the cost model's error)")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest relative output error accepted (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--report", metavar="REPORT.json", help="also write the full report as JSON to this file")
    add_json(p)
    add_quiet(p)
    p.set_defaults(func=_optimize)


def _output_path(args) -> Path:
    if args.output:
        return Path(args.output)
    if args.zoo:
        return Path(f"{args.zoo}.opt.pt2")
    src = Path(args.model)
    for suffix in (".pt2", ".onnx"):
        if src.name.endswith(suffix):
            return src.with_name(src.name[:-len(suffix)] + ".opt" + suffix)
    return src.with_name(src.name + ".opt.pt2")


def _check_outputs(args, out: Path) -> None:
    """Before any work: the outputs can be written and none of them is the input."""
    from ..fileio import check_writable
    wanted = [out] + [Path(x) for x in (args.pt2, args.report) if x]
    onnx_in = args.model is not None and Path(args.model).suffix.lower() == ".onnx"
    if out.suffix not in (".pt2", ".onnx") or (out.suffix == ".onnx" and not onnx_in):
        raise ModelError(f"{out}: the output must end in .pt2" + (" or .onnx" if onnx_in else ""))
    if args.pt2 and not args.pt2.endswith(".pt2"):
        raise ModelError(f"--pt2 {args.pt2}: the name must end in .pt2")
    for p in wanted:
        check_writable(p)
        if args.model and Path(args.model).exists() and p.resolve() == Path(args.model).resolve():
            raise ModelError(f"{p} is the input model; write the optimized model elsewhere (-o OUT)")
    if len({p.resolve() for p in wanted}) < len(wanted):
        raise ModelError("two outputs have the same name; give each its own file")


def _cost_model(args):
    """The model of the device, precision and target asked for, and a line saying which."""
    from ..cost import choose_cost_model
    return choose_cost_model(args.device, args.dtype, args.target, args.profile, freezing=args.freezing)


def _optimize(args) -> int:
    from .pipeline import load_model, load_rules, optimize, write_model, write_onnx
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 / MODEL.onnx or --zoo NAME (exactly one)")
    check_limits(args.alpha, args.budget, args.time_limit)
    check_min_gain(args.min_gain)
    out = _output_path(args)
    _check_outputs(args, out)
    limits = Limits(iterations=args.iter_limit, nodes=args.node_limit, seconds=args.time_limit)
    limits.check()
    cost, modelled = _cost_model(args)
    rules = load_rules(args.db, args.example_rules, not args.one_way, args.exclude_rule)
    model = load_model(args.model, args.zoo, args.batch_size, specialize=args.specialize)
    best, rep, res = optimize(model, rules, cost, args.alpha, args.budget, args.time_limit, args.tolerance,
                              progress=show_progress(args), profile_name=modelled,
                              method=args.search, limits=limits, min_gain=args.min_gain)
    if out.suffix == ".onnx":
        rep.output = str(write_onnx(best, out, model, args.tolerance))
    else:
        rep.output = str(write_model(best, out, model, args.tolerance, original=not rep.rewritten))
    if args.pt2:
        rep.output += f", {write_model(best, args.pt2, model, args.tolerance, original=not rep.rewritten)}"
    if args.report:
        from ..fileio import write_text
        write_text(args.report, json.dumps(rep.to_json(), indent=2, default=str) + "\n")
    if args.json:
        print_json(rep.to_json())
    else:
        print(_summary(rep, res, rules))
    return 0


def _rule_names(rep, rules) -> str:
    """Applied rules as ``id  one-line form  xN``, most used first."""
    texts = {getattr(rules, "labels", {}).get(r.id, r.id): r.text() for r in rules}
    applied = sorted(rep.search["rules_applied"].items(), key=lambda kv: -kv[1])
    return "\n".join(f"{k} x{v}: {texts.get(k, '?')}" for k, v in applied) or "none"


def _unchanged(rep) -> str:
    """Why the original program was written, if it was."""
    if rep.rewritten:
        return ""
    if rep.cost_found is not None and rep.cost_found < rep.cost_before:
        return (f" (the best graph found is priced {100 * (1 - rep.cost_found / rep.cost_before):.2f}% cheaper, "
                f"under --min-gain {rep.min_gain:g}: the original program, unchanged)")
    return " (nothing priced cheaper: the original program, unchanged)"


def _summary(rep, res, rules=()) -> str:
    from .report import format_table
    s = rep.search
    rows = [
        ("model", f"{rep.model} -> {rep.output}" + _unchanged(rep)),
        ("cost model", rep.profile or rep.device),
        ("operators", f"{rep.nodes_before} -> {rep.nodes_after}"),
        ("cost (us)", f"{rep.cost_before:.2f} -> {rep.cost_after:.2f} "
                      f"({100 * (1 - rep.cost_after / rep.cost_before) if rep.cost_before else 0:.2f}% less)"),
        ("graphs explored", f"{s['explored']} (stopped by {s['stop_reason']}; {s['candidates']} candidates)")
        if "explored" in s else
        ("e-graph", f"{s['enodes']} e-nodes, {s['eclasses']} classes, {s['iterations']} iterations (stopped by "
                    f"{s['stop_reason']}); extracted by {s['extraction']} ({s['ilp_status']})"),
        ("rules applied", _rule_names(rep, rules)),
        ("output check", f"max relative error {rep.max_relative_error:.1e} (tolerance {rep.tolerance:g}) on "
                         f"{len(rep.output_check)} input sets: {', '.join(rep.output_check)}"),
        ("time (s)", ", ".join(f"{k} {v:.2f}" for k, v in rep.seconds.items())),
    ]
    return format_table(rows)
