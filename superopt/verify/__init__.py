"""The verifier: proves candidate rules from the axioms of ``specs/`` with Z3, then
cross-checks every proven rule numerically (see DESIGN.md, "Verifier").

Public API: :func:`verify_rule`, :func:`verify_rules`, :class:`VerifyResult`; the pieces
(:func:`prove`, :func:`crosscheck`, :class:`Theory`) are exported for tests and scripts.
"""

from .result import CROSSCHECKS, STATUSES, VerifyResult
from .prove import Limits, ProofOutcome, Theory, prove
from .crosscheck import CrossCheck, crosscheck, rescaled
from .verifier import VerifyError, theory_for, verify_rule, verify_rules

__all__ = ["VerifyResult", "STATUSES", "CROSSCHECKS", "Limits", "ProofOutcome", "Theory", "prove",
           "CrossCheck", "crosscheck", "rescaled", "VerifyError", "theory_for", "verify_rule", "verify_rules"]
