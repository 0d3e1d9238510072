"""Numeric validation of the axioms: an unsound axiom would make every proof worthless.

Each axiom is instantiated at several shapes and attribute values where its conditions hold,
both sides are evaluated with the float64 reference semantics on random inputs, and they must
agree. Instances of every distinct structure found are evaluated (ranks, axes of size 1,
attribute values), since broadcasting bugs hide in a minority of draws. A variable without a
shape template or shape rule fails it, and so does a draw where both sides are well-formed but
of different types (the axiom is false there), and so do too few instances: its conditions or
templates are wrong. Sources
that reach a batch-norm variance through layout operators are drawn positive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..semantics.reference import evaluate, positive_sources, random_inputs
from .instantiate import sample_instances
from .terms import Axiom

__all__ = ["AxiomCheck", "check_axiom", "check_axioms"]


@dataclass
class AxiomCheck:
    """The outcome for one axiom: ``ok``, the instances tried, and what went wrong."""
    axiom: Axiom
    instances: int = 0
    max_error: float = 0.0
    problem: str = ""
    seconds: float = 0.0
    examples: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problem


def check_axiom(ax: Axiom, seed: int = 0, want: int = 96, min_instances: int = 2, rtol: float = 1e-9,
                tries: int = 1500, enough: int = 192) -> AxiomCheck:
    """Evaluate up to ``want`` instances of distinct structure among ``enough`` found in ``tries``
    draws (see :func:`sample_instances`)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    res = AxiomCheck(ax)
    mismatches: list = []
    for env, shapes, rule in sample_instances(ax, rng, want=want, tries=tries, mismatches=mismatches,
                                                  enough=enough):
        res.instances += 1
        res.examples.append({"attrs": env, "shapes": shapes})
        for _ in range(2):
            inputs = _random_inputs(rule, rng)
            a, = evaluate(rule.lhs, inputs)
            b, = evaluate(rule.rhs, inputs)
            err = float(np.max(np.abs(a - b))) if a.size else 0.0
            scale = max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
            res.max_error = max(res.max_error, err / scale)
            if a.shape != b.shape or not err <= rtol * scale:
                res.problem = (f"sides differ (max error {err:.3g}) at attributes {env} and shapes {shapes}"
                               if a.shape == b.shape else f"sides have shapes {a.shape} and {b.shape} at {env} {shapes}")
                break
        if res.problem:
            break
    if not res.problem and ax.unstated:
        verb = "has" if len(ax.unstated) == 1 else "have"
        res.problem = (f"{', '.join(ax.unstated)} {verb} no shape template and no shape rule: "
                       f"write e.g. `shapes {ax.unstated[0]}=any` (any shape), "
                       f"`{ax.unstated[0]}=like(x)` or `{ax.unstated[0]}=bcast(x)`")
    if not res.problem and mismatches:
        env, shapes, msg = mismatches[0]
        res.problem = f"sides have different types ({msg}) at attributes {env} and shapes {shapes}"
    if not res.problem and res.instances < min_instances:
        res.problem = (f"only {res.instances} instance(s) found where its conditions hold and both sides are "
                       f"well-formed; check its shapes and conditions")
    res.seconds = time.perf_counter() - t0
    return res


#: operators that only move values: a source reaching a positive-only input through them
#: (a batch-norm variance built with concat) must be drawn positive too
def _random_inputs(rule, rng: np.random.Generator) -> dict:
    inputs = random_inputs(rule.lhs, rng)
    for name in positive_sources(rule.rhs) - positive_sources(rule.lhs):
        inputs[name] = rng.uniform(0.5, 1.5, np.shape(inputs[name]))
    return inputs


def check_axioms(axioms, seed: int = 0) -> list[AxiomCheck]:
    return [check_axiom(ax, seed) for ax in axioms]
