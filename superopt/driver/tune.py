"""``superopt tune MODEL --device cuda``: measure superopt's kernels for a model's own shapes.

The regions tuned are those of the graph the driver's search returns (fold and merge, the
search, keep if cheaper: the passes before the kernel pass), since the kernel pass looks each of
that graph's regions up in the profile; tuning the imported graph measured regions the search
had already changed (a norm weight folded into the next linear), and nothing was chosen.
Generation, verification and timing: :func:`superopt.kernel.model_tuning.tune_graph`.
"""

from __future__ import annotations

import sys

import torch

from ..cliargs import print_json
from ..cost import choose_cost_model
from ..errors import ModelError
from ..fileio import check_writable
from ..kernel import model_tuning
from ..kernel.tune import TuneError
from ..rules.load import load_rules
from .model import LoadedModel, load_model
from .options import Options
from .passes import PASSES
from .pipeline import optimize

__all__ = ["run_tune", "searched_graph"]


def searched_graph(model: LoadedModel, dtype: str = "bf16", cost_device: str = "h100"):
    """The graph the driver's kernel pass sees for ``model``."""
    cost, _ = choose_cost_model(cost_device, dtype)
    kernel_pass = next(i for i, p in enumerate(PASSES) if p.name == "kernels")
    return optimize(model, load_rules(), cost, Options(input_sets=1), passes=PASSES[:kernel_pass], dtype=dtype).graph


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def run_tune(args) -> int:
    """The command: a CUDA device, the model, its searched graph, then the kernel tuning."""
    if not _has_cuda():
        raise TuneError("superopt tune needs a CUDA device; run it on a GPU machine (elsewhere the shipped "
                        "H100 kernel profile decides)")
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 or --zoo NAME (not both)")
    check_writable(args.output, "kernel profile")
    quiet = args.json
    if not quiet:
        print(f"superopt: searching the graph of {args.model or args.zoo}...", file=sys.stderr, flush=True)
    graph = searched_graph(load_model(args.model, args.zoo, args.batch_size), args.dtype, args.cost_device)
    if not quiet:
        print("superopt: generating and tuning its kernels (minutes)...", file=sys.stderr, flush=True)
    line = model_tuning.tune_line
    prof, rows = model_tuning.tune_graph(graph, args.dtype, args.workers, args.repeat,
                                         log=(lambda r: None) if quiet else (lambda r: print(line(r), flush=True)))
    prof.save(args.output)
    if args.json:
        print_json({"profile": args.output, "regions": rows})
    else:
        print(f"{len(rows)} regions, {len(prof.entries)} kernels measured; wrote {args.output}")
    return 0
