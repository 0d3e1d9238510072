"""``superopt optimize``: import a model, run the driver's passes, write what the backend runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..cliargs import (add_json, add_quiet, cores, nonnegative_float, positive_float, positive_int, print_json,
                       share, show_progress)
from ..cost import choose_cost_model
from ..errors import ModelError, ResourceLimitError
from ..fileio import check_writable, write_text
from ..rules.load import DEFAULT_RULES, REVERSED_SUFFIX, load_rules
from ..search.report import format_table
from .model import load_model
from .options import Options
from .pipeline import optimize
from .write import write_model, write_onnx

__all__ = ["register", "set_threads", "DEFAULT_THREADS"]

D = Options()
#: intra-op threads of one ``optimize`` (more gain little on these graphs, and parallel runs on
#: one machine would each take every core)
DEFAULT_THREADS = 4


def register(sub) -> None:
    p = sub.add_parser("optimize", help="optimize a model (.pt2, .onnx or --zoo NAME) with the proven rules",
                       description="Import a model, search for the cheapest equal graph under the proven rules "
                                   "(equality saturation, or TASO's backtracking search), choose the memory layout "
                                   "and fused library calls the cost model prices cheaper, check the outputs "
                                   "against the original's, and write it: a .pt2 that "
                                   "torch.export.load(...).module() runs with the original's inputs (after "
                                   "`import superopt` where it calls superopt's fused ops; --portable for none), "
                                   "or an .onnx for an .onnx model.")
    p.add_argument("model", nargs="?", help="a torch.export program (.pt2) or an ONNX model (.onnx)")
    p.add_argument("--zoo", metavar="NAME", help="optimize a built-in model instead (see `superopt zoo list`)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="batch size of a --zoo model, or of an ONNX model's symbolic batch axis (default 1)")
    p.add_argument("-o", "--output", help="where to write the optimized model (default MODEL.opt.pt2 / .onnx)")
    p.add_argument("--pt2", metavar="OUT.pt2", help="for an ONNX model: also write a .pt2")
    p.add_argument("--portable", action="store_true",
                   help="write a program that needs nothing but torch (no superopt custom ops)")
    p.add_argument("--db", "--rules", dest="db", default=DEFAULT_RULES,
                   help=f"rule database (default {DEFAULT_RULES}; --rules is the old name)")
    p.add_argument("--example-rules", action="store_true", help="use the small hand-written rule set instead")
    p.add_argument("--one-way", action="store_true", help="apply rules left to right only (default: both ways)")
    p.add_argument("--exclude-rule", action="append", default=[], metavar="ID",
                   help=f"leave a rule out (repeatable; ID{REVERSED_SUFFIX}: only its right-to-left use)")
    p.add_argument("--specialize", action="store_true",
                   help="optimize a program with dynamic shapes at its example sizes (the result is static)")
    _cost_args(p)
    _search_args(p)
    p.add_argument("--min-gain", type=share, default=D.min_gain, metavar="SHARE",
                   help="keep the model unchanged unless the optimized graph is priced this share cheaper "
                        f"(default {D.min_gain:g}: smaller predicted gains are within the cost model's error)")
    p.add_argument("--tolerance", type=nonnegative_float, default=D.tolerance,
                   help=f"largest relative output error accepted (default {D.tolerance:g})")
    p.add_argument("--input-sets", type=positive_int, default=D.input_sets, choices=range(1, 6), metavar="N",
                   help=f"input sets of the output check, 1 to 5 (default {D.input_sets}: the examples and a "
                        f"random draw; the rules are proven, the check is the safety net)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help=f"intra-op threads (default min({DEFAULT_THREADS}, cores), so parallel runs share the machine)")
    p.add_argument("--report", metavar="REPORT.json", help="also write the full report as JSON to this file")
    add_json(p)
    add_quiet(p)
    p.set_defaults(func=_optimize)


def _cost_args(p) -> None:
    p.add_argument("--profile", help="measured operator times: a file from `superopt profile`, or h100 for the "
                                     "shipped H100 profile (default: the shipped profile of --device if any)")
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
    p.add_argument("--layout", choices=("choose", "inductor"), default=D.layout,
                   help="convolution memory layout: the one the profile prices cheaper (default), or Inductor's rule")


def _search_args(p) -> None:
    p.add_argument("--search", choices=("saturate", "backtrack"), default=D.search,
                   help="equality saturation with extraction by DAG cost (default) or TASO's backtracking search")
    p.add_argument("--iter-limit", type=positive_int, default=D.iterations,
                   help=f"saturate: rounds of rule application (default {D.iterations})")
    p.add_argument("--node-limit", type=positive_int, default=D.nodes,
                   help=f"saturate: e-nodes at most (default {D.nodes})")
    p.add_argument("--alpha", type=float, default=D.alpha,
                   help=f"backtrack: queue graphs costing under alpha x the best so far (default {D.alpha})")
    p.add_argument("--budget", type=positive_int, default=D.budget,
                   help=f"backtrack: graphs to expand (default {D.budget})")
    p.add_argument("--time-limit", "--timeout", dest="time_limit", type=positive_float, default=D.time_limit,
                   help=f"seconds of search (default {D.time_limit:g})")


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


def set_threads(threads: int | None) -> int:
    """Intra-op threads of this process: ``threads`` (at most the cores), else min(4, cores)."""
    n = min(DEFAULT_THREADS, cores()) if threads is None else threads
    if n > cores():
        raise ResourceLimitError(f"--threads {n} on a machine with {cores()} cores; give at most {cores()}")
    torch.set_num_threads(n)
    return n


def _options(args) -> Options:
    return Options(search=args.search, iterations=args.iter_limit, nodes=args.node_limit, time_limit=args.time_limit,
                   alpha=args.alpha, budget=args.budget, min_gain=args.min_gain, tolerance=args.tolerance,
                   input_sets=args.input_sets, layout=args.layout, portable=args.portable,
                   progress=show_progress(args)).check()


def _phase(args, name: str) -> None:
    if show_progress(args):
        print(f"superopt: {name}...", file=sys.stderr, flush=True)


def _optimize(args) -> int:
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 / MODEL.onnx or --zoo NAME (exactly one)")
    opts = _options(args)
    set_threads(args.threads)
    out = _output_path(args)
    _check_outputs(args, out)
    cost, modelled = choose_cost_model(args.device, args.dtype, args.target, args.profile, freezing=args.freezing,
                                       layout=args.layout, conv_relu=not args.portable)
    _phase(args, "loading rules")
    rules = load_rules(args.db, args.example_rules, not args.one_way, args.exclude_rule)
    _phase(args, "importing the model")
    model = load_model(args.model, args.zoo, args.batch_size, specialize=args.specialize)
    res = optimize(model, rules, cost, opts, dtype=args.dtype, profile_name=modelled)
    _phase(args, "writing")
    rep = res.report
    if out.suffix == ".onnx":
        rep.output = str(write_onnx(res, out, args.tolerance))
    else:
        rep.output = str(write_model(res, out, args.tolerance))
    if args.pt2:
        rep.output += f", {write_model(res, args.pt2, args.tolerance)}"
    if args.report:
        write_text(args.report, json.dumps(rep.to_json(), indent=2, default=str) + "\n")
    if args.json:
        print_json(rep.to_json())
    else:
        print(_summary(res, rules))
    return 0


def _rule_names(rep, rules) -> str:
    """Applied rules as ``id xN: one-line form``, most used first."""
    texts = {getattr(rules, "labels", {}).get(r.id, r.id): r.text() for r in rules}
    applied = sorted(rep.search.get("rules_applied", {}).items(), key=lambda kv: -kv[1])
    lines = [f"{k} x{v}: {texts.get(k, '?')}" for k, v in applied]
    if any(k.endswith(REVERSED_SUFFIX) for k, _ in applied):
        lines.append(f"(ID{REVERSED_SUFFIX}: rule ID applied right to left; `superopt rules show ID{REVERSED_SUFFIX}`)")
    return "\n".join(lines) or "none"


def _unchanged(res) -> str:
    """Why the original program was written, if it was."""
    rep = res.report
    if not res.unchanged:
        return ""
    if rep.cost_found is not None and rep.cost_found < rep.cost_before:
        return (f" (the best graph found is priced {100 * (1 - rep.cost_found / rep.cost_before):.2f}% cheaper, "
                f"under --min-gain {rep.min_gain:g}: the original program, unchanged)")
    return " (nothing priced cheaper: the original program, unchanged)"


def _code(res) -> str:
    """The layout and library-call choice, and what loading the written program needs."""
    lay, plan = res.report.layout, res.plan
    if not lay:
        text = "Inductor's own layout"
    elif not lay["kept"]:
        text = (f"Inductor's own layout (the chosen one is priced {lay['cost_chosen_us']:.2f} us against "
                f"{lay['cost_inductor_rule_us']:.2f}: within --min-gain)")
    else:
        text = (f"{'channels-last' if plan.channels_last else 'NCHW'} convolutions, {len(plan.conv_relu)} fused "
                f"cuDNN conv+bias+residual+ReLU calls")
    ops = res.report.custom_ops
    return text + (f"; loading needs `import superopt` ({', '.join(ops)}; --portable for none)" if ops else "")


def _summary(res, rules=()) -> str:
    rep, s = res.report, res.report.search
    rows = [
        ("model", f"{rep.model} -> {rep.output}" + _unchanged(res)),
        ("cost model", rep.profile or rep.device),
        ("operators", f"{rep.nodes_before} -> {rep.nodes_after}"),
        ("cost (us)", f"{rep.cost_before:.2f} -> {rep.cost_after:.2f} "
                      f"({100 * (1 - rep.cost_after / rep.cost_before) if rep.cost_before else 0:.2f}% less)"),
        ("graphs explored", f"{s['explored']} (stopped by {s['stop_reason']}; {s['candidates']} candidates)")
        if "explored" in s else
        ("e-graph", f"{s['enodes']} e-nodes, {s['eclasses']} classes, {s['iterations']} iterations (stopped by "
                    f"{s['stop_reason']}); extracted by {s['extraction']} ({s['ilp_status']})"),
        ("rules applied", _rule_names(rep, rules)),
        ("code", _code(res)),
        ("output check", f"max relative error {rep.max_relative_error:.1e} (tolerance {rep.tolerance:g}) on "
                         f"{len(rep.output_check)} input sets: {', '.join(rep.output_check)}"),
        ("passes", ", ".join(rep.passes)),
        ("time (s)", ", ".join(f"{k} {v:.2f}" for k, v in rep.seconds.items())),
    ]
    return format_table(rows)
