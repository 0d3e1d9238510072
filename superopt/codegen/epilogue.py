"""Which IR nodes the FX code emits as one torch call: a bias or affine epilogue folded back
into the library call that takes it, and attention written out op by op emitted as
``F.scaled_dot_product_attention``.

The importer splits ``linear`` into ``matmul`` + ``add``, ``layer_norm`` into ``layernorm`` +
``mul`` + ``add`` and a biased convolution into ``conv2d`` + ``add``, so that rules see one
operator per job. Emitted as they are, those are two or three kernels where PyTorch runs one
(cuBLAS adds the bias in the GEMM's epilogue, the layer-norm kernel applies the affine map):
in bf16 under a CUDA graph the imported BERT ran 1.5x slower than the original module. This
module finds the pairs again: an ``add`` of a weight vector to a ``matmul`` by a weight matrix
(``F.linear``), or to a ``conv2d`` without activation (``F.conv2d`` with bias), and ``mul``/``add``
by weights of the normalized shape after a ``layernorm`` (``F.layer_norm`` with weight and bias).
Attention, ``matmul(softmax(matmul(q, kᵀ) [* s] [+ mask]), v)`` over the last axis, is emitted
as one ``scaled_dot_product_attention`` call: Inductor finds that pattern in the graph dynamo
gives it and runs a flash-attention kernel, but not in code where the scale is a constant
tensor; without it ViT-B/16 in bf16 ran 1.5x slower under Inductor (H100, batch 16). In float32
there is no flash kernel: the memory-efficient one ran ViT-B/16 at batch 1 5% slower than
Inductor's matmul-softmax-matmul, so the caller can turn it off (``attention=False``).
A convolution whose bias, residual add and ReLU the caller says run in one cuDNN call
(``conv_relu``: chains the cost model chose, :meth:`superopt.cost.CostModel.conv_relu_fusions`)
is emitted as ``superopt::conv2d_relu`` (:mod:`.cudnn`).
An inner node is folded only when the fused call is its one user and not a graph output, so
nothing else needs its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..cost.fusion import linear_calls, sole_user as _sole_user
from ..ir.graph import Graph, Ref

__all__ = ["Fused", "find_epilogues"]


@dataclass(frozen=True)
class Fused:
    """One torch call for several nodes: ``kind`` is ``linear``, ``conv2d``, ``conv2d_relu``
    (``mask``: the residual or None), ``layer_norm`` or ``sdpa``; ``x`` the data input (attention: the queries), ``weight`` the matrix/kernel/scale
    weight or None (attention: the keys, or the transposed keys when ``keys_transposed``),
    ``bias`` the bias/shift weight or None (attention: the values); ``base`` the
    matmul/conv/layernorm node (attention: the scores' matmul), ``mask`` an attention's additive
    mask, ``scale`` its scale."""

    kind: str
    base: int
    x: Ref
    weight: Ref | None
    bias: Ref | None
    mask: Ref | None = None
    scale: float = 1.0
    keys_transposed: bool = False
    pieces: tuple = ()  # linear_pieces: (add node, start, size, bias) per piece of the output


def _weight_channels(g: Graph, r: Ref, c: int) -> bool:
    """A weight of shape ``(c, 1, 1)`` or ``(1, c, 1, 1)``: one value per output channel."""
    node = g.nodes[r.node]
    shape = g.type_of(r).shape
    return node.op == "weight" and shape in ((c, 1, 1), (1, c, 1, 1))


def _other(n, r: Ref) -> Ref:
    return n.inputs[1] if n.inputs[0] == r else n.inputs[0]


def find_epilogues(g: Graph, attention: bool = True, conv_relu: Mapping | None = None) -> tuple[dict[int, Fused], set[int]]:
    """``(fused, folded)``: the node at which each fused call is emitted (the last node of its
    group, whose value the call gives), and the nodes folded into some call (not emitted).
    ``attention=False`` leaves attention op by op (see :func:`superopt.codegen.fx.to_fx`);
    ``conv_relu``: chains (by their relu node, :class:`superopt.cost.fusion.ConvReluChain`) to
    emit as one cuDNN call each."""
    outputs = set(g.outputs)
    linear = linear_calls(g)
    fused: dict[int, Fused] = {}
    folded: set[int] = set()
    for relu, ch in (conv_relu or {}).items():
        conv = g.nodes[ch.conv]
        fused[relu] = Fused("conv2d_relu", ch.conv, conv.inputs[0], conv.inputs[1], ch.bias, ch.residual)
        folded |= {ch.conv, *ch.nodes} - {relu}
    for i, n in enumerate(g.nodes):
        if i in folded or i in fused:
            continue
        if n.op == "matmul":
            call = linear.get(i)
            if call is not None and call.pieces:  # one linear, its pieces given to the bias adds' users
                fused[call.end] = Fused("linear_pieces", i, n.inputs[0], n.inputs[1], None, pieces=call.pieces)
                folded |= call.nodes - {call.end} - {p[0] for p in call.pieces}
            elif call is not None:
                fused[call.end] = Fused("linear", i, n.inputs[0], n.inputs[1], call.bias)
                folded.add(i)
        elif n.op == "conv2d" and n.attr.get("activation", "none") in (None, "none"):
            user = _sole_user(g, i, outputs)
            if user is not None and g.nodes[user].op == "add":
                b = _other(g.nodes[user], Ref(i, 0))
                if _weight_channels(g, b, n.types[0].shape[1]) and g.nodes[user].types[0] == n.types[0]:
                    fused[user] = Fused("conv2d", i, n.inputs[0], n.inputs[1], b)
                    folded.add(i)
        elif n.op == "layernorm":
            shape = n.types[0].shape[len(n.types[0].shape) - n.attr["ndim"]:]
            end, scale = _affine_step(g, i, "mul", shape, outputs)
            end, shift = _affine_step(g, end, "add", shape, outputs)
            if end != i:
                fused[end] = Fused("layer_norm", i, n.inputs[0], scale, shift)
                folded |= {j for j in (i, g.nodes[end].inputs[0].node, g.nodes[end].inputs[1].node)
                           if j != end and g.nodes[j].op not in ("weight", "input")}
        elif n.op == "softmax" and n.attr["axis"] == n.types[0].rank - 1:
            att = _attention(g, i, outputs) if attention else None
            if att is not None:
                (end, f), inner = att
                fused[end] = f
                folded |= inner
    return fused, folded


def _affine_step(g: Graph, i: int, op: str, shape: tuple, outputs: set) -> tuple[int, Ref | None]:
    """``(user, weight)`` when node ``i``'s one user is ``op`` with a weight of the normalized
    ``shape`` (a layer norm's scale or shift), else ``(i, None)``."""
    user = _sole_user(g, i, outputs)
    if user is not None and g.nodes[user].op == op:
        w = _other(g.nodes[user], Ref(i, 0))
        if g.nodes[w.node].op == "weight" and _trimmed(g.type_of(w).shape) == shape \
                and g.nodes[user].types[0] == g.nodes[i].types[0]:
            return user, w
    return i, None


def _attention(g: Graph, soft: int, outputs: set):
    """``((last node, Fused), folded nodes)`` for attention around the softmax ``soft``, or None."""
    n = g.nodes[soft]
    out = _sole_user(g, soft, outputs)
    if out is None or g.nodes[out].op != "matmul" or g.nodes[out].inputs[0] != Ref(soft, 0):
        return None
    v = g.nodes[out].inputs[1]
    inner, cur, mask, scale = {soft}, n.inputs[0].node, None, 1.0
    if g.nodes[cur].op == "add" and _sole_user(g, cur, outputs) is not None:
        a, b = g.nodes[cur].inputs
        if g.nodes[a.node].op not in ("smul", "matmul"):
            a, b = b, a
        if g.type_of(a) == g.nodes[cur].types[0] and g.type_of(b).rank <= g.type_of(a).rank:
            inner.add(cur)
            mask, cur = b, a.node
    if g.nodes[cur].op == "smul" and _sole_user(g, cur, outputs) is not None:
        w = g.nodes[g.nodes[cur].inputs[1].node]
        if w.op != "weight" or w.name not in g.data or g.data[w.name].size != 1:
            return None
        scale = float(g.data[w.name].reshape(()))
        inner.add(cur)
        cur = g.nodes[cur].inputs[0].node
    scores = g.nodes[cur]
    if scores.op != "matmul" or _sole_user(g, cur, outputs) is None:
        return None
    q, kt = scores.inputs
    rank = g.type_of(q).rank
    if rank < 3 or g.type_of(kt).rank != rank or g.type_of(v).rank != rank:
        return None
    inner.add(cur)
    tnode = g.nodes[kt.node]
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    if tnode.op == "transpose" and tuple(tnode.attr["perm"]) == swap:
        if _sole_user(g, kt.node, outputs) is not None:
            inner.add(kt.node)
        keys, transposed = tnode.inputs[0], False
    else:
        keys, transposed = kt, True
    return (out, Fused("sdpa", cur, q, keys, v, mask, scale, transposed)), inner


def _trimmed(shape: tuple) -> tuple:
    """``shape`` without leading 1s (a broadcast weight's own extent)."""
    k = 0
    while k < len(shape) - 1 and shape[k] == 1:
        k += 1
    return tuple(shape[k:])
