"""From the enumeration's compact graphs to IR graphs and rules.

A graph found by the enumeration is named by a *locator* ``(level, row)``: row ``row`` of the
records of level ``level`` (its parent in the frontier of ``level - 1`` plus one node), or, at
level 0, an entry of :func:`level0_graphs` (one or two input tensors and no operator). Both
sides of a candidate are rebuilt with the :class:`~superopt.ir.GraphBuilder`, their outputs
sorted by value hash so that output ``k`` on the left equals output ``k`` on the right.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..ir import Graph, GraphBuilder, Rule
from ..semantics import Field, interpret, to_field
from .expand import Expander, h64
from .fastfield import fast_table

__all__ = ["level0_graphs", "level0_fingerprints", "Compact", "node_of_record", "to_graph", "make_rule",
           "fields_agree"]


def level0_graphs(settings) -> list[tuple[int, ...]]:
    """The operator-free graphs: each data input alone, and each pair of them (two outputs).
    (Graphs whose outputs are all computed from weights are never fingerprinted: the optimizer
    folds those away, so a rule about them is never used.)"""
    data = [v for v, spec in enumerate(settings.inputs) if not spec.weight]
    pairs = list(itertools.combinations(data, 2)) if settings.max_outputs >= 2 else []
    return [(a,) for a in data] + pairs


def level0_fingerprints(ex: Expander) -> list[int]:
    return [h64(len(g), *sorted(ex.src_vh[v] for v in g)) for g in level0_graphs(ex.settings)]


@dataclass(frozen=True)
class Compact:
    """A graph as the enumeration stores it: nodes ``(op, attrs, inputs)``, or for level 0 the
    input tensors that are its outputs."""

    nodes: tuple
    sources: tuple = ()


def node_of_record(rec, instances: dict) -> tuple:
    """The ``(op, attrs, inputs)`` node a record adds to its parent."""
    op, attrs = instances[int(rec["inst"])]
    return op, attrs, tuple(int(v) for v in rec["ins"] if v >= 0)


def to_graph(ex: Expander, c: Compact, outs: list[int]) -> Graph:
    """The IR graph of ``c`` (only the inputs it uses) with the value ids ``outs`` as outputs."""
    used = sorted({v for _, _, ins in c.nodes for v in ins if v < ex.n_src} | set(c.sources))
    b = GraphBuilder()
    ref = {}
    for v in used:
        spec = ex.settings.inputs[v]
        ref[v] = b.input(spec.name, spec.shape)
    nxt = ex.n_src
    for op, attrs, ins in c.nodes:
        out = b.add(op, [ref[v] for v in ins], dict(attrs))
        for r in out:
            ref[nxt] = r
            nxt += 1
    return b.build([ref[v] for v in outs])


def make_rule(ex: Expander, member: Compact, outs_m, rep: Compact, outs_r) -> Rule | None:
    """``member => rep`` with output ``k`` of one being output ``k`` of the other; None when the
    sides use different inputs."""
    lhs, rhs = to_graph(ex, member, outs_m), to_graph(ex, rep, outs_r)
    if set(lhs.input_names) != set(rhs.input_names):
        return None
    return Rule(lhs, rhs)


def fields_agree(rule: Rule, seeds=("check-1", "check-2")) -> bool:
    """Both sides agree under independent fingerprints (other field seeds): guards against
    fingerprint collisions, likely only around max pooling, whose field semantics (the max of
    random field elements) makes two different windows agree whenever they share their max."""
    for seed in seeds:
        f = Field(seed=seed)
        table = fast_table(f)
        env = f.random_inputs(rule.lhs, np.random.default_rng(sum(map(ord, seed))))
        a = interpret(rule.lhs, env, table, "fingerprint", to_field)
        b = interpret(rule.rhs, env, table, "fingerprint", to_field)
        if not all(np.array_equal(x, y) for x, y in zip(a, b)):
            return False
    return True
