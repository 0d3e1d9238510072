"""Compile superopt's generated kernels on a CUDA GPU and check their outputs (no timing).

For a few regions at model sizes (bf16: RMSNorm -> 4096x6144 linear, gate/up + SiLU·mul,
grouped-query decode attention over a 2048-position cache, causal prefill attention), generate
the kernel programs (verification is what CI does at small sizes; here ``--verify`` turns it
on), compile each candidate under two tile configs with Triton, run it on the GPU and compare
with the region's float64 reference on the CPU. Prints one table row per (candidate, config).

    python scripts/check_kernels_gpu.py [--verify] [--small]
    TRITON_INTERPRET=1 python scripts/check_kernels_gpu.py --tiny     # a dry run on the CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kernel_regions import attention, gate_up, layernorm_matmul, masked_sdpa, rmsnorm_matmul  # noqa: E402
from superopt.ir.graph import Graph, GraphBuilder  # noqa: E402
from superopt.kernel import compile_program, default_configs, generate_kernels  # noqa: E402
from superopt.semantics.reference import evaluate, random_inputs  # noqa: E402


def as_bf16(region: Graph) -> Graph:
    """The same region with every source in bfloat16 (the graph's dtypes follow)."""
    b = GraphBuilder()
    remap = {}
    for i, n in enumerate(region.nodes):
        if n.name is not None:
            t = n.types[0]
            ref = (b.input(n.name, t.shape, "bfloat16") if n.op == "input" else
                   b.weight(n.name, t.shape, region.data.get(n.name), "bfloat16"))
            remap[(i, 0)] = ref
        else:
            for k, r in enumerate(b.add(n.op, [remap[tuple(r)] for r in n.inputs], n.attr)):
                remap[(i, k)] = r
    return b.build([remap[tuple(r)] for r in region.outputs])


def regions(s: int):
    yield "rmsnorm->linear 16x4096x6144", rmsnorm_matmul(16, 4096 // s, 6144 // s)
    yield "gate/up silu 16x4096x4096", gate_up(16, 4096 // s, 4096 // s, residual=False)
    yield "gqa decode 32q/8kv 2048", attention(h=32 // min(s, 4), kvh=8 // min(s, 4), l=1, s=2048 // s, d=128,
                                               scale=128 ** -0.5)
    yield "layernorm->linear 16x768x3072", layernorm_matmul(16, 768 // s, 3072 // s)
    yield "masked gqa decode 32q/8kv 2048", masked_sdpa(h=32 // min(s, 4), kvh=8 // min(s, 4), l=1, s=2048 // s, d=128,
                                                        mask_shape=(1, 1, 1, 2048 // s))
    yield "causal prefill 8h 256", attention(h=8, kvh=8, l=max(256 // s, 17), s=max(256 // s, 17), d=64, causal=1,
                                             scale=0.125)


def check(name, region, verify, torch, rows, device):
    region = as_bf16(region)
    t0 = time.perf_counter()
    rep = generate_kernels(region, verify=verify, time_limit=200)
    gen = time.perf_counter() - t0
    env = random_inputs(region, np.random.default_rng(0))
    env.update({k: np.asarray(v, float) for k, v in region.data.items()})
    env = {k: torch.tensor(v, dtype=torch.float32).bfloat16().double().numpy() for k, v in env.items()}
    want = evaluate(region, env)[0]
    cands = rep.candidates or []
    if not cands:
        rows.append((name, "-", "-", "-", f"no candidate: {rep.stop} {dict(rep.prune_reasons)}"))
    for cand in cands:
        ins = dict(env)
        if cand.prep:
            ins.update(zip(cand.prep.names, evaluate(cand.prep.graph, env)))
        args = [torch.tensor(np.asarray(ins[t.name]), dtype=torch.float32).to(device)
                for t in cand.program.inputs]
        for cfg in (default_configs(cand.program)[0], default_configs(cand.program)[-1]):
            try:
                (out,) = compile_program(cand.program, cfg)(*args)
                if device == "cuda":
                    torch.cuda.synchronize()
                got = out.float().cpu().numpy().reshape(want.shape)
                err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))
                status = "ok" if err < 2e-2 else "WRONG"
            except Exception as e:  # report and go on: this script is a check, not a library
                err, status = float("nan"), f"FAILED {type(e).__name__}: {str(e)[:160]}"
            rows.append((name, cand.moves + f" ({cand.verdict.status})", cfg.text(), f"{err:.2e}", status))
    rows.append((name, f"generated in {gen:.1f}s", rep.table().splitlines()[1:5], "", ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verify", action="store_true", help="verify every candidate (slow at model sizes)")
    ap.add_argument("--small", action="store_true", help="quarter sizes")
    ap.add_argument("--tiny", action="store_true", help="1/16 sizes, and run on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args(argv)
    import torch
    import triton
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("check_kernels_gpu needs a CUDA device (or --tiny under TRITON_INTERPRET=1)")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print(f"device {name} torch {torch.__version__} triton {triton.__version__}", flush=True)
    rows = []
    for name, region in regions(16 if args.tiny else 4 if args.small else 1):
        check(name, region, args.verify, torch, rows, device)
        for r in rows:
            print(" | ".join(map(str, r)), flush=True)
        rows.clear()


if __name__ == "__main__":
    main()
