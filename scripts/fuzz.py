"""Fuzz ``superopt`` end to end and print a table.

Models: random small ``torch.nn.Module`` s (``tests/fuzzmodels.py``) are exported with
``torch.export``, optimized by ``superopt optimize`` (in a worker process, many models per
process), and the written ``.pt2`` files are loaded in a *fresh* process and called exactly as
the original (same positional and keyword inputs) on new inputs; outputs must have the same
structure and values. A crash is an exception that escapes the CLI (a traceback); a refusal is
``superopt: error:`` with exit 2 (for example a model with nothing to optimize); a mismatch is a
written model whose outputs differ.

With ``--dtype bf16`` (``fp16``; or ``mixed``: every odd seed in bf16) the models are cast to
that precision before export, so the import of a half-precision program (its float32 form, or
as it is) and its code written back at that precision are what gets fuzzed. Their fresh-process
check leaves out the inputs scaled by 30: there a rewrite's rounding, as legitimate as the
original's (a per-channel scale folded into the next weight rounds ``w * g`` to bf16 where the
original rounded ``x * g``), can flip a saturated softmax whose logits are in the thousands (bf16
rounds them by units); bf16 seed 93 of 200 differed that way on the fuzz's draw and passed on the
check's own (``superopt optimize --input-sets 5``).

With ``--door backend`` the models go through ``torch.compile(backend="superopt")`` instead
(Inductor off, half of them unsearched, so that the backend's own import and code are what runs)
and are checked against a twin run eagerly, buffers included.

Files: random bytes, truncations and byte flips of real ``.pt2``, ``.onnx``, rule database,
graph, profile and spec files go through every command that reads them; each must exit 0 or
exit 2 with a single ``superopt: error:`` line, never a traceback.

    python scripts/fuzz.py --count 1000 --files 200 --workers 2
    python scripts/fuzz.py --count 200 --files 0 --dtype mixed
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# --min-gain 0: every rewrite priced cheaper is applied and written, so the rewrite path is what gets fuzzed
OPTIMIZE_FLAGS = ["--quiet", "--budget", "30", "--time-limit", "5", "--min-gain", "0"]


def run_cli(argv: list[str]) -> tuple[int, str, str | None]:
    """(exit code, stderr, traceback or None) of ``superopt ARGV`` run in this process."""
    from superopt.cli import main
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001 - anything escaping the CLI is what we are looking for
        return -1, err.getvalue(), traceback.format_exc()
    return rc, err.getvalue(), None


# ---- models -------------------------------------------------------------------------------

def build_model(seed: int, dtype: str = "fp32") -> tuple:
    """``fuzzmodels.build(seed)``, cast to half precision where ``dtype`` says (``mixed``: odd
    seeds in bf16)."""
    import torch
    import torch.utils._pytree as pytree
    import fuzzmodels
    model, args, kwargs = fuzzmodels.build(seed)
    to = {"bf16": torch.bfloat16, "fp16": torch.float16, "mixed": torch.bfloat16 if seed % 2 else None}.get(dtype)
    if to is not None:
        half = lambda x: x.to(to) if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
        model, args, kwargs = model.to(to), pytree.tree_map(half, args), pytree.tree_map(half, kwargs)
    return model, args, kwargs


def optimize_worker(seeds: list[int], folder: Path, flags: list[str] = OPTIMIZE_FLAGS, dtype: str = "fp32") -> list[dict]:
    """Export and optimize each seed's model in this process; one result per seed."""
    import torch
    torch.set_num_threads(1)
    out = []
    for seed in seeds:
        model, args, kwargs = build_model(seed, dtype)
        src, dst = folder / f"m{seed}.pt2", folder / f"m{seed}.opt.pt2"
        try:
            torch.export.save(torch.export.export(model, args, kwargs), str(src))
        except Exception as e:  # noqa: BLE001 - a model torch cannot export is not superopt's problem
            out.append({"seed": seed, "status": "unexportable", "detail": str(e).splitlines()[0][:200]})
            continue
        rc, err, tb = run_cli(["optimize", str(src), "-o", str(dst), *flags])
        if tb is not None or rc not in (0, 2):
            out.append({"seed": seed, "status": "crash", "detail": (tb or err)[-2000:]})
        elif rc == 2:
            out.append({"seed": seed, "status": "refused", "detail": err.strip().splitlines()[-1][:300]})
        else:
            out.append({"seed": seed, "status": "written"})
    return out


def check_worker(seeds: list[int], folder: Path, dtype: str = "fp32") -> list[dict]:
    """In a fresh process: load each optimized file and compare it with the rebuilt original."""
    import torch
    torch.set_num_threads(1)
    out = []
    for seed in seeds:
        model, args, kwargs = build_model(seed, dtype)
        try:
            loaded = torch.export.load(str(folder / f"m{seed}.opt.pt2")).module()
            out.append(_compared(seed, model, loaded, args, kwargs))
        except Exception as e:  # noqa: BLE001 - a written model that does not run is a mismatch
            out.append({"seed": seed, "status": "mismatch", "detail": f"{type(e).__name__}: {e}"[:300]})
    return out


def _compared(seed: int, reference, candidate, args, kwargs, state=()) -> dict:
    """One model's row: ``candidate`` against ``reference`` on the check's input sets (the same
    structure, then ``check_outputs``), ``ok`` with its worst error or ``mismatch``; raises where a
    call fails. A half-precision model's sets leave out the inputs scaled by 30 (module docstring)."""
    import torch
    import torch.utils._pytree as pytree
    from superopt.driver.outcheck import OutputMismatch, check_outputs, make_input_sets
    want, got = reference(*args, **kwargs), candidate(*args, **kwargs)
    if pytree.tree_structure(want) != pytree.tree_structure(got):
        raise AssertionError(f"output structure {pytree.tree_structure(got)} != {pytree.tree_structure(want)}")
    sets = make_input_sets(args, kwargs, seed=seed + 99)
    if any(isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
           for t in pytree.tree_leaves((args, kwargs))):
        sets = [x for x in sets if x[0] != "normal x30"]
    res = check_outputs(reference, candidate, sets, 1e-4, state=state)
    if isinstance(res, OutputMismatch):
        return {"seed": seed, "status": "mismatch", "detail": res.describe()}
    return {"seed": seed, "status": "ok", "error": res.worst}


def backend_worker(seeds: list[int], dtype: str = "fp32") -> list[dict]:
    """Each seed's model through ``torch.compile(backend="superopt")`` (the imported graph, searched
    for half the seeds, handed on as it is: ``inductor`` off, so no compiler runs) against a twin run eagerly, on
    the check's input sets, its buffers compared after every call and put back (the same check as
    the CLI's, ``check_outputs``). Statuses: ``ok`` (``written`` in the table's words), ``mismatch``,
    ``crash``."""
    import torch
    from superopt.driver.backend import CACHE, register
    torch.set_num_threads(1)
    register()
    out = []
    for seed in seeds:
        model, args, kwargs = build_model(seed, dtype)
        twin = build_model(seed, dtype)[0]
        state = tuple(name for name, _ in model.named_buffers())
        torch._dynamo.reset()
        CACHE.clear()
        try:
            # half the seeds hand on the imported graph unsearched: most small models have no cheaper
            # graph, and the backend would hand on the original, which checks nothing of its own code
            search = seed % 4 >= 2
            f = torch.compile(model, backend="superopt", options={"inductor": False, "min_gain": 0.0, "time_limit": 5,
                                                                  "search": search})
            out.append(_compared(seed, twin, f, args, kwargs, state))
        except Exception as e:  # noqa: BLE001 - anything the compiled model raises is what we are looking for
            out.append({"seed": seed, "status": "crash", "detail": f"{type(e).__name__}: {e}"[:300]})
    return out


# ---- corrupted files ----------------------------------------------------------------------

def _mutations(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["truncate", "flip", "random", "empty", "zeros"])
    if kind == "truncate" and data:
        return data[:rng.randrange(len(data))]
    if kind == "flip" and data:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == "random":
        return os.urandom(rng.randint(1, 4096))
    if kind == "zeros":
        return bytes(rng.randint(1, 1024))
    return b""


def _commands(kind: str, f: str, folder: Path, good_pt2: str) -> list[list[str]]:
    o = str(folder / "out")
    return {
        "pt2": [["import", f], ["optimize", f, "-o", o + ".pt2", *OPTIMIZE_FLAGS], ["profile", f, "--device", "cpu",
                                                                                 "-o", o + ".json", "--quiet"]],
        "onnx": [["import", f], ["optimize", f, "-o", o + ".onnx", *OPTIMIZE_FLAGS]],
        "db": [["rules", "list", "--db", f], ["rules", "stats", "--db", f], ["rules", "export", "--db", f],
               ["optimize", good_pt2, "--db", f, "-o", o + ".pt2", *OPTIMIZE_FLAGS]],
        "graph": [["ir", "check", f], ["codegen", f, "-o", o + ".pt2"]],
        "profile": [["optimize", good_pt2, "--profile", f, "-o", o + ".pt2", *OPTIMIZE_FLAGS]],
        "specs": [["specs", "check", "--specs", f], ["specs", "list", "--specs", f]],
    }[kind]


def _clean(rc: int, err: str, tb) -> bool:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if tb is not None or "Traceback" in err:
        return False
    return rc in (0, 1) or (rc == 2 and len([ln for ln in lines if ln.startswith("superopt: error:")]) == 1
                            and lines[-1].startswith("superopt: error:"))


def files_worker(originals: dict, count: int, seed: int, folder: Path) -> list[dict]:
    """Mutate real files ``count`` times and run every command that reads each."""
    import torch
    torch.set_num_threads(1)
    rng = random.Random(seed)
    out = []
    for k in range(count):
        kind = rng.choice(sorted(originals))
        data = _mutations(Path(originals[kind]).read_bytes(), rng)
        f = folder / f"bad{k}{Path(originals[kind]).suffix}"
        f.write_bytes(data)
        for argv in _commands(kind, str(f), folder, originals["pt2"]):
            rc, err, tb = run_cli(argv)
            out.append({"kind": kind, "argv": " ".join(argv[:2]), "rc": rc, "clean": _clean(rc, err, tb),
                        "refused": rc == 2, "detail": (tb or err)[-600:]})
        f.unlink(missing_ok=True)
    return out


def small_db(path: Path, rules: int = 60) -> None:
    """A real rule database of a few shipped rules (loading all of them takes seconds)."""
    from superopt.rules import RuleDB
    with RuleDB.open(ROOT / "rules" / "default.db") as src:
        rows = src.query(status="proven", limit=rules)
        pairs = [(r.rule, r.result) for r in rows]
    with RuleDB.create(path, {"fuzz": True}) as db:
        db.add(pairs)


def make_originals(folder: Path) -> dict:
    """Real, valid files of every kind the commands read."""
    import torch
    import fuzzmodels
    from superopt.frontend import from_exported_program
    from superopt.ir.serialize import save_graph
    model, args, kwargs = fuzzmodels.build(3)
    ep = torch.export.export(model, args, kwargs)
    files = {"pt2": folder / "good.pt2", "graph": folder / "good.json", "db": folder / "good.db",
             "profile": folder / "good_profile.json", "specs": folder / "good.axioms"}
    torch.export.save(ep, str(files["pt2"]))
    g, _ = from_exported_program(ep)
    save_graph(g, files["graph"])
    small_db(files["db"])
    shutil.copy(ROOT / "superopt" / "cost" / "profiles" / "h100-fp32.json", files["profile"])
    shutil.copy(ROOT / "specs" / "taso.axioms", files["specs"])
    try:
        from superopt.codegen import to_onnx
        to_onnx(g, folder / "good.onnx")
        files["onnx"] = folder / "good.onnx"
    except Exception:  # noqa: BLE001 - no onnx package: no ONNX files fuzzed
        pass
    return {k: str(v) for k, v in files.items()}


# ---- driver -------------------------------------------------------------------------------

def _spawn(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, text=True)


def _collect(p: subprocess.Popen) -> list[dict]:
    out, _ = p.communicate()
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    if p.returncode != 0:
        rows.append({"status": "crash", "detail": f"worker exited with {p.returncode}"})
    return rows


def fuzz_models(start: int, count: int, batch: int, workers: int, folder: Path, deadline: float = float("inf"),
                log=None, flags: list[str] = OPTIMIZE_FLAGS, dtype: str = "fp32", door: str = "cli") -> list[dict]:
    """Optimize in one worker per batch, then check in a fresh worker; ``workers`` batches at once.
    No batch starts after ``deadline`` (time.time()); each result is also written to ``log``.
    ``door="backend"``: each batch through :func:`backend_worker` instead, checked there."""
    batches = [list(range(s, min(s + batch, start + count))) for s in range(start, start + count, batch)]
    results: list[dict] = []
    running: list = []
    while (batches and time.time() < deadline) or running:
        while batches and len(running) < workers and time.time() < deadline:
            seeds = batches.pop(0)
            sub = folder / f"b{seeds[0]}"
            sub.mkdir(exist_ok=True)
            stage = "optimize" if door == "cli" else "backend"
            running.append((stage, seeds, sub, _spawn(["--worker", stage, "--seeds", _fmt(seeds),
                                                       "--dir", str(sub), "--optimize-flags", " ".join(flags),
                                                       "--dtype", dtype])))
        stage, seeds, sub, p = running.pop(0)
        rows = _collect(p)
        for r in rows:
            if log is not None and r.get("status") != "written":
                log.write(json.dumps(r) + "\n")
                log.flush()
        if stage == "optimize":
            results += [r for r in rows if r["status"] != "written"]
            written = [r["seed"] for r in rows if r["status"] == "written"]
            if written:
                running.insert(0, ("check", written, sub, _spawn(["--worker", "check", "--seeds", _fmt(written),
                                                                 "--dir", str(sub), "--dtype", dtype])))
        else:
            results += rows
            shutil.rmtree(sub, ignore_errors=True)
    return results


def _fmt(seeds: list[int]) -> str:
    return ",".join(map(str, seeds))


def table(models: list[dict], files: list[dict], seconds: float, door: str = "cli") -> str:
    st = lambda s: sum(1 for r in models if r.get("status") == s)  # noqa: E731
    runs = len(files)
    equal = "written and equal in a fresh process" if door == "cli" else "compiled and equal to eager"
    rows = [("models fuzzed", len(models)), (equal, st("ok")),
            ("crashes (traceback)", st("crash")), ("output mismatches", st("mismatch")),
            ("refusals (exit 2, one line)", st("refused")), ("not exportable by torch", st("unexportable")),
            ("corrupted-file runs", runs), ("  refused cleanly (exit 2, one line)", sum(r["refused"] and r["clean"]
                                                                                       for r in files)),
            ("  accepted (file still valid)", sum(r["rc"] in (0, 1) and r["clean"] for r in files)),
            ("  crashes or unclean errors", sum(not r["clean"] for r in files)), ("seconds", f"{seconds:.0f}")]
    return "\n".join(f"| {k} | {v} |" for k, v in [("what", "count"), ("---", "---"), *rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=300, help="random models (default 300)")
    p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--files", type=int, default=50, help="corrupted files (default 50)")
    p.add_argument("--batch", type=int, default=40, help="models per worker process (default 40)")
    p.add_argument("--workers", type=int, default=2, help="worker processes at once (default 2)")
    p.add_argument("--json", help="also write every result to this JSON file")
    p.add_argument("--log", help="append each model's result (other than ok) to this file as it comes")
    p.add_argument("--time-budget", type=float, default=float("inf"),
                   help="start no batch after this many seconds (the table counts what completed)")
    p.add_argument("--example-rules", action="store_true",
                   help="optimize with the small hand-written rule set (default: the shipped database)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "mixed"), default="fp32",
                   help="the models' precision: float32 (default), bf16, fp16, or mixed (odd seeds in bf16)")
    p.add_argument("--door", choices=("cli", "backend"), default="cli",
                   help="cli: superopt optimize, the file checked in a fresh process (default); backend: "
                        "torch.compile(backend='superopt'), checked against the model run eagerly")
    p.add_argument("--optimize-flags", help=argparse.SUPPRESS)
    p.add_argument("--table-from-log", metavar="LOG", help="print the table of a --log file (a run cut short)")
    p.add_argument("--worker", choices=("optimize", "check", "backend", "files"), help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.table_from_log:
        rows = [json.loads(ln) for ln in Path(args.table_from_log).read_text().splitlines() if ln.strip()]
        print(table(rows, [], float("nan")))
        return 0
    t0 = time.time()
    log = open(args.log, "a") if args.log else None
    with tempfile.TemporaryDirectory(prefix="superopt-fuzz-") as tmp:
        folder = Path(tmp)
        files = []
        if args.files:
            files = _collect(_spawn(["--worker", "files", "--seeds", f"{args.files},{args.start}", "--dir", tmp]))
        flags = OPTIMIZE_FLAGS + (["--example-rules"] if args.example_rules else [])
        models = fuzz_models(args.start, args.count, args.batch, args.workers, folder, t0 + args.time_budget, log,
                             flags, args.dtype, args.door)
    print(f"python scripts/fuzz.py --count {args.count} --start {args.start} --files {args.files} "
          f"--batch {args.batch} --workers {args.workers}" + (" --example-rules" if args.example_rules else "")
          + (f" --dtype {args.dtype}" if args.dtype != "fp32" else "") + (" --door backend" if args.door != "cli" else "")
          + (f" --time-budget {args.time_budget:g}"
                                                             if args.time_budget < float("inf") else ""))
    print(table(models, files, time.time() - t0, args.door))
    bad = [r for r in models if r.get("status") in ("crash", "mismatch")] + [r for r in files if not r.get("clean")]
    for r in bad[:20]:
        print(json.dumps(r)[:1500], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"models": models, "files": files}, indent=1))
    return 1 if bad else 0


def _worker(args) -> int:
    folder = Path(args.dir)
    nums = [int(s) for s in args.seeds.split(",") if s]
    if args.worker == "optimize":
        rows = optimize_worker(nums, folder, args.optimize_flags.split() if args.optimize_flags else OPTIMIZE_FLAGS,
                               args.dtype)
    elif args.worker == "check":
        rows = check_worker(nums, folder, args.dtype)
    elif args.worker == "backend":
        rows = backend_worker(nums, args.dtype)
    else:
        sub = folder / "files"
        sub.mkdir(exist_ok=True)
        rows = files_worker(make_originals(sub), nums[0], nums[1], sub)
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
