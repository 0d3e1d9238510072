"""Programmatic dependent launch on the device: a decode step's chain of superopt kernels timed
with and without it (``SUPEROPT_PDL``), in one run (GPU only).

The kernels are those of a model verdict in the shipped profile (by default Llama-3-8B's decode
step at batch 1: q/k/v, o, gate/up, down), each with its profiled config, chained as in the layer
(each kernel's output feeds the next where the shapes allow, so every dependent launch really
waits on its primary). One CUDA graph holds an L2 eviction and then the chain, ``--calls`` times;
another the eviction alone; the chain costs the difference of their medians over the calls.
Variants are timed in turn, round after round. Outputs must be bitwise equal across variants
(the lowering changes when a kernel starts, not what it computes).

    python scripts/check_pdl_gpu.py --model llama3_8b_decode --rows 1

Session 34 (H100, Llama-3-8B decode, b1): 158.24 us without, 157.31 with (1.006x); the same
variant measured three times spread 0.7%. A version that also prefetched its first loop tiles
into the L2 before the wait gained nothing (16-32 KB per program) or lost (128 KB: 0.974x,
512 KB: 0.847x): it was removed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chain_programs(model: str, batch_rows: int):
    """(program, config) of the model verdict's kernels, in the layer's order (by input size)."""
    from superopt.kernel.program import parse_program
    from superopt.kernel.tune import parse_config
    data = json.loads((Path(__file__).resolve().parents[1] / "superopt/kernel/profiles/h100-bf16.json").read_text())
    entries = {e["signature"]: e for e in data["entries"]}
    for v in data.get("models", []):
        progs = [parse_program(t) for _, t in v.get("programs", [])]
        if v.get("model") == model and progs and progs[0].dim_sizes.get("M") == batch_rows:
            out = [(parse_program(entries[s]["program"]), parse_config(entries[s]["config"])) for s in v["kernels"]]
            return sorted(out, key=_layer_order)
    raise SystemExit(f"no model verdict for {model} with {batch_rows} rows in the shipped profile")


def _layer_order(pc):
    """q/k/v (K 4096, N 6144), o (K = N = 4096), gate/up (N 14336), down (K 14336)."""
    s = pc[0].dim_sizes
    return (s["K"] > s["N"], s["N"] > 2 * s["K"], s["N"] == s["K"])


def build(pcs, pdl: bool):
    import torch
    from superopt.kernel import compile as kc
    os.environ["SUPEROPT_PDL"] = "1" if pdl else "0"
    kc._LOADED.clear()
    runs = [kc.compile_program(p, c) for p, c in pcs]
    gen = torch.Generator().manual_seed(0)
    inputs = [[(torch.randn(t.shape, generator=gen) * 0.05).to("cuda", getattr(torch, t.dtype)) for t in p.inputs]
              for p, _ in pcs]

    def chain():
        prev, outs = None, []
        for run, ins in zip(runs, inputs):
            args = list(ins)
            if prev is not None and prev.numel() >= args[0].numel():   # feed the previous output
                args[0] = prev.reshape(-1)[: args[0].numel()].reshape(args[0].shape)
            prev = run(*args)[0]
            outs.append(prev)
        return outs
    return chain


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_8b_decode")
    ap.add_argument("--rows", type=int, default=1, help="the verdict's batch rows (M)")
    ap.add_argument("--repeats", type=int, default=2, help="each variant captured this many times (the spread)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default="")
    ap.add_argument("--eager", action="store_true",
                    help="only run each variant's chain once outside a CUDA graph, synchronizing after it, "
                         "and compare outputs (a fault names its variant)")
    a = ap.parse_args(argv)
    import torch
    from superopt.cost.measure import cuda_graph, l2_flush, replay_medians
    pcs = chain_programs(a.model, a.rows)
    print(f"{torch.cuda.get_device_name()}: {len(pcs)} kernels: "
          + "; ".join(f"{p.dim_sizes} {c.text()}" for p, c in pcs), flush=True)
    variants = [(f"{'pdl' if pdl else 'no pdl'} #{k + 1}", pdl) for k in range(a.repeats) for pdl in (False, True)]
    if a.eager:
        base = None
        for name, pdl in variants:
            print(f"{name}: ", end="", flush=True)
            out = build(pcs, pdl)()
            torch.cuda.synchronize()
            base = base or out
            print("ok, equal" if all(torch.equal(x, y) for x, y in zip(out, base)) else "ok, DIFFERENT", flush=True)
        return 0
    evict = l2_flush(256 << 20)
    graphs, outs, keep = {}, {}, []
    for name, pdl in variants:
        chain = build(pcs, pdl)
        keep.append(chain)   # a graph reads its inputs' memory: they live as long as it does

        def step(chain=chain):
            evict()
            return chain()
        graphs[name], out = cuda_graph(step, a.calls)
        graphs[name].replay()
        torch.cuda.synchronize()
        outs[name] = [o.clone() for o in out]
    flush_only, _ = cuda_graph(evict, a.calls)
    base = outs[variants[0][0]]
    times = {n: [] for n, _ in variants}
    for _ in range(a.rounds):
        for n in times:
            both, alone = replay_medians([graphs[n], flush_only], 5)
            times[n].append(max(0.0, (both - alone) / a.calls))
    nbytes = sum(math.prod(t.shape) * 2 for p, _ in pcs for t in p.inputs if t.shape and len(t.shape) == 2 and min(t.shape) > 16)
    rows = []
    print(f"{'variant':<24} {'chain us':>9} {'vs no pdl':>9} {'% of BW floor':>13} {'equal':>6}")
    ref = statistics.median(times[variants[0][0]])
    for n, _ in variants:
        us = statistics.median(times[n])
        equal = all(torch.equal(x, y) for x, y in zip(outs[n], base))
        pct = 100 * nbytes / 3.35e12 / (us * 1e-6)
        rows.append({"variant": n, "us": round(us, 2), "speedup": round(ref / us, 3),
                     "pct_floor": round(pct, 1), "equal": equal})
        print(f"{n:<24} {us:>9.2f} {ref / us:>9.3f} {pct:>13.1f} {str(equal):>6}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "model": a.model,
                                            "rows": a.rows, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
