"""Measure the GPU profiles shipped with superopt: every distinct operator of the zoo models,
per precision and batch size.

    python scripts/profile_zoo.py --out DIR [--precisions fp32 tf32 bf16] [--batch-sizes 1 8 16 32]
                                  [--workers 12] [--deadline 520]

For each zoo model and batch size (in a pool of worker processes): import it, fold its weights,
run the search under the CUDA-graph and the Inductor cost models (fp32; Inductor also bf16) (the shipped rule database,
else the hand-written example rules), so that the operators the optimizer creates (merged,
widened, folded) are measured too. Then, for each precision (``fp32`` with TF32 off,
``tf32``, ``bf16``), time every distinct operator of those graphs (superopt.cost.measure: CUDA
events, warm-up, median; eager, and inside a CUDA graph for the kernel alone). Writes
``DIR/<device>-<precision>.json`` (copy them to superopt/cost/profiles/) and
``DIR/profile_log.json``; each profile is saved as soon as it is measured, and past
``--deadline`` seconds the remaining operators are left out (the profile says how many).

    python scripts/profile_zoo.py --out DIR --convs PROFILE.json ...

measures every convolution of existing profiles again (NCHW and channels-last, alone and as
cuDNN's fused convolution + bias + ReLU, weights cold: superopt.cost.measure) and writes them to
DIR, without measuring the rest again;
``--graph-times PROFILE.json ...`` measures again the CUDA-graph time of every other operator
(per call, the graph's launch left out) and a matmul's time as ``F.linear`` with a bias, then the
generated-kernel line, and writes them to DIR;
``--generated-kernels PROFILE.json ...`` measures the line that prices Inductor's generated
kernels (``settings.generated_kernel_line``).

    python scripts/profile_zoo.py --out DIR --ops-from PROFILE.json --precisions fp16

measures the operators of an existing profile at other precisions, without searching the zoo
again.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _args():
    from superopt.models import ZOO
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--precisions", nargs="+", default=["fp32", "tf32", "bf16"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--models", nargs="+", default=list(ZOO))
    p.add_argument("--workers", type=int, default=max(1, min(12, mp.cpu_count() - 2)))
    p.add_argument("--deadline", type=float, default=520.0, help="seconds; stop measuring past this")
    p.add_argument("--time-limit", type=float, default=15.0, help="seconds of search per model and mode")
    # what the shipped profiles' graph times were taken with: at --inner 5 a graph time (the
    # difference of replays of 5 and 10 calls, over 5) came out at 6 ns for a 24 KB kernel
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--convs", nargs="+", default=None, metavar="PROFILE",
                   help="only measure these profiles' convolutions again")
    p.add_argument("--graph-times", nargs="+", default=None, metavar="PROFILE",
                   help="only measure these profiles' CUDA-graph times of operators but convolutions again")
    p.add_argument("--generated-kernels", nargs="+", default=None, metavar="PROFILE",
                   help="only add the time line of Inductor's generated kernels to these profiles")
    p.add_argument("--ops-from", metavar="PROFILE",
                   help="measure this profile's operators at --precisions instead of searching the zoo for them")
    return p.parse_args()


def _remeasure_convs(paths, args, out: Path) -> int:
    """Measure the convolutions of existing profiles again, each saved to ``out`` as soon as it
    is measured."""
    from superopt.cost.measure import measure_convs
    from superopt.cost.profile import load_profile
    start = time.monotonic()
    for path in paths:
        t0 = time.monotonic()
        prof = load_profile(path)
        n = measure_convs(prof, repeat=args.repeat, progress=False, deadline=start + args.deadline)
        prof.save(out / Path(path).name)
        print(f"{path}: {n} convolutions measured in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return 0


def _remeasure_graph_times(paths, args, out: Path) -> int:
    """Measure the CUDA-graph times of existing profiles again (convolutions kept), then their
    generated-kernel line; each saved to ``out`` as soon as it is measured."""
    from superopt.cost.measure import measure_generated_kernels, measure_graph_times
    from superopt.cost.profile import load_profile
    start = time.monotonic()
    for path in paths:
        t0 = time.monotonic()
        prof = load_profile(path)
        n = measure_graph_times(prof, repeat=args.repeat, inner=args.inner, progress=False,
                                deadline=start + args.deadline)
        fit = measure_generated_kernels(prof, repeat=args.repeat, inner=args.inner)
        prof.save(out / Path(path).name)
        print(f"{path}: {n} operators measured in {time.monotonic() - t0:.0f} s; launch "
              f"{prof.launch_overhead_us} us; generated kernels {fit}", file=sys.stderr, flush=True)
    return 0


def _rules():
    from superopt.rules.load import DEFAULT_RULES, load_rules
    try:
        return load_rules(DEFAULT_RULES), "default"
    except Exception as e:  # no database here (or it cannot be read): the examples
        print(f"rules: {e}; using the example rules", file=sys.stderr)
        return load_rules(examples=True), "examples"


def _ops_of(task):
    """One (model, batch): the distinct operators of its imported and optimized graphs."""
    name, bs, time_limit = task
    import torch
    torch.set_num_threads(1)
    from superopt.cost import CostModel, shipped_profile
    from superopt.cost.measure import distinct_ops
    from superopt.frontend import from_module
    from superopt.models import build
    from superopt.search import search
    from superopt.search.cse import eliminate_common_subexpressions as cse
    from superopt.search.fold import fold_constants
    key = f"{name}@{bs}"
    try:
        rules, _ = _rules()
        module, inputs = build(name, batch_size=bs)
        g = cse(fold_constants(from_module(module, inputs)[0]))
        graphs, log = {key: g}, {}
        # the searches the backend and the benchmark run: what they create must be measured
        # (a convolution the profile lacks is priced by the roofline, which can be far off)
        for mode, prec in (("graph", "fp32"), ("inductor", "fp32"), ("inductor", "bf16")):
            res = search(g, rules, CostModel("h100", shipped_profile(f"h100-{prec}"), mode=mode), budget=300,
                         time_limit=time_limit, progress=False)
            graphs[f"{key}/{mode}/{prec}"] = cse(fold_constants(res.graph))
            log[f"{mode}/{prec}"] = res.report.to_json()["rules_applied"]
        return key, distinct_ops(graphs), log
    except Exception as e:
        return key, {}, {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}


def _ops_from(path) -> dict:
    """The operators of an existing profile, as :func:`superopt.cost.measure.distinct_ops` lists them."""
    from superopt.cost.profile import load_profile
    from superopt.ir import TensorType
    prof = load_profile(path)
    return {k: (e.op, dict(e.attrs), [TensorType(tuple(s), "float32") for s in e.inputs], list(e.models))
            for k, e in prof.entries.items()}


def _collect(args, log):
    tasks = [(m, bs, args.time_limit) for bs in args.batch_sizes for m in args.models]
    ops: dict = {}
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for key, found, info in pool.imap_unordered(_ops_of, tasks):
            log["models"][key] = info
            for k, (op, attrs, ins, models) in found.items():
                have = ops.setdefault(k, (op, attrs, ins, []))
                have[3].extend(m for m in models if m not in have[3])
            print(f"searched {key}: {len(found)} operators", file=sys.stderr, flush=True)
    return ops


def _measure(ops, precision, args, deadline):
    """One precision's profile of the collected operators."""
    from superopt.cost.measure import measure_graphs
    prof = measure_graphs({}, "cuda", warmup=3, repeat=args.repeat, inner=args.inner, progress=False,
                          deadline=deadline, precision=precision, ops=ops)
    prof.settings.update(models=sorted({m for *_, ms in ops.values() for m in ms}), batch_sizes=args.batch_sizes,
                         script="scripts/profile_zoo.py")
    return prof


def main() -> int:
    args = _args()
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from superopt.cost.measure import measure_generated_kernels
    if args.convs:
        return _remeasure_convs(args.convs, args, out)
    if args.graph_times:
        return _remeasure_graph_times(args.graph_times, args, out)
    if args.generated_kernels:
        from superopt.cost.profile import load_profile
        for path in args.generated_kernels:
            prof = load_profile(path)
            fit = measure_generated_kernels(prof, repeat=args.repeat, inner=args.inner)
            prof.save(out / Path(path).name)
            print(f"{path}: generated kernels {fit}", file=sys.stderr, flush=True)
        return 0
    import torch
    log: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
                 "models": {}, "profiles": {}}
    ops = _ops_from(args.ops_from) if args.ops_from else _collect(args, log)
    log["ops_from"] = args.ops_from
    log["seconds_search"] = round(time.monotonic() - start, 1)
    print(f"{len(ops)} distinct operators after {log['seconds_search']} s", file=sys.stderr, flush=True)
    left = args.deadline - (time.monotonic() - start)
    for k, precision in enumerate(args.precisions):
        t0 = time.monotonic()
        share = left / (len(args.precisions) - k)
        prof = _measure(ops, precision, args, t0 + share)
        prof.save(out / f"{prof.device}-{precision}.json")
        spent = time.monotonic() - t0
        left -= spent
        log["profiles"][precision] = {"entries": len(prof.entries), "seconds": round(spent, 1),
                                      "launch_overhead_us": prof.launch_overhead_us,
                                      "left_out": prof.settings.get("left_out_past_deadline", 0)}
        print(f"{precision}: {len(prof.entries)} operators, launch {prof.launch_overhead_us} us, {spent:.0f} s",
              file=sys.stderr, flush=True)
        (out / "profile_log.json").write_text(json.dumps(log, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
