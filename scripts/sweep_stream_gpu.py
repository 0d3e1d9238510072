"""A wide tile-config sweep of a model verdict's weight-streaming kernels on the device (GPU only):
which (column tile, loop tile, warps, stages, split) reads the weights fastest, against the
shipped profile's config and the weight-read floor. Used to choose ``STREAM_SHAPES``
(:mod:`superopt.kernel.tune`); the tuner itself tries only that short list.

Every config is compiled in worker processes, checked against the shipped config's output
(bf16 tolerance), timed alone like the tuner times (CUDA graph, L2 evicted; a quick pass, then the
fastest few again with all replays).

    python scripts/sweep_stream_gpu.py --model llama3_8b_decode --rows 1 --workers 16
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from check_pdl_gpu import chain_programs  # noqa: E402  (the verdict's kernels, in layer order)

#: weight bytes a program may keep in flight across its pipeline stages (shared memory)
SMEM = 200 * 1024


def space(p, split_ok: bool):
    from superopt.kernel.program import TileConfig
    from superopt.kernel.triton_lower import grid_size
    sizes = p.dim_sizes
    rows = [d for d, t in p.grid if t and sizes[d] <= 16]
    cols = [d for d, t in p.grid if t and d not in rows]
    out = []
    for bn, bk, warps, stages, split in itertools.product((16, 32, 64, 128), (64, 128, 256, 512, 1024),
                                                          (2, 4, 8), (3, 4, 5), (1, 2)):
        if sizes[p.loop] % bk or (16 + bn) * bk * 2 * stages > SMEM or bn * bk // (32 * warps) > 256:
            continue
        if split > 1 and (not split_ok or sizes[p.loop] // bk < 2 * split):
            continue
        c = TileConfig(tuple((d, 16) for d in rows) + tuple((d, bn) for d in cols) + ((p.loop, bk),), warps, stages, split)
        if split > 1 and grid_size(p, c) * split > 8 * 132:
            continue
        out.append(c)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_8b_decode")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    import torch
    from superopt.kernel.compile import compile_program
    from superopt.kernel.split import split_kind
    from superopt.kernel.errors import KernelError
    from superopt.kernel.tune import config_text, measure_us, warm_all
    pcs = chain_programs(a.model, a.rows)
    plans = []
    for p, shipped in pcs:
        try:
            split_kind(p)
            ok = True
        except KernelError:
            ok = False
        configs = [shipped] + [c for c in space(p, ok) if c != shipped]
        plans.append((p, shipped, configs))
    tasks = [(p.text(), config_text(c), "bf16") for p, _, cs in plans for c in cs]
    print(f"{torch.cuda.get_device_name()}: compiling {len(tasks)} configs", flush=True)
    errs = dict(zip(tasks, warm_all(tasks, a.workers)))
    results = []
    print(f"{'kernel':<22} {'shipped us':>10} {'best us':>8} {'gain':>6} {'BW % shipped':>12} {'BW % best':>9}  best config")
    for p, shipped, configs in plans:
        gen = torch.Generator().manual_seed(0)
        xs = [(torch.randn(t.shape, generator=gen) * 0.05).to("cuda", getattr(torch, t.dtype)) for t in p.inputs]
        want = compile_program(p, shipped)(*xs)[0].float()
        quick = []
        for c in configs:
            if errs.get((p.text(), config_text(c), "bf16")):
                continue
            run = compile_program(p, c)
            got = run(*xs)[0].float()
            if float((got - want).abs().max() / want.abs().max().clamp_min(1e-6)) > 2e-2:
                continue
            quick.append([measure_us(run, xs, 5), c, run])
        quick.sort(key=lambda q: q[0])
        final = [(measure_us(q[2], xs, 50), q[1]) for q in quick[: a.top]]
        ship_us = measure_us(compile_program(p, shipped), xs, 50)
        best_us, best = min(final, key=lambda f: f[0])
        nbytes = sum(math.prod(t.shape) * 2 for t in p.inputs if len(t.shape) == 2 and min(t.shape) > 16)
        name = "x".join(str(p.dim_sizes[d]) for d in ("M", "K", "N"))
        bw = lambda us: 100 * nbytes / 3.35e12 / (us * 1e-6)   # noqa: E731
        print(f"{name:<22} {ship_us:>10.2f} {best_us:>8.2f} {ship_us / best_us:>6.3f} {bw(ship_us):>12.1f} {bw(best_us):>9.1f}  "
              f"{best.text()}", flush=True)
        results.append({"kernel": name, "shipped": shipped.text(), "shipped_us": round(ship_us, 2), "best": best.text(),
                        "best_config": config_text(best), "best_us": round(best_us, 2), "tried": len(quick),
                        "finalists": [(round(u, 2), c.text()) for u, c in sorted(final, key=lambda f: f[0])]})
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": a.rows, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
