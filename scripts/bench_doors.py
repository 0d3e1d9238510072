"""The zoo-wide GPU table of the three doors, in one device call: what ``superopt optimize``
writes and what ``backend="superopt"`` runs, each against ``torch.compile`` alone.

    python scripts/bench_doors.py --out DIR [--models M ...] [--batch-sizes 1 16] [--dtypes fp32 bf16]
                                  [--extra llama3_8b_decode@16/bf16] [--workers 8] [--optimize-jobs 6]
                                  [--deadline-s 330] [--hard-deadline-s 520] [--repeat 50] [--programs DIR]
    python scripts/bench_doors.py --out DIR --report A/doors.json B/doors.json   # merge two runs, table, plot
    python scripts/bench_doors.py --out DIR --configs llama3_8b_decode@1/bf16 llama3_8b_decode@16/bf16 --workers 2
        # the Llama-3-8B decode step, whose KV caches are written in place, through the three doors
    python scripts/bench_doors.py --out DIR --configs llama3_8b_decode+buffers@1/bf16 llama3_8b_decode+buffers+posmask@1/bf16
        # the same step holding its caches in buffers (gpt-fast's way), and also building its mask
        # from the cache position (transformers' executorch export): `superopt zoo export --cache
        # buffers [--mask positions]`, then `superopt optimize` on that program

For each configuration (model, batch, dtype: ``fp32`` with TF32 off, or ``bf16``, both modules
cast), three variants, each compiled with ``torch._inductor.config.freezing`` set while dynamo
traces and in a frame of its own (:func:`bench_gpu._own_frame`):

* ``ro``: the original module under ``torch.compile(mode="reduce-overhead")``, the baseline;
* ``cli``: the program ``superopt optimize --zoo M --batch-size B --device h100 --dtype D`` wrote
  (``--device`` another device),
  ``torch.export.load(...).module()``, compiled the same way (as a user would);
* ``backend``: the original under ``torch.compile(backend=superopt_backend,
  options={"mode": "reduce-overhead", "device": "h100"})``.

How the work is laid out so that it fits one call: every ``superopt optimize`` starts first, in
processes of its own (``--optimize-jobs`` at once, ``--optimize-threads`` intra-op threads each),
heaviest configuration first; at the same time ``--workers`` worker processes take configurations
from one queue in the same order, compile ``ro`` and ``backend`` (which need no written program),
then wait for their configuration's program and compile ``cli``. Compiles share the GPU; a worker
times only while it has the GPU alone (:class:`bench_gpu._GpuGate`, :func:`bench_gpu._time_all`:
interleaved rounds, the least round median, GPU time with the call queued behind a GPU sleep, and
latency), and checks every variant's outputs against the original's. No configuration starts after
``--deadline-s``; at ``--hard-deadline-s`` the workers are stopped and the table is printed from
what finished. ``DIR/doors.json`` is written after every configuration (a partial run still gives
a table), with one progress line per configuration on stderr. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing as mp
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402  (the GPU gate, frames of their own, the timing)
from bench_gpu import _geomean, _own_frame, _time_all  # noqa: E402
from bench_kernels import mark_static_caches  # noqa: E402  (the same caches as the kernel benchmark)

ZOO = ["squeezenet1_1", "resnet50", "resnext50_32x4d", "inception_v3", "nasnet_a_mobile", "bert_base", "vit_b16"]
#: the issue's two "never slower" cases (a Llama-style decoder block, ViT-B/16 at b16 bf16): at least 0.99x
ISSUE_CASES = ("llama3_8b_decode@16/bf16", "vit_b16@16/bf16")
VARIANTS = ("ro", "cli", "backend")
#: rough compile + optimize seconds of a model, to start the longest configurations first
_WEIGHT = {"nasnet_a_mobile": 5, "inception_v3": 4, "bert_base": 3, "vit_b16": 3, "resnext50_32x4d": 2.5,
           "llama3_8b_decode": 2.5, "llama3_8b_prefill": 2.5, "resnet50": 2, "squeezenet1_1": 1}
FLOOR = 0.98  # no variant below this against RO + freezing
ISSUE_FLOOR = 0.99
CLI_GAP = 0.03  # the CLI within 3% of the backend


class Config(NamedTuple):
    """One measured configuration."""

    model: str
    batch: int
    dtype: str

    @property
    def key(self) -> str:
        return f"{self.model}@{self.batch}/{self.dtype}"

    @property
    def slug(self) -> str:
        return f"{self.model}-b{self.batch}-{self.dtype}"

    @staticmethod
    def parse(text: str) -> "Config":
        """``model@batch/dtype`` (as :attr:`key` writes it)."""
        try:
            model, rest = text.split("@")
            batch, dtype = rest.split("/")
            return Config(model, int(batch), dtype)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give MODEL@BATCH/DTYPE, e.g. vit_b16@16/bf16") from None


def plan(models, batches, dtypes, extra=()) -> list[Config]:
    """Every (model, batch, dtype) and the extra configurations, once each, heaviest first."""
    configs = [Config(m, b, d) for m in models for b in batches for d in dtypes] + list(extra)
    unique = list(dict.fromkeys(configs))
    return sorted(unique, key=lambda c: -_WEIGHT.get(c.model, 2) * (1.3 if c.batch > 1 else 1.0))


# ---- the `superopt optimize` runs ------------------------------------------------------------


def optimize_command(cfg: Config, programs: Path, threads: int, device: str = "h100") -> list[str]:
    """The command a user runs (the program and its JSON report under ``programs``); a model
    named ``M+buffers`` is exported first (``superopt zoo export M --cache buffers``)."""
    name, kw = zoo_name(cfg)
    rest = ["--device", device, "--dtype", cfg.dtype, "-o", str(programs / f"{cfg.slug}.pt2"),
            "--report", str(programs / f"{cfg.slug}.json"), "--threads", str(threads), "--quiet"]
    if not kw:
        return [sys.executable, "-m", "superopt", "optimize", "--zoo", name, "--batch-size", str(cfg.batch), *rest]
    src = str(programs / f"{cfg.slug}.in.pt2")
    how = ["--cache", "buffers"] * ("cache" in kw) + ["--mask", "positions"] * ("mask" in kw) + \
        ["--rotary", "positions"] * ("rotary" in kw) + ["--dtype", cfg.dtype] * ("export" in kw)
    export = [sys.executable, "-m", "superopt", "zoo", "export", name, "--batch-size", str(cfg.batch), *how, "-o", src]
    return ["sh", "-c", f"{shlex.join(export)} && {shlex.join([sys.executable, '-m', 'superopt', 'optimize', src, *rest])}"]


#: ``M+WORD`` configurations: the zoo builder's keyword for each word
_STYLES = {"buffers": ("cache", "buffers"), "posmask": ("mask", "positions"), "rotpos": ("rotary", "positions"),
           "halfexport": ("export", "half")}


def builder_kwargs(kw: dict) -> dict:
    """The zoo builder's keywords of a configuration's (``export`` is how the CLI's is exported)."""
    return {k: v for k, v in kw.items() if k != "export"}


def zoo_name(cfg: Config) -> tuple[str, dict]:
    """(zoo model, builder keywords) of ``M``, ``M+buffers`` (the decode caches held in buffers),
    ``M+posmask`` (the mask built from the cache position) or both; ``+rotpos``: the rotary tables
    computed from position ids (transformers' LlamaRotaryEmbedding); ``+halfexport``: the CLI's
    program exported at the configuration's dtype (``superopt zoo export --dtype``, as a user
    exports an LLM in bf16), not in float32 (``export`` is no builder keyword: see
    :func:`builder_kwargs`)."""
    name, *words = cfg.model.split("+")
    bad = [w for w in words if w not in _STYLES]
    if bad:
        raise ValueError(f"{cfg.model}: unknown {bad}; known: {', '.join(_STYLES)}")
    return name, dict(_STYLES[w] for w in words)


def done_path(programs: Path, cfg: Config) -> Path:
    return programs / f"{cfg.slug}.done.json"


def _finish(cfg: Config, proc, log: Path, programs: Path, started: float) -> None:
    report = programs / f"{cfg.slug}.json"
    doc = {"seconds": round(time.time() - started, 1), "returncode": proc.returncode}
    if proc.returncode == 0 and report.exists():
        doc["report"] = json.loads(report.read_text())
    else:
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        doc["error"] = (lines or [f"exit status {proc.returncode}"])[-1][:300]
    tmp = done_path(programs, cfg).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(done_path(programs, cfg))  # whole or absent: a worker polls for it
    what = doc.get("error") or ("rewritten" if doc["report"].get("rewritten") else "the original program")
    print(f"  optimize {cfg.key}: {doc['seconds']:.0f} s, {what}", file=sys.stderr, flush=True)


def run_optimizes(configs, programs: Path, jobs: int, deadline: float, command: Callable, timeout_s: float,
                  stop=None) -> None:
    """Run ``command(cfg)`` for every configuration, ``jobs`` at once, in order; write each
    one's outcome to :func:`done_path` as it ends. None starts after ``deadline`` (epoch
    seconds), one running longer than ``timeout_s`` is killed, ``stop`` (an Event) kills all;
    every configuration gets its file, so no worker waits forever."""
    pending, running = list(configs), {}
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    while pending or running:
        if stop is not None and stop.is_set():
            break
        while pending and len(running) < jobs and time.time() < deadline:
            cfg = pending.pop(0)
            log = programs / f"{cfg.slug}.log"
            with open(log, "w") as fh:
                proc = subprocess.Popen(command(cfg), stdout=fh, stderr=subprocess.STDOUT, env=env)
            running[cfg] = (proc, log, time.time())
        if pending and time.time() >= deadline:
            for cfg in pending:
                _write_error(programs, cfg, "not started: past the deadline")
            pending = []
        for cfg, (proc, log, started) in list(running.items()):
            if proc.poll() is None and time.time() - started > timeout_s:
                proc.kill()
                proc.wait()
            if proc.poll() is not None:
                _finish(cfg, proc, log, programs, started)
                del running[cfg]
        time.sleep(0.1)
    for cfg, (proc, log, started) in running.items():
        proc.kill()
        proc.wait()
        _finish(cfg, proc, log, programs, started)
    for cfg in pending:
        _write_error(programs, cfg, "not started: the run was stopped")


def _write_error(programs: Path, cfg: Config, why: str) -> None:
    done_path(programs, cfg).write_text(json.dumps({"error": why}))


def wait_done(programs: Path, cfg: Config, until: float, poll_s: float = 0.5) -> dict:
    """The outcome of ``cfg``'s optimize once it is there, or an error past ``until``."""
    path = done_path(programs, cfg)
    while not path.exists():
        if time.time() > until:
            return {"error": "optimize not finished before the hard deadline"}
        time.sleep(poll_s)
    return json.loads(path.read_text())


# ---- the queue -------------------------------------------------------------------------------


class Task(NamedTuple):
    """What a worker gets: the configuration, the measuring function and its settings."""

    cfg: Config
    measure: Callable
    settings: dict


def run_task(task: Task) -> dict:
    """One configuration's row: skipped past the deadline, else ``measure``'s (a failure is a row)."""
    row = {"model": task.cfg.model, "batch": task.cfg.batch, "dtype": task.cfg.dtype}
    if time.time() > task.settings["deadline"]:
        return {**row, "status": "skipped", "why": "past --deadline-s when a worker was free"}
    started = time.time()
    try:
        row.update(task.measure(task.cfg, task.settings))
        row.setdefault("status", "ok")
    except Exception as e:  # one configuration failing is a row of the table, not the end of the run
        import traceback
        row.update(status="failed", why=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                   trace=traceback.format_exc()[-2000:])
    row["seconds"] = round(time.time() - started, 1)
    return row


def run_queue(tasks: list[Task], pool, hard_deadline: float, on_row: Callable[[dict], None]) -> list[dict]:
    """Feed ``tasks`` to ``pool`` in order, call ``on_row`` with each row as it comes; past
    ``hard_deadline`` (epoch seconds) the rows not in are marked unfinished and it returns."""
    rows, it = [], pool.imap_unordered(run_task, tasks)
    for _ in tasks:
        try:
            row = it.next(timeout=max(0.0, hard_deadline - time.time()))
        except (mp.TimeoutError, StopIteration):
            break
        rows.append(row)
        on_row(row)
    seen = {(r["model"], r["batch"], r["dtype"]) for r in rows}
    for t in tasks:
        if tuple(t.cfg) not in seen:
            row = {"model": t.cfg.model, "batch": t.cfg.batch, "dtype": t.cfg.dtype, "status": "unfinished",
                   "why": "still running or queued at --hard-deadline-s"}
            rows.append(row)
            on_row(row)
    return rows


# ---- the summary -----------------------------------------------------------------------------


def speedups(row: dict) -> dict:
    """``cli`` and ``backend`` against ``ro`` (RO time / variant time), and ``cli/backend``."""
    t = row.get("times_ms") or {}
    out = {v: t["ro"] / t[v] for v in ("cli", "backend") if t.get(v) and t.get("ro")}
    if "cli" in out and "backend" in out:
        out["cli/backend"] = out["cli"] / out["backend"]
    return out


def flags(row: dict) -> list[str]:
    """What the row misses of the issue's bar."""
    sp, key = speedups(row), Config(row["model"], row["batch"], row["dtype"]).key
    floor = ISSUE_FLOOR if key in ISSUE_CASES else FLOOR
    out = [f"{v} {sp[v]:.3f} < {floor}" for v in ("cli", "backend") if v in sp and sp[v] < floor]
    if sp.get("cli/backend", 1.0) < 1.0 - CLI_GAP:
        out.append(f"cli {100 * (1 - sp['cli/backend']):.1f}% below the backend")
    out += [f"{v}: no CUDA graph" for v, n in (row.get("cudagraph_skips") or {}).items() if n]
    tol = bench_gpu.TOL.get(row["dtype"], 5e-2)
    if row.get("status") == "ok" and any(e > tol for e in row.get("errors", {}).values()):
        out.append("outputs differ: " + ", ".join(f"{k} {e:.1e}" for k, e in row["errors"].items()))
    return out


def summarize(rows: list[dict]) -> dict:
    """Per (batch, dtype): the geomean and worst of ``cli`` and ``backend``, and the rows flagged."""
    groups: dict = {}
    for r in rows:
        if r["model"] in ZOO and speedups(r):
            groups.setdefault(f"b{r['batch']} {r['dtype']}", []).append(speedups(r))
    summary = {g: {v: {"geomean": _geomean([s.get(v) for s in ss]), "worst": round(min(x[v] for x in ss if v in x), 3),
                       "n": sum(v in x for x in ss)}
                   for v in ("cli", "backend", "cli/backend") if any(v in x for x in ss)}
               for g, ss in sorted(groups.items())}
    ok = [speedups(r) for r in rows if r["model"] in ZOO and speedups(r)]
    summary["all"] = {v: {"geomean": _geomean([s.get(v) for s in ok]),
                          "worst": round(min(s[v] for s in ok if v in s), 3), "n": sum(v in s for s in ok)}
                      for v in ("cli", "backend", "cli/backend") if any(v in s for s in ok)}
    summary["flagged"] = {Config(r["model"], r["batch"], r["dtype"]).key: flags(r) for r in rows if flags(r)}
    return summary


def _wrote(row: dict) -> str:
    c = row.get("cli") or {}
    if c.get("error"):
        return "optimize: " + c["error"][:60]
    lay = c.get("layout") or {}
    text = "rewritten" if c.get("rewritten") else "original"
    if lay.get("kept"):
        text += ", channels-last" if lay.get("channels_last") else ", NCHW"
    ops = [o.split("::")[-1] for o in c.get("custom_ops") or []]
    reports = row.get("backend_report") or []
    kept = sorted({str(r.get("kept", "?")).split(" ")[0] for r in reports})
    chosen = sum((r.get("kernels") or {}).get("chosen") or 0 for r in reports if r.get("kept") == "optimized")
    kept = [k + (f" ({chosen} kernels)" if k == "optimized" and chosen else "") for k in kept]
    return (text + (f", {'+'.join(ops)}" if ops else "") + (" (not timed)" if c.get("not_timed") else "")
            + (f" | backend: {'+'.join(kept)}" if kept else ""))


def format_table(rows: list[dict]) -> str:
    """The table: one line a configuration, then the geomeans and worst cases, then the flags."""
    def cell(x):
        return f"{x:9.3f}" if x is not None else f"{'-':>9}"
    order = sorted(rows, key=lambda r: (r["batch"], r["dtype"], r["model"]))
    lines = [f"{'model':18} {'batch':>5} {'dtype':>5} {'CLI/RO':>9} {'backend/RO':>10} {'CLI/bknd':>9}  "
             f"{'RO ms':>8}  what the CLI wrote"]
    for r in order:
        if r.get("status") != "ok":
            lines.append(f"{r['model']:18} {r['batch']:5d} {r['dtype']:>5}  {r['status'].upper()}: "
                         f"{r.get('why', '')[:90]}")
            continue
        sp = speedups(r)
        lines.append(f"{r['model']:18} {r['batch']:5d} {r['dtype']:>5} {cell(sp.get('cli'))} "
                     f"{cell(sp.get('backend')):>10} "
                     f"{cell(sp.get('cli/backend'))}  {r['times_ms'].get('ro', float('nan')):8.3f}  {_wrote(r)}"
                     + ("  <-- " + "; ".join(flags(r)) if flags(r) else ""))
    s = summarize(rows)
    lines.append("")
    for g, per in s.items():
        if g != "flagged" and per:
            lines.append(f"{g:>10}: " + "   ".join(f"{v} geomean {d['geomean']} worst {d['worst']} (n={d['n']})"
                                                  for v, d in per.items()))
    lines.append(f"flagged (below {FLOOR}x, {ISSUE_FLOOR}x for {', '.join(ISSUE_CASES)}, or CLI more than "
                 f"{100 * CLI_GAP:.0f}% below the backend): " + (", ".join(s["flagged"]) or "none"))
    return "\n".join(lines)


# ---- one configuration on the GPU (a worker process) -----------------------------------------


def _init_worker(gate, threads: int) -> None:
    bench_gpu._init(gate)  # the gate, and Inductor's compile threads limited
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _compiled(module, tag: str, x, **how):
    """``torch.compile(module, **how)`` in a frame of its own, freezing set while dynamo traces,
    called twice (compiled, CUDA graph recorded) while sharing the GPU."""
    import copy
    import torch
    with torch._inductor.config.patch(freezing=True), bench_gpu._GATE.shared():
        fn = torch.compile(_own_frame(copy.deepcopy(module), tag), **how)
        fn(*x)
        fn(*x)
    return fn


def _cli_summary(done: dict) -> dict:
    if "report" not in done:
        return {"error": done.get("error", "no report")}
    rep = done["report"]
    lay = rep.get("layout") or {}
    return {"rewritten": rep.get("rewritten"), "custom_ops": rep.get("custom_ops"), "passes": rep.get("passes"),
            "layout": {k: lay.get(k) for k in ("kept", "channels_last", "conv_relu_fused")} if lay else {},
            "predicted": round(rep["cost_before"] / rep["cost_after"], 4) if rep.get("cost_after") else None,
            "optimize_s": done.get("seconds"), "output": rep.get("output")}


def _cudagraph_skips() -> int:
    """Inductor's count of compiled graphs that run without a CUDA graph under reduce-overhead
    (an input written in place that is not a static address, a CPU tensor...)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


def measure(cfg: Config, settings: dict) -> dict:
    """Compile the three variants of ``cfg``, time them alone on the GPU, check their outputs."""
    import torch
    import superopt  # noqa: F401  (registers the custom ops a written program may call)
    from superopt.cost.measure import set_precision
    from superopt.driver.backend import CACHE, superopt_backend
    from superopt.models import build
    torch.set_num_threads(settings["threads"])
    for knob in ("cache_size_limit", "recompile_limit"):  # several compiled copies of one forward
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    set_precision(cfg.dtype)
    cast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.dtype, torch.float32)
    name, kw = zoo_name(cfg)
    module, inputs = build(name, batch_size=cfg.batch, **builder_kwargs(kw))
    x = tuple(t.cuda().to(cast) if t.is_floating_point() else t.cuda() for t in inputs)
    if "cache" not in kw:
        mark_static_caches(name, x)  # a decode step's KV caches (written in place), as HF's StaticCache
    orig = module.cuda().eval().to(cast)
    CACHE.clear()
    torch._dynamo.reset()
    row: dict = {"errors": {}, "compile_s": {}, "cudagraph_skips": {}}
    fns = {}
    with torch.no_grad():
        with bench_gpu._GATE.shared():
            want = orig(*x)
        for tag, mod, how in (("ro", orig, {"mode": "reduce-overhead"}),
                              ("backend", orig, {"backend": superopt_backend,
                                                 "options": {"mode": "reduce-overhead", "device": settings["device"]}})):
            t0 = time.time()
            skips = _cudagraph_skips()
            fns[tag] = _compiled(mod, f"{tag}_{cfg.slug}", x, **how)
            row["compile_s"][tag] = round(time.time() - t0, 1)
            row["cudagraph_skips"][tag] = _cudagraph_skips() - skips
        row["backend_report"] = [rep for _, rep in CACHE.values()]
        cli = row["cli"] = _cli_summary(wait_done(Path(settings["programs"]), cfg, settings["hard_deadline"]))
        changed = "error" not in cli and (cli["rewritten"] or cli["layout"].get("kept"))
        if changed or "error" not in cli and not settings["skip_unchanged"]:
            t0 = time.time()
            # the original program, unchanged, is the zoo module's float32 export: cast, its
            # dtype asserts (RMSNorm's upcast) would fail, so the module it was exported from
            # stands for it (what a user who exported the module in bf16 gets back)
            program = torch.export.load(cli["output"]).module().cuda() if changed else orig
            if changed and "export" not in kw:   # a program exported in half precision is run as written:
                program = program.to(cast)       # (cast, its float32 weights, e.g. a folded inv_freq.float(), would not be)
            cli["timed_as"] = "the written program" if changed else "the original module (the original program written)"
            skips = _cudagraph_skips()
            fns["cli"] = _compiled(program, f"cli_{cfg.slug}", x, mode="reduce-overhead")
            row["compile_s"]["cli"] = round(time.time() - t0, 1)
            row["cudagraph_skips"]["cli"] = _cudagraph_skips() - skips
        elif "error" not in cli:
            cli["not_timed"] = True
        gpu, lat = _time_all(fns, x, settings["repeat"], row["errors"], want)
    row["times_ms"] = {k: round(v, 4) for k, v in gpu.items()}
    row["latency_ms"] = {k: round(v, 4) for k, v in lat.items()}
    del fns
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


# ---- main ------------------------------------------------------------------------------------


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for doors.json")
    p.add_argument("--models", nargs="+", default=ZOO)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16"),
                   help="fp32 (TF32 off) and/or bf16 (both modules cast)")
    p.add_argument("--extra", nargs="*", type=Config.parse, default=[Config.parse(ISSUE_CASES[0])],
                   help=f"more configurations MODEL@BATCH/DTYPE (default {ISSUE_CASES[0]}; none: --extra)")
    p.add_argument("--configs", nargs="+", type=Config.parse,
                   help="exactly these configurations MODEL@BATCH/DTYPE instead of --models x --batch-sizes x --dtypes "
                        "(e.g. to run again what a run left unfinished)")
    p.add_argument("--device", default="h100",
                   help="what the CLI's --device and the backend's device option say (default h100; cuda: the GPU "
                        "here, as a user's default `auto` on it)")
    p.add_argument("--workers", type=int, default=8, help="worker processes compiling and timing (default 8)")
    p.add_argument("--optimize-jobs", type=int, default=6, help="`superopt optimize` runs at once (default 6)")
    p.add_argument("--optimize-threads", type=int, default=2, help="intra-op threads of each (default 2)")
    p.add_argument("--optimize-timeout-s", type=float, default=300.0)
    p.add_argument("--deadline-s", type=float, default=330.0,
                   help="no configuration starts after this many seconds (default 330)")
    p.add_argument("--hard-deadline-s", type=float, default=520.0,
                   help="stop everything and print the table after this many seconds (default 520)")
    p.add_argument("--repeat", type=int, default=50, help="timed calls per variant, each way (in 5 rounds)")
    p.add_argument("--skip-unchanged", action="store_true",
                   help="do not time a written program that is the original (count it as not timed)")
    p.add_argument("--programs", help="where the written programs go (default: a temporary directory)")
    p.add_argument("--report", nargs="+", help="merge these doors.json files and print the table; nothing is run")
    return p.parse_args(argv)


def plot(rows: list[dict], path: Path) -> bool:
    """Bars of CLI and backend against RO per configuration, one panel per (batch, dtype);
    False where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_doors: matplotlib not installed: no plot", file=sys.stderr)
        return False
    groups = sorted({(r["batch"], r["dtype"]) for r in rows if speedups(r)})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), squeeze=False, sharey=True)
    for ax, (batch, dtype) in zip(axes[0], groups):
        mine = sorted((r for r in rows if (r["batch"], r["dtype"]) == (batch, dtype) and speedups(r)),
                      key=lambda r: r["model"])
        xs = range(len(mine))
        for k, (door, label) in enumerate((("cli", "superopt optimize"), ("backend", 'backend="superopt"'))):
            ax.bar([i + 0.4 * k - 0.2 for i in xs], [speedups(r).get(door, math.nan) for r in mine], 0.4, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["model"].replace("_", " ") for r in mine], rotation=60, ha="right", fontsize=7)
        ax.set_title(f"batch {batch}, {dtype}")
    axes[0][0].set_ylabel("speedup over RO + freezing")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def _merge(files) -> dict:
    docs = [json.loads(Path(f).read_text()) for f in files]
    doc = {k: v for k, v in docs[0].items() if k not in ("rows", "summary", "args", "seconds")}
    doc["rows"] = [r for d in docs for r in d["rows"]]
    doc["merged_from"] = [{"file": str(f), "args": d.get("args"), "seconds": d.get("seconds")}
                          for f, d in zip(files, docs)]
    return doc


def _save(doc: dict, out: Path) -> None:
    doc["summary"] = summarize(doc["rows"])
    tmp = out / "doors.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(out / "doors.json")


def _measure_all(args, out: Path) -> dict:
    import threading
    import torch
    start = time.time()
    deadline, hard = start + args.deadline_s, start + args.hard_deadline_s
    programs = Path(args.programs or tempfile.mkdtemp(prefix="doors-"))
    programs.mkdir(parents=True, exist_ok=True)
    configs = plan([], [], [], args.configs) if args.configs else plan(args.models, args.batch_sizes, args.dtypes,
                                                                       args.extra)
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "scipy": importlib.util.find_spec("scipy") is not None,  # the search's integer program, where installed
           "args": {k: ([c.key for c in v] if k in ("extra", "configs") and v else v) for k, v in vars(args).items()},
           "rows": []}
    for c in configs:  # an earlier run's outcome (same --programs on a warm machine) is not this run's
        done_path(programs, c).unlink(missing_ok=True)
    stop = threading.Event()
    launcher = threading.Thread(target=run_optimizes, daemon=True, args=(
        configs, programs, args.optimize_jobs, deadline, lambda c: optimize_command(c, programs, args.optimize_threads, args.device),
        args.optimize_timeout_s, stop))
    launcher.start()
    settings = {"deadline": deadline, "hard_deadline": hard, "programs": str(programs), "repeat": args.repeat,
                "threads": 2, "skip_unchanged": args.skip_unchanged, "device": args.device}
    ctx = mp.get_context("spawn")
    gate = bench_gpu._GpuGate(ctx.Manager())

    def on_row(row):
        doc["rows"].append(row)
        doc["seconds"] = round(time.time() - start, 1)
        _save(doc, out)
        sp = speedups(row)
        print(f"[{doc['seconds']:.0f}s] {Config(row['model'], row['batch'], row['dtype']).key}: {row['status']} "
              + " ".join(f"{k} {v:.3f}" for k, v in sp.items()) + (f" {row.get('why', '')[:120]}" if not sp else ""),
              file=sys.stderr, flush=True)

    pool = ctx.Pool(args.workers, initializer=_init_worker, initargs=(gate, 2))
    try:
        run_queue([Task(c, measure, settings) for c in configs], pool, hard, on_row)
    finally:
        stop.set()
        pool.terminate()
        launcher.join(timeout=30)
    return doc


def main(argv=None) -> int:
    args = _args(argv)
    out = Path(args.out)
    if args.report:
        doc = _merge(args.report)
    else:
        try:
            import torch
        except ImportError:
            print("bench_doors: error: torch is not installed", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("bench_doors: error: no CUDA GPU here; this benchmark times compiled programs on one "
                  "(--report merges runs without a GPU)", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        doc = _measure_all(args, out)
    out.mkdir(parents=True, exist_ok=True)
    _save(doc, out)
    plot(doc["rows"], out / "doors.png")
    print(f"{doc.get('device', '?')}, torch {doc.get('torch', '?')}; baseline torch.compile(mode=\"reduce-overhead\") "
          f"with freezing; GPU time (queued), the least of 5 round medians")
    print(format_table(doc["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
