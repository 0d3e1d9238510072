"""GPU benchmark of superopt's fused kernels against Inductor, in one run (issue 23).

    python scripts/bench_kernels.py --out DIR [--tokens 1 4 16] [--models llama3_8b_decode:1 ...]
                                    [--budget 500] [--workers 12] [--max-autotune]

Everything in bf16 on one GPU; baseline and superopt measured in the same run:

* **RMSNorm -> linear** (hidden 4096 -> 6144, Mirage's own case) at ``--tokens``: the IR region
  graph, its kernels generated and verified by :func:`superopt.kernel.generate_kernels`, tuned
  by :func:`superopt.kernel.tune.tune_region`; then the module written as Hugging Face writes it
  (float32 upcast, rsqrt, weight, ``nn.Linear``) under ``torch.compile(mode="reduce-overhead")``
  with Inductor freezing, under ``mode="max-autotune"`` + freezing, and the chosen kernel as the
  ``superopt::kernel`` custom op under reduce-overhead + freezing; floor: weight bytes / the GPU's HBM rate
  (3.35 TB/s on an H100, 4.8 on an H200).
* **zoo models** (``NAME:BATCH``): ``superopt tune``'s work (every region generated in worker
  processes, tuned), then :func:`superopt.kernel.choose.choose_kernels` with that profile, the
  graph's module in bf16 under reduce-overhead + freezing, against the zoo module under the same
  (and max-autotune + freezing with ``--max-autotune``). For Llama decode, the floor is the
  weight and KV-cache bytes / the HBM rate; with ``--profile-kernels`` a torch.profiler kernel list
  of the superopt variant says where the time goes.

Every timed call: L2 flushed (a 256 MB write), the call queued behind a GPU sleep, CUDA events;
median of ``--repeat``. Outputs are compared with the module's eager bf16 outputs. Prints a
table, writes ``DIR/bench_kernels.json`` after every row and ``DIR/profile.json`` (the kernel
profile of the winners; what ships as ``superopt/kernel/profiles/h100-bf16.json``, or
``h200-bf16.json`` measured on an H200). No new row
starts after ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

from bench_gpu import _own_frame  # a forward of its own per compiled variant

H100_BYTES_PER_S = 3.35e12   # the floor: bytes at an H100 SXM's HBM3 rate


def hbm_bytes_per_s() -> float:
    """The visible GPU's HBM rate (superopt.cost.devices: H100 3.35 TB/s, H200 4.8 TB/s); the
    H100's where the GPU is not described there."""
    import torch
    from superopt.cost.devices import DEVICES, device_key
    dev = DEVICES.get(device_key(torch.cuda.get_device_name()))
    return dev.bandwidth if dev is not None and dev.name != "cpu" else H100_BYTES_PER_S


EPS = 1e-5


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    p.add_argument("--models", nargs="*", default=["llama3_8b_decode:1", "llama3_8b_decode:16", "gpt2_block:1",
                                                    "gpt2_block:16"])
    p.add_argument("--max-autotune", action="store_true", help="also time the models under max-autotune")
    p.add_argument("--pipeline", action="store_true",
                   help="zoo models through the whole driver (superopt.driver.optimize: graph search with the "
                        "shipped rules, then the kernel pass with the shipped kernel profile), no tuning in the run")
    p.add_argument("--tune-first", action="store_true",
                   help="with --pipeline: tune the model's regions first and write the winners into the shipped "
                        "profile of this GPU (superopt/kernel/profiles/h100-bf16.json on an H100, h200-bf16.json on "
                        "an H200; replacing entries of the same regions)")
    p.add_argument("--in-model", action=argparse.BooleanOptionalAction, default=True,
                   help="with --tune-first: then time the whole model with kernel sets and ship the verdict "
                        "(as `superopt tune` does)")
    p.add_argument("--profile-kernels", nargs="*", default=["llama3_8b_decode:1", "llama3_8b_decode:16"])
    p.add_argument("--static-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="mark a decode step's KV-cache inputs as static addresses for CUDA graphs, as Hugging "
                        "Face's StaticCache does (torch._dynamo.mark_static_address); without it reduce-overhead "
                        "copies both caches into the graph's input buffers on every call, in every variant")
    p.add_argument("--profile-baseline", action="store_true", help="also list the kernels of the RO baseline")
    p.add_argument("--budget", type=float, default=480.0, help="seconds after which no new case starts")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--row-kernels", action="store_true",
                   help="with --tune-first: also tune row-owning regions (superopt tune --row-kernels)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--candidates", type=int, default=2, help="verified candidates tuned per region (default 2)")
    p.add_argument("--configs", type=int, default=12, help="tile configs per candidate variant (default 12)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--out-features", type=int, default=6144)
    return p.parse_args()


# ---- Mirage's case: the IR graph and the module as Hugging Face writes it --------------------

def rms_region(t: int, k: int, n: int, gated: bool, rng):
    """RMSNorm(x) -> linear (or gate/up + silu·mul) as an IR graph, weights with data (named
    ``g``, ``w`` / ``wg``, ``wu``, as :func:`hf_module` reads them)."""
    import numpy as np
    from superopt.ir import GraphBuilder
    b = GraphBuilder()
    x = b.input("x", (t, k))
    ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
    eps = b.weight("eps", (1,), np.full((1,), EPS, np.float32))
    r = b.op("rsqrt", b.op("add", ms, eps))
    h = b.op("mul", b.op("mul", x, r), b.weight("g", (k,), (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)))

    def lin(name):
        return b.op("matmul", h, b.weight(name, (k, n), (rng.standard_normal((k, n)) / k ** 0.5).astype(np.float32)))
    if not gated:
        return b.build([lin("w")])
    gate, up = lin("wg"), lin("wu")
    return b.build([b.op("mul", b.op("silu", gate), up)])


def hf_module(region, gated: bool):
    """The region as Hugging Face writes it: float32 upcast, rsqrt, weight, ``nn.Linear``."""
    import torch

    class RMSLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            d = region.data
            self.g = torch.nn.Parameter(torch.as_tensor(d["g"]), requires_grad=False)
            names = ["wg", "wu"] if gated else ["w"]
            self.lins = torch.nn.ModuleList()
            for nm in names:
                lin = torch.nn.Linear(*d[nm].shape, bias=False)
                lin.weight = torch.nn.Parameter(torch.as_tensor(d[nm]).t().contiguous(), requires_grad=False)
                self.lins.append(lin)

        def forward(self, x):
            dt = x.dtype
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
            h = self.g * h.to(dt)
            if gated:
                return torch.nn.functional.silu(self.lins[0](h)) * self.lins[1](h)
            return self.lins[0](h)
    return RMSLinear()


def compiled(module, mode: str, args, tag: str | None = None, reset: bool = True):
    """``torch.compile(mode=mode)`` with freezing on while dynamo traces (each variant compiled
    afresh, in a frame of its own, ``tag`` naming it: dynamo caches compiled frames per code
    object). ``reset=False`` keeps the variants compiled before alive, to be timed in turn."""
    import torch
    import torch._inductor.config as ic
    if reset:
        torch._dynamo.reset()
    fn = torch.compile(_own_frame(module, tag or mode), mode=mode)
    ic.freezing = True
    try:
        with torch.no_grad():
            for _ in range(3):
                fn(*args)
    finally:
        ic.freezing = False
    return fn


def time_call(fn, args, repeat: int, flush_bytes: int = 256 << 20) -> float:
    """Median microseconds: L2 flushed by a read (``l2_flush``: a write would leave dirty lines
    whose write-back the call pays), then the call queued behind a GPU sleep."""
    import torch
    from superopt.cost.measure import l2_flush
    evict = l2_flush(flush_bytes)
    out = []
    with torch.no_grad():
        for _ in range(repeat):
            evict()
            torch.cuda._sleep(2_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1000)
    return statistics.median(out)


def _leaves(out):
    import torch
    return [t.float() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _rel_err(got, want) -> float:
    errs = [float((g - w).abs().max() / w.abs().max().clamp_min(1e-6)) for g, w in zip(_leaves(got), _leaves(want))]
    return round(max(errs), 5) if errs else float("nan")


def time_variants(row, variants, args, want, repeat, out):
    """Compile, check and time each ``(label, module, mode)``; results into ``row``."""
    for label, mod, mode in variants:
        try:
            fn = compiled(mod, mode, args)
            with __import__("torch").no_grad():
                row[f"{label}_err"] = _rel_err(fn(*args), want)
            row[f"{label}_us"] = round(time_call(fn, args, repeat), 2)
        except Exception as e:
            row[f"{label}_error"] = _keep_failed(e, out)
    ours = row.get("superopt_ro_us")
    if ours:
        for base in ("ro", "max_autotune"):
            if row.get(f"{base}_us"):
                row[f"speedup_vs_{base}"] = round(row[f"{base}_us"] / ours, 3)
        if row.get("floor_us"):
            row["floor_ratio"] = round(ours / row["floor_us"], 3)
            row["pct_of_floor"] = round(100 * row["floor_us"] / ours, 1)


def kernels_module(graph, profile, signature=None):
    """``graph`` with the profile's winning kernels (choose_kernels), as a module; the report."""
    import torch
    from superopt.codegen.export import to_module
    from superopt.kernel.choose import choose_kernels
    h, rep = choose_kernels(graph, None, torch.cuda.get_device_name(), "bf16", profile)
    return to_module(h, signature), rep


def ship_profile(tuned) -> None:
    """Write ``tuned`` into the shipped profile of this GPU (``profiles/h100-bf16.json`` on an
    H100), replacing the entries it measured again: same region and precision (a kernel measured
    again with the current generator replaces a stale one even where the stale one was faster)."""
    import torch
    import superopt.kernel
    from superopt.cost.devices import device_key
    from superopt.kernel.profile import KernelProfile
    path = Path(superopt.kernel.__file__).parent / "profiles" / f"{device_key(torch.cuda.get_device_name())}-bf16.json"
    old = KernelProfile.load(path) if path.exists() else KernelProfile()
    kept = KernelProfile({k: e for k, e in old.entries.items() if k not in tuned.entries}, dict(old.models))
    kept.merge(tuned).save(path)


def pipeline_module(model):
    """The model through :func:`superopt.driver.optimize` as the CLI runs it for this GPU in bf16
    (saturation with the shipped rules, keep if cheaper, the kernel pass with the shipped kernel
    profile, the output check); the module and a short report."""
    from superopt.cost.select import choose_cost_model
    from superopt.driver import Options, optimize
    from superopt.rules.load import load_rules
    cost, _ = choose_cost_model("cuda", "bf16")   # this GPU's kernels and verdicts (an H200: priced as the H100)
    res = optimize(model, load_rules(), cost, Options(input_sets=1), dtype="bf16")
    rep = res.report
    mine = model.reference if res.unchanged else res.module()  # what `superopt optimize` writes
    kern = rep.kernels if isinstance(rep.kernels, dict) else {}
    short = {"cost_before": rep.cost_before, "cost_after": rep.cost_after, "rewritten": rep.rewritten,
             "rules": sorted((rep.search or {}).get("rules_applied", []))[:12], "seconds": rep.seconds,
             "kernels": {"chosen": kern.get("chosen", 0),
                         "regions": [f"{r['region']}: {r['decision']} ({r['reason']})" for r in kern.get("regions", [])]}}
    return mine, short


def _bf16(args):
    import torch
    return tuple(a.to("cuda", torch.bfloat16) if a.is_floating_point() else a.to("cuda") for a in args)


def run_mirage(t, args, profile, rows, out):
    """RMSNorm -> linear at ``t`` tokens (see the module docstring)."""
    import numpy as np
    import torch
    from superopt.kernel.model_tuning import tune_graph
    region = rms_region(t, args.hidden, args.out_features, False, np.random.default_rng(0))
    row = {"case": f"rmsnorm_linear_{args.hidden}x{args.out_features}", "batch": t,
           "floor_us": round((args.hidden * args.out_features * 2 + args.hidden * 2) / hbm_bytes_per_s() * 1e6, 2)}
    _, tuned = tune_graph(region, "bf16", args.workers, args.repeat, profile, log=lambda r: None,
                          max_candidates=args.candidates, max_configs=args.configs)
    row.update({k: v for k, v in tuned[0].items() if k not in ("region", "signature")})
    x = (torch.randn(t, args.hidden, device="cuda", dtype=torch.bfloat16),)
    base = hf_module(region, False).to("cuda", torch.bfloat16).eval()
    mine, rep = kernels_module(region, profile)
    row["chosen"] = rep.chosen
    with torch.no_grad():
        want = base(*x)
    variants = [("ro", base, "reduce-overhead"), ("superopt_ro", mine.to("cuda", torch.bfloat16).eval(), "reduce-overhead"),
                ("max_autotune", base, "max-autotune")]
    time_variants(row, variants, x, want, args.repeat, out)
    rows.append(row)


def kv_caches(name: str, inputs) -> list:
    """A decode step's key and value cache inputs ([b, kv_heads, positions >= 1024, head_dim]),
    none for other models."""
    return [a for a in inputs if "decode" in name and a.dim() == 4 and a.shape[-2] >= 1024]


def mark_static_caches(name: str, inputs) -> bool:
    """Mark a decode step's caches as static addresses for CUDA graphs, as HF's ``StaticCache``
    does; whether there were any."""
    import torch
    caches = kv_caches(name, inputs)
    for a in caches:
        torch._dynamo.mark_static_address(a)
    return bool(caches)


def _floor_us(name, model) -> float | None:
    """Weights (and the KV cache of a decode step) read once at the GPU's HBM rate."""
    n = sum(p.numel() * 2 for p in model.reference.parameters())
    n += sum(a.numel() * 2 for a in kv_caches(name, model.inputs))
    return round(n / hbm_bytes_per_s() * 1e6, 2)


def run_model(spec, args, profile, rows, out):
    """One zoo model at one batch size (see the module docstring)."""
    import torch
    from superopt.kernel.model_tuning import tune_graph
    from superopt.driver import load_model
    from superopt.driver.tune import ModelSource, model_verdict, searched
    name, batch = spec.split(":")
    model = load_model(zoo=name, batch_size=int(batch))
    row = {"case": name, "batch": int(batch), "floor_us": _floor_us(name, model)}
    t0 = time.perf_counter()
    if args.pipeline:
        if args.tune_first:
            found = searched(model)       # one search: the regions tuned and the model timed whole
            row["search_s"] = round(time.perf_counter() - t0, 1)

            def whole_model(p):           # while the winners' proofs run (tune_graph's during_proofs)
                t1 = time.perf_counter()
                verdict = model_verdict(model, p, "bf16", repeat=args.repeat,
                                        log=lambda m: print(m, flush=True), found=found,
                                        source=ModelSource(zoo=name, batch_size=int(batch)), workers=args.workers)
                row["verdict_s"] = round(row.get("verdict_s", 0.0) + time.perf_counter() - t1, 1)
                row.pop("verdict", None)
                verdicts[:] = []
                if verdict is not None:
                    row["verdict"] = {"kernels": len(verdict.kernels), "us": verdict.us,
                                      "inductor_us": verdict.inductor_us, "original_us": verdict.original_us,
                                      "original": verdict.why_original,
                                      "tried": [[len(k), us] for k, us in verdict.tried]}
                    verdicts[:] = [verdict]
            verdicts: list = []
            tuned_profile, row["regions"] = tune_graph(found.graph, "bf16", args.workers, args.repeat, None,
                                                       rows=args.row_kernels,
                                                       log=lambda r: None, max_candidates=args.candidates,
                                                       max_configs=args.configs,
                                                       during_proofs=whole_model if args.in_model else None)
            for verdict in verdicts:
                tuned_profile.add_model(verdict)
            # regions, proofs and (--in-model) the whole-model verdict, which runs beside the proofs
            row["tune_model_s" if args.in_model else "tune_s"] = round(time.perf_counter() - t0, 1)
            ship_profile(tuned_profile)
            profile.entries.update(tuned_profile.entries)
        mine, row["pipeline"] = pipeline_module(model)
        row["chosen"] = (row["pipeline"].get("kernels") or {}).get("chosen", 0)
        row["optimize_s"] = round(time.perf_counter() - t0, 1)
    else:
        _, tuned = tune_graph(model.graph, "bf16", args.workers, args.repeat, profile, log=lambda r: None,
                              max_candidates=args.candidates, max_configs=args.configs)
        row["tune_s"] = round(time.perf_counter() - t0, 1)
        row["regions"] = tuned
        mine, rep = kernels_module(model.graph, profile, model.signature)
        row["chosen"], row["choice"] = rep.chosen, rep.to_json()
    xs = _bf16(model.inputs)
    if args.static_cache and mark_static_caches(name, xs):
        row["static_cache"] = True
    base = model.reference.to("cuda", torch.bfloat16).eval()
    with torch.no_grad():
        want = base(*xs)
    variants = [("ro", base, "reduce-overhead"), ("superopt_ro", mine.to("cuda", torch.bfloat16).eval(), "reduce-overhead")]
    if args.max_autotune:
        variants.append(("max_autotune", base, "max-autotune"))
    time_variants(row, variants, xs, want, args.repeat, out)
    if spec in args.profile_kernels and "superopt_ro_us" in row:
        row["kernels"] = kernel_list(compiled(mine, "reduce-overhead", xs), xs)
        if args.profile_baseline:
            row["kernels_ro"] = kernel_list(compiled(base, "reduce-overhead", xs), xs)
    rows.append(row)


def kernel_list(fn, args, top: int = 12) -> list:
    """The GPU kernels of one call and their time (torch.profiler), the longest first; a kernel
    launched several times a call (``superopt_kernel``) also with each launch's time, in order."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    calls = 5
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    ev = [(e.key, e.device_time_total / calls, e.count // calls) for e in prof.key_averages()]
    ev.sort(key=lambda t: -t[1])
    each: dict = {}   # a kernel called several times a step: each call's time, in launch order
    try:
        for e in sorted(prof.events(), key=lambda e: e.time_range.start):
            if e.device_time_total > 0 and "CUDA" in str(e.device_type):
                each.setdefault(e.key, []).append(e.device_time_total)
    except Exception:  # noqa: BLE001 (a profiler without per-event times: totals only)
        each = {}
    return [{"kernel": k[:90], "us": round(us, 2), "calls": c,
             **({"each_us": [round(sum(t[i::c]) / len(t[i::c]), 2) for i in range(c)]}
                if c > 1 and len(t := each.get(k, [])) == calls * c else {})}
            for k, us, c in ev[:top]]


def _keep_failed(e: Exception, out: Path) -> str:
    """The error in one line; a generated file Inductor failed to import is copied to ``out``."""
    import re
    import shutil
    msg = f"{type(e).__name__}: {e}"
    m = re.search(r"Failed to import (\S+\.py)", msg)
    if m and Path(m.group(1)).exists():
        shutil.copy(m.group(1), out / Path(m.group(1)).name)
    traceback.print_exc()
    return msg.splitlines()[0][:300] + (f" (kept {Path(m.group(1)).name})" if m else "")


COLS = ("case", "batch", "floor_us", "ro_us", "max_autotune_us", "superopt_ro_us", "speedup_vs_ro",
        "speedup_vs_max_autotune", "pct_of_floor", "chosen", "tune_s", "tune_model_s")


def print_table(rows):
    print(" | ".join(COLS))
    for r in rows:
        errs = [f"{k}: {v}" for k, v in r.items() if k.endswith("error") and v]
        print(" | ".join(str(r.get(c, "-")) for c in COLS) + ("  ERRORS " + "; ".join(errs) if errs else ""))


def main() -> int:
    args = _args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from superopt.kernel.profile import KernelProfile
    t0 = time.perf_counter()
    profile, rows = KernelProfile(), []
    jobs = [("mirage", t) for t in args.tokens] + [("model", m) for m in args.models]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "argv": sys.argv[1:]}
    for kind, what in jobs:
        if time.perf_counter() - t0 > args.budget:
            rows.append({"case": str(what), "error": "skipped: out of time"})
            continue
        try:
            (run_mirage if kind == "mirage" else run_model)(what, args, profile, rows, out)
        except Exception as e:
            rows.append({"case": str(what), "error": _keep_failed(e, out)})
        rows[-1]["elapsed_s"] = round(time.perf_counter() - t0, 1)
        (out / "bench_kernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        profile.save(out / "profile.json")
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("regions", "choice")}, default=str), flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
