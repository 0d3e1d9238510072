"""``verify_rule`` and ``verify_rules``: prove, cross-check, and say what happened.

A rule is ``proven`` when Z3 finds ``lhs != rhs`` unsat from the axioms' instances and the
float64 cross-check agrees; ``refuted`` when it is proven but the cross-check fails (an unsound
axiom or a translation bug: reported loudly, never applied); ``unproven`` otherwise, with the
reason (sat, unknown, timeout) and whether it at least holds numerically.

``verify_rules`` runs the proofs on local processes (default: all cores) or, given a
``dask.distributed.Client``, on a cluster; results come back in input order.

>>> from superopt.axioms import parse_axioms
>>> from superopt.ir import GraphBuilder, Rule
>>> axioms = parse_axioms("axiom mul_comm: mul(x, y) == mul(y, x)")
>>> def side(op, swap=False):
...     b = GraphBuilder(); x, y = b.input("x", (3,)), b.input("y", (3,))
...     return b.build([b.op(op, *((y, x) if swap else (x, y)))])
>>> verify_rule(Rule(side("mul"), side("mul", swap=True)), axioms).status
'proven'
>>> res = verify_rule(Rule(side("add"), side("mul")), axioms)
>>> res.status, res.crosscheck, res.reason.split(":")[0]
('unproven', 'failed', 'sat')
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from typing import Iterable, Sequence

from tqdm import tqdm

from ..axioms.parse import load_axioms
from ..errors import SuperoptError
from ..ir.rule import Rule
from .crosscheck import crosscheck
from .prove import Limits, Theory, prove
from .ranks import lift_rule, rank_plan
from .result import VerifyResult

__all__ = ["verify_rule", "verify_rules", "theory_for", "all_ranks", "VerifyError"]


class VerifyError(SuperoptError):
    """Verification cannot start: bad limits or arguments."""


_THEORIES: dict = {}
_DEFAULT_AXIOMS: list | None = None


def _default_axioms() -> list:
    global _DEFAULT_AXIOMS
    if _DEFAULT_AXIOMS is None:
        _DEFAULT_AXIOMS = load_axioms()
    return _DEFAULT_AXIOMS


def theory_for(axioms=None) -> Theory:
    """The compiled axioms (cached per process; ``None``: the shipped ``specs/``)."""
    axioms = _default_axioms() if axioms is None else axioms
    last = _THEORIES.get("last")
    if last is not None and last[0] is axioms and last[1] == len(axioms):  # the same list again
        return last[2]
    key = tuple((a.name, str(a), repr(sorted(a.shapes.items())), repr(sorted(a.rules.items()))) for a in axioms)
    th = _THEORIES.get(key)
    if th is None:
        if len(_THEORIES) > 16:
            _THEORIES.clear()
        th = _THEORIES[key] = Theory(axioms)
    _THEORIES["last"] = (axioms, len(axioms), th)
    return th


def verify_rule(rule: Rule, axioms=None, timeout_s: float = 5.0, seed: int = 0,
                limits: Limits = Limits()) -> VerifyResult:
    """Prove ``rule`` from ``axioms`` within ``timeout_s`` seconds, then cross-check it."""
    if not timeout_s > 0:
        raise VerifyError(f"the time limit must be positive, got {timeout_s}")
    proof = prove(rule, theory_for(axioms), timeout_s, limits)
    try:
        cc = crosscheck(rule, seed)
    except SuperoptError as e:  # an operator without reference semantics (opaque)
        return _unchecked(proof, str(e))
    if proof.answer == "unsat":
        if cc.passed:
            ranks = all_ranks(rule, axioms, timeout_s, seed, limits)
            return VerifyResult("proven", proof.reason, proof.seconds, proof.axioms, "passed", cc.error, *ranks)
        reason = f"cross-check failed: {cc.detail}; the proof used {', '.join(proof.axioms) or 'no axiom'}"
        return VerifyResult("refuted", reason, proof.seconds, proof.axioms, "failed", cc.error)
    numeric = "holds numerically (an axiom may be missing)" if cc.passed else f"numerically false ({cc.detail})"
    return VerifyResult("unproven", f"{proof.reason}; {numeric}", proof.seconds, (),
                        "passed" if cc.passed else "failed", cc.error)


def all_ranks(rule: Rule, axioms=None, timeout_s: float = 5.0, seed: int = 0,
              limits: Limits = Limits()) -> tuple[bool, tuple[str, ...], str]:
    """``(all_ranks, batch inputs, how)`` for a proven rule: lifted by 1 up to the rule's rank
    bound, proven and cross-checked at each (superopt.verify.ranks), or why it is per instance."""
    plan = rank_plan(rule)
    if isinstance(plan, str):
        return False, (), f"per instance: {plan}"
    names, bound = plan
    for k in range(1, bound + 1):
        lifted = lift_rule(rule, k, names)
        proof = prove(lifted, theory_for(axioms), timeout_s, limits)
        if proof.answer != "unsat":
            return False, (), f"per instance: not proven with {k} extra leading axes ({proof.reason})"
        cc = crosscheck(lifted, seed)
        if not cc.passed:
            return False, (), f"per instance: cross-check failed with {k} extra leading axes ({cc.detail})"
    return True, names, f"all ranks: {', '.join(names)} lifted by 1..{bound} (bound {bound}) proven"


def _unchecked(proof, why: str) -> VerifyResult:
    proven = proof.answer == "unsat"
    return VerifyResult("proven" if proven else "unproven", f"{proof.reason}; not cross-checked: {why}",
                        proof.seconds, proof.axioms if proven else (), "skipped", 0.0)


# ---- many rules ----------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(axioms, timeout_s, seed, limits):
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: no worker tracebacks
    _WORKER.update(axioms=axioms, timeout_s=timeout_s, seed=seed, limits=limits)


def _verify_doc(doc: dict, axioms=None, timeout_s=None, seed=None, limits=None) -> dict:
    """Verify one rule given as JSON; never raises (a failure becomes an unproven result)."""
    w = _WORKER
    axioms = w.get("axioms") if axioms is None else axioms
    try:
        res = verify_rule(Rule.from_json(doc), axioms, timeout_s or w["timeout_s"],
                          w.get("seed", 0) if seed is None else seed, limits or w.get("limits", Limits()))
    except Exception as e:  # a verifier bug must not stop a long job; it is reported per rule
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        res = VerifyResult("unproven", f"error: {detail}", 0.0)
    return res.to_json()


def _context():
    """fork where the platform has it (fast: the axioms are compiled once, before forking, and the
    workers only run numpy, Z3 and Python, never torch); spawn elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def verify_rules(rules: Iterable[Rule], axioms=None, timeout_s: float = 5.0, workers: int | None = None,
                 progress: bool = True, client=None, seed: int = 0, limits: Limits = Limits()) -> list[VerifyResult]:
    """Verify many rules in parallel; results in input order. Refuted rules are reported on
    stderr as they are found: each one is a soundness bug in an axiom or in the translation."""
    rules = list(rules)
    axioms = _default_axioms() if axioms is None else list(axioms)
    if not timeout_s > 0:
        raise VerifyError(f"the time limit must be positive, got {timeout_s}")
    if workers is not None and workers < 1:
        raise VerifyError(f"--workers must be at least 1, got {workers}")
    docs = [r.to_json() for r in rules]
    bar = tqdm(total=len(docs), desc="verify", unit="rule", disable=not progress, file=sys.stderr)
    if client is not None:
        out = _on_dask(client, docs, axioms, timeout_s, seed, limits, bar)
    else:
        out = _on_processes(docs, axioms, timeout_s, seed, limits, workers or os.cpu_count() or 1, bar)
    bar.close()
    results = [VerifyResult.from_json(d) for d in out]
    for rule, res in zip(rules, results):
        if res.status == "refuted":
            print(f"superopt: REFUTED rule {rule.id} ({rule.text()}): {res.reason}. "
                  f"An axiom or the translation is unsound; the rule will never be applied.", file=sys.stderr)
        elif res.reason.startswith("error:"):
            print(f"superopt: verifier error on rule {rule.id} ({rule.text()}): {res.reason}", file=sys.stderr)
    return results


def _on_processes(docs: Sequence[dict], axioms, timeout_s, seed, limits, workers, bar) -> list[dict]:
    # here in a daemonic process (a multiprocessing.Pool's worker), which may not start any
    if workers == 1 or len(docs) < 4 or multiprocessing.current_process().daemon:
        _init_worker(axioms, timeout_s, seed, limits)
        out = []
        for d in docs:
            out.append(_verify_doc(d))
            bar.update(1)
        return out
    from concurrent.futures import ProcessPoolExecutor
    chunk = max(1, min(16, len(docs) // (workers * 8)))
    theory_for(axioms)  # compiled here, inherited by forked workers
    with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init_worker,
                             initargs=(axioms, timeout_s, seed, limits)) as pool:
        out = []
        for d in pool.map(_verify_doc, docs, chunksize=chunk):
            out.append(d)
            bar.update(1)
        return out


def _on_dask(client, docs, axioms, timeout_s, seed, limits, bar) -> list[dict]:
    """Map the proofs on a ``dask.distributed.Client`` (superopt must be importable on the
    workers); only the client's own methods are used, so nothing is imported here."""
    shared = client.scatter(axioms, broadcast=True)
    futures = client.map(_verify_doc, docs, axioms=shared, timeout_s=timeout_s, seed=seed, limits=limits,
                         pure=False)
    out = []
    for f in futures:  # in input order; the progress bar lags behind the fastest workers a little
        out.append(f.result())
        bar.update(1)
    return out
