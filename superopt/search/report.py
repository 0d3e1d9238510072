"""The search's report: limits, stop reason, counts, costs and timings; a table and JSON."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from enum import Enum

__all__ = ["SearchReport", "SaturationReport", "StopReason", "format_table"]


class StopReason(str, Enum):
    """Why a search stopped (egg's ``StopReason``); compares equal to, and prints as, its value."""

    SATURATED = "saturated"              # equality saturation: no rule adds anything new
    EXHAUSTED = "exhausted"              # backtracking: the queue ran dry
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    BUDGET = "budget"                    # backtracking: that many graphs were expanded
    TIME_LIMIT = "time limit"

    def __str__(self) -> str:
        return self.value


@dataclass(kw_only=True)
class _Report:
    """What both searches report: rules, stop reason, proofs, costs, rewrites, timings."""

    rules: int = 0
    rules_skipped: int = 0
    stop_reason: StopReason | None = None
    instance_proofs: dict = field(default_factory=dict)  # the gate's counts: ran, proved, reused, refused
    nodes_before: int = 0
    nodes_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    rules_applied: dict = field(default_factory=dict)
    by_rule: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    seconds: defaultdict = field(default_factory=lambda: defaultdict(float))
    labels: dict = field(default_factory=dict, repr=False)

    def label(self, rule_id: str) -> str:
        """How the report names a rule (its database id; ``ID~`` for the reversal of ``ID``)."""
        return self.labels.get(rule_id, rule_id)

    @property
    def reduction(self) -> float:
        """Fraction of the cost removed (0.08 = 8% cheaper)."""
        return 1.0 - self.cost_after / self.cost_before if self.cost_before else 0.0

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "labels"}
        doc["stop_reason"] = None if self.stop_reason is None else self.stop_reason.value
        doc["by_rule"], doc["rejected"] = dict(self.by_rule), dict(self.rejected)
        doc["seconds"] = {k: round(v, 4) for k, v in self.seconds.items()}
        if "rule_seconds" in doc:
            doc["rule_seconds"] = {k: round(v, 4) for k, v in self.rule_seconds.most_common()}
        doc["reduction"] = round(self.reduction, 6)
        return doc

    def _rows(self, limits: str, work: list) -> str:
        """The table: the search's own rows (``work``) between the common ones."""
        return format_table([
            ("limits", limits),
            ("stopped by", str(self.stop_reason)),
            ("rules", f"{self.rules} usable, {self.rules_skipped} skipped"),
            *work[:1],
            ("instance proofs", ", ".join(f"{k} {v}" for k, v in self.instance_proofs.items() if k != "store")
             or "none"),
            *work[1:],
            ("operators", f"{self.nodes_before} -> {self.nodes_after}"),
            ("cost (us)", f"{self.cost_before:.2f} -> {self.cost_after:.2f} ({100 * self.reduction:.2f}% less)"),
            ("rules applied", ", ".join(f"{k} x{v}" for k, v in sorted(self.rules_applied.items())) or "none"),
            ("time (s)", ", ".join(f"{k} {v:.3f}" for k, v in self.seconds.items())),
        ])


@dataclass(kw_only=True)
class SearchReport(_Report):
    """What a backtracking search did. Costs in microseconds of the cost model's device."""

    alpha: float
    budget: int
    time_limit: float
    explored: int = 0
    candidates: int = 0
    pruned_by_cost: int = 0
    duplicates: int = 0
    key_collisions: int = 0
    queue_peak: int = 0
    plans_reused: int = 0
    steps: list = field(default_factory=list)

    def table(self) -> str:
        return self._rows(f"alpha {self.alpha}, budget {self.budget} graphs, time limit {self.time_limit:g} s", [
            ("graphs explored", f"{self.explored} ({self.candidates} candidates, {self.pruned_by_cost} over "
                                f"alpha x best, {self.duplicates} seen before, {self.key_collisions} "
                                f"distinct under one key, queue peak {self.queue_peak})")])


@dataclass(kw_only=True)
class SaturationReport(_Report):
    """What an equality saturation and its extraction did. Costs in microseconds."""

    limits: dict
    iterations: int = 0
    enodes: int = 0
    eclasses: int = 0
    instances_checked: int = 0
    repeats: int = 0  # matches found again at a form applied before (skipped)
    replayed: int = 0  # patterns not matched again: nothing near their tops changed since the last search
    bans: int = 0  # rules banned for a while for matching too often (backoff)
    held: int = 0  # classes the growth bound refused to growing patterns while matching, and
    #               merges a round had no room for (not applied)
    paying: int = 0  # growing rewrites applied as folds: cheaper than what they matched
    trace: list = field(default_factory=list)  # per iteration: phase, e-nodes, classes, rewrites, unions
    rule_seconds: Counter = field(default_factory=Counter)  # matching time per rule
    extraction: str = ""
    dropped_for_cycles: int = 0
    ilp_status: str = ""
    gap: float | None = None
    greedy_cost: float = 0.0  # the greedy extraction's cost (the integer program's start)
    kept_original: int = 0  # values switched back to how the input computes them (no dearer)

    def table(self) -> str:
        lim = self.limits
        gap = "" if self.gap is None else f", gap {100 * self.gap:.2f}%"
        return self._rows(
            f"{lim['iterations']} iterations, {lim['nodes']} e-nodes, {lim['seconds']:g} s, "
            f"multi-patterns in {lim['multi_rounds']} round(s)", [
                ("e-graph", f"{self.enodes} e-nodes in {self.eclasses} classes after {self.iterations} iterations "
                            f"({sum(self.by_rule.values())} rewrites, {self.repeats} repeated matches skipped, "
                            f"{self.replayed} unchanged patterns not matched again, "
                            f"{self.bans} rule bans, {self.held} held back by the growth bound "
                            f"{lim.get('growth', '-')}, {self.paying} growing rewrites cheaper at their match "
                            f"applied as folds, {self.instances_checked} instances checked)"),
                ("extraction", f"{self.extraction} ({self.ilp_status}{gap}; greedy {self.greedy_cost:.2f} us; "
                               f"{self.dropped_for_cycles} e-nodes dropped by the cycle filter; "
                               f"{self.kept_original} values kept as the input computes them: their rewrites "
                               f"did not lower the price)"),
                ("slowest to match", ", ".join(f"{k} {v:.2f} s" for k, v in self.rule_seconds.most_common(3))
                 or "-")])


def format_table(rows) -> str:
    """Two aligned columns."""
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  " + str(v).replace("\n", "\n" + " " * (w + 2)) for k, v in rows)
