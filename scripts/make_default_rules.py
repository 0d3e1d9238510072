"""Build the shipped rule database, ``rules/default.db``, from ``rules/default.json``.

Each generator job of the settings file (one family of ``superopt.generate.families`` each) runs
into a scratch database (enumerate, fingerprint, prune, verify); the axioms listed under
``"axioms"`` become candidates too (``superopt.generate.axiom_rules``: what is larger than the
generator's reach and is the statement of an axiom, batch norm as an affine map), and so do the
curated ones (``superopt.rules.curated``, none today); all are verified, then merged, in that
order, into a fresh database, each with the settings that produced it (a rule found by two jobs
is credited to the first). Deterministic: the same settings
file gives the same rules in the same order. Prints proven / unproven / refuted per job.

    python scripts/make_default_rules.py [--settings rules/default.json] [--out rules/default.db]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from superopt import __version__
from superopt.errors import SuperoptError
from superopt.generate import Settings, generate
from superopt.generate.axiom_rules import axiom_rules
from superopt.rules import RuleDB
from superopt.rules.curated import curated_rules
from superopt.rules.kernel_rules import kernel_rules, put_kernel_rules
from superopt.verify import verify_rules

ROOT = Path(__file__).resolve().parents[1]


def _generated(job: dict, scratch: Path, timeout: float):
    """(settings, [(rule, result)]) of one generator job."""
    settings = Settings.make(max_ops=job["max_ops"], ops=job["ops"], seed=job.get("seed", 0),
                             verify_timeout_s=timeout)
    out = scratch / f"{job['ops']}-{job['max_ops']}.db"
    t0 = time.perf_counter()
    generate(settings, out, progress=sys.stderr.isatty(), workers=job.get("workers"))
    with RuleDB.open(out) as db:
        stored = db.query()
        pairs = [(s.rule, s.result) for s in stored]
        meta = db.meta["settings"]
    print(f"  {job['ops']:<12} N={job['max_ops']}  {len(pairs):>5} rules  {_counts(pairs)}  "
          f"{time.perf_counter() - t0:6.1f} s", flush=True)
    return meta, pairs


def _counts(pairs) -> str:
    n = {k: sum(1 for _, r in pairs if r.status == k) for k in ("proven", "unproven", "refuted")}
    return " / ".join(f"{v} {k}" for k, v in n.items())


def _curated(timeout: float):
    rules = curated_rules()
    t0 = time.perf_counter()
    results = verify_rules(rules, timeout_s=timeout, progress=False)
    print(f"  {'curated':<12}       {len(rules):>5} rules  {_counts(list(zip(rules, results)))}  "
          f"{time.perf_counter() - t0:6.1f} s")
    return {"source": "curated", "module": "superopt.rules.curated", "generator_version": __version__}, \
        list(zip(rules, results))


def _from_axioms(names, timeout: float):
    rules = axiom_rules(names)
    t0 = time.perf_counter()
    results = verify_rules(rules, timeout_s=timeout, progress=False)
    print(f"  {'axioms':<12}       {len(rules):>5} rules  {_counts(list(zip(rules, results)))}  "
          f"{time.perf_counter() - t0:6.1f} s")
    return {"source": "axiom", "axioms": list(names), "module": "superopt.generate.axiom_rules",
            "generator_version": __version__}, list(zip(rules, results))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", default=str(ROOT / "rules" / "default.json"))
    p.add_argument("--out", help="the database to write (default: the settings file's 'output')")
    p.add_argument("--no-curated", action="store_true", help="generated rules only (for comparisons)")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    conf = json.loads(Path(args.settings).read_text())
    out = Path(args.out or ROOT / conf["output"])
    timeout = conf.get("verify_timeout_s", 5.0)
    batches = []
    with tempfile.TemporaryDirectory(prefix="superopt-default-") as tmp:
        print(f"building {out} from {args.settings}")
        for job in conf["generate"]:
            batches.append(_generated(job, Path(tmp), timeout))
        if conf.get("axioms"):
            batches.append(_from_axioms(conf["axioms"], timeout))
        if conf.get("curated") and not args.no_curated and curated_rules():
            batches.append(_curated(timeout))
        partial = out.with_suffix(".db.partial")
        partial.unlink(missing_ok=True)
        with RuleDB.create(partial, {"settings_file": conf, "superopt_version": __version__}) as db:
            for settings, pairs in batches:
                db.add(pairs, settings)
            kernels = put_kernel_rules(db, _kernel_rules_of(out))  # measured on a GPU: carried over
            counts = {s: len(db.query(status=s)) for s in ("proven", "unproven", "refuted")}
            all_ranks = sum(1 for r in db.query(status="proven") if r.all_ranks)
        partial.replace(out)
    print(f"{counts['proven']} proven; {all_ranks} of them for all ranks; {kernels} kernel rule(s) kept")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t_start:.0f} s: "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def _kernel_rules_of(path: Path) -> list:
    """The kernel rules of the database being replaced (``scripts/ship_kernel_rules.py`` stored
    them from GPU measurements; regenerating the graph rules must not drop them)."""
    if not path.is_file():
        return []
    with RuleDB.open(path) as old:
        return kernel_rules(old)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except SuperoptError as e:
        print(f"make_default_rules: error: {e}", file=sys.stderr)
        raise SystemExit(2)
