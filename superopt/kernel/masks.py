"""An attention mask the batch shares, given the batch axis as a view.

gpt-fast builds a decode step's mask as one row of its causal mask, ``[1, 1, l, s]``, shared by
every sequence of the batch; transformers writes ``[b, 1, l, s]``; torch's attention also takes
``[s]``, ``[l, s]`` and ``[heads, l, s]``. Attention broadcasts each to its scores, but a kernel region's
signature holds its inputs' shapes, and the attention kernels are measured (and shipped) with
the batch axis: at batch 16 such a step got no attention kernel, nor one with a rank-2 mask at
batch 1.
Here each such mask is expanded to ``[b, w, l, s]`` (``expand``: a view, no copy; what
attention does with it anyway), so that its region is the one measured.

The rewrite is axiom ``sdpa_mask_batch_expand`` of ``specs/llm.axioms`` read right to left
(``sdpa_mask_rank1_expand`` to ``sdpa_mask_rank3_expand`` for the lower ranks); it is checked as
a proven rule (:func:`~superopt.kernel.verify.check_identity`: found in the database or proven
now) at a small instance of each form (the mask's rank; grouped heads or not; the mask per head,
per query, per key or not) before it is applied, as the sibling merge is. The kernel pass keeps
it only where an attention kernel then reads the expanded mask (:func:`reads_expanded_mask`).
"""

from __future__ import annotations

import functools

from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule
from .regions import Region, region_graph, replace_regions
from .verify import Identity, check_identity

__all__ = ["expand_shared_masks", "expanded_shape", "mask_expand_rule", "reads_expanded_mask"]


def expanded_shape(batch: int, m_shape: tuple) -> tuple:
    """The rank-4 shape a mask of shape ``m_shape`` is read with at ``batch`` (``[b, w, l, s]``)."""
    m_shape = tuple(m_shape)
    return (batch,) + (m_shape[1:] if len(m_shape) == 4 else (1,) * (3 - len(m_shape)) + m_shape)


def mask_expand_rule(gqa: int, per_head: bool, per_query: bool, per_key: bool = True, rank: int = 4) -> Rule:
    """``sdpa(q, k, v, m) => sdpa(q, k, v, expand(m))`` at a small instance: batch 2, four query
    heads (two key-value heads where ``gqa``), the mask ``[1, 4 or 1, 3 or 1, 5 or 1]`` (its last
    ``rank`` axes: ``[3 or 1, 5 or 1]`` at rank 2, which has no head axis)."""
    n, hq, lq, s, e = 2, 4, 3, 5, 3
    h = 2 if gqa else hq
    m_shape = (1, hq if per_head else 1, lq if per_query else 1, s if per_key else 1)[4 - rank:]

    def side(expanded: bool) -> Graph:
        b = GraphBuilder()
        q, k, v = b.input("q", (n, hq, lq, e)), b.input("k", (n, h, s, e)), b.input("v", (n, h, s, e))
        m = b.input("m", m_shape)
        if expanded:
            m = b.op("expand", m, shape=expanded_shape(n, m_shape))
        return b.build([b.op("sdpa", q, k, v, m, scale=0.5, causal=0, gqa=gqa)])
    return Rule(side(False), side(True))


@functools.lru_cache(maxsize=None)
def _proven(gqa: int, per_head: bool, per_query: bool, per_key: bool, rank: int) -> bool:
    rule = mask_expand_rule(gqa, per_head, per_query, per_key, rank)
    return check_identity(Identity("an attention mask shared by the batch, expanded to it", rule)).startswith("proven")


def _shared(g: Graph, i: int):
    """``(batch, mask shape)`` where node ``i`` is an attention whose mask lacks the leading axes
    of the scores: one of rank 4 that the batch shares (batch axis 1) at a batch above 1, or one of
    rank 1 to 3 at any batch; else None."""
    n = g.nodes[i]
    if n.op != "sdpa" or len(n.inputs) != 4:
        return None
    q, m = g.type_of(n.inputs[0]), g.type_of(n.inputs[3])
    if q.rank != 4 or m.rank not in (1, 2, 3, 4) or m.rank == 4 and (m.shape[0] != 1 or q.shape[0] == 1):
        return None
    return q.shape[0], m.shape


def expand_shared_masks(g: Graph, prove: bool = True) -> tuple[Graph, int]:
    """``g`` with the mask of every attention that the batch shares expanded to the batch (see the
    module docstring) where the identity is proven for its form, and how many. ``prove=False``
    skips the proof (timing only, as the kernel pass's other trials)."""
    todo = []
    for i, n in enumerate(g.nodes):
        found = _shared(g, i)
        if found is None:
            continue
        batch, m = found
        full = expanded_shape(1, m)
        form = (int(n.attr["gqa"]), full[1] > 1, full[2] > 1, full[3] > 1, len(m))
        if prove and not _proven(*form):
            continue
        sub, boundary = region_graph(g, {i}, [Ref(i, 0)])
        region = Region("mask", (i,), (i,), boundary, (Ref(i, 0),), sub)
        todo.append((region, _emitter(dict(n.attr), batch, m)))
    if not todo:
        return g, 0
    return replace_regions(g, todo), len(todo)


def _emitter(attrs: dict, batch: int, m_shape: tuple):
    def emit(b: GraphBuilder, ins: list[Ref]) -> list[Ref]:
        q, k, v, m = ins
        return list(b.add("sdpa", [q, k, v, b.op("expand", m, shape=expanded_shape(batch, m_shape))], attrs))
    return emit


def reads_expanded_mask(g: Graph) -> bool:
    """Whether a ``kernel`` node of ``g`` reads a mask :func:`expand_shared_masks` expanded (an
    ``expand`` to the shape :func:`expanded_shape` gives: a rank-4 value of batch axis 1 along that
    axis only, or a value of rank 1 to 3 given the leading axes)."""
    for n in g.nodes:
        if n.op != "kernel":
            continue
        for r in n.inputs:
            src = g.nodes[r.node]
            if src.op != "expand":
                continue
            before, after = g.type_of(src.inputs[0]).shape, src.types[0].shape
            grew = after[0] > 1 if len(before) == 4 else len(before) in (1, 2, 3)
            if len(after) == 4 and grew and (len(before) < 4 or before[0] == 1) \
                    and after == expanded_shape(after[0], before):
                return True
    return False
