"""``superopt verify --db X``: re-verify a rule database (for example after the axioms change).

The database code belongs to the next stage (``superopt.rules``); it is imported only when the
command runs, so the verifier library itself never depends on it.
"""

from __future__ import annotations


from ..cliargs import add_json, add_quiet, positive_int, show_progress
from .verifier import VerifyError

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("verify", help="prove (and cross-check) every rule of a database again",
                       description="Prove every rule of a rule database again from the axioms, cross-check the "
                                   "proven ones numerically, and store the new results in one transaction. "
                                   "Exits with 1 when a rule is refuted (an axiom or the translation is unsound).")
    p.add_argument("--db", required=True, help="the rule database, e.g. rules/default.db")
    p.add_argument("--timeout", type=float, default=5.0, help="time limit per proof in seconds (default 5)")
    p.add_argument("--workers", type=positive_int, default=None, help="local processes (default: all cores)")
    p.add_argument("--specs", default=None, help="a .axioms file or folder (default: the shipped specs/)")
    p.add_argument("--status", choices=("proven", "unproven", "refuted"), help="only rules with this status")
    p.add_argument("--scheduler", default=None, help="a Dask scheduler address: prove on that cluster")
    add_json(p)
    add_quiet(p)
    p.set_defaults(func=_verify)


def _client(address: str | None):
    if address is None:
        return None
    try:
        from distributed import Client
    except ImportError:
        raise VerifyError("--scheduler needs Dask: pip install 'superopt[distributed]'") from None
    try:
        return Client(address, timeout=10)
    except (OSError, TimeoutError) as e:
        raise VerifyError(f"cannot reach the Dask scheduler at {address}: {e}") from None


def _verify(args) -> int:
    from ..axioms.parse import load_axioms
    from ..rules.reverify import reverify
    if not args.timeout > 0:
        raise VerifyError(f"--timeout must be positive, got {args.timeout}")
    if args.workers is not None and args.workers < 1:
        raise VerifyError(f"--workers must be at least 1, got {args.workers}")
    axioms = load_axioms(args.specs)
    report = reverify(args.db, axioms, args.timeout, args.workers, progress=show_progress(args),
                      client=_client(args.scheduler), status=args.status)
    if args.json:
        from ..cliargs import print_json
        print_json(report.to_json())
    else:
        print(report.table())
    return 1 if report.refuted else 0
