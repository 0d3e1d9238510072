"""Where a decode attention kernel's time goes: the shipped profile's decode attention kernels
(batch 1, each with its profiled config) timed as generated and as edited copies of their Triton
source that leave parts out, in one run (GPU only). The edits are for timing only; their outputs
are wrong (except ``loads first``, which moves the loop's loads to the top of its body: the same
values, issued before the first dot).

    python scripts/check_attention_gpu.py [--profile h200-bf16] [--repeat 30]

Variants: ``as is``; ``loads first``; ``no combine`` (the split's last program skips the combine
and the output store); ``no loop`` (no key/value tile read: the query prologue, the partials'
stores, the ticket and the combine); ``no loop, no combine`` (close to the launch alone).
Every kernel is timed in a CUDA graph with the L2 evicted before each call
(:func:`superopt.kernel.tune.measure_us`), the variants in turn, ``--rounds`` rounds; medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def attention_entries(profile: str) -> list[dict]:
    """The profile's decode attention entries at batch 1 (one query row per head)."""
    data = json.loads((Path(__file__).resolve().parents[1] / f"superopt/kernel/profiles/{profile}.json").read_text())
    return [e for e in data["entries"] if "sdpa @ 1x" in e["region"] and "x1x" in e["region"].split("@")[1][:12]]


def loads_first(src: str) -> str:
    """The loop body's loads (with their comment lines) moved to just after its offsets."""
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("for t_S in range("))
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and
                len(lines[i]) - len(lines[i].lstrip()) < indent), len(lines))
    body = lines[start + 1:end]
    first = next(i for i, ln in enumerate(body) if not ln.strip().startswith(("offs_", "mask_")))
    loads, rest, i = [], [], first
    while i < len(body):
        if "= tl.load(" in body[i]:
            if rest and rest[-1].strip().startswith("#"):
                loads.append(rest.pop())
            loads.append(body[i])
        else:
            rest.append(body[i])
        i += 1
    return "\n".join(lines[:start + 1] + body[:first] + loads + rest + lines[end:]) + "\n"


def no_combine(src: str) -> str:
    return re.sub(r"if ticket == \d+:", "if ticket < 0:", src)


def no_loop(src: str) -> str:
    return re.sub(r"t_hi = tl\.minimum\(t_lo \+ \d+, \d+\)", "t_hi = t_lo", src)


VARIANTS = {"as is": lambda s: s, "loads first": loads_first, "no combine": no_combine, "no loop": no_loop,
            "no loop, no combine": lambda s: no_loop(no_combine(s))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="h200-bf16")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the table as JSON here")
    args = p.parse_args(argv)
    import torch
    from superopt.kernel.compile import _import, _launcher, cache_dir
    from superopt.kernel.program import parse_program
    from superopt.kernel.triton_lower import to_triton
    from superopt.kernel.tune import measure_us, parse_config
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    rows = []
    for e in attention_entries(args.profile):
        program, config = parse_program(e["program"]), parse_config(e["config"])
        inputs = [torch.randn(t.shape, device="cuda").to(dtypes[t.dtype]) for t in program.inputs]
        src = to_triton(program, config)
        runs = {}
        for name, edit in VARIANTS.items():
            text = edit(src)
            path = cache_dir() / "check_attention" / f"{program.name}_{abs(hash(text))}.py"
            runs[name] = _launcher(program, config, _import(path, text))
            runs[name](*inputs)
        want = runs["as is"](*inputs)[0].float()
        moved = runs["loads first"](*inputs)[0].float()
        times = {k: [] for k in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                times[name].append(measure_us(run, inputs, repeat=args.repeat))
        row = {"region": e["region"][:60], "config": config.text(), "profiled_us": e["us"],
               "loads_first_equal": bool(torch.equal(want, moved))}
        row.update({k: round(statistics.median(v), 2) for k, v in times.items()})
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ["region", "config", "profiled_us", *VARIANTS, "loads_first_equal"]
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
