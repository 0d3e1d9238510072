"""The verifier: proves candidate rules from the axioms of ``specs/`` with Z3, then
cross-checks every proven rule numerically (see DESIGN.md, "Verifier").

Public API: :func:`verify_rule`, :func:`verify_rules`, :class:`VerifyResult`; the pieces
(:func:`prove`, :func:`crosscheck`, :class:`Theory`) are exported for tests and scripts.

Only :mod:`.result` is imported with the package: the rule database needs just
:class:`VerifyResult`, and ``superopt optimize`` reads a database of proven rules, so z3 and the
prover (about 0.07 s of start-up) load when a name below is first used (see superopt._lazy).
"""

import sys
import types

from .._lazy import lazy_exports
from .result import CROSSCHECKS, STATUSES, VerifyResult

#: public name -> submodule, imported on first use
__getattr__ = lazy_exports(__name__, {
    "Limits": ".prove", "ProofOutcome": ".prove", "Theory": ".prove", "prove": ".prove",
    "CrossCheck": ".crosscheck", "crosscheck": ".crosscheck", "rescaled": ".crosscheck",
    "VerifyError": ".verifier", "theory_for": ".verifier", "verify_rule": ".verifier",
    "verify_rules": ".verifier",
})

#: public functions named like the submodule that defines them
_SHADOWED = frozenset({"prove", "crosscheck"})


class _Package(types.ModuleType):
    """The package's ``prove`` and ``crosscheck`` are the functions, as when they were imported
    eagerly: the import system binds a submodule to its package when the submodule first loads
    (whoever imports it), and that binding would hide the function from ``__getattr__``."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["superopt.verify.prove"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["VerifyResult", "STATUSES", "CROSSCHECKS", "Limits", "ProofOutcome", "Theory", "prove",
           "CrossCheck", "crosscheck", "rescaled", "VerifyError", "theory_for", "verify_rule", "verify_rules"]
