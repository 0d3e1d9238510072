"""GPU benchmark of superopt's fused kernels against Inductor, in one run (issue 23).

    python scripts/bench_kernels.py --out DIR [--tokens 1 2 4 8 16] [--budget 500] [--workers 8]

Cases (bf16, H100):

* **RMSNorm -> linear** (hidden 4096 -> 6144, Mirage's own case) at 1..16 tokens, and the
  **gated MLP input** (RMSNorm -> gate and up projections 4096 -> 14336 -> SiLU·mul, the
  Llama-3-8B sizes) at 1 and 16 tokens. Each is an IR region graph; its kernel programs (the
  generator's candidates when ``superopt.kernel.generate_kernels`` is present, and this
  script's own two programs: the norm's division moved after the matmul, its sum of squares
  accumulated in the matmul's K loop, gate and up in one loop) are tuned by
  :func:`superopt.kernel.tune.tune_region` (compiled in parallel workers, checked against
  Inductor's output, timed alone from a CUDA graph, L2 flushed).
* Then, per case, the module written as Hugging Face writes it under
  ``torch.compile(mode="reduce-overhead")`` with Inductor freezing, the same with
  ``mode="max-autotune"`` + freezing, and the same module with the region replaced by the
  chosen ``superopt::kernel`` custom op under reduce-overhead + freezing. Each is timed the
  same way: the call queued behind a GPU sleep, L2 flushed before it, median of ``--repeat``.
  The memory floor is the weight bytes over 3.35 TB/s.

Prints a table, writes ``DIR/bench_kernels.json`` after every row and ``DIR/profile.json``
(the kernel profile of the winners: what ships as ``superopt/kernel/profiles/h100-bf16.json``).
Stops starting new work after ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

HBM_BYTES_PER_S = 3.35e12
EPS = 1e-5


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--gated-tokens", type=int, nargs="*", default=[1, 16])
    p.add_argument("--budget", type=float, default=480.0, help="seconds after which no new case starts")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--out-features", type=int, default=6144)
    p.add_argument("--ffn", type=int, default=14336)
    return p.parse_args()


# ---- the region graphs (IR) and the script's own kernel programs ---------------------------

def rms_region(t: int, k: int, n: int, gated: bool, rng):
    """RMSNorm(x) -> linear (or gate/up + silu·mul) as an IR graph, weights with data."""
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


def rms_program(t: int, k: int, n: int, gated: bool) -> str:
    """The norm's division moved after the matmul (a row scaling commutes with it), its sum of
    squares accumulated in the K loop; gated: gate and up in the same loop, SiLU·mul after."""
    ws = ["wg", "wu"] if gated else ["w"]
    lines = [f"kernel rms_{'gated' if gated else 'linear'}", f"dim M {t}", f"dim K {k}", f"dim N {n}",
             f"input x bf16[{t},{k}]", f"input g bf16[{k}]"]
    lines += [f"input {w} bf16[{k},{n}]" for w in ws]
    lines += [f"output y bf16[{t},{n}]", "grid N", "loop K", "acc ss[M] = 0"]
    lines += [f"acc a{w}[M,N] = 0" for w in ws]
    lines += ["body:", "  a = load x[M,K]", "  gg = load g[K]", "  ag = mul a gg", "  ab = cast ag dtype=bf16"]
    for w in ws:
        lines += [f"  b{w} = load {w}[K,N]", f"  c{w} = dot ab b{w}", f"  d{w} = add a{w} c{w}", f"  update a{w} d{w}"]
    lines += ["  sq = mul a a", "  s = sum sq dim=K", "  s2 = add ss s", "  update ss s2", "post:",
              f"  ms = mul ss 1/{k}", f"  r = rsqrt ms eps={EPS}"]
    if gated:
        lines += ["  yg = mul awg r", "  yu = mul awu r", "  sg = silu yg", "  y0 = mul sg yu"]
    else:
        lines += ["  y0 = mul aw r"]
    lines += ["  store y[M,N] y0"]
    return "\n".join(lines) + "\n"


def candidates(region, t, k, n, gated) -> tuple[list, dict]:
    """Kernel programs for the region: the generator's (verified) and the script's own."""
    from superopt.kernel.program import parse_program
    progs, report = [parse_program(rms_program(t, k, n, gated))], {"generator": "absent"}
    try:
        from superopt.kernel import generate_kernels
    except ImportError:
        return progs, report
    rep = generate_kernels(region)
    report = {"generator": "ran", "enumerated": getattr(rep, "enumerated", None),
              "pruned": getattr(rep, "pruned", None), "verified": getattr(rep, "verified", None)}
    return progs + [c.program for c in rep.candidates], report


# ---- the Hugging Face style modules ---------------------------------------------------------

def hf_module(region, gated: bool):
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


def kernel_module(region, entry):
    """The region as one ``superopt::kernel`` call (weights as parameters)."""
    import torch
    from superopt.kernel import torch_op  # noqa: F401  (registers the op)
    from superopt.kernel.regions import reference_text

    ref = reference_text(region)
    names = [region.nodes[i].name for i in region.weights]

    class KernelCall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for nm in names:
                self.register_parameter(nm, torch.nn.Parameter(torch.as_tensor(region.data[nm]), requires_grad=False))

        def forward(self, x):
            return torch.ops.superopt.kernel([x] + [getattr(self, nm) for nm in names], entry.program,
                                             entry.config, ref)[0]
    return KernelCall()


def compiled(module, mode: str, x):
    """``torch.compile(mode=mode)`` with freezing on while dynamo traces, in its own frame."""
    import torch
    import torch._inductor.config as ic

    class Frame(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)
    torch._dynamo.reset()  # each variant compiled afresh (dynamo caches compiled frames per code object)
    fn = torch.compile(Frame(module), mode=mode)
    ic.freezing = True
    try:
        with torch.no_grad():
            for _ in range(3):
                fn(x)
    finally:
        ic.freezing = False
    return fn


def time_call(fn, x, repeat: int, flush_bytes: int = 256 << 20) -> float:
    """Median microseconds: L2 flushed, then the call queued behind a GPU sleep."""
    import torch
    scratch = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
    out = []
    with torch.no_grad():
        for _ in range(repeat):
            scratch.zero_()
            torch.cuda._sleep(2_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(x)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1000)
    return statistics.median(out)


def run_case(name, t, k, n, gated, args, profile, rows, out):
    import numpy as np
    import torch
    from superopt.kernel.tune import tune_region
    rng = np.random.default_rng(0)
    region = rms_region(t, k, n, gated, rng)
    progs, gen = candidates(region, t, k, n, gated)
    res = tune_region(region, progs, "bf16", workers=args.workers, repeat=args.repeat)
    row = {"case": name, "tokens": t, "generator": gen, "tune_s": round(res.seconds, 1),
           "tried": len(res.tried), "region_inductor_us": round(res.inductor_us, 2)}
    wbytes = k * n * 2 * (2 if gated else 1) + k * 2
    row["floor_us"] = round(wbytes / HBM_BYTES_PER_S * 1e6, 2)
    if res.entry is None:
        row["error"] = "no candidate ran correctly: " + "; ".join(str(r[3]) for r in res.tried[:3])
        rows.append(row)
        return
    profile.add(res.entry)
    row.update(kernel_us=res.entry.us, config=res.entry.config)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    base = hf_module(region, gated).to("cuda", torch.bfloat16).eval()
    mine = kernel_module(region, res.entry).to("cuda", torch.bfloat16).eval()
    with torch.no_grad():
        want = base(x).float()
    for label, mod, mode in (("ro", base, "reduce-overhead"), ("superopt_ro", mine, "reduce-overhead"),
                             ("max_autotune", base, "max-autotune")):
        try:
            fn = compiled(mod, mode, x)
            with torch.no_grad():
                got = fn(x).float()
        except Exception as e:
            row[f"{label}_error"] = _keep_failed(e, out)
            continue
        row[f"{label}_err"] = round(float((got - want).abs().max() / want.abs().max()), 5)
        row[f"{label}_us"] = round(time_call(fn, x, args.repeat), 2)
    ours = row.get("superopt_ro_us")
    if ours:
        for base_label in ("ro", "max_autotune"):
            if row.get(f"{base_label}_us"):
                row[f"speedup_vs_{base_label}"] = round(row[f"{base_label}_us"] / ours, 3)
        row["floor_ratio"] = round(ours / row["floor_us"], 3)
    rows.append(row)


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


def print_table(rows):
    cols = ("case", "tokens", "floor_us", "kernel_us", "region_inductor_us", "ro_us", "max_autotune_us",
            "superopt_ro_us", "speedup_vs_ro", "speedup_vs_max_autotune", "floor_ratio", "tune_s")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "-")) for c in cols) + ("  ERROR " + r["error"] if "error" in r else ""))


def main() -> int:
    args = _args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from superopt.kernel.profile import KernelProfile
    t0 = time.perf_counter()
    profile, rows = KernelProfile(), []
    cases = [(f"rmsnorm_linear_{args.hidden}x{args.out_features}", t, args.hidden, args.out_features, False)
             for t in args.tokens]
    cases += [(f"rmsnorm_gate_up_{args.hidden}x{args.ffn}", t, args.hidden, args.ffn, True) for t in args.gated_tokens]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for case in cases:
        if time.perf_counter() - t0 > args.budget:
            rows.append({"case": case[0], "tokens": case[1], "error": "skipped: out of time"})
            continue
        try:
            run_case(*case, args, profile, rows, out)
        except Exception as e:
            rows.append({"case": case[0], "tokens": case[1], "error": _keep_failed(e, out)})
        (out / "bench_kernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        profile.save(out / "profile.json")
        print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
