"""``superopt profile``: measure every distinct operator of a model on this machine with torch."""

from __future__ import annotations

import re

from ..cliargs import add_json, add_quiet, positive_int, show_progress
from .errors import CostError

__all__ = ["register", "model_graph"]


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure a model's operators on this machine (a cost profile)",
                       description="Time every distinct operator of a model (operator, attributes, input "
                                   "shapes, dtype) with torch: median of several runs after a warm-up, eager "
                                   "and, on CUDA, inside a CUDA graph (the kernel alone, without launch "
                                   "overhead). The result is a profile file for `superopt optimize --profile`.")
    p.add_argument("model", nargs="?", help="a torch.export program (.pt2)")
    p.add_argument("--zoo", metavar="NAME", action="append", help="a built-in model instead (repeatable)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="batch size of --zoo models (default 1)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to measure (default cuda)")
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16"), default="fp32",
                   help="precision to measure at (fp32: TF32 off; default fp32)")
    p.add_argument("-o", "--output", required=True, help="profile file to write (JSON)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--repeat", type=int, default=15, help="timed samples; the median is kept (default 15)")
    p.add_argument("--inner", type=int, default=10, help="calls per sample (default 10)")
    add_json(p)
    add_quiet(p)
    p.set_defaults(func=_profile)


def model_graph(path: str | None = None, zoo: str | None = None, batch_size: int = 1):
    """The IR graph of a ``.pt2`` file or of a zoo model."""
    from ..frontend import from_exported_program, from_module, load_pt2
    if zoo is not None:
        from ..models import build
        module, inputs = build(zoo, batch_size=batch_size)
        return from_module(module, inputs, source=f"zoo:{zoo}")[0]
    return from_exported_program(load_pt2(path), source=str(path))[0]


def _profile(args) -> int:
    from .measure import measure_graphs
    if (args.model is None) == (not args.zoo):
        raise CostError("give a MODEL.pt2 or --zoo NAME (not both)")
    if min(args.warmup, args.repeat - 1, args.inner - 1) < 0:
        raise CostError("--repeat and --inner must be at least 1, --warmup at least 0")
    from ..fileio import check_writable
    check_writable(args.output, "profile")  # before measuring, not after
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise CostError("torch sees no CUDA device here; profile with --device cpu, or run on a GPU machine")
    if args.model is not None:
        graphs = {args.model: model_graph(args.model)}
    else:
        graphs = {f"{z}@{args.batch_size}": model_graph(zoo=z, batch_size=args.batch_size) for z in args.zoo}
    prof = measure_graphs(graphs, args.device, args.warmup, args.repeat, args.inner,
                          progress=show_progress(args), precision=args.dtype)
    prof.save(args.output)
    summary = _summary(prof, args.output)
    if args.json:
        from ..cliargs import print_json
        print_json({re.sub(r"[^a-z0-9]+", "_", k.lower()).strip("_"): v for k, v in summary.items()})
    else:
        w = max(map(len, summary))
        print("\n".join(f"{k:<{w}}  {v}" for k, v in summary.items()))
    return 0


def _summary(prof, path) -> dict:
    eager = sum(e.eager_us for e in prof.entries.values())
    graph = [e.graph_us for e in prof.entries.values() if e.graph_us is not None]
    return {
        "profile": str(path),
        "device": f"{prof.device} ({prof.device_name})",
        "torch": prof.torch_version,
        "precision": prof.precision,
        "distinct operators": len(prof.entries),
        "sum of eager times (us)": round(eager, 2),
        "sum of CUDA-graph times (us)": round(sum(graph), 2) if graph else "n/a (CPU)",
        "launch overhead (us, median)": prof.launch_overhead_us if prof.launch_overhead_us is not None else "n/a (CPU)",
    }
