"""``generate``: enumerate, fingerprint, prune, verify, store; resumable and parallel.

>>> from superopt.generate import Settings, generate
>>> s = Settings.make(max_ops=2, ops="transpose", inputs="x=2x3")
>>> report = generate(s, workers=1, progress=False)
>>> [r.text() for r in report.rules]
['transpose[perm=(1,0)](transpose[perm=(1,0)](x)) => x']
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from .candidates import collect_candidates
from .checkpoint import Store, checkpoint_dir, open_store
from .errors import GenerateError
from .levels import run_levels
from .parallel import Runner, make_runner
from .report import GenerateReport, peak_memory_mb
from .settings import Settings

__all__ = ["generate", "check_output", "verify_and_store", "VERIFY_BATCH"]

#: rules per verification batch, at least (one database transaction and checkpoint each)
VERIFY_BATCH = 128


def check_output(out: str | Path, settings: Settings, overwrite: bool = False) -> bool:
    """Refuse an output path that cannot be written, before any work is done; True when it
    already holds the finished result of these very settings (nothing left to do)."""
    p = Path(out)
    if p.is_dir():
        raise GenerateError(f"--out {p} is a folder; give a file name such as {p / 'taso.db'}")
    if not p.parent.is_dir():
        raise GenerateError(f"--out {p}: the folder {p.parent} does not exist; create it first")
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise GenerateError(f"--out {p}: not writable; choose a path you can write to")
    if not p.exists() or checkpoint_dir(p).exists():
        return False
    from ..rules import RuleDB
    from ..rules.db import refuse_if_being_written
    if overwrite:
        refuse_if_being_written(p)  # another generate writing it would lose its work
        p.unlink()
        return False
    with RuleDB.open(p) as db:
        meta = db.meta
    if meta.get("complete") == "0":
        return False  # left by an interrupted run whose checkpoint is gone: made again
    if meta.get("settings", {}).get("digest") == settings.digest():
        return True
    raise GenerateError(f"--out {p} already exists, made with other settings; pass --overwrite to replace it, "
                        f"or choose another path")


def _finished(out: Path, settings: Settings, runner: str) -> GenerateReport:
    """The report of a run that had already finished: its rules and statuses, from the database."""
    from ..rules import RuleDB
    with RuleDB.open(out) as db:
        stored = db.query()
    counts = Counter(s.status for s in stored)
    report = GenerateReport(settings.to_json(), str(out), runner, True, "already complete: nothing to do",
                            rules=[s.rule for s in stored])
    report.verify = {"rules": len(stored), **{k: counts.get(k, 0) for k in ("proven", "unproven", "refuted")},
                     "stored": 0}
    report.prune.rules = len(stored)
    report.phases = {"total": 0.0}
    return report


def _db_settings(settings: Settings) -> dict:
    from .. import __version__
    return {**settings.to_json(), "digest": settings.digest(), "generator_version": __version__}


def _open_db(out: Path, settings: Settings, started: bool):
    """The run's database; created anew while no batch is stored yet (a file left by this run's
    own interrupted start may be empty)."""
    from ..rules import RuleDB
    if out.exists() and not started:
        return RuleDB.create(out, _db_settings(settings), overwrite=True)
    if out.exists():
        db = RuleDB.open(out, writable=True)
        if db.meta.get("settings", {}).get("digest") != settings.digest():
            db.close()
            raise GenerateError(f"{out} was made by a run with different settings; choose another --out")
        return db
    return RuleDB.create(out, _db_settings(settings))


def verify_and_store(rules: list, settings: Settings, out: Path, store: Store, runner: Runner,
                     progress: bool = True, batch: int | None = None) -> dict:
    """Verify ``rules`` in batches and add each batch to the database in one transaction; a
    batch already stored (per the checkpoint) is skipped, so a resumed run writes nothing twice."""
    from ..axioms.parse import load_axioms
    from ..verify import verify_rules
    axioms = load_axioms(settings.specs) if settings.specs else None
    if not store.has("verify/plan"):  # the batches must not move when a run resumes on other workers
        store.put("verify/plan", {"size": batch or max(VERIFY_BATCH, 8 * runner.workers)})
    size = store.get("verify/plan")["size"]
    counts: Counter = Counter()
    stored = 0
    bar = tqdm(total=len(rules), desc="verify", unit="rule", disable=not progress, leave=False)
    with _open_db(out, settings, store.has("verify/batch-00000")) as db:
        db.set_meta("complete", "0")  # until every batch is stored (`rules stats` says so)
        for start in range(0, len(rules), size):
            name = f"verify/batch-{start // size:05d}"
            chunk = rules[start:start + size]
            if store.has(name):
                done = store.get(name)
            else:
                results = verify_rules(chunk, axioms, timeout_s=settings.verify_timeout_s, workers=runner.workers,
                                       progress=False, client=runner.client)
                added = db.add(zip(chunk, results), _db_settings(settings))
                done = {"statuses": dict(Counter(r.status for r in results)), "added": added}
                store.put(name, done)
            counts.update(done["statuses"])
            stored += done["added"]
            bar.update(len(chunk))
        db.set_meta("complete", "1")
    bar.close()
    return {"rules": len(rules), **{k: counts.get(k, 0) for k in ("proven", "unproven", "refuted")},
            "stored": stored}


def generate(settings: Settings, out: str | Path | None = None, *, workers: int | None = None,
             scheduler: str | None = None, dask_workers: int | None = None, progress: bool = True,
             overwrite: bool = False, keep_checkpoint: bool = False, runner: Runner | None = None) -> GenerateReport:
    """Run the generator. With ``out``, candidates are verified and stored in the rule database
    there, and the run checkpoints to ``<out>.ckpt`` (removed when it finishes, unless
    ``keep_checkpoint``); without, it only enumerates and prunes (nothing is written)."""
    settings.validate()
    out = Path(out) if out is not None else None
    if out is not None and check_output(out, settings, overwrite):
        return _finished(out, settings, "nothing (already done)")
    scratch = None
    if out is None and settings.max_ops >= 4:  # big: keep the records on disk, not in memory
        scratch = tempfile.TemporaryDirectory(prefix="superopt-generate-")
    store, resumed = open_store(checkpoint_dir(out) if out is not None else
                                Path(scratch.name) if scratch is not None else None, settings)
    own_runner = runner is None
    runner = runner or make_runner(workers, scheduler, dask_workers)
    report = GenerateReport(settings.to_json(), str(out) if out else None, runner.describe(), resumed)
    try:
        t0 = time.perf_counter()
        report.levels = run_levels(settings, store, runner, progress)
        t1 = time.perf_counter()
        report.rules, report.prune = collect_candidates(settings, store, progress, runner)
        t2 = time.perf_counter()
        report.phases = {"enumerate": t1 - t0, "prune": t2 - t1}
        if out is not None:
            report.verify = verify_and_store(report.rules, settings, out, store, runner, progress)
            report.phases["verify"] = time.perf_counter() - t2
            if not keep_checkpoint:
                store.remove()
    finally:
        if own_runner:
            runner.close()
        if scratch is not None:
            scratch.cleanup()
    report.phases["total"] = sum(report.phases.values())
    report.peak_memory_mb = peak_memory_mb()
    return report
