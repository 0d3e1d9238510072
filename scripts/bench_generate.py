"""Benchmark the rule generator: for N = 2, 3 (and 4 with --n4), with and without
representative-based pruning, how many graphs it enumerates and how fast, how many candidates
each pruning step leaves, the final rules, wall and CPU time, and peak memory.

    python scripts/bench_generate.py [--ops taso] [--inputs SET] [--workers 2] [--n4] [--no-compare] [--json]
    python scripts/bench_generate.py --families [--workers 2]   # each family of the shipped DB at its N

Generation only (enumerate, fingerprint, prune): no verification, nothing written. Each run is
a fresh process so that peak memory is its own; "CPU s" adds the worker processes. The anchor
is TASO (SOSP 2019): its generator took about 5 minutes for its rule set on a large machine.
Run it on an idle machine: other jobs on the same cores slow the enumeration down.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

_ONE = """
import json, resource, sys, time
from superopt.generate import Settings, generate
from superopt.generate.classics import find_classics
n, ops, inputs, reps, workers = int(sys.argv[1]), sys.argv[2], sys.argv[3] or None, sys.argv[4] == "1", int(sys.argv[5])
s = Settings.make(max_ops=n, ops=ops, inputs=inputs, representatives=reps)
t0 = time.perf_counter()
r = generate(s, workers=workers, progress=False)
wall = time.perf_counter() - t0
cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
          for f in ("ru_utime", "ru_stime"))
doc = r.to_json()
doc["settings"]["ops_name"] = ops
doc.update(wall=wall, cpu=cpu, classics=sum(find_classics(r.rules).values()) if n >= 3 else None)
print(json.dumps(doc))
"""


def run_one(n: int, ops: str, inputs: str | None, reps: bool, workers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _ONE, str(n), ops, inputs or "", "1" if reps else "0", str(workers)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"N={n} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(d: dict) -> dict:
    p = d["prune"]
    enum_s = d["phases"]["enumerate"]
    return {"ops": d["settings"]["ops_name"], "N": d["settings"]["max_ops"],
            "reps": "on" if d["settings"]["representatives"] else "off",
            "graphs": d["graphs"], "graphs/s": round(d["graphs"] / enum_s) if enum_s else 0,
            "classes": d["classes"], "pairs": p["pairs"], "-subgraph": p["common_subgraph"],
            "-supergraph": p["common_supergraph"], "-renaming": p["renaming"], "-collisions": p["collisions"],
            "-instances": p["instances"], "rules": p["rules"], "enum s": round(enum_s, 1),
            "prune s": round(d["phases"]["prune"], 1), "wall s": round(d["wall"], 1), "CPU s": round(d["cpu"], 1),
            "peak MB": round(d["peak_memory_mb"]), "classics": d["classics"] if d["classics"] is not None else "-"}


def table(rows: list[dict]) -> str:
    head = list(rows[0])
    cells = [[str(r[h]) for h in head] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="taso", help="operator preset or list (default taso)")
    p.add_argument("--inputs", default=None, help="input set or list (default: the preset's)")
    p.add_argument("--workers", type=int, default=2, help="local processes (default 2: the target machine)")
    p.add_argument("--n4", action="store_true", help="also N = 4 (minutes, GBs)")
    p.add_argument("--no-compare", action="store_true", help="skip the runs without representatives")
    p.add_argument("--families", action="store_true", help="each family of the shipped database, at its N")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    runs = []
    if args.families:
        from superopt.generate.families import FAMILIES, SHIPPED
        for name in SHIPPED:
            runs.append(run_one(FAMILIES[name].max_ops, name, None, True, args.workers))
            print(f"{name}: {runs[-1]['wall']:.0f} s", file=sys.stderr)
    for n in () if args.families else (2, 3, 4) if args.n4 else (2, 3):
        for reps in (True,) if args.no_compare or n == 4 else (True, False):
            t0 = time.perf_counter()
            d = run_one(n, args.ops, args.inputs, reps, args.workers)
            runs.append(d)
            print(f"N={n} representatives={'on' if reps else 'off'}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps(runs, indent=1, sort_keys=True, default=str))
    else:
        print(f"superopt generate --ops {'(each family)' if args.families else args.ops}: {args.workers} worker(s); "
              f"candidates before and after each pruning step (-step: removed by it)")
        print(table([_row(d) for d in runs]))
        print("anchor: TASO's generator took about 5 minutes for its rule set (SOSP 2019), on a large machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
