"""scripts/bench_verify.py --proofs: the proofs of rules in both directions, timed alone."""

import sys
from pathlib import Path

from superopt.ir import GraphBuilder, Rule
from superopt.rules.examples import fuse_conv_relu, merge_matmuls

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_verify  # noqa: E402


def _relu_twice(k: int) -> Rule:
    """relu(relu(x)) => relu(x) (k=1: proven by relu idempotence) or => x (k=0: false)."""
    def side(n):
        b = GraphBuilder()
        y = b.input("x", (2, 3))
        for _ in range(n):
            y = b.op("relu", y)
        return b.build([y])
    return Rule(side(2), side(k))


def test_proof_passes_count_both_directions_and_digest_outcomes():
    rules = [fuse_conv_relu(), merge_matmuls()]
    rep = bench_verify.proof_passes(rules, repeat=2, timeout_s=5.0)
    assert rep["proofs"] == 4 and len(rep["cpu_s"]) == 2 and all(t >= 0 for t in rep["cpu_s"])
    again = bench_verify.proof_passes(rules, repeat=1, timeout_s=5.0)
    assert again["digest"] == rep["digest"]  # the same outcomes, however long they took


def test_digest_tells_a_proven_rule_from_an_unproven_one():
    true = bench_verify.proof_passes([_relu_twice(1)], repeat=1)
    false = bench_verify.proof_passes([_relu_twice(0)], repeat=1, timeout_s=0.5)  # never proven: no need to wait 5 s
    assert true["digest"] != false["digest"]


def test_phases_time_the_proofs_steps_and_leave_prove_as_it_was():
    import importlib
    prove_mod = importlib.import_module("superopt.verify.prove")  # (the package's ``prove`` is the function)
    before = prove_mod.Theory.matches
    rep = bench_verify.proof_passes([_relu_twice(1)], repeat=2, phases=True)
    steps = rep["phases_least_s"]
    assert {"match axioms", "apply matches", "Z3 decides"} <= set(steps) and all(v >= 0 for v in steps.values())
    assert prove_mod.Theory.matches is before  # the wrappers are put back
    assert rep["digest"] == bench_verify.proof_passes([_relu_twice(1)], repeat=1)["digest"]
