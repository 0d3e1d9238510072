"""``superopt optimize`` and ``superopt tune``: their arguments (the work is in :mod:`.command` and
:mod:`.tune`, imported when the command runs, so that ``superopt --help`` does not wait for torch)."""

from __future__ import annotations

import argparse

from ..cliargs import add_json, add_quiet, nonnegative_float, positive_float, positive_int, share
from ..rules.load import DEFAULT_RULES, REVERSED_SUFFIX
from .idle import METER
from .options import DEFAULT_THREADS, Options, output_path

__all__ = ["register"]

D = Options()


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
    p.add_argument("--kernel-profile", metavar="PROFILE.json",
                   help="kernel timings `superopt tune` measured, read on top of the shipped H100 profile "
                        "(also: SUPEROPT_KERNEL_PROFILE)")
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
                   help=f"input sets of the output check, 1 to 5 (default {D.input_sets}: the examples, run "
                        f"through the whole model, and a random draw, run through the rewritten regions)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help=f"intra-op threads, at most the cores (default: this run's share of the cores among the "
                        f"tasks running now, at most {DEFAULT_THREADS}, so that parallel runs share the machine)")
    p.add_argument("--report", metavar="REPORT.json", help="also write the full report as JSON to this file")
    add_json(p)
    add_quiet(p)
    p.set_defaults(func=_optimize, end_at_once=True)  # superopt.cli.end_process: no interpreter teardown
    _register_tune(sub)


def _register_tune(sub) -> None:
    p = sub.add_parser("tune", help="measure superopt's fused kernels for a model on this GPU (a kernel profile)",
                       description="Search the model's graph as `superopt optimize` does, then generate, verify and "
                                   "time superopt's fused kernels for every region of the result (norm -> linear, "
                                   "gate/up, attention) against Inductor's code for the same region, and write the "
                                   "winners as a kernel profile (JSON).")
    p.add_argument("model", nargs="?", help="a torch.export program (.pt2)")
    p.add_argument("--zoo", metavar="NAME", help="a built-in model instead")
    p.add_argument("--batch-size", type=positive_int, default=1, help="batch size of a --zoo model (default 1)")
    p.add_argument("--device", choices=("cuda",), default="cuda", help="where to measure (only cuda)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                   help="precision (default auto: a program's own, as `optimize`'s; bf16 for a --zoo model, built "
                        "in float32)")
    p.add_argument("--cost-device", default="h100",
                   help="the device the graph search prices for, as `optimize --device` (default h100)")
    p.add_argument("-o", "--output", default="kernel-profile.json", help="profile to write (default kernel-profile.json)")
    p.add_argument("--workers", type=positive_int, default=8, help="compile/generate processes (default 8)")
    p.add_argument("--repeat", type=positive_int, default=50, help="timed replays per kernel (default 50)")
    p.add_argument("--in-model", action=argparse.BooleanOptionalAction, default=True,
                   help="then time the whole model with and without the kernels and keep the set that makes it "
                        "faster (the profile's model verdict; default on)")
    p.add_argument("--row-kernels", action="store_true",
                   help="also tune row-owning kernels (a linear, its residual add and the next LayerNorm in one "
                        "kernel); off by default: on an H100 they ran 2.4-2.6x slower than Inductor's code")
    p.add_argument("--model-budget", type=positive_float, default=180.0, metavar="SECONDS",
                   help="time for the whole-model timing's kernel sets (default 180)")
    p.add_argument("--db", metavar="RULES.db",
                   help="also store the measured kernels as kernel rules in this rule database (created if "
                        "missing): `superopt rules list --kernels --db RULES.db` shows them")
    add_json(p)
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from .tune import run_tune  # torch, the search and the kernel level: only when the command runs
    return run_tune(args)


def _optimize(args) -> int:
    METER.mark()  # the idle cores are measured from here (spare_core: what goes beside the run)
    from .aside import raise_if_terminated, terminate_as_interrupt  # torch: SIGTERM acts as Ctrl-C does
    with terminate_as_interrupt():
        ahead = None
        if args.zoo is not None and args.model is None and args.batch_size == 1:
            # the zoo: the model's weights drawn, or the model exported, beside the imports below
            from .ahead import start_ahead
            ahead = start_ahead(args.zoo, output_path(args))
        try:
            from .command import run_optimize  # torch and the whole pipeline: only when the command runs
            raise_if_terminated()  # a SIGTERM in the imports above
            return run_optimize(args, ahead)
        finally:
            if hasattr(ahead, "discard"):
                ahead.discard()
            if ahead is not None:  # a build still under way (an interrupt, an early error) ends first
                ahead.join()


def _cost_args(p) -> None:
    p.add_argument("--profile", help="measured operator times: a file from `superopt profile`, or h100 for the "
                                     "shipped H100 profile (default: the shipped profile of --device if any)")
    p.add_argument("--device", default="auto", help="device whose costs are modelled: auto (the visible GPU, else this "
                                                    "CPU), cuda, h100, h200, cpu (default auto)")
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "tf32", "bf16", "fp16"),
                   help="precision the model will run at: auto takes the program's own (bf16 or fp16 where its "
                        "floating inputs or weights are, else fp32); the written model keeps its own dtype "
                        "(default auto)")
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
    p.add_argument("--iter-limit", type=int, default=D.iterations,
                   help=f"saturate: rounds of rule application (default {D.iterations})")
    p.add_argument("--node-limit", type=int, default=D.nodes,
                   help=f"saturate: e-nodes at most (default {D.nodes})")
    p.add_argument("--alpha", type=float, default=D.alpha,
                   help=f"backtrack: queue graphs costing under alpha x the best so far (default {D.alpha})")
    p.add_argument("--budget", type=positive_int, default=D.budget,
                   help=f"backtrack: graphs to expand (default {D.budget})")
    p.add_argument("--time-limit", "--timeout", dest="time_limit", type=positive_float, default=D.time_limit,
                   help=f"seconds of search (default {D.time_limit:g})")


