"""GPU benchmark of what `superopt optimize` writes: the `.pt2` against the original module.

    python scripts/bench_optimize.py --out DIR [--models squeezenet1_1 resnet50 ...] [--batch-size 1]
                                     [--dtype fp32] [--device h100] [--repeat 40]

``scripts/bench_gpu.py`` measures the ``superopt`` backend; this measures the command a user runs
on a model they then compile themselves. For each zoo model: ``superopt optimize --zoo M`` with
its defaults (the Inductor model with Inductor's layout rule, saturation) at ``--dtype``, every
model in a process of its own at once; then, one model at a time on the GPU, at that precision
(fp32 with TF32 off, TF32, or both modules cast to bf16 / fp16: the written program keeps the
model's dtype), the original module and the written program:

* ``eager`` (the call queued behind a long GPU sleep: GPU time, not the CPU's issue time) and
  ``cudagraph`` (the forward in one CUDA graph), 3 interleaved rounds, median of the medians;
* ``ro+frz``: ``torch.compile(mode="reduce-overhead")`` with ``torch._inductor.config.freezing``,
  the baseline the Inductor model predicts against.

A model written back as the original program (nothing priced cheaper, or less than ``--min-gain``) is
reported, not timed. Writes ``DIR/optimize_b{B}.json`` (``optimize_b{B}_{dtype}.json`` for
another precision than fp32) after each model and prints a table of
predicted (the command's cost before / after) and measured speedups. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from copy import deepcopy
from pathlib import Path

from bench_gpu import _graphed, _median_ms  # same timing and capture as the backend's benchmark

ZOO = ["squeezenet1_1", "resnet50", "resnext50_32x4d", "inception_v3", "nasnet_a_mobile", "bert_base", "vit_b16"]
MODES = ("eager", "cudagraph", "ro+frz")


def _optimize_all(models, batch: int, device: str, dtype: str, out: Path) -> dict:
    """Run `superopt optimize` on every model at once; {model: its JSON report or an error}."""
    procs = {}
    for m in models:
        cmd = [sys.executable, "-m", "superopt", "optimize", "--zoo", m, "--batch-size", str(batch),
               "--device", device, "--dtype", dtype, "-o", str(out / f"{m}-b{batch}.pt2"), "--json"]
        procs[m] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, OMP_NUM_THREADS="2"))
    reports = {}
    for m, p in procs.items():
        so, se = p.communicate()
        try:
            reports[m] = json.loads(so)
        except json.JSONDecodeError:
            reports[m] = {"error": (se.strip().splitlines() or ["no output"])[-1]}
    return reports


def _gpu_us(fn, x, n: int, sleep_cycles: int = 3_000_000) -> float:
    """Median GPU microseconds of one call after 3 untimed ones (:func:`bench_gpu._median_ms`, queued)."""
    for _ in range(3):
        fn(*x)
    return 1e3 * _median_ms(fn, x, n, queued=True, sleep_cycles=sleep_cycles)


def _time(model: str, batch: int, program: Path, dtype: str, repeat: int, backend: bool = False,
          compiled_only: bool = False) -> dict:
    """{variant: {mode: microseconds}} for the original module and the written program at ``dtype``
    (``backend``: also the original under ``backend="superopt"`` with reduce-overhead, freezing set
    as for the baseline; ``compiled_only``: RO + freezing only, no eager or CUDA-graph timing)."""
    import torch
    import superopt  # noqa: F401  (registers the custom ops a written program may call)
    from superopt.cost.measure import set_precision
    from superopt.driver.backend import superopt_backend
    from superopt.models import build
    set_precision(dtype)
    cast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    module, inputs = build(model, batch_size=batch)
    x = tuple(t.cuda().to(cast) if t.is_floating_point() else t.cuda() for t in inputs)
    mods = {"original": module.cuda().eval().to(cast),
            "optimized": torch.export.load(str(program)).module().cuda().to(cast)}
    times: dict = {k: {m: [] for m in ("eager", "cudagraph")} for k in mods}
    with torch.no_grad():
        for _ in range(0 if compiled_only else 3):
            for k, mod in mods.items():
                times[k]["eager"].append(_gpu_us(mod, x, max(repeat // 3, 5), 40_000_000))
                times[k]["cudagraph"].append(_gpu_us(_graphed(mod, x)[0], x, repeat // 2))
        compiled = {}
        for k, mod in mods.items():
            times[k] = {m: statistics.median(v) for m, v in times[k].items() if v}
            with torch._inductor.config.patch(freezing=True):
                compiled[k] = torch.compile(deepcopy(mod), mode="reduce-overhead")
                compiled[k](*x)
                compiled[k](*x)
        if backend:
            with torch._inductor.config.patch(freezing=True):
                compiled["backend"] = torch.compile(deepcopy(mods["original"]), backend=superopt_backend,
                                                    options={"mode": "reduce-overhead", "device": "h100"})
                compiled["backend"](*x)
                compiled["backend"](*x)
            times["backend"] = {}
        rounds = {k: [] for k in compiled}
        for _ in range(3):  # interleaved rounds, median of the medians
            for k, f in compiled.items():
                rounds[k].append(_gpu_us(f, x, repeat))
        for k, v in rounds.items():
            times[k]["ro+frz"] = statistics.median(v)
        torch._dynamo.reset()
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the programs and optimize_b{B}.json")
    p.add_argument("--models", nargs="+", default=ZOO)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="h100", help="what `optimize --device` models (default h100)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"),
                   help="what `optimize --dtype` models, and the precision both modules run at (default fp32)")
    p.add_argument("--repeat", type=int, default=40, help="timed calls per measurement (default 40)")
    p.add_argument("--backend", action="store_true",
                   help="also time backend=\"superopt\" + reduce-overhead on the original (CLI and backend side by side)")
    p.add_argument("--compiled-only", action="store_true", help="time RO + freezing only (no eager, no CUDA graph)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_optimize: error: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_optimize: error: no CUDA GPU here; this benchmark times the written programs on one",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    reports = _optimize_all(args.models, args.batch_size, args.device, args.dtype, out)
    result = out / (f"optimize_b{args.batch_size}.json" if args.dtype == "fp32"
                    else f"optimize_b{args.batch_size}_{args.dtype}.json")
    rows = {}
    for m in args.models:
        rep = reports[m]
        row = rows[m] = {"batch": args.batch_size, "rewritten": rep.get("rewritten"), "error": rep.get("error")}
        if "error" not in rep:
            row.update(predicted=rep["cost_before"] / rep["cost_after"], rules_applied=rep["search"].get("rules_applied"),
                       found=rep["cost_before"] / rep["cost_found"] if rep.get("cost_found") else None)
        if rep.get("rewritten") or (args.backend and "error" not in rep):
            t = row["times_us"] = _time(m, args.batch_size, out / f"{m}-b{args.batch_size}.pt2", args.dtype,
                                        args.repeat, args.backend, args.compiled_only)
            row["measured"] = {k: t["original"][k] / t["optimized"][k] for k in MODES if k in t["optimized"]}
            if args.backend:
                row["backend"] = t["original"]["ro+frz"] / t["backend"]["ro+frz"]
            row["code"] = {"layout": rep.get("layout"), "custom_ops": rep.get("custom_ops"), "passes": rep.get("passes")}
        print(f"[{time.time() - t0:.0f}s] {m}@{args.batch_size} done", file=sys.stderr, flush=True)
        result.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                      "dtype": args.dtype, "rows": rows}, indent=1) + "\n")
    print(f"{'model':18s} {'batch':>5s} {'predicted':>9s} " + " ".join(f"{k:>9s}" for k in MODES))
    for m, r in rows.items():
        if r.get("error"):
            print(f"{m:18s} {args.batch_size:5d}  error: {r['error']}")
        elif not r["rewritten"] and "measured" not in r:
            why = f"best found {r['found']:.3f}, under --min-gain" if (r.get("found") or 1.0) > 1.0 else "nothing cheaper"
            print(f"{m:18s} {args.batch_size:5d} {r['predicted']:9.3f}  the original program ({why})")
        else:
            print(f"{m:18s} {args.batch_size:5d} {r['predicted']:9.3f} " +
                  " ".join(f"{r['measured'][k]:9.3f}" if k in r["measured"] else f"{'-':>9s}" for k in MODES) +
                  (f"  backend {r['backend']:.3f}" if "backend" in r else "") +
                  ("" if r["rewritten"] else "  (written back unchanged)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
