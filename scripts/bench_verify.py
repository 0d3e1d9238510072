#!/usr/bin/env python3
"""Benchmark the verifier: proofs per second, the proof-time distribution, peak memory.

The rule set (default about 133 rules, the size of TASO's shipped set) mixes multi-step rules
in TASO's style (conv/matmul fusion, transposes, split/concat, four wrong rules), every
candidate of a tiny N <= 2 enumeration bucketed by fingerprint, and instances of the shipped
axioms; or the rules of a database (``--db``). Each rule is verified in this process, one at
a time (proof times are per proof: instantiation + Z3, without the cross-check; wall and CPU
times of the whole verification are given too), then once more over ``--workers`` processes
for throughput. Peak memory is the maximum resident set size (Z3 included).

    python scripts/bench_verify.py [--rules 133] [--timeout 5] [--workers 2] [--db X.db] [--json]
    python scripts/bench_verify.py --proofs [--db X.db] [--repeat 3] [--phases]

``--proofs`` times the proofs alone, the way two checkouts are compared: every rule of the
database (default: the shipped one) and its reversal proven by ``prove`` (no cross-check, no
rank lifting), one after the other in this process, ``--repeat`` times; it prints the CPU
seconds of each pass (the first warms the caches) and a digest of the outcomes (answer, axioms,
stop reason, rounds), which must be equal on both checkouts. It uses only ``prove``,
``theory_for`` and ``RuleDB``, so it runs against older trees too:
``PYTHONPATH=/path/to/old python scripts/bench_verify.py --proofs --db rules/default.db``.
With ``--phases`` each pass also gives the CPU seconds of the proofs' steps (axiom matching,
applying matches, rebuilding, setting a proof up, building the Z3 instances, Z3's decision), read
by wrapping ``superopt.verify.prove``'s steps (names older trees have too), and the least of each
over the passes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from collections import Counter

import numpy as np
import z3

from superopt.axioms import load_axioms
from superopt.verify import verify_rule, verify_rules
from superopt.verify.samples import composed_rules, enumerated_rules, instance_rules


def rule_set(n: int, axioms, seed: int) -> list:
    """``n`` rules: all composed ones, the N <= 2 enumerations, then axiom instances."""
    rules = list(composed_rules().values())
    rules += enumerated_rules(2) + enumerated_rules(2, ops=("add", "relu", "concat0", "concat1"))
    inst = [r for name, r in instance_rules(axioms, seed=seed, per_axiom=1)[::2]]
    rng = np.random.default_rng(seed)
    rules += [inst[i] for i in rng.permutation(len(inst))]
    return rules[:n]


def _peak_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # kilobytes on Linux


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))] if xs else 0.0


def run(args) -> dict:
    axioms = load_axioms(args.specs)
    if args.db:
        from superopt.rules import RuleDB
        with RuleDB.open(args.db) as db:
            rules = [s.rule for s in db.query(limit=args.rules)]
    else:
        rules = rule_set(args.rules, axioms, args.seed)
    verify_rule(rules[0], axioms)  # warm up: compile the axioms, start Z3
    t0, c0 = time.perf_counter(), time.process_time()
    results = [verify_rule(r, axioms, timeout_s=args.timeout) for r in rules]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    proof = [r.seconds for r in results]
    t1 = time.perf_counter()
    verify_rules(rules, axioms, timeout_s=args.timeout, workers=args.workers, progress=False)
    par = time.perf_counter() - t1
    return {
        "rules": len(rules), "axioms": len(axioms), "timeout_s": args.timeout, "z3": z3.get_version_string(),
        "status": dict(Counter(r.status for r in results)),
        "crosscheck": dict(Counter(r.crosscheck for r in results)),
        "serial": {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rules_per_s": round(len(rules) / wall, 1)},
        "proof_s": {"total": round(sum(proof), 3), "proofs_per_s": round(len(rules) / sum(proof), 1),
                    "p50_ms": round(1000 * _pct(proof, 50), 2), "p90_ms": round(1000 * _pct(proof, 90), 2),
                    "p99_ms": round(1000 * _pct(proof, 99), 2), "max_ms": round(1000 * max(proof), 2)},
        "proven_proof_s": round(sum(r.seconds for r in results if r.status == "proven"), 3),
        "parallel": {"workers": args.workers, "wall_s": round(par, 3), "rules_per_s": round(len(rules) / par, 1)},
        "peak_mb": {"this_process": round(_peak_mb(), 1), "workers": round(_peak_mb(resource.RUSAGE_CHILDREN), 1)},
        "load_average": os.getloadavg()[0],
    }


def proof_passes(rules, repeat: int = 3, timeout_s: float = 5.0, phases: bool = False) -> dict:
    """Each rule and its reversal proven by ``prove`` alone, ``repeat`` times: the CPU seconds of
    each pass and a digest of the outcomes (answer, axioms, stop reason, rounds); with
    ``phases``, the least CPU seconds of each step over the passes (:func:`_timed_steps`)."""
    from superopt.verify.prove import prove
    from superopt.verify.verifier import theory_for
    pairs = [r for rule in rules for r in (rule, rule.reversed())]
    theory = theory_for(None)
    cpu, digests, steps, least = [], set(), Counter(), {}
    with _timed_steps(steps if phases else None):
        for _ in range(repeat):
            steps.clear()
            h, c0 = hashlib.blake2b(digest_size=8), time.process_time()
            for r in pairs:
                out = prove(r, theory, timeout_s)
                h.update(repr((out.answer, out.axioms, out.stop, out.rounds)).encode())
            cpu.append(round(time.process_time() - c0, 3))
            digests.add(h.hexdigest())
            least = {k: min(v, least.get(k, v)) for k, v in steps.items()}
    if len(digests) != 1:
        raise AssertionError(f"the proofs gave different outcomes on two passes: {sorted(digests)}")
    rep = {"proofs": len(pairs), "cpu_s": cpu, "digest": digests.pop(), "load_average": os.getloadavg()[0]}
    if phases:
        rep["phases_least_s"] = {k: round(v, 3) for k, v in sorted(least.items())}
    return rep


#: the proofs' steps ``--phases`` times: (where, attribute, name in the report, a generator)
_STEPS = (("Theory", "matches", "match axioms", True), ("_Search", "_apply", "apply matches", False),
          ("_Search", "__init__", "set up", False), ("_Search", "z3_instances", "Z3 instances", False),
          ("EGraph", "rebuild", "rebuild", False), (None, "decide", "Z3 decides", False))


class _timed_steps:
    """Wrap ``superopt.verify.prove``'s steps so that each adds its CPU seconds to ``into``
    (nothing when ``into`` is None); put back on exit. A step a tree lacks is left out."""

    def __init__(self, into: Counter | None):
        import importlib
        self.into, self.mod, self.saved = into, importlib.import_module("superopt.verify.prove"), []

    def __enter__(self):
        for owner, attr, name, gen in _STEPS if self.into is not None else ():
            where = self.mod if owner is None else getattr(self.mod, owner, None)
            f = getattr(where, attr, None)
            if f is not None:
                self.saved.append((where, attr, f))
                setattr(where, attr, self._wrap(f, name, gen))
        return self

    def _wrap(self, f, name: str, gen: bool):
        into = self.into

        def timed(*args, **kwargs):
            t = time.process_time()
            out = list(f(*args, **kwargs)) if gen else f(*args, **kwargs)
            into[name] += time.process_time() - t
            return iter(out) if gen else out
        return timed

    def __exit__(self, *exc):
        for where, attr, f in self.saved:
            setattr(where, attr, f)


def table(rep: dict) -> str:
    p, s, q = rep["proof_s"], rep["serial"], rep["parallel"]
    rows = [
        ("rules", f"{rep['rules']} ({', '.join(f'{k} {v}' for k, v in sorted(rep['status'].items()))}); "
                  f"cross-check {', '.join(f'{k} {v}' for k, v in sorted(rep['crosscheck'].items()))}"),
        ("limits", f"{rep['timeout_s']:g} s per proof, {rep['axioms']} axioms, z3 {rep['z3']}"),
        ("proof time", f"total {p['total']:.2f} s ({p['proofs_per_s']} proofs/s); proven rules only "
                       f"{rep['proven_proof_s']:.2f} s"),
        ("distribution", f"p50 {p['p50_ms']} ms, p90 {p['p90_ms']} ms, p99 {p['p99_ms']} ms, max {p['max_ms']} ms"),
        ("serial verify", f"{s['wall_s']:.2f} s wall, {s['cpu_s']:.2f} s CPU ({s['rules_per_s']} rules/s, "
                          f"with cross-checks)"),
        ("parallel verify", f"{q['wall_s']:.2f} s wall on {q['workers']} workers ({q['rules_per_s']} rules/s)"),
        ("peak memory", f"{rep['peak_mb']['this_process']:.0f} MB (this process), "
                        f"{rep['peak_mb']['workers']:.0f} MB (largest worker)"),
        ("load average", f"{rep['load_average']:.2f} (other jobs on the machine slow wall times)"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", type=int, default=133, help="how many rules (default 133)")
    ap.add_argument("--timeout", type=float, default=5.0, help="time limit per proof, seconds")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the parallel run")
    ap.add_argument("--specs", default=None, help="axioms (default: the shipped specs/)")
    ap.add_argument("--db", default=None, help="benchmark on the rules of this database instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--proofs", action="store_true",
                    help="time the proofs of a database's rules in both directions alone (see above)")
    ap.add_argument("--repeat", type=int, default=3, help="passes of --proofs")
    ap.add_argument("--phases", action="store_true", help="with --proofs: the CPU seconds of each step of the proofs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.proofs:
        from superopt.rules import RuleDB
        from superopt.rules.load import DEFAULT_RULES
        with RuleDB.open(args.db or DEFAULT_RULES) as db:
            rules = [s.rule for s in db.query()]
        rep = proof_passes(rules, args.repeat, args.timeout, args.phases)
        print(json.dumps(rep, indent=2, sort_keys=True) if args.json else
              f"{rep['proofs']} proofs: CPU s per pass {', '.join(map(str, rep['cpu_s']))}; outcomes digest "
              f"{rep['digest']}; load average {rep['load_average']:.2f}" +
              ("".join(f"\n  {k:<14} {v:6.3f} s (least of {args.repeat})" for k, v in rep.get("phases_least_s", {}).items())))
        return 0
    rep = run(args)
    print(json.dumps(rep, indent=2, sort_keys=True) if args.json else table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
