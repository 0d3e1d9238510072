"""A per-head RMSNorm of an attention's queries, as Qwen3 and Gemma 3 write it (``q_norm`` over
the head dim, before the heads are moved to axis 1 and before the rotary embedding)::

    q = q_norm(q_proj(x).view(b, l, h, d)).transpose(1, 2)
    q_norm(x) = w · (x · rsqrt(mean(x², -1) + eps))          (casts to and from float32 allowed)

The region cutter takes these nodes into the attention's region (:func:`match_head_norm` on
the model's graph, below the rotary embedding where there is one), and the attention translator
normalizes the query rows in its prologue (:mod:`superopt.kernel.attention`): the sum of
squares of the two half-width loads, the row scale ``rsqrt(Σ/d + eps)`` and the weight's halves,
so the norm costs no kernel of its own (in a Qwen3 decode step it was one of Inductor's small
kernels between superopt's). The identities a program relies on are proven rules
(:func:`identities`): a split distributes over the row scale and the weight, and the mean of
squares over the head dim is the sum of its halves' sums over d.

Where the transpose swaps a query axis of more than one position with the heads, the prologue
reads the source as ``[B, L, H, D]``; at one position (a decode step) it is a relabelling.

>>> import numpy as np
>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder()
>>> x = b.input("x", (1, 1, 4, 8))
>>> ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=3, keepdim=1)
>>> r = b.op("rsqrt", b.op("add", ms, b.weight("eps", (), np.array(1e-6, np.float32))))
>>> y = b.op("mul", b.weight("w", (8,)), b.op("mul", x, r))
>>> g = b.build([b.op("transpose", y, perm=(0, 2, 1, 3))])
>>> m = match_head_norm(g, g.outputs[0])
>>> (g.nodes[m.source.node].name, g.nodes[m.weight.node].name, m.transposed, len(m.nodes))
('x', 'w', True, 9)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule

__all__ = ["HeadNorm", "match_head_norm", "identities"]


@dataclass(frozen=True)
class HeadNorm:
    """``w · (x · rsqrt(mean(x², -1) + eps))`` at ``nodes`` (with the transpose after it where
    ``transposed``: axes 1 and 2 swapped); ``source`` the x it reads under ``casts`` (the float32
    upcast: another region may have computed it), ``weight`` the [d] weight, ``eps`` the
    one-element weight added to the mean."""

    source: Ref
    weight: Ref
    eps: Ref
    transposed: bool
    nodes: frozenset[int]
    casts: frozenset[int] = frozenset()


def _uncast(g: Graph, ref: Ref, seen: set[int]) -> Ref:
    while g.nodes[ref.node].op == "cast":
        seen.add(ref.node)
        ref = g.nodes[ref.node].inputs[0]
    return ref


def _is_weight(g: Graph, ref: Ref, numel: int | None = None, last: int | None = None) -> bool:
    n, t = g.nodes[ref.node], g.type_of(ref)
    if n.op != "weight":
        return False
    if numel is not None:
        return t.numel == numel
    return t.rank >= 1 and t.shape[-1] == last and t.numel == last


def _row_scale(g: Graph, ref: Ref, x: Ref) -> tuple[Ref, set[int], set[int]] | None:
    """``rsqrt(mean(x², -1, keepdim) + eps)`` at ``ref`` (x under casts): ``(eps, nodes, casts
    of x)``."""
    seen: set[int] = set()
    rs = g.nodes[ref.node]
    if rs.op != "rsqrt":
        return None
    add = g.nodes[rs.inputs[0].node]
    if add.op != "add" or len(add.inputs) != 2:
        return None
    for m_ref, eps in (add.inputs, add.inputs[::-1]):
        mean = g.nodes[m_ref.node]
        if mean.op != "mean" or not _is_weight(g, eps, numel=1):
            continue
        rank = g.type_of(mean.inputs[0]).rank
        if mean.attr.get("axis") not in (rank - 1, -1) or not mean.attr.get("keepdim"):
            continue
        pw = g.nodes[mean.inputs[0].node]
        if pw.op != "pow" or float(pw.attr.get("exponent", 0)) != 2.0 or _uncast(g, pw.inputs[0], seen) != x:
            continue
        return eps, {ref.node, rs.inputs[0].node, m_ref.node, mean.inputs[0].node, eps.node}, seen
    return None


def _norm(g: Graph, ref: Ref) -> tuple[Ref, Ref, Ref, set[int], set[int]] | None:
    """``(source, weight, eps, nodes, casts of the source)`` of the RMSNorm computing ``ref``,
    else None."""
    seen: set[int] = set()
    ref = _uncast(g, ref, seen)
    top = g.nodes[ref.node]
    if top.op != "mul" or len(top.inputs) != 2:
        return None
    d = g.type_of(ref).shape[-1]
    for w, y_ref in (top.inputs, top.inputs[::-1]):
        if not _is_weight(g, w, last=d):
            continue
        inner = set(seen)
        y_ref = _uncast(g, y_ref, inner)
        y = g.nodes[y_ref.node]
        if y.op != "mul" or len(y.inputs) != 2:
            continue
        for x, r in (y.inputs, y.inputs[::-1]):
            xs: set[int] = set()
            src = _uncast(g, x, xs)
            if g.type_of(src).shape != g.type_of(ref).shape:
                continue
            found = _row_scale(g, r, src)
            if found is not None:
                return src, w, found[0], inner | found[1] | {ref.node, y_ref.node, w.node}, xs | found[2]
    return None


def match_head_norm(g: Graph, ref: Ref) -> HeadNorm | None:
    """The per-head RMSNorm computing the queries ``ref`` [.., H, L, D] (see the module
    docstring), or None."""
    n = g.nodes[ref.node]
    transposed = n.op == "transpose" and g.type_of(ref).rank == 4 and tuple(n.attr.get("perm", ())) == (0, 2, 1, 3)
    found = _norm(g, n.inputs[0] if transposed else ref)
    if found is None:
        return None
    src, w, eps, nodes, casts = found
    if g.type_of(src).rank < 3:
        return None
    return HeadNorm(src, w, eps, transposed, frozenset(nodes | ({ref.node} if transposed else set())),
                    frozenset(casts))


def _halves_rule(d: int = 8) -> Rule:
    """split(x · r · w) == (x_lo · r · w_lo, x_hi · r · w_hi) for the row scale
    r = rsqrt(mean(x²) + e) over the whole head dim, at a small instance (proven at every rank)."""
    h = d // 2

    def side(kernel: bool):
        b = GraphBuilder()
        x, w, e = b.input("x", (2, 3, d)), b.input("w", (d,)), b.input("e", (1,))
        r = b.op("rsqrt", b.op("add", b.op("mean", b.op("pow", x, exponent=2.0), axis=2, keepdim=1), e))
        if not kernel:
            return b.build(list(b.op("split", b.op("mul", b.op("mul", x, r), w), axis=2, sizes=(h, h))))
        lo, hi = b.op("split", x, axis=2, sizes=(h, h))
        wl, wh = b.op("split", w, axis=0, sizes=(h, h))
        return b.build([b.op("mul", b.op("mul", lo, r), wl), b.op("mul", b.op("mul", hi, r), wh)])
    return Rule(side(False), side(True))


def _sum_halves_rule(d: int = 8) -> Rule:
    """sum(concat(a, b), -1) == sum(a, -1) + sum(b, -1): the sum of squares over the head dim as
    the sum of its halves' sums."""
    h = d // 2

    def side(split: bool):
        b = GraphBuilder()
        a, c = b.input("a", (2, 3, h)), b.input("c", (2, 3, h))
        if split:
            return b.build([b.op("add", b.op("sum", a, axis=2, keepdim=1), b.op("sum", c, axis=2, keepdim=1))])
        return b.build([b.op("sum", b.op("concat", a, c, axis=2), axis=2, keepdim=1)])
    return Rule(side(False), side(True))


@functools.cache
def identities():
    """The graph identities a head-norm prologue over two half-width loads relies on, as
    :class:`~superopt.kernel.verify.Identity`."""
    from .verify import Identity
    return (Identity("head norm halves: a split distributes over x·rsqrt(mean(x²)+e)·w", _halves_rule()),
            Identity("sum_concat: a sum over the head dim as the sum of its halves' sums", _sum_halves_rule()))
