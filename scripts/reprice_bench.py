"""Price recorded GPU measurements again with the current Inductor cost model (no GPU needed).

    python scripts/reprice_bench.py [scripts/results/bench_b1.json scripts/results/bench_b16.json]
                                    [--models bert_base ...] [--time-limit 60] [--workers 2]

``scripts/bench_gpu.py`` records, per zoo model, batch and precision, the time of
``backend="superopt"`` with and without its search (reduce-overhead). This script rebuilds each
model on the CPU, imports it as the backend does and runs the backend's search (the search
prices nodes one at a time, so it finds the graph that was measured whatever the fusion model
says of whole graphs: the script checks that by pricing both graphs as the recorded model did
and comparing with the recorded costs). Then it prices the imported and the optimized graph with
the current Inductor model and prints its predicted speedup next to the recorded prediction and
the measured one (imported / optimized: the rewrites alone). A change to the fusion model can so
be checked against every measurement already taken before a GPU is at hand; a change to the
search or the rules cannot (their graphs were never measured).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="*", default=[str(ROOT / "scripts/results/bench_b1.json"),
                                                  str(ROOT / "scripts/results/bench_b16.json")])
    p.add_argument("--models", nargs="+", help="only these zoo models")
    p.add_argument("--time-limit", type=float, default=60.0,
                   help="seconds of search per graph (the GPU host's search ran under 20 s on faster cores)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="write the rows here")
    return p.parse_args()


def _recorded_model_cost(model, graph) -> float:
    """What the recorded (pre-epilogue, pre-merge) Inductor model said: every group a kernel."""
    from superopt.cost.fusion import _groups
    from superopt.cost.model import constant_nodes
    return sum(model.group_cost(graph, k) for k in _groups(graph, constant_nodes(graph)))


def reprice(task) -> dict:
    row, time_limit = task
    import torch
    from superopt.rules.load import load_rules
    from superopt.search import search
    from superopt.cost import choose_cost_model
    from superopt.frontend import from_module
    from superopt.models import build
    from superopt.search.cse import eliminate_common_subexpressions as cse
    from superopt.search.fold import fold_constants
    torch.set_num_threads(1)
    name, bs, prec = row["model"], row["batch"], row["precision"]
    module, inputs = build(name, batch_size=bs)
    g = cse(fold_constants(from_module(module.eval(), inputs, source=name)[0]))
    model, _ = choose_cost_model("h100", prec, "inductor")
    # the backtracking search the backend ran when these GPU rows were recorded (budget 300)
    best = cse(fold_constants(search(g, load_rules(), model, budget=300, time_limit=time_limit, progress=False).graph))
    rec = [r for r in row.get("backend_report", []) if "search off" not in r.get("kept", "")]
    t = row["times_ms"]
    out = {"model": name, "batch": bs, "precision": prec,
           "recorded_us": [sum(r["cost_before_us"] for r in rec), sum(r["cost_after_us"] for r in rec)],
           "replayed_old_us": [round(_recorded_model_cost(model, g), 2), round(_recorded_model_cost(model, best), 2)],
           "now_us": [round(model.graph_cost(g), 2), round(model.graph_cost(best), 2)],
           "recorded_pred": row.get("predicted_speedup", {}).get("inductor")}
    kept = bool(rec) and all(r["kept"] == "optimized" for r in rec)
    out["kept_then"] = kept
    out["kept_now"] = out["now_us"][1] < out["now_us"][0]
    # the current model's prediction for the graph that was measured (a graph the backend did
    # not keep then ran as imported); ``kept_now``: whether the backend would keep it today
    out["pred_now"] = round(out["now_us"][0] / out["now_us"][1], 4) if kept else 1.0
    imp, so = t.get("reduce-overhead/superopt-imported"), t.get("reduce-overhead/superopt")
    out["measured"] = round(imp / so, 4) if imp and so else None
    return out


def main() -> int:
    args = _args()
    rows = []
    for path in args.results:
        rows += [r for r in json.loads(Path(path).read_text())["rows"]
                 if r.get("backend_report") and (not args.models or r["model"] in args.models)]
    tasks = [(r, args.time_limit) for r in rows]
    if args.workers > 1:
        with mp.get_context("spawn").Pool(args.workers) as pool:
            out = pool.map(reprice, tasks, chunksize=1)
    else:
        out = [reprice(t) for t in tasks]
    print(f"{'config':28} {'replayed':>9} {'measured':>9} {'pred then':>9} {'pred now':>9} {'kept now':>8}"
          f"  within 10% then/now")
    then_ok = now_ok = 0
    for r in out:
        same = abs(r["replayed_old_us"][1] - r["recorded_us"][1]) <= 0.01 * r["recorded_us"][1]
        ok_then = r["measured"] and r["recorded_pred"] and abs(r["recorded_pred"] / r["measured"] - 1) <= 0.10
        ok_now = r["measured"] and abs(r["pred_now"] / r["measured"] - 1) <= 0.10
        then_ok += bool(ok_then)
        now_ok += bool(ok_now)
        print(f"{r['model'] + ' b' + str(r['batch']) + ' ' + r['precision']:28} {'same' if same else 'DIFFERS':>9} "
              f"{r['measured'] or float('nan'):9.3f} {r['recorded_pred'] or float('nan'):9.3f} {r['pred_now']:9.3f}"
              f" {'yes' if r['kept_now'] else 'no':>8}"
              f"  {'yes' if ok_then else 'no'}/{'yes' if ok_now else 'no'}")
    print(f"within 10% of the measured rewrites-alone speedup: {then_ok}/{len(out)} then, {now_ok}/{len(out)} now")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
