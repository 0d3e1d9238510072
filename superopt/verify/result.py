"""What verifying one rule gives: :class:`VerifyResult`, JSON-able.

>>> r = VerifyResult("proven", "unsat", 0.01, ("add_comm",), "passed", 0.0)
>>> VerifyResult.from_json(r.to_json()) == r
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["VerifyResult", "STATUSES", "CROSSCHECKS"]

#: ``proven``: Z3 found lhs != rhs unsat and the cross-check passed; ``unproven``: no proof (sat,
#: unknown, timeout: see ``reason``), never applied; ``refuted``: proven, yet the cross-check
#: failed (an unsound axiom or a translation bug), never applied.
STATUSES = ("proven", "unproven", "refuted")
CROSSCHECKS = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one rule.

    ``seconds`` is the proof time (instantiation and Z3); ``axioms_used`` the minimized unsat
    core; ``crosscheck_error`` the largest relative error of the float64 cross-check. An
    unproven rule is cross-checked too, to tell a false candidate (``failed``) from a missing
    axiom (``passed``).
    """

    status: str
    reason: str
    seconds: float
    axioms_used: tuple[str, ...] = ()
    crosscheck: str = "skipped"
    crosscheck_error: float = 0.0
    all_ranks: bool = False           # proven for every number of extra leading axes (verify/ranks.py)
    batch_inputs: tuple[str, ...] = ()  # the inputs those axes are added to
    ranks: str = ""                   # how all_ranks was decided, or why the rule is proven per instance

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        if self.crosscheck not in CROSSCHECKS:
            raise ValueError(f"crosscheck {self.crosscheck!r} is not one of {CROSSCHECKS}")
        object.__setattr__(self, "axioms_used", tuple(self.axioms_used))
        object.__setattr__(self, "batch_inputs", tuple(self.batch_inputs))

    @property
    def applicable(self) -> bool:
        """Whether the optimizer may apply the rule: proven and cross-checked."""
        return self.status == "proven" and self.crosscheck == "passed"

    def to_json(self) -> dict:
        d = asdict(self)
        d["axioms_used"] = list(self.axioms_used)
        d["batch_inputs"] = list(self.batch_inputs)
        if d["crosscheck_error"] == float("inf"):
            d["crosscheck_error"] = "inf"
        return d

    @staticmethod
    def from_json(doc: dict) -> "VerifyResult":
        d = dict(doc)
        d["axioms_used"] = tuple(d.get("axioms_used", ()))
        d["batch_inputs"] = tuple(d.get("batch_inputs", ()))
        d["crosscheck_error"] = float(d.get("crosscheck_error", 0.0))
        return VerifyResult(**d)
