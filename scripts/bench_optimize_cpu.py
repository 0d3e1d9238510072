"""How long `superopt optimize` takes, per phase, on this machine (no GPU needed).

    python scripts/bench_optimize_cpu.py [--models squeezenet1_1 ... | all] [--device h100] [--before DIR]
                                         [--repeat 1] [--warm] [--parallel N] [--threads N] [--json OUT.json]
                                         [--spare-core auto|1|0] [--wait-idle] [--until-search]

Runs ``superopt optimize --zoo M --device D --json`` for every zoo model, one process at a time
(as a user would, a fresh process each: imports included), and prints a table of the wall time,
the CPU seconds (user + system: on a shared machine a better estimate of an idle machine's wall
time, less the waits for the disk), the CPU seconds of the run's own process ("run cpu": work
done beside it in a second process, on an idle core, left out) and the report's per-phase
seconds (and, where the report has them, each phase's CPU seconds in the run's own process:
on a shared machine the steadier figure). ``--before DIR`` also
runs a second checkout of superopt (e.g. the main branch) on the same model right before, alternating, so that both see the same
machine load; the table then gives their ratio. The load average is printed with each row: on
a shared machine, compare ratios, not seconds.

``--parallel N`` then starts N runs at once (the models in turn, repeated to make N jobs, N
at a time until every model ran at least once in company) and prints each model's wall time
alone and in company, and their ratio: the issue asks eight runs on 16 cores to finish each
model within 2x of its time alone. On the device machine (16 cores, no GPU needed), from the
checkout with z3/networkx/tqdm importable:

    python scripts/bench_optimize_cpu.py --warm --parallel 8 --json $OUT/parallel.json

and, with a second checkout (the base) extracted into ``base/``, the base and this one alone on
an idle machine, where the work beside a run gets a core of its own:

    python scripts/bench_optimize_cpu.py --before base --warm --json $OUT/alone.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ["squeezenet1_1", "resnet50", "resnext50_32x4d", "inception_v3", "nasnet_a_mobile", "bert_base", "vit_b16"]


THREADS: list = []  # extra arguments of every run (--threads N)
SPARE: dict = {}  # SUPEROPT_SPARE_CORE per checkout ("before", "after"), where given
WAIT_IDLE: list = []  # non-empty: each run alone waits for a quiet second first (--wait-idle)
STAMPS: list = []  # non-empty: each run gives the seconds until its search (--until-search)


def run_once(tree: Path, model: str, device: str, out: Path, cache: Path | None = None, alone: bool = True) -> dict:
    """One `superopt optimize` from the checkout ``tree``: wall seconds, CPU seconds (user +
    system: on a shared machine closer to what an idle one would take than the wall time; only
    ``alone``, one run at a time) and the report; ``cache``: the instance-proof cache file this
    checkout keeps (two checkouts sharing one would each find what the other proved)."""
    cmd = [sys.executable, "-m", "superopt", "optimize", "--zoo", model, "--device", device,
           "-o", str(out / f"{model}.opt.pt2"), "--json", *THREADS]
    stamps = out / "stamps.json"
    if STAMPS:  # the same command, run by this script's stamping runner
        cmd[1:3] = [str(Path(__file__).resolve()), "--stamped-run", str(stamps)]
    # the checkout first, then what the caller's path holds (carried wheels on the device machine)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    if cache is not None:
        env["SUPEROPT_PROOF_CACHE"] = str(cache)
    said = SPARE.get("after" if tree == ROOT else "before")
    if said is not None:
        env["SUPEROPT_SPARE_CORE"] = said
    if WAIT_IDLE and alone:
        _wait_idle()
    t, used, busy = time.perf_counter(), _children_cpu(), _busy_seconds()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out, timeout=900)
    wall, cpu = time.perf_counter() - t, _children_cpu() - used
    others = _busy_seconds() - busy - cpu if busy is not None and alone else None
    try:
        rep = json.loads(p.stdout)
    except json.JSONDecodeError:
        rep = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    search = rep.get("search", {})
    marks = json.loads(stamps.read_text()) if STAMPS and stamps.exists() else None
    return {"until_search": _until_search(marks, rep.get("cpu_s", {}).get("import beside")),"wall_s": round(wall, 2), "cpu_s": round(cpu, 2) if alone else None, "load": round(os.getloadavg()[0], 1),
            "others_cpu_s": round(others, 2) if others is not None else None,
            "seconds": rep.get("seconds", {}), "cpu_seconds": rep.get("cpu_seconds", {}),
            "error": rep.get("error"), "cost": [rep.get("cost_before"), rep.get("cost_after")],
            "search_seconds": search.get("seconds", {}), "proofs": search.get("instance_proofs", {}),
            "output_check": rep.get("output_check", {}), "cpu_run_s": rep.get("cpu_s", {}).get("run"),
            "beside": rep.get("region_check", {}).get("beside"),
            "import_beside": rep.get("cpu_s", {}).get("import beside")}


def all_models() -> list[str]:
    """Every zoo model, as `superopt zoo list` lists them (read from this checkout)."""
    cmd = [sys.executable, "-c", "from superopt.models import ZOO; print(' '.join(ZOO))"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.split()


def _stamped_run(path: str) -> None:
    """``superopt optimize`` (the arguments after ``--stamped-run PATH``) run as the command runs,
    with (wall, CPU) seconds since this process started written to ``PATH`` at its end: where the
    zoo model is forked to be exported beside (``fork``), where this process starts waiting for its
    graph (``wait``) and has it (``got``), and where the search starts (``search``)."""
    import atexit
    import importlib.abc
    import importlib.util
    t0, marks = time.perf_counter(), {}

    def mark(name):
        marks.setdefault(name, (round(time.perf_counter() - t0, 3), round(time.process_time(), 3)))

    def wrap(obj, attr, name, after=None):
        fn = getattr(obj, attr)

        def stamped(*a, **k):
            mark(name)
            try:
                return fn(*a, **k)
            finally:
                if after:
                    mark(after)
        setattr(obj, attr, stamped)

    def ahead(mod):
        if hasattr(mod, "ExportedAhead"):  # a checkout without it forks nothing
            wrap(mod.ExportedAhead, "__init__", "fork")
            wrap(mod.ExportedAhead, "imported", "wait", "got")
    hooks = {"superopt.driver.passes": lambda mod: wrap(mod, "saturate", "search"), "superopt.driver.ahead": ahead}

    class Hook(importlib.abc.MetaPathFinder):  # patches each module as it is first imported, where the run imports it
        def find_spec(self, name, path=None, target=None):
            if name not in hooks:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda mod: (run(mod), hooks[name](mod))
            return spec
    sys.meta_path.insert(0, Hook())
    atexit.register(lambda: Path(path).write_text(json.dumps(marks)))  # the command's end runs the exit hooks
    sys.argv = ["superopt", *sys.argv[3:]]
    from superopt.cli import main as superopt_main
    sys.exit(superopt_main())


def _until_search(marks: dict | None, beside: dict | None) -> dict | None:
    """Seconds from the start to the search: the wall, and what an idle machine would take, from
    CPU seconds: this process's CPU at the search where nothing went beside, else its CPU at the
    fork plus the longer of its own work until it waited and the export beside (its CPU), plus
    the rest (the graph unpacked)."""
    if not marks or "search" not in marks:
        return None
    wall, cpu = marks["search"]
    if "fork" in marks and "got" in marks and beside:
        fork, wait, got = marks["fork"][1], marks["wait"][1], marks["got"][1]
        cpu = fork + max(wait - fork, beside["cpu_s"]) + (marks["search"][1] - got)
    return {"wall_s": wall, "idle_s": round(cpu, 3)}


def _busy_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (``/proc/stat``), None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and I/O wait


def _wait_idle(cores_busy: float = 0.2, most_s: float = 120.0) -> None:
    """Wait (at most ``most_s``) for a second in which other work used under ``cores_busy`` cores."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        before = _busy_seconds()
        time.sleep(1.0)
        if before is None or _busy_seconds() - before < cores_busy:
            return


def _children_cpu() -> float:
    """User + system seconds of this process's finished children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _phases(sec: dict) -> str:
    short = {"fold + merge duplicates": "fold", "keep if cheaper": "keep", "layout + library calls": "layout",
             "output check": "check", "write + check": "write", "numeric check": "check",
             "export + check + write": "write",
             "fold + merge duplicates (after)": "fold2", "region check": "regions"}
    return " ".join(f"{short.get(k, k)} {v:.1f}" for k, v in sec.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=ZOO,
                   help="zoo models to run (default: the seven of issue 25; `all`: every model of `superopt zoo list`)")
    p.add_argument("--device", default="h100")
    p.add_argument("--before", type=Path, help="another superopt checkout to time on the same models")
    p.add_argument("--repeat", type=int, default=1, help="runs per model and checkout (the median is kept)")
    p.add_argument("--parallel", type=int, default=0, metavar="N", help="also run N at once (alone vs in company)")
    p.add_argument("--warm", action="store_true", help="one untimed run per model first (instance proofs cached)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    p.add_argument("--threads", type=int, help="intra-op threads of every run (default: each run picks its share)")
    p.add_argument("--spare-core", choices=("auto", "1", "0"), default="auto",
                   help="whether runs take a core as idle (SUPEROPT_SPARE_CORE): 1 to measure on a shared machine "
                        "what an idle one does, 0 to keep every run in one process (default: each run looks)")
    p.add_argument("--spare-core-before", choices=("1", "0"),
                   help="the same for the --before checkout alone (e.g. 0: the base as it ran on an idle machine "
                        "whose load average read busy, against this checkout's own decision or --spare-core 1)")
    p.add_argument("--wait-idle", action="store_true",
                   help="before each run alone, wait (up to 2 minutes) for a second in which other work kept the "
                        "machine's cores idle; each row gives the CPU seconds others used during the run")
    p.add_argument("--until-search", action="store_true",
                   help="also time each run until its search starts (the start-up, the rules and the model's "
                        "import), as the wall and as an idle machine would take it, from CPU seconds")
    args = p.parse_args()
    WAIT_IDLE[:] = [True] if args.wait_idle else []
    STAMPS[:] = [True] if args.until_search else []
    if args.models == ["all"]:
        args.models = all_models()
    if args.spare_core != "auto":
        os.environ["SUPEROPT_SPARE_CORE"] = args.spare_core
        SPARE["after"] = args.spare_core
    if args.spare_core_before is not None:
        SPARE["before"] = args.spare_core_before
    THREADS[:] = ["--threads", str(args.threads)] if args.threads else []
    rows = []
    print(f"{'model':<17} {'before s':>8} {'after s':>8} {'ratio':>6} {'cpu before':>10} {'cpu after':>9} "
          f"{'ratio':>6} {'run cpu':>7} {'load':>5}  phases after (s)")
    with tempfile.TemporaryDirectory() as tmp:
        # each checkout its own proof cache, warmed by its own untimed run with --warm
        cache = {"after": Path(tmp) / "proofs-after.db", "before": Path(tmp) / "proofs-before.db"}
        for m in args.models if args.warm else ():
            if args.before:
                run_once(args.before, m, args.device, Path(tmp), cache["before"])
            run_once(ROOT, m, args.device, Path(tmp), cache["after"])
        for m in args.models:
            row = {"model": m}
            for _ in range(args.repeat):
                if args.before:
                    row.setdefault("before", []).append(run_once(args.before, m, args.device, Path(tmp),
                                                                 cache["before"]))
                row.setdefault("after", []).append(run_once(ROOT, m, args.device, Path(tmp), cache["after"]))
            pick = {k: sorted(v, key=lambda r: r["wall_s"])[len(v) // 2] for k, v in row.items() if k != "model"}
            row.update(pick)
            b, a = pick.get("before"), pick["after"]
            ratio = f"{b['wall_s'] / a['wall_s']:.2f}" if b else "-"
            cpu_ratio = f"{b['cpu_s'] / a['cpu_s']:.2f}" if b else "-"
            same = "" if not b or b["cost"] == a["cost"] else f"  COST DIFFERS: before {b['cost']} after {a['cost']}"
            print(f"{m:<17} {b['wall_s'] if b else '-':>8} {a['wall_s']:>8} {ratio:>6} {b['cpu_s'] if b else '-':>10} "
                  f"{a['cpu_s']:>9} {cpu_ratio:>6} {a['cpu_run_s'] or '-':>7} {a['load']:>5}  "
                  f"{a['error'] or _phases(a['seconds'])}{same}" + (f" ({a['beside']})" if a["beside"] else "")
                  + _others(a),
                  flush=True)
            if a.get("until_search"):
                print(f"{'':<75}  until the search: " + "; ".join(
                    f"{name} {r['until_search']['wall_s']} s wall, {r['until_search']['idle_s']} s idle (from CPU)"
                    for name, r in (("after", a), ("before", b)) if r and r.get("until_search")), flush=True)
            if b:
                print(f"{'':<17} {'':>8} {'':>8} {'':>6} {'':>10} {'':>9} {'':>6} {b['cpu_run_s'] or '-':>7} "
                      f"{b['load']:>5}  before: {b['error'] or _phases(b['seconds'])}" + _others(b), flush=True)
            for name, r in (("after", a), ("before", b)):
                if r and r.get("cpu_seconds"):  # the phases' CPU seconds (a checkout that reports them)
                    print(f"{'':<75}  CPU {name}: {_phases(r['cpu_seconds'])}", flush=True)
            rows.append(row)
            _save(args.json, rows)  # after every row: a run cut short keeps what it measured
        if args.parallel > 0:
            together(rows, args.parallel, args.device, Path(tmp), cache["after"])
    _save(args.json, rows)
    return 0


def _others(r: dict) -> str:
    return f" [others {r['others_cpu_s']} s CPU]" if r.get("others_cpu_s") is not None else ""


def _save(path: Path | None, rows: list) -> None:
    if path is not None:
        path.write_text(json.dumps(rows, indent=2) + "\n")


def together(rows: list, n: int, device: str, out: Path, cache: Path | None = None) -> None:
    """Run the models ``n`` at a time (in turn, repeated to make at least ``n`` jobs) and print,
    per model, its time alone (``rows``), its slowest run in company, and the ratio (``cache``:
    the instance-proof cache the runs alone used, so that both find the same proofs cached)."""
    models = [r["model"] for r in rows]
    jobs = list(itertools.islice(itertools.cycle(models), max(n, len(models))))
    print(f"\n{n} runs at once on {os.cpu_count()} cores ({len(jobs)} jobs)", flush=True)

    def one(k_model):
        k, m = k_model
        d = out / f"par{k}"
        d.mkdir(exist_ok=True)
        return m, run_once(ROOT, m, device, d, cache, alone=False)

    with ThreadPoolExecutor(n) as pool:
        done = list(pool.map(one, enumerate(jobs)))
    print(f"{'model':<17} {'alone s':>8} {'parallel s':>10} {'ratio':>6}  phases in company (s)")
    for r in rows:
        runs = [res for m, res in done if m == r["model"]]
        worst = max(runs, key=lambda x: x["wall_s"])
        r["parallel"] = runs
        alone = r["after"]["wall_s"]
        print(f"{r['model']:<17} {alone:>8} {worst['wall_s']:>10} {worst['wall_s'] / alone:>6.2f}  "
              f"{worst['error'] or _phases(worst['seconds'])}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stamped-run"]:
        _stamped_run(sys.argv[2])
    sys.exit(main())
