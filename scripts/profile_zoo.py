"""Measure the H100 profile shipped with superopt: every distinct operator of the zoo models.

    python scripts/profile_zoo.py --out DIR [--batch-sizes 1 8] [--deadline 480] [--device cuda]

For each zoo model and batch size: import it, fold its weights, run the search (the rule
database if there is one, else the hand-written example rules) so that the operators the
optimizer creates (fused, merged, folded) are measured too, then time every distinct operator
of the original and optimized graphs (superopt.cost.measure: CUDA events, warm-up, median,
eager and inside a CUDA graph). Also times each whole model, original and optimized, eagerly
and as a CUDA graph, which shows how much of batch-1 inference is launch overhead (the
imported graph, before the search, is timed through the same code generator as the optimized
one, so that comparison shows the search alone). Writes
``DIR/<device>.json`` (the profile) and ``DIR/zoo_timings.json``; partial results are saved
as it goes, so a run cut short still leaves a usable profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:
    import tqdm  # noqa: F401
except ImportError:  # the device machine may lack it: a do-nothing stand-in
    import importlib.machinery
    import types
    stub = types.ModuleType("tqdm")
    stub.__spec__ = importlib.machinery.ModuleSpec("tqdm", None)
    stub.tqdm = lambda it=None, **kw: type("T", (), {"__iter__": lambda s: iter(it or []), "update": lambda s, n=1: 0,
                                                     "set_postfix": lambda s, **k: 0, "close": lambda s: 0})()
    sys.modules["tqdm"] = stub

import torch  # noqa: E402

from superopt.cost import CostModel  # noqa: E402
from superopt.cost.measure import measure_graphs  # noqa: E402
from superopt.models import ZOO  # noqa: E402


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--models", nargs="+", default=list(ZOO))
    p.add_argument("--deadline", type=float, default=480.0, help="seconds; stop measuring past this")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=int, default=300, help="search budget per model")
    return p.parse_args()


def _rules():
    from superopt.search.pipeline import DEFAULT_RULES, load_rules
    try:
        return load_rules(DEFAULT_RULES), DEFAULT_RULES
    except Exception as e:  # no database here (or it cannot be read): the examples
        print(f"rules: {e}; using the example rules", file=sys.stderr)
        return load_rules(examples=True), "examples"


def _graphs(args, rules, log):
    """name@batch -> (original graph, optimized graph, torch module, inputs)."""
    from superopt.frontend import from_module
    from superopt.models import build
    from superopt.search import search
    from superopt.search.cse import eliminate_common_subexpressions as cse
    from superopt.search.fold import fold_constants
    out = {}
    for bs in args.batch_sizes:
        for name in args.models:
            try:
                module, inputs = build(name, batch_size=bs)
                g = cse(fold_constants(from_module(module, inputs)[0]))
                res = search(g, rules, CostModel("h100"), budget=args.budget, time_limit=20, progress=False)
                out[f"{name}@{bs}"] = (g, cse(fold_constants(res.graph)), module, inputs)
                log[f"{name}@{bs}"] = {"search": res.report.to_json()}
            except Exception as e:
                log[f"{name}@{bs}"] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            print(f"imported {name}@{bs}", file=sys.stderr, flush=True)
    return out


def _time_model(fn, inputs, warmup=5, repeat=20):
    """Median ms of one forward: eager (CUDA events) and replayed as a CUDA graph."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        torch.cuda.synchronize()
        eager = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(*inputs); b.record(); b.synchronize()
            eager.append(a.elapsed_time(b))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*inputs)
        replay = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graph.replay(); b.record(); b.synchronize()
            replay.append(a.elapsed_time(b))
    return round(statistics.median(eager), 4), round(statistics.median(replay), 4)


def _model_timings(graphs, log, deadline):
    from superopt.codegen import to_fx
    for key, (g, best, module, inputs) in graphs.items():
        if time.monotonic() > deadline:
            break
        try:
            dev_in = tuple(x.cuda() for x in inputs)
            row = {"original_ms": _time_model(module.cuda(), dev_in),
                   "imported_ms": _time_model(to_fx(g).cuda(), dev_in),  # the same code path as the optimized
                   "optimized_ms": _time_model(to_fx(best).cuda(), dev_in)}
            row["cost_model_us"] = {"original": round(CostModel("h100").graph_cost(g), 2),
                                    "optimized": round(CostModel("h100").graph_cost(best), 2)}
            log[key]["timings"] = row
            module.cpu()
        except Exception as e:
            log[key]["timing_error"] = f"{type(e).__name__}: {e}"


def main() -> int:
    args = _args()
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rules, rules_name = _rules()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    log: dict = {"torch": torch.__version__, "device": name, "rules": rules_name}
    graphs = _graphs(args, rules, log)
    (out / "zoo_timings.json").write_text(json.dumps(log, indent=1, default=str))
    flat = {}
    for key, (g, best, _, _) in graphs.items():
        flat[key], flat[key + "/optimized"] = g, best
    prof = measure_graphs(flat, args.device, progress=False, deadline=start + args.deadline)
    prof.settings.update(rules=rules_name, batch_sizes=args.batch_sizes, script="scripts/profile_zoo.py")
    prof.save(out / f"{prof.device}.json")
    print(f"profile: {len(prof.entries)} operators, launch overhead {prof.launch_overhead_us} us, "
          f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    _model_timings(graphs, log, start + args.deadline + 60)
    (out / "zoo_timings.json").write_text(json.dumps(log, indent=1, default=str))
    for key, row in log.items():
        if isinstance(row, dict) and "timings" in row:
            print(key, row["timings"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
