"""Benchmark the search on every zoo model: a table of nodes, search time, graphs explored,
cost before/after and the rules used.

    python scripts/bench_search.py [--rules rules/default.db | --rules generated | --example-rules]
                                   [--profile p.json] [--budget 1000] [--alpha 1.05] [--time-limit 60] [--json]
                                   [--search saturate|backtrack|both] [--cost analytic|inductor] [--calls]
    python scripts/bench_search.py --same before.json after.json

``--rules generated`` is the shipped database without its curated rules (what the generator
found alone). The "by source" column counts the rewrites credited to generated and to curated
rules (a database rule's source is the settings it was stored with). ``--search saturate``
runs equality saturation (search time includes the extraction and the proof gate, whose share
is shown apart: the proofs of rule instances, which Tensat does not do); ``both`` runs the two
searches on each model and prints them side by side with Tensat's published figures.

Costs are under the H100 analytic model (and, with --profile, also priced with the profile);
``--cost inductor`` searches and prices under the model ``optimize`` uses by default instead;
``--cost both`` runs the saturation under each and prints, per model, the reduction under the
analytic H100 model (Tensat's comparison) next to the one under the Inductor model (what a user
of ``superopt optimize`` gets), with each extraction's gap.
The anchors are TASO's search as measured by Tensat (MLSys 2021) on a comparable machine.
Each model runs in a fresh process; "peak MB" is how much the search raised its peak memory.
Run it on an idle machine: other jobs on the same cores slow the search down. The clock starts
after a full garbage collection (the search runs with the collector off; a collection the model's
loading left due would otherwise land in the search's time or not, by chance: 0.2 s).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import multiprocessing
import resource
import sqlite3
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from superopt.cost import CostModel, choose_cost_model, open_profile
from superopt.search import search
from superopt.search.cse import eliminate_common_subexpressions
from superopt.search.fold import fold_constants
from superopt.driver.model import load_model
from superopt.errors import SuperoptError
from superopt.models.zoo import get_spec
from superopt.rules.load import DEFAULT_RULES, load_rules

#: model -> (search seconds, cost reduction) of Tensat itself (MLSys 2021), the saturation's targets
TENSAT = {"bert_base": (1.4, 0.092), "resnext50_32x4d": (0.7, 0.088), "inception_v3": (5.1, 0.100),
          "squeezenet1_1": (0.3, 0.245), "nasnet_a_mobile": (10.6, 0.073)}
#: model -> (search seconds, cost reduction) of TASO, as Tensat measured it
ANCHORS = {"bert_base": (1.4, 0.085), "resnext50_32x4d": (0.7, 0.055), "inception_v3": (5.1, 0.063),
           "squeezenet1_1": (0.3, 0.067), "nasnet_a_mobile": (10.6, 0.019)}
MODELS = ["bert_base", "resnext50_32x4d", "inception_v3", "squeezenet1_1", "nasnet_a_mobile", "resnet50", "vit_b16"]


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", default=DEFAULT_RULES,
                   help="a rule database, or 'generated': the shipped one without its curated rules")
    p.add_argument("--example-rules", action="store_true", help="the hand-written rules instead of a database")
    p.add_argument("--one-way", action="store_true")
    p.add_argument("--profile", help="also price the graphs with this H100 profile (a file, or h100: the shipped one)")
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--budget", type=int, default=1000)
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--search", choices=("saturate", "backtrack", "both"), default="backtrack")
    p.add_argument("--cost", choices=("analytic", "inductor", "both"), default="analytic",
                   help="search and price under the H100 analytic model (Tensat's comparison) or under the "
                        "default model optimize uses (Inductor target, shipped H100 profile, freezing); both: "
                        "the saturation under each, side by side")
    p.add_argument("--json", action="store_true")
    p.add_argument("--same", nargs=2, metavar=("A.json", "B.json"),
                   help="compare two --json outputs: what each search found (cost, reduction, e-nodes, e-classes, "
                        "iterations, stop, gap, rules used) per model and cost model; exit 1 where any differs")
    p.add_argument("--calls", action="store_true",
                   help="count the search's Python function calls (cProfile: a measure of its work that the "
                        "machine's load does not change; the seconds are then the profiled ones)")
    return p.parse_args(argv)


def rule_sources(path: str) -> dict[str, str]:
    """Database rule id -> ``generated`` or ``curated`` (the source its settings name)."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT r.id, s.json FROM rules r LEFT JOIN settings s ON r.settings_id = s.id").fetchall()
    finally:
        conn.close()
    return {rid: "curated" if json.loads(doc or "{}").get("source") == "curated" else "generated"
            for rid, doc in rows}


def _load(args):
    """The rules to apply: ``--rules generated`` drops the shipped database's curated rules."""
    if args.rules == "generated":
        curated = [rid for rid, src in rule_sources(DEFAULT_RULES).items() if src == "curated"]
        return load_rules(DEFAULT_RULES, False, not args.one_way, exclude=curated)
    return load_rules(args.rules, args.example_rules, not args.one_way)


def bench_one(name: str, args) -> dict:
    """One model, in a process of its own (so its peak memory is its own)."""
    rules = _load(args)
    analytic = CostModel("h100") if args.cost == "analytic" else choose_cost_model("h100")[0]
    measured = CostModel("h100", open_profile(args.profile, "h100")) if args.profile else None
    model = load_model(zoo=name)
    g = eliminate_common_subexpressions(fold_constants(model.graph))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from superopt.search.instance_proofs import InstanceProofs
    from superopt.search.saturate import Limits, saturate
    gc.collect()  # before the clock: loading the model leaves a full collection due (0.2 s with torch loaded),
    #               which the next allocation would start inside the search's time, or not, by chance
    prof = None
    if getattr(args, "calls", False):
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    if args.search == "saturate":
        gate = InstanceProofs.for_rules(getattr(rules, "source", None))
        res = saturate(g, rules, analytic, gate, Limits(seconds=args.time_limit), labels=rules.labels)
        gate.flush()
    else:
        res = search(g, rules, analytic, args.alpha, args.budget, args.time_limit, progress=False,
                     labels=rules.labels)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    calls = None
    if prof is not None:
        import pstats
        prof.disable()
        calls = sum(v[1] for v in pstats.Stats(prof).stats.values())
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    rep = res.report
    best = eliminate_common_subexpressions(fold_constants(res.graph))
    after = analytic.graph_cost(best)
    row = {"model": name, "search": args.search, "nodes": rep.nodes_before, "nodes_after": rep.nodes_after,
           "search_s": round(secs, 3), "cpu_s": round(cpu, 3), "explored": getattr(rep, "explored", None) or getattr(rep, "enodes", 0),
           "stop": str(rep.stop_reason), "cost_before_us": round(rep.cost_before, 2),
           "cost_after_us": round(after, 2), "reduction": round(1 - after / rep.cost_before, 4),
           "rules_used": rep.rules_applied, "anchor": ANCHORS.get(name), "tensat": TENSAT.get(name),
           "search_peak_mb": round(peak_mb, 1), "seconds": {k: round(v, 3) for k, v in rep.seconds.items()},
           "calls": calls}
    if args.search == "saturate":
        row.update(extraction=rep.extraction, gap=rep.gap, eclasses=rep.eclasses, iterations=rep.iterations,
                   greedy_cost_us=round(getattr(rep, "greedy_cost", 0.0), 2), ilp_status=rep.ilp_status,
                   held=getattr(rep, "held", None), paying=getattr(rep, "paying", None),
                   repeats=getattr(rep, "repeats", None), bans=getattr(rep, "bans", None))
    if not args.example_rules:
        src = rule_sources(DEFAULT_RULES if args.rules == "generated" else args.rules)
        row["by_source"] = {}
        for rid, n in rep.rules_applied.items():
            kind = src.get(rid.rstrip("~"), "generated")
            row["by_source"][kind] = row["by_source"].get(kind, 0) + n
    if measured is not None:
        before, after = measured.graph_cost(g), measured.graph_cost(best)
        row.update(profile_before_us=round(before, 2), profile_after_us=round(after, 2),
                   profile_reduction=round(1 - after / before, 4))
    return row


def _table(rows) -> str:
    head = f"{'model':<16} {'nodes':>11} {'search s':>9} {'peak MB':>8} {'explored':>8} {'stop':>10} {'cost us':>19} " \
           f"{'less':>7} {'TASO (s, less)':>15} {'profile less':>12} {'by source':>12}  rules used"
    out = [head, "-" * len(head)]
    for r in rows:
        anchor = f"{r['anchor'][0]:.1f}, {100 * r['anchor'][1]:.1f}%" if r["anchor"] else "-"
        prof = f"{100 * r['profile_reduction']:.2f}%" if "profile_reduction" in r else "-"
        rules = ", ".join(f"{k[:8]} x{v}" for k, v in sorted(r["rules_used"].items(), key=lambda kv: -kv[1]))
        src = r.get("by_source", {})
        src = f"gen {src.get('generated', 0)}/cur {src.get('curated', 0)}" if "by_source" in r else "-"
        out.append(f"{r['model']:<16} {r['nodes']:>5}->{r['nodes_after']:<5} {r['search_s']:>9.2f} "
                   f"{r['search_peak_mb']:>8.0f} {r['explored']:>8} "
                   f"{r['stop']:>10} {r['cost_before_us']:>9.1f}->{r['cost_after_us']:<9.1f}"
                   f"{100 * r['reduction']:>6.2f}% {anchor:>15} {prof:>12} {src:>12}  {rules or '-'}")
    return "\n".join(out)


def _per_model(rows, key: str) -> dict:
    """model -> {row[key]: row}, models in the order of their first row."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["model"], {})[r[key]] = r
    return by


def _side_by_side(rows) -> str:
    """Backtracking and saturation per model, with Tensat's figures (``--search both``)."""
    by = _per_model(rows, "search")
    head = (f"{'model':<16} {'backtrack s':>11} {'less':>7} {'saturate s':>10} {'proofs s':>8} {'less':>7} {'e-nodes':>7} "
            f"{'stop':>15} {'extraction':>12} {'gap':>6} {'Tensat s, less':>15} {'TASO s, less':>13}")
    out = [head, "-" * len(head)]
    for name, d in by.items():
        b, s = d.get("backtrack"), d.get("saturate")
        t, a = (b or s)["tensat"], (b or s)["anchor"]
        out.append(f"{name:<16} {b['search_s'] if b else float('nan'):>11.2f} "
                   f"{100 * b['reduction'] if b else float('nan'):>6.2f}% "
                   f"{s['search_s'] if s else float('nan'):>10.2f} {s['seconds'].get('proof gate', 0) if s else float('nan'):>8.2f} "
                   f"{100 * s['reduction'] if s else float('nan'):>6.2f}% "
                   f"{s['explored'] if s else '-':>7} {s['stop'] if s else '-':>15} "
                   f"{s.get('extraction', '-') if s else '-':>12} {_gap(s):>6} "
                   f"{f'{t[0]:.1f}, {100 * t[1]:.1f}%' if t else '-':>15} {f'{a[0]:.1f}, {100 * a[1]:.1f}%' if a else '-':>13}")
    return "\n".join(out)


def _by_cost(rows) -> str:
    """The saturation's reduction per model under the analytic H100 model and under the Inductor
    model (``--cost both``), with search seconds and extraction gaps."""
    by = _per_model(rows, "cost")
    head = (f"{'model':<16} {'analytic: s':>11} {'cpu s':>6} {'less':>7} {'gap':>6} {'stop':>10} "
            f"{'inductor: s':>11} {'cpu s':>6} {'less':>7} {'gap':>6} {'stop':>10} {'Tensat s, less':>15}")
    out = [head, "-" * len(head)]
    for name, d in by.items():
        a, i = d.get("analytic"), d.get("inductor")
        t = (a or i)["tensat"]
        cell = lambda r: (f"{r['search_s']:>11.2f} {r.get('cpu_s', float('nan')):>6.2f} {100 * r['reduction']:>6.2f}% "  # noqa: E731
                          f"{_gap(r):>6} {r['stop']:>10}" if r else f"{'-':>11} {'-':>6} {'-':>7} {'-':>6} {'-':>10}")
        out.append(f"{name:<16} {cell(a)} {cell(i)} {f'{t[0]:.1f}, {100 * t[1]:.1f}%' if t else '-':>15}")
    out.append("analytic: Tensat's comparison; inductor: the model `superopt optimize` prices with by default "
               "(what a user gets); s: wall seconds, cpu s: this process's CPU seconds (steadier under load)")
    return "\n".join(out)


def _gap(row) -> str:
    """The extraction's gap; ``<=`` where the local search's pick was proven within it."""
    if not row or row.get("gap") is None:
        return "-"
    return ("<=" if str(row.get("ilp_status", "")).startswith("known pick within") else "") + f"{100 * row['gap']:.2f}%"


def main(argv=None) -> int:
    """Bad input (an unknown model, a missing or corrupt rule database) prints one line and
    exits 2."""
    args = _args(argv)
    if args.same:
        return _same(*args.same)
    try:
        for name in args.models:
            get_spec(name)  # before any worker starts: an unknown name is one line, not a traceback
        return _run(args)
    except SuperoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


#: what a search found, as --json writes it (the seconds and calls aside)
FOUND = ("cost_after_us", "reduction", "explored", "eclasses", "iterations", "stop", "gap", "ilp_status", "rules_used",
         "nodes_after")


def _same(a: str, b: str) -> int:
    """``--same A.json B.json``: one line per model and cost model, ``same`` or the fields that
    differ (a change meant to keep results, measured before and after); 1 where any differs."""
    try:
        rows = [{(r["model"], r.get("cost")): r for r in json.loads(Path(f).read_text())["models"]} for f in (a, b)]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read a --json output: {e}", file=sys.stderr)
        return 2
    differ = False
    for key in rows[0].keys() | rows[1].keys():
        x, y = rows[0].get(key), rows[1].get(key)
        diff = ["missing"] if x is None or y is None else [f for f in FOUND if x.get(f) != y.get(f)]
        differ |= bool(diff)
        print(f"{key[0]} ({key[1]}): " + ("same" if not diff else "differs: " + ", ".join(diff)))
    return int(differ)


def _run(args) -> int:
    if not args.example_rules and args.rules != "generated" and not Path(args.rules).exists():
        print(f"no rule database at {args.rules}; using the hand-written example rules", file=sys.stderr)
        args.example_rules = True
    rules = _load(args)
    rows = []
    ctx = multiprocessing.get_context("spawn")
    kinds = ("backtrack", "saturate") if args.search == "both" else (args.search,)
    if args.cost == "both":
        kinds = ("saturate",)
    costs = ("analytic", "inductor") if args.cost == "both" else (args.cost,)
    for name in args.models:
        for kind, cost in itertools.product(kinds, costs):
            with ProcessPoolExecutor(1, mp_context=ctx) as pool:
                job = argparse.Namespace(**{**vars(args), "search": kind, "cost": cost})
                rows.append({**pool.submit(bench_one, name, job).result(), "cost": cost})
            print(f"done {name} ({kind}, {cost}): {rows[-1]['search_s']} s, {100 * rows[-1]['reduction']:.2f}%"
                  + (f", {rows[-1]['calls']} calls" if rows[-1]["calls"] is not None else ""), file=sys.stderr)
    settings = {"rules": "examples" if args.example_rules else args.rules, "rule_count": len(rules), "cost": args.cost,
                "budget": args.budget, "alpha": args.alpha, "time_limit": args.time_limit, "search": args.search}
    if args.json:
        print(json.dumps({"settings": settings, "models": rows}, indent=2))
    else:
        print(", ".join(f"{k} {v}" for k, v in settings.items()))
        print(_by_cost(rows) if args.cost == "both" else _side_by_side(rows) if args.search == "both" else _table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
