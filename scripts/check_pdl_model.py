"""Programmatic dependent launch in the whole model, as a user runs it (GPU only): a zoo model's
program as ``superopt optimize`` writes it for this GPU, its kernels launched plainly and as
dependent launches (``SUPEROPT_PDL=1`` while that copy compiles its kernels), against
``torch.compile(mode="reduce-overhead")`` with freezing, timed in interleaved rounds in one
process. The kernels and their configs are the same in both; the outputs must be equal.

    python scripts/check_pdl_model.py --models llama32_1b_decode:1 llama32_1b_decode:16

Prints a table: microseconds (the least of the rounds' medians) of RO, the program with plain
launches and with dependent launches, and the ratio plain / dependent.

Session 46 (H200, shipped profile): plain / dependent 0.968 (Llama-3.2-1B decode b1), 0.997
(b16), 0.983 (Llama-3-8B decode b1), 0.962 (b16): dependent launch never paid, and session 45's
per-model decision in ``superopt tune`` (whose own timing had seen +1.5% at 1B b16) was removed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fresh_launchers(pdl: bool) -> None:
    """Kernels compiled from now on launch dependently or not: the per-process launcher caches
    emptied (a compiled program's CUDA graph keeps the launches it recorded)."""
    from superopt.kernel import compile as kc
    from superopt.kernel import torch_op
    os.environ["SUPEROPT_PDL"] = "1" if pdl else "0"
    kc._LOADED.clear()
    torch_op._launcher.cache_clear()


def compiled(module, tag: str, xs):
    """reduce-overhead with freezing, in a frame of its own (no dynamo reset: the variants live
    side by side and are timed in turn)."""
    import torch
    from bench_gpu import _own_frame
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        fn = torch.compile(_own_frame(module, tag), mode="reduce-overhead")
        for _ in range(3):
            fn(*xs)
    return fn


def run(spec: str, rounds: int, repeat: int) -> dict:
    import torch
    import bench_kernels as bk
    from superopt.driver import load_model
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    name, batch = spec.split(":")
    model = load_model(zoo=name, batch_size=int(batch))
    xs = bk._bf16(model.inputs)
    bk.mark_static_caches(name, xs)
    fns, row = {}, {"case": name, "batch": int(batch)}
    mod, rep = bk.pipeline_module(model)
    row["chosen"] = rep["kernels"]["chosen"]
    for flag in (False, True):
        fresh_launchers(flag)
        fns["pdl" if flag else "plain"] = compiled(mod.to("cuda", torch.bfloat16).eval(), f"{flag}_{name}", xs)
    fresh_launchers(False)
    fns["ro"] = compiled(model.reference.to("cuda", torch.bfloat16).eval(), f"ro_{name}", xs)
    with torch.no_grad():   # cloned at once: a CUDA graph's outputs are overwritten by the next replay
        outs = {k: [t.clone() for t in bk._leaves(fn(*xs))] for k, fn in fns.items()}
    row["equal"] = all(torch.equal(a, b) for a, b in zip(outs["plain"], outs["pdl"]))
    row["err"] = bk._rel_err(outs["pdl"], outs["ro"])
    samples = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            samples[k].append(bk.time_call(fns[k], xs, repeat))
    for k, v in samples.items():
        row[f"{k}_us"] = round(min(v), 2)
        row[f"{k}_spread"] = round((max(v) - min(v)) / statistics.median(v), 3)
    row["pdl_gain"] = round(row["plain_us"] / row["pdl_us"], 3)
    row["plain_vs_ro"] = round(row["ro_us"] / row["plain_us"], 3)
    row["pdl_vs_ro"] = round(row["ro_us"] / row["pdl_us"], 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama32_1b_decode:1"], help="zoo NAME:BATCH")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=30, help="timed calls a round and variant")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    import torch
    rows = []
    cols = ("case", "batch", "chosen", "ro_us", "plain_us", "pdl_us", "pdl_gain", "plain_vs_ro", "pdl_vs_ro",
            "equal", "err")
    print(f"{torch.cuda.get_device_name()}\n" + " | ".join(cols), flush=True)
    for spec in a.models:
        try:
            row = run(spec, a.rounds, a.repeat)
        except Exception as e:   # one model's failure is reported; the others still run
            row = {"case": spec, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        print(" | ".join(str(row.get(c, "-")) for c in cols) + (f"  ERROR {row['error']}" if "error" in row else ""),
              flush=True)
        torch._dynamo.reset()
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
