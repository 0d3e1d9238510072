"""Rotary embeddings on an attention's queries, as Hugging Face writes them
(``apply_rotary_pos_emb``): ``q·cos + rotate_half(q)·sin``, ``rotate_half(q) = concat(-q[..., h:],
q[..., :h])`` over the last axis (``h`` half the head dim).

The region cutter takes these nodes into the attention's region (:func:`match_rotary` on the
model's graph), and the attention translator computes the rotated queries in its prologue from
two half-width loads of q, at ``D`` and ``D+h`` (:mod:`superopt.kernel.attention`)::

    lo = q_lo·cos_lo + (-q_hi)·sin_lo        hi = q_hi·cos_hi + q_lo·sin_hi
    scores = lo·k_loᵀ + hi·k_hiᵀ

so the rotation costs no kernel of its own (in a decode step it was one of Inductor's three small
kernels between superopt's). The two identities the program relies on are proven rules
(:func:`identities`): a split distributes over the rotation's adds and multiplies by the tables
(``split_add``, ``split_mul_bias_axis``, ``split_concat``), and a dot over the head dim is the
sum of the dots over its halves (``matmul_add_concat_batched``).

The negation may be written ``smul`` or ``mul`` by a constant -1 (HF's ``-x2`` imports as
``smul`` by a -1 scalar); the two halves may come from one split of q or from two; the add's and
the multiplies' operands in either order. Anything else is no rotary match, and the region
keeps the attention alone (Inductor then computes the rotation).

>>> from superopt.ir import GraphBuilder
>>> import numpy as np
>>> b = GraphBuilder()
>>> q, c, s = b.input("q", (1, 2, 1, 8)), b.input("c", (1, 1, 1, 8)), b.input("s", (1, 1, 1, 8))
>>> lo, hi = b.op("split", q, axis=3, sizes=(4, 4))
>>> neg = b.op("smul", hi, b.weight("m1", (), np.array(-1.0, np.float32)))
>>> e = b.op("add", b.op("mul", q, c), b.op("mul", b.op("concat", neg, lo, axis=3), s))
>>> g = b.build([e])
>>> m = match_rotary(g, g.outputs[0])
>>> (g.nodes[m.q.node].name, g.nodes[m.cos.node].name, g.nodes[m.sin.node].name, m.half)
('q', 'c', 's', 4)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule

__all__ = ["RotaryMatch", "match_rotary", "identities"]


@dataclass(frozen=True)
class RotaryMatch:
    """``q·cos + rotate_half(q)·sin`` at ``nodes`` (the add, the multiplies, the concat, the
    negation and its -1, the splits); ``q``, ``cos``, ``sin``: the values it reads; ``minus``:
    the -1 weight (a kernel multiplies by it: the fingerprint takes every weight as a random
    field value, and the compiled program reads it as the number it holds)."""

    q: Ref
    cos: Ref
    sin: Ref
    minus: Ref
    half: int
    nodes: frozenset[int]


def _last_axis(n, rank: int) -> bool:
    return n.attr.get("axis") in (rank - 1, -1)


def _half_of(g: Graph, ref: Ref, q: Ref, index: int, half: int) -> int | None:
    """The node of ``split(q)[index]`` over q's last axis in two halves of ``half``, else None."""
    n = g.nodes[ref.node]
    rank = g.type_of(q).rank
    if n.op != "split" or ref.index != index or n.inputs[0] != q or not _last_axis(n, rank) \
            or tuple(n.attr.get("sizes", ())) != (half, half):
        return None
    return ref.node


def _minus_one(g: Graph, ref: Ref) -> bool:
    n = g.nodes[ref.node]
    if n.op != "weight" or g.type_of(ref).numel != 1 or n.name not in g.data:
        return False
    return float(np.asarray(g.data[n.name]).reshape(-1)[0]) == -1.0


def _negated(g: Graph, ref: Ref) -> tuple[Ref, Ref] | None:
    """``(x, minus)`` where ``ref`` is ``-x`` written as smul or mul by a constant -1 ``minus``."""
    n = g.nodes[ref.node]
    if n.op not in ("smul", "mul") or len(n.inputs) != 2:
        return None
    for x, k in (n.inputs, n.inputs[::-1]):
        if _minus_one(g, k) and g.type_of(x).shape == g.type_of(ref).shape:
            return x, k
    return None


def _rotate_half(g: Graph, ref: Ref, q: Ref, half: int) -> tuple[set[int], Ref] | None:
    """The nodes of ``concat(-q_hi, q_lo)`` at ``ref`` and the -1 weight, else None."""
    cat = g.nodes[ref.node]
    if cat.op != "concat" or len(cat.inputs) != 2 or not _last_axis(cat, g.type_of(q).rank):
        return None
    neg = _negated(g, cat.inputs[0])
    if neg is None:
        return None
    hi, lo = _half_of(g, neg[0], q, 1, half), _half_of(g, cat.inputs[1], q, 0, half)
    if hi is None or lo is None:
        return None
    return {ref.node, hi, lo, neg[1].node, cat.inputs[0].node}, neg[1]


def _table_fits(g: Graph, table: Ref, q: Ref) -> bool:
    """A cos/sin table broadcast to q from the right, its last axis the head dim."""
    t, qt = g.type_of(table), g.type_of(q)
    return (t.rank <= qt.rank and t.shape[-1:] == qt.shape[-1:]
            and all(a in (1, b) for a, b in zip(t.shape[::-1], qt.shape[::-1])))


def match_rotary(g: Graph, ref: Ref) -> RotaryMatch | None:
    """The rotary embedding computing ``ref`` (see the module docstring), or None."""
    top = g.nodes[ref.node]
    if top.op != "add" or len(top.inputs) != 2 or ref.index != 0:
        return None
    for direct_ref, rot_ref in (top.inputs, top.inputs[::-1]):
        direct, rot = g.nodes[direct_ref.node], g.nodes[rot_ref.node]
        if direct.op != "mul" or rot.op != "mul" or direct_ref.node == rot_ref.node:
            continue
        for q, cos in (direct.inputs, direct.inputs[::-1]):
            qt = g.type_of(q)
            if qt.rank < 3 or qt.shape[-1] % 2 or g.type_of(direct_ref).shape != qt.shape \
                    or g.type_of(ref).shape != qt.shape or not _table_fits(g, cos, q):
                continue
            for cat, sin in (rot.inputs, rot.inputs[::-1]):
                half = _rotate_half(g, cat, q, qt.shape[-1] // 2)
                if half is not None and _table_fits(g, sin, q) and g.type_of(rot_ref).shape == qt.shape:
                    return RotaryMatch(q, cos, sin, half[1], qt.shape[-1] // 2,
                                       frozenset(half[0] | {ref.node, direct_ref.node, rot_ref.node}))
    return None


def _halves_rule(d: int = 8) -> Rule:
    """split(q·c + rotate_half(q)·s) == (q_lo·c_lo + (-q_hi)·s_lo, q_hi·c_hi + q_lo·s_hi), at a
    small instance (the tables as vectors over the head dim; proven at every rank)."""
    h = d // 2

    def side(kernel: bool):
        b = GraphBuilder()
        ax = 2
        x, c, s = b.input("x", (2, 3, d)), b.input("c", (d,)), b.input("s", (d,))
        m1 = b.weight("minus_one", (), np.array(-1.0, np.float32))
        lo, hi = b.op("split", x, axis=ax, sizes=(h, h))
        if not kernel:
            e = b.op("add", b.op("mul", x, c), b.op("mul", b.op("concat", b.op("smul", hi, m1), lo, axis=ax), s))
            return b.build(list(b.op("split", e, axis=ax, sizes=(h, h))))
        cl, ch = b.op("split", c, axis=0, sizes=(h, h))
        sl, sh = b.op("split", s, axis=0, sizes=(h, h))
        return b.build([b.op("add", b.op("mul", lo, cl), b.op("mul", b.op("smul", hi, m1), sl)),
                        b.op("add", b.op("mul", hi, ch), b.op("mul", lo, sh))])
    return Rule(side(False), side(True))


def _dot_halves_rule(l: int = 3, d: int = 8, s: int = 5) -> Rule:
    """matmul(concat(a, b), concat(c, d)) == a·c + b·d: a dot over the head dim as the sum of
    the dots over its halves."""
    h = d // 2

    def side(split: bool):
        b = GraphBuilder()
        a, bb = b.input("a", (l, h)), b.input("b", (l, h))
        c, dd = b.input("c", (h, s)), b.input("d", (h, s))
        if split:
            return b.build([b.op("add", b.op("matmul", a, c), b.op("matmul", bb, dd))])
        return b.build([b.op("matmul", b.op("concat", a, bb, axis=1), b.op("concat", c, dd, axis=0))])
    return Rule(side(False), side(True))


@functools.cache
def identities():
    """The two graph identities a rotary prologue relies on, as :class:`~superopt.kernel.verify.Identity`
    (built once: the translator asks for them once per combination of moves)."""
    from .verify import Identity
    return (Identity("rotary halves: a split distributes over q·cos + rotate_half(q)·sin", _halves_rule()),
            Identity("matmul_add_concat: the dot over the head dim as the sum of its halves' dots", _dot_halves_rule()))
