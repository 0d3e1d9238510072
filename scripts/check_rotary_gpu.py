"""Where the rotary prologue's time goes in the Llama-3-8B decode attention kernel (batch 1, bf16,
32 query / 8 key-value heads, 2,048 cached positions): four programs over one config grid,
each compiled in a process pool and timed alone under CUDA graphs with the L2 flushed
(``tune.measure_us``):

* ``plain``: the shipped profile's kernel for the attention alone (q rotated by Inductor before it);
* ``rotary``: the shipped kernel for the attention with the queries' rotation in its region
  (:mod:`superopt.kernel.rotary`: half-width loads, the rotation in the prologue, two dots);
* ``plain+table``: ``plain`` with one more prologue load (a [128] table) multiplied into q (the
  cost of a prologue that computes the dot's operand rather than loading it);
* ``halves``: ``rotary`` without the rotation (q's halves straight into the two dots: the
  cost of the split dot alone).

Timing only: the programs are not checked for what they compute (the last two compute
something else by construction). Prints one row per program and config, then each program's
best three.

    python scripts/check_rotary_gpu.py [--profile superopt/kernel/profiles/h100-bf16.json] [--workers 16]
    python scripts/check_rotary_gpu.py --print     # the four programs' text only (no GPU)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superopt.kernel import parse_program  # noqa: E402
from superopt.kernel.profile import KernelProfile  # noqa: E402
from superopt.kernel.program import TileConfig  # noqa: E402

PLAIN = "sdpa @ 1x32x1x128,1x8x2048x128,1x8x2048x128,1x1x1x2048"
ROTARY = "split-smul-concat-mul-mul-add-sdpa @ 1x32x1x128,"


def programs(profile: KernelProfile) -> dict[str, str]:
    entries = {e.region: e.program for e in profile.entries.values() if e.dtype == "bf16"}
    plain = entries.get(PLAIN)
    rot = next((p for r, p in entries.items() if r.startswith(ROTARY)), None)
    if plain is None or rot is None:
        raise SystemExit("the profile has no plain and rotary Llama-3-8B b1 decode attention entries")
    q = re.search(r"\n  (\w+) = load (\w+)\[B,H,L,D\]\n", plain)          # plain's query load
    table = plain.replace("\noutput ", "\ninput tab bf16[1,1,1,128]\noutput ", 1)
    table = table.replace(q.group(0), q.group(0) + f"  tab_1 = load tab[0,0,0,D]\n  qt = mul {q.group(1)} tab_1\n"
                                                   f"  qtl = cast qt dtype=bf16\n", 1)
    table = re.sub(rf"dot {q.group(1)} ", "dot qtl ", table)
    q_lo = re.search(r"\n  (\w+) = load (\w+)\[B,H,L,D\]\n", rot)
    q_hi = re.search(rf"\n  (\w+) = load {q_lo.group(2)}\[B,H,L,D\+\d+\]\n", rot)
    halves = rot
    for src, part in ((q_lo.group(1), 0), (q_hi.group(1), 1)):   # each dot's cast reads a raw half
        cast = re.findall(r"\n  (\w+__lo) = cast (\w+) dtype=bf16\n", halves)[part]
        halves = halves.replace(f"{cast[0]} = cast {cast[1]} ", f"{cast[0]} = cast {src} ")
    pre = halves.split("\npre:\n")[1].split("\nbody:\n")[0]
    kept = "\n".join(ln for ln in pre.splitlines() if ln.startswith((f"  {q_lo.group(1)} ", f"  {q_hi.group(1)} ")))
    halves = halves.replace(pre, kept)
    used = set(re.findall(r"load (\w+)\[", halves))
    halves = "\n".join(ln for ln in halves.splitlines() if not ln.startswith("input ") or ln.split()[1] in used) + "\n"
    out = {"plain": plain, "rotary": rot, "plain+table": table, "halves": halves}
    for text in out.values():
        parse_program(text)
    return out


def grid() -> list[TileConfig]:
    return [TileConfig((("L", 16), ("S", s)), w, st, split=split)
            for s, split in ((256, 8), (128, 16), (128, 8), (64, 16)) for w, st in ((4, 2), (4, 3), (2, 2))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=str(Path(__file__).resolve().parents[1] / "superopt/kernel/profiles/h100-bf16.json"))
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--print", action="store_true", help="print the four programs and stop")
    args = ap.parse_args()
    progs = programs(KernelProfile.load(args.profile))
    if args.print:
        for name, text in progs.items():
            print(f"# {name}\n{text}")
        return 0
    import torch
    from superopt.kernel.compile import compile_program
    from superopt.kernel.tune import config_text, measure_us, warm_all
    cfgs = grid()
    warm_all([(t, config_text(c), "bf16") for t in progs.values() for c in cfgs], args.workers)
    rows = []
    for name, text in progs.items():
        p = parse_program(text)
        gen = torch.Generator(device="cpu").manual_seed(0)
        ins = []
        for t in p.inputs:
            x = torch.randn(t.shape, generator=gen) / 4
            if len(t.shape) == 1:                    # rotate_half's -1
                x = torch.full(t.shape, -1.0)
            elif t.shape[-1] == 2048:                # the additive mask: nothing masked
                x = torch.zeros(t.shape)
            ins.append(x.to("cuda", torch.bfloat16))
        for c in cfgs:
            try:
                us = measure_us(compile_program(p, c), ins, repeat=args.repeat)
            except Exception as e:   # a config Triton cannot run (shared memory): reported, skipped
                print(f"{name:12s} {config_text(c):70s} failed: {type(e).__name__}", flush=True)
                continue
            rows.append((name, config_text(c), us))
            print(f"{name:12s} {config_text(c):70s} {us:7.2f}", flush=True)
    print()
    print("program | best us | config")
    for name in progs:
        for _, cfg, us in sorted((r for r in rows if r[0] == name), key=lambda r: r[2])[:3]:
            print(f"{name} | {us:.2f} | {cfg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
