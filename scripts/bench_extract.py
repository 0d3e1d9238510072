"""The extraction alone, per zoo model: seconds, method, solver status, gap and reduction, under
the analytic H100 model and the Inductor model, optionally against another checkout.

    python scripts/bench_extract.py [--models bert_base ...] [--before DIR] [--seconds 30] [--phases] [--json]

Each model is saturated once per checkout (the default limits, under the Inductor model as
``optimize`` does; a fresh process per model and checkout, the checkout's code on
``PYTHONPATH``), then extracted with that checkout's ``extract`` under both cost models. With
``--before DIR`` (e.g. the main branch) both checkouts run one after the other per model, so
they see the same machine load: compare their ratios. The gap is the program's best objective
over the solver's lower bound ("<=": the local search's pick proven within it); "cpu s" the
extraction's CPU seconds, "graph" a hash of the graph extracted (equal: the same graph).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ["squeezenet1_1", "resnet50", "resnext50_32x4d", "inception_v3", "nasnet_a_mobile", "bert_base", "vit_b16"]

#: run in a fresh process with the checkout's code: saturate once, extract under both models
_CHILD = r"""
import gc, hashlib, json, sys, time
from superopt.cost import CostModel, choose_cost_model
from superopt.driver.model import load_model
from superopt.rules.load import DEFAULT_RULES, load_rules
from superopt.search.cse import eliminate_common_subexpressions
from superopt.search.fold import fold_constants
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.saturate import DEFAULT_LIMITS, saturate
name, seconds, phases = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
import superopt.search.extract as X
spent, depth = {}, [0]


def timed(label, f):  # f, with its CPU seconds added to spent[label] (the outermost timed call only)
    def g(*a, **k):
        depth[0] += 1
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[label] = spent.get(label, 0.0) + time.process_time() - t
    return g


if phases:  # extract() calls these through its module: time each (prices and builds inside minimal apart)
    for fn, label in (("Problem", "problem"), ("greedy_choice", "greedy"), ("drop_cycles", "filter"),
                      ("local_search", "local"), ("ilp_choice", "program"), ("prefer_original", "minimal"),
                      ("build_graph", "build")):
        setattr(X, fn, timed(label, getattr(X, fn)))
rules = load_rules(DEFAULT_RULES, False, True)
g = eliminate_common_subexpressions(fold_constants(load_model(zoo=name).graph))
gate = InstanceProofs.for_rules(getattr(rules, "source", None))
extract = X.extract
res = saturate(g, rules, choose_cost_model("h100")[0], gate, DEFAULT_LIMITS, labels=rules.labels, use_ilp=False)
gate.flush()
eg, roots = res.egraph, [res.egraph.find(c) for c in res.egraph.add_graph(g)]
out = {"enodes": len(eg)}
gc.disable()  # as saturate() runs it
extract(eg, roots, g, CostModel("h100"), seconds, DEFAULT_LIMITS.ilp_gap)  # scipy imported outside the timing
for kind in ("analytic", "inductor"):
    cost = CostModel("h100") if kind == "analytic" else choose_cost_model("h100")[0]
    cost.assume_layout_of(g)
    if phases:
        cost.graph_cost = timed("price", cost.graph_cost)
    spent.clear()
    t, c = time.perf_counter(), time.process_time()
    best, how = extract(eg, roots, g, cost, seconds, DEFAULT_LIMITS.ilp_gap)
    out[kind] = {"s": round(time.perf_counter() - t, 3), "cpu": round(time.process_time() - c, 3),
                 "phases": {k: round(v, 3) for k, v in spent.items()},
                 "method": how.method, "status": how.status, "gap": how.gap,
                 "less": 1 - cost.graph_cost(best) / cost.graph_cost(g),
                 "graph": hashlib.sha256(repr(best).encode()).hexdigest()[:12]}
print(json.dumps(out))
"""


def run(tree: Path, model: str, seconds: float, phases: bool = False) -> dict:
    """One model's extractions with the checkout ``tree`` (a fresh process)."""
    # the checkout first, then what the caller's path holds (carried wheels on the device machine)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-c", _CHILD, model, str(seconds), "1" if phases else "0"],
                       capture_output=True, text=True, env=env, cwd=tree, timeout=1800)  # cwd: "-c" puts it first on sys.path
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}


def _cell(r: dict | None) -> str:
    if not r:
        return f"{'-':>6} {'-':>6} {'-':>12} {'-':>8} {'-':>7} {'-':>12}"
    gap = "-" if r["gap"] is None else ("<=" if r["status"].startswith("known pick within") else "") + \
        f"{100 * r['gap']:.2f}%"
    return f"{r['s']:>6.2f} {r.get('cpu', 0):>6.2f} {r['method']:>12} {gap:>8} {100 * r['less']:>6.3f}% " \
           f"{r.get('graph', ''):>12}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=ZOO)
    p.add_argument("--before", type=Path, help="another superopt checkout to run on the same models first")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="the integer program's safety net (saturate's default; its node budget decides)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--phases", action="store_true",
                   help="also the CPU seconds of each step of the extraction (problem, greedy, filter, local, "
                        "program, minimal, build, price: the last two outside minimal)")
    args = p.parse_args()
    trees = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    rows = []
    print(f"{'model':<16} {'side':<6} {'cost':<9} {'s':>6} {'cpu s':>6} {'method':>12} {'gap':>8} {'less':>8} "
          f"{'graph':>12}  load", flush=True)
    for m in args.models:
        row = {"model": m}
        for side, tree in trees:
            row[side] = r = run(tree, m, args.seconds, args.phases)
            load = os.getloadavg()[0]
            for kind in ("analytic", "inductor"):
                text = r.get("error") if "error" in r else _cell(r.get(kind))
                print(f"{m:<16} {side:<6} {kind:<9} {text}  {load:.1f}", flush=True)
                if args.phases and r.get(kind, {}).get("phases"):
                    print(" " * 33 + "  ".join(f"{k} {v:.3f}" for k, v in r[kind]["phases"].items()), flush=True)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
