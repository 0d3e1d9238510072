"""Re-verifying a rule database (for example after the axioms changed): ``superopt verify --db``.

The rules are read, verified (in parallel, with progress), and all results are written back in
one transaction, so an interrupted run changes nothing. The report counts statuses before and
after, lists the rules whose status changed and every refuted rule, and gives proof times.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field

import z3

from .. import __version__
from ..verify import verify_rules
from ..verify.verifier import theory_for
from .db import RuleDB
from .inspect import time_distribution

__all__ = ["ReverifyReport", "reverify", "axioms_digest"]


def axioms_digest(axioms) -> str:
    """A short hash of the axioms' text: which axioms a database was verified with."""
    text = "\n".join(f"{a.name}: {a}" for a in axioms)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class ReverifyReport:
    """What ``superopt verify --db`` did: limits, counts, changes, timings."""
    path: str
    rules: int
    timeout_s: float
    workers: int | None
    axioms: int
    wall_seconds: float = 0.0
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    changed: list = field(default_factory=list)   # (id, old status, new status, text)
    refuted: list = field(default_factory=list)   # (id, text, reason)
    proof_seconds: dict = field(default_factory=dict)

    @property
    def proofs_per_second(self) -> float:
        return self.rules / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {"path": self.path, "rules": self.rules, "timeout_s": self.timeout_s, "workers": self.workers,
                "axioms": self.axioms, "wall_seconds": round(self.wall_seconds, 3),
                "proofs_per_second": round(self.proofs_per_second, 2), "before": self.before, "after": self.after,
                "changed": [dict(zip(("id", "before", "after", "text"), c)) for c in self.changed],
                "refuted": [dict(zip(("id", "text", "reason"), r)) for r in self.refuted],
                "proof_seconds": self.proof_seconds}

    def table(self) -> str:
        d = self.proof_seconds
        rows = [("database", self.path),
                ("limits", f"{self.timeout_s:g} s per proof, {self.workers or 'all'} worker(s), {self.axioms} axioms"),
                ("rules", str(self.rules)),
                ("before", ", ".join(f"{k} {v}" for k, v in sorted(self.before.items())) or "-"),
                ("after", ", ".join(f"{k} {v}" for k, v in sorted(self.after.items())) or "-"),
                ("changed status", str(len(self.changed))),
                ("refuted", str(len(self.refuted))),
                ("wall time", f"{self.wall_seconds:.2f} s ({self.proofs_per_second:.1f} rules/s)"),
                ("proof time", f"total {d.get('total', 0):.2f} s, p50 {1000 * d.get('p50', 0):.1f} ms, "
                               f"p90 {1000 * d.get('p90', 0):.1f} ms, max {1000 * d.get('max', 0):.1f} ms")]
        w = max(len(k) for k, _ in rows)
        lines = [f"{k:<{w}}  {v}" for k, v in rows]
        lines += [f"  {i}: {a} -> {b}  {t}" for i, a, b, t in self.changed[:50]]
        lines += [f"REFUTED {i}: {t}: {r}" for i, t, r in self.refuted]
        return "\n".join(lines)


def reverify(path, axioms=None, timeout_s: float = 5.0, workers: int | None = None, progress: bool = True,
             client=None, status: str | None = None) -> ReverifyReport:
    """Verify the rules of the database at ``path`` again (those with ``status``, or all) and
    store the new results in one transaction."""
    theory = theory_for(axioms)
    with RuleDB.open(path) as db:
        stored = db.query(status=status)
        rules = [s.rule for s in stored]
    report = ReverifyReport(str(path), len(rules), timeout_s, workers, len(theory.axioms))
    report.before = dict(Counter(s.status for s in stored))
    t0 = time.perf_counter()
    results = verify_rules(rules, theory.axioms, timeout_s=timeout_s, workers=workers, progress=progress,
                           client=client)
    report.wall_seconds = time.perf_counter() - t0
    note = {"timeout_s": timeout_s, "axioms": len(theory.axioms), "axioms_digest": axioms_digest(theory.axioms),
            "superopt_version": __version__, "z3_version": z3.get_version_string()}
    with RuleDB.open(path, writable=True) as db:
        db.update_results([(s.id, r) for s, r in zip(stored, results)], note=note)
    report.after = dict(Counter(r.status for r in results))
    report.changed = [(s.id, s.status, r.status, s.text) for s, r in zip(stored, results) if s.status != r.status]
    report.refuted = [(s.id, s.text, r.reason) for s, r in zip(stored, results) if r.status == "refuted"]
    report.proof_seconds = time_distribution(r.seconds for r in results)
    return report
