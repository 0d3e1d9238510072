"""Programmatic dependent launch in the whole model, as a user runs it (GPU only): a zoo model's
program as ``superopt optimize`` writes it for this GPU, its kernels launched plainly and as
dependent launches (``SUPEROPT_PDL=1`` while that copy compiles its kernels:
:func:`keep_launchers`), against ``torch.compile(mode="reduce-overhead")`` with freezing, timed
in interleaved rounds in one process. The kernels and their configs are the same in both; the
outputs must be equal.

    python scripts/check_pdl_model.py --models llama32_1b_decode:1 llama32_1b_decode:16

Prints a table: microseconds (the least of the rounds' medians) of RO, the program with plain
launches and with dependent launches, and the ratio plain / dependent.

Session 46 (H200, shipped profile): plain / dependent 0.973 (Llama-3.2-1B decode b1), 1.001
(b16), 0.977 (Llama-3-8B decode b1), 0.962 (b16): dependent launch never paid, and session 45's
per-model decision in ``superopt tune`` (whose own timing had seen +1.5% at 1B b16) was removed.
A first version of this script emptied the op's launcher cache between the variants: the first
variant's CUDA graph then wrote ticket counters that had been freed and handed to the second,
and its outputs were wrong (relative error 0.63). The product's own cache was bounded (256) and
could have done the same in a process with more kernels; it no longer evicts.
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


_KEPT: dict = {}


def keep_launchers() -> None:
    """The op's launchers cached per (program, config, ``SUPEROPT_PDL``) and never dropped: each
    variant gets its own (compiled with or without dependent launch), and the ones a variant's
    CUDA graph recorded stay alive (a split schedule's launcher owns the ticket counters the
    graph writes; freed, the next variant's counters could land on them)."""
    from superopt.kernel import torch_op
    build = torch_op._launcher.__wrapped__

    def launcher(program: str, config: str):
        key = (program, config, os.environ.get("SUPEROPT_PDL", "0"))
        if key not in _KEPT:
            _KEPT[key] = build(program, config)
        return _KEPT[key]
    torch_op._launcher = launcher


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
    mod, rep = bk.pipeline_module(model)   # (its output check runs the reference on the CPU)
    row["chosen"] = rep["kernels"]["chosen"]
    base = model.reference.to("cuda", torch.bfloat16).eval()
    with torch.no_grad():   # the eager reference, before any compiled call (as bench_kernels checks)
        want = [t.clone() for t in bk._leaves(base(*xs))]
    for flag in (False, True):   # kernels compile at a variant's first call: with or without PDL
        os.environ["SUPEROPT_PDL"] = "1" if flag else "0"
        fns["pdl" if flag else "plain"] = bk.compiled(mod.to("cuda", torch.bfloat16).eval(), "reduce-overhead", xs,
                                                      tag=f"{flag}_{name}", reset=False)
    os.environ["SUPEROPT_PDL"] = "0"
    fns["ro"] = bk.compiled(base, "reduce-overhead", xs, tag=f"ro_{name}", reset=False)
    with torch.no_grad():   # cloned at once: a CUDA graph's outputs are overwritten by the next replay
        outs = {k: [t.clone() for t in bk._leaves(fn(*xs))] for k, fn in fns.items()}
    row["equal"] = all(torch.equal(a, b) for a, b in zip(outs["plain"], outs["pdl"]))
    row["leaves"] = {k: [list(t.shape) for t in v] for k, v in dict(outs, eager=want).items()}
    for k, v in outs.items():
        row[f"{k}_err"] = bk._rel_err(v, want)
    row["err"] = max(row["plain_err"], row["pdl_err"])
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
    keep_launchers()
    rows = []
    cols = ("case", "batch", "chosen", "ro_us", "plain_us", "pdl_us", "pdl_gain", "plain_vs_ro", "pdl_vs_ro",
            "equal", "err", "ro_err")
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
