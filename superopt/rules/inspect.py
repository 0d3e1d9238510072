"""Summaries of rule databases: counts and time distributions (``stats``), and ``diff``.

>>> time_distribution([0.1, 0.2, 0.3, 0.4])["p50"]
0.2
"""

from __future__ import annotations

from collections import Counter

from .db import RuleDB

__all__ = ["stats", "diff", "time_distribution"]


def time_distribution(seconds) -> dict:
    """Count, total, mean and percentiles (nearest rank) of a list of times in seconds."""
    xs = sorted(seconds)
    if not xs:
        return {"count": 0, "total": 0.0, "mean": 0.0, "min": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}

    def pct(p):
        return xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))]

    return {"count": len(xs), "total": sum(xs), "mean": sum(xs) / len(xs), "min": xs[0], "p50": pct(50),
            "p90": pct(90), "p99": pct(99), "max": xs[-1]}


def stats(db: RuleDB) -> dict:
    """Counts by status, cross-check, size and operator; the proof-time distribution."""
    rows = db.query()
    by_size = Counter(f"{s.sizes[0]}->{s.sizes[1]}" for s in rows)
    by_op = Counter(op for s in rows for op in s.ops)
    by_axiom = Counter(a for s in rows if s.status == "proven" for a in s.axioms_used)
    return {
        "path": str(db.path),
        "rules": len(rows),
        "by_status": dict(Counter(s.status for s in rows)),
        "by_crosscheck": dict(Counter(s.crosscheck for s in rows)),
        "applicable": sum(1 for s in rows if s.status == "proven" and s.crosscheck == "passed"),
        "by_size": dict(sorted(by_size.items())),
        "by_op": dict(sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))),
        "axioms_used": dict(sorted(by_axiom.items(), key=lambda kv: (-kv[1], kv[0]))),
        "all_ranks": sum(1 for s in rows if s.status == "proven" and s.all_ranks),
        "per_instance": dict(Counter(_why_per_instance(s.ranks) for s in rows
                                     if s.status == "proven" and not s.all_ranks).most_common()),
        "unproven": [{"id": s.id, "text": s.text, "reason": s.reason} for s in rows if s.status != "proven"],
        "proof_seconds": time_distribution(s.seconds for s in rows),
        "proof_seconds_proven": time_distribution(s.seconds for s in rows if s.status == "proven"),
        "meta": db.meta,
    }


def _why_per_instance(ranks: str) -> str:
    """The class of reason a rule is proven per instance (its operator, not its sizes)."""
    why = ranks.removeprefix("per instance: ") or "not verified for all ranks"
    return why.split(" (")[0]


def diff(a: RuleDB, b: RuleDB) -> dict:
    """Rules only in ``a``, only in ``b``, and rules in both whose status differs."""
    ia, ib = a.ids(), b.ids()
    only_a = [s for s in a.query() if s.id not in ib]
    only_b = [s for s in b.query() if s.id not in ia]
    sa = {s.id: s for s in a.query() if s.id in ib}
    changed = [(sa[s.id], s) for s in b.query() if s.id in sa and sa[s.id].status != s.status]
    return {"a": str(a.path), "b": str(b.path), "only_a": only_a, "only_b": only_b, "status_changed": changed,
            "common": len(ia & ib)}
