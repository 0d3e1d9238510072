"""How Inductor will compile a graph: fusion groups, each one kernel.

Inductor calls a library kernel (cuBLAS, cuDNN, flash attention) for every matmul and
convolution (``extern`` operators), generates one Triton kernel per group of fused
``pointwise`` operators, fuses pointwise consumers into a reduction's kernel (softmax,
layernorm, pooling), runs views as index arithmetic, and with freezing folds everything
computed from weights alone. :func:`fusion_groups` applies those rules to an IR graph; the
cost model prices each group as one kernel (:meth:`superopt.cost.CostModel.graph_cost` in
``inductor`` mode): an extern kernel at its measured time, a generated kernel as a floor
plus the bytes it reads from and writes to memory over the measured bandwidth
(:func:`fit_kernel_line`, fitted to a profile's pointwise operators).

Two things the library calls absorb (``freezing``: Inductor's freezing passes, which the
backend and the benchmark's baseline turn on): a bias added to a matmul's or convolution's
result and read by nothing else fused is the library call's epilogue (``F.linear`` is one
``addmm``, ``F.conv2d`` takes the bias), and with freezing Inductor merges sibling matmuls on
one input whose weights are constants of equal inner size into one matmul on the concatenated
weights: 2 or 3 without biases, 3 with (its ``matmul_fuse_pattern``s and
``addmm_fuse_pattern_second``); such siblings are one ``extern`` group of several nodes,
priced as the merged matmul. Four or more siblings are left unmerged (which three Inductor
would take is not modelled).

A third is ours, not Inductor's: cuDNN runs a convolution's bias, a residual add and the ReLU
after them in the convolution's epilogue (:mod:`superopt.codegen.cudnn`, which the ``superopt``
backend emits); :func:`conv_relu_chains` finds those chains, and the cost model prices them as
measured (:meth:`superopt.cost.CostModel.conv_relu_fusions`).

What it leaves out: Inductor's cycle check before a fusion (a pointwise group is never
split here), prologue fusion into reductions, and epilogue fusion into matmul templates
(``max-autotune`` only).

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (1, 8, 16, 16)); w = b.weight("w", (8, 8, 3, 3))
>>> c = b.op("conv2d", x, w, padding=(1, 1)); bias = b.weight("bias", (8, 1, 1))
>>> g = b.build([b.op("relu", b.op("add", c, bias))])
>>> [(k.kind, [g.nodes[i].op for i in k.nodes]) for k in fusion_groups(g)]
[('extern', ['conv2d']), ('pointwise', ['add', 'relu'])]
>>> g = b.build([b.op("matmul", x, w) for w in (b.weight(f"w{k}", (16, 4)) for k in range(3))])
>>> [(k.kind, len(k.nodes)) for k in fusion_groups(g)]  # q, k and v: one matmul with freezing
[('extern', 3)]
>>> [(k.kind, len(k.nodes)) for k in fusion_groups(g, freezing=False)]
[('extern', 1), ('extern', 1), ('extern', 1)]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, Ref
from .analytic import DTYPE_BYTES, cost_facts, is_view

__all__ = ["Group", "ConvReluChain", "LinearCall", "conv_relu_chains", "linear_calls", "fusion_groups",
           "group_bytes", "fit_kernel_line", "sole_use", "sole_user", "weight_vector"]


@dataclass
class Group:
    """One kernel: its kind (``extern``, ``pointwise``, ``reduction``, ``opaque``, or
    ``epilogue``: a bias the library call before it adds, no kernel of its own) and nodes
    (several for an ``extern`` group: sibling matmuls Inductor merges into one)."""

    kind: str
    nodes: list = field(default_factory=list)


@dataclass(frozen=True)
class ConvReluChain:
    """``relu(conv2d(x, w) [+ bias] [+ residual])``: the convolution node, the constant
    per-channel bias and the residual value it adds (or None), the ``relu`` node whose value
    the chain gives, and the nodes after the convolution (adds, relu). A ``conv2d_bias`` node's
    bias is its third input; with ``activation='relu'`` its ``relu`` is the node itself."""

    conv: int
    bias: Ref | None
    residual: Ref | None
    relu: int
    nodes: tuple


def conv_relu_chains(graph: Graph, skip: set[int]) -> dict[int, ConvReluChain]:
    """The chains (by their ``relu`` node) where a convolution without activation is followed
    by at most one add of a constant bias of one value per output channel and at most one add
    of a value of the convolution's type, then a ReLU, each step the only use of the value
    before it (which is no graph output): what one cuDNN call computes. A ``conv2d_bias`` brings
    its bias (no other is added), and one with its ReLU is a chain by itself, by its own node.
    ``skip``: the nodes computed from weights alone."""
    outputs = set(graph.outputs)
    found: dict[int, ConvReluChain] = {}
    for c in graph.compute_nodes():
        n = graph.nodes[c]
        if n.op not in ("conv2d", "conv2d_bias") or c in skip or graph.type_of(n.inputs[0]).rank != 4:
            continue
        bias = n.inputs[2] if n.op == "conv2d_bias" else None
        if n.attr.get("activation", "none") not in (None, "none"):
            if bias is not None:  # conv2d_bias with its relu: the whole chain, by the node itself
                found[c] = ConvReluChain(c, bias, None, c, (c,))
            continue
        ty, cur, residual, chain = n.types[0], Ref(c, 0), None, []
        while True:
            users = graph.users.get(cur, ())
            if len(users) != 1 or cur in outputs:
                break
            u = graph.nodes[users[0][0]]
            if u.op == "relu":
                found[users[0][0]] = ConvReluChain(c, bias, residual, users[0][0], tuple(chain + [users[0][0]]))
                break
            if u.op != "add" or u.types[0] != ty or len(u.inputs) != 2 or u.inputs[0] == u.inputs[1]:
                break
            other = u.inputs[1] if u.inputs[0] == cur else u.inputs[0]
            if other.node in skip and bias is None and graph.type_of(other).shape in ((ty.shape[1], 1, 1), (1, ty.shape[1], 1, 1)):
                bias = other
            elif other.node not in skip and residual is None and graph.type_of(other) == ty:
                residual = other
            else:
                break
            chain.append(users[0][0])
            cur = Ref(users[0][0], 0)
    return found


@dataclass(frozen=True)
class LinearCall:
    """A matmul by a weight matrix and the bias adds after it that the generated code runs as
    one ``F.linear`` call (:mod:`superopt.codegen.epilogue`): ``end`` the node at which the call
    is emitted, ``bias`` the bias of a plain one; a merged matmul cut back into pieces (splits
    along the last axis, each piece plus its own bias) has ``pieces``, ``(add node, start,
    size, bias)`` each, the biases then being one vector of the call. ``nodes``: the nodes the
    call computes (the matmul, splits and adds)."""

    matmul: int
    end: int
    bias: Ref | None
    pieces: tuple = ()
    nodes: frozenset = frozenset()


def linear_calls(graph: Graph) -> dict[int, LinearCall]:
    """The :class:`LinearCall` of each matmul (by its node) that has one: a matmul of a rank >= 2
    value by a 2-d weight whose one user adds a weight vector of its output's width (or, merged,
    whose pieces each do), each step the only use of the value before it and no graph output."""
    outputs = set(graph.outputs)
    found: dict[int, LinearCall] = {}
    for i in graph.compute_nodes():
        n = graph.nodes[i]
        if n.op != "matmul" or graph.nodes[n.inputs[1].node].op != "weight" or graph.type_of(n.inputs[1]).rank != 2 \
                or graph.type_of(n.inputs[0]).rank < 2:
            continue
        user = sole_user(graph, i, outputs)
        if user is None:
            continue
        u = graph.nodes[user]
        if u.op == "add":
            b = _other(u, Ref(i, 0))
            if weight_vector(graph, b, n.types[0].shape[-1]) and u.types[0] == n.types[0]:
                found[i] = LinearCall(i, user, b, (), frozenset((i, user)))
        elif u.op == "split":
            cut = _pieces(graph, Ref(i, 0), 0, outputs)
            if cut is not None:
                pieces, splits = cut
                found[i] = LinearCall(i, user, None, tuple(pieces), frozenset({i, *splits, *(p[0] for p in pieces)}))
    return found


def _pieces(graph: Graph, r: Ref, start: int, outputs: set):
    """A merged matmul's output cut back into pieces along its last axis (splits of splits),
    each piece plus its own bias vector: ``([(add node, start, size, bias)], split nodes)``,
    or None when some piece has another use. The biases are then one vector of the merged
    matmul's epilogue: ``(x W)[.., piece] + b_i == (x W + concat(b))[.., piece]``."""
    user = sole_use(graph, r, outputs)
    if user is None:
        return None
    node, ty = graph.nodes[user], graph.type_of(r)
    if node.op == "split" and node.attr["axis"] == ty.rank - 1:
        pieces, splits, off = [], {user}, start
        for k, size in enumerate(node.attr["sizes"]):
            sub = _pieces(graph, Ref(user, k), off, outputs)
            if sub is None:
                return None
            pieces += sub[0]
            splits |= sub[1]
            off += size
        return pieces, splits
    if node.op == "add" and graph.nodes[r.node].op == "split" and node.types[0] == ty:
        b = _other(node, r)
        if b != r and weight_vector(graph, b, ty.shape[-1]):
            return [(user, start, ty.shape[-1], b)], set()
    return None


def sole_use(graph: Graph, r: Ref, outputs: set) -> int | None:
    """The one node that uses value ``r`` (None if several, none, or a graph output)."""
    users = graph.users.get(r, ())
    return users[0][0] if len(users) == 1 and r not in outputs else None


def sole_user(graph: Graph, i: int, outputs: set) -> int | None:
    """The one node that uses node ``i``'s single value."""
    return sole_use(graph, Ref(i, 0), outputs) if len(graph.nodes[i].types) == 1 else None


def weight_vector(graph: Graph, r: Ref, n: int) -> bool:
    """A weight whose shape is ``(..., 1, n)``: one value per output feature."""
    shape = graph.type_of(r).shape
    return graph.nodes[r.node].op == "weight" and len(shape) >= 1 and shape[-1] == n and all(s == 1 for s in shape[:-1])


def _other(n, r: Ref) -> Ref:
    return n.inputs[1] if n.inputs[0] == r else n.inputs[0]


def _fusion(graph: Graph, i: int) -> str:
    n = graph.nodes[i]
    facts = cost_facts(n.op)
    if facts.fusion == "view" or is_view(n.op, n.attr, [graph.type_of(r) for r in n.inputs]):
        return "view"
    if n.op == "transpose" and strided_operand(graph, i):
        return "view"
    return facts.fusion


def strided_operand(graph: Graph, i: int) -> bool:
    """Whether transpose ``i`` runs as no kernel under Inductor: every use is a matmul that
    reads it as a strided operand, directly or through more such transposes. A batched GEMM
    takes one of the last two axes contiguous, the other at any stride, and the batch axes at
    one stride (torch.matmul folds them with a reshape, which copies where they do not fold).
    Measured, ViT-B/16 b1 under RO + freezing: the q, k and v head transposes ran no kernel,
    the one after attention (into a reshape) one clone."""
    src = graph.type_of(graph.nodes[i].inputs[0]).shape
    strides, acc = [0] * len(src), 1
    for a in range(len(src) - 1, -1, -1):
        strides[a], acc = acc, acc * src[a]
    outputs = set(graph.outputs)
    users = graph.users

    def ok(ref: Ref, perm: list) -> bool:  # perm[j]: the source axis that output axis j is
        if ref in outputs or not users.get(ref):
            return False
        for u, _ in users[ref]:
            un = graph.nodes[u]
            if un.op == "transpose":
                if not ok(Ref(u, 0), [perm[p] for p in un.attr["perm"]]):
                    return False
            elif un.op != "matmul" or not _gemm_strides([src[a] for a in perm], [strides[a] for a in perm]):
                return False
        return True

    return len(src) >= 2 and ok(Ref(i, 0), list(graph.nodes[i].attr["perm"]))


def _gemm_strides(shape: list, strides: list) -> bool:
    """One of the last two axes at stride 1 and the batch axes (size 1 aside) folding into one."""
    if 1 not in (strides[-1], strides[-2]) and not (shape[-1] == 1 or shape[-2] == 1):
        return False
    batch = [(n, st) for n, st in zip(shape[:-2], strides[:-2]) if n != 1]
    return all(a_st == b_n * b_st for (_, a_st), (b_n, b_st) in zip(batch, batch[1:]))


def fusion_groups(graph: Graph, skip: set[int] | None = None, freezing: bool = True) -> list[Group]:
    """The kernels Inductor makes of the nodes that run (``skip``: folded nodes; default: the
    nodes computed from weights alone; ``freezing``: Inductor's freezing passes run)."""
    from .model import constant_nodes
    skip = constant_nodes(graph) if skip is None else skip
    groups = _groups(graph, skip)
    biased = set()  # library calls whose bias is their epilogue
    for k in groups:
        call = _bias_of(graph, k.nodes[0], skip) if k.kind == "pointwise" and len(k.nodes) == 1 else None
        if call is not None:
            k.kind = "epilogue"
            biased.add(call)
    return _merge_siblings(graph, groups, skip, biased) if freezing else groups


def _groups(graph: Graph, skip: set[int]) -> list[Group]:
    live = graph.live()
    group_of: dict[int, int] = {}  # node -> group index (views: their input's group)
    parent: list[int] = []  # union-find over groups
    groups: list[Group] = []

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def new(kind, i):
        parent.append(len(groups))
        groups.append(Group(kind, [i]))
        return len(groups) - 1

    for i in graph.compute_nodes():
        if i in skip or i not in live:
            continue
        kind = _fusion(graph, i)
        srcs = [find(group_of[r.node]) for r in graph.nodes[i].inputs if r.node in group_of]
        if kind == "view":
            if srcs:
                group_of[i] = srcs[0]
            continue
        if kind != "pointwise":
            group_of[i] = new(kind, i)
            continue
        fusable = [k for k in dict.fromkeys(srcs) if groups[k].kind in ("pointwise", "reduction")]
        reductions = [k for k in fusable if groups[k].kind == "reduction"]
        target = reductions[0] if reductions else (fusable[0] if fusable else None)
        if target is None:
            group_of[i] = new("pointwise", i)
            continue
        for k in fusable:
            if k != target and groups[k].kind == "pointwise":
                parent[k] = target
                groups[target].nodes += groups[k].nodes
                groups[k].nodes = []
        groups[target].nodes.append(i)
        group_of[i] = target
    return [g for k, g in enumerate(groups) if parent[k] == k and g.nodes]


_LIBRARY_OPS = ("matmul", "conv2d")


def _bias_of(graph: Graph, i: int, skip: set[int]) -> int | None:
    """The library call (matmul, conv2d) whose result node ``i`` adds a constant bias to, as the
    call's epilogue: ``i`` is an add of the call's sole use and a constant, of the call's type."""
    n = graph.nodes[i]
    if n.op != "add" or len(n.inputs) != 2:
        return None
    for a, b in (n.inputs, n.inputs[::-1]):
        src = graph.nodes[a.node]
        if (src.op in _LIBRARY_OPS and a.node not in skip and b.node in skip and len(graph.users.get(a, ())) == 1
                and graph.type_of(a) == n.types[0] and graph.type_of(b).numel == n.types[0].shape[-1 if src.op == "matmul" else 1]):
            return a.node
    return None


def _merge_siblings(graph: Graph, groups: list[Group], skip: set[int], biased: set[int]) -> list[Group]:
    """Inductor's freezing merge of sibling matmuls (see the module docstring): the groups of
    each merged set become one ``extern`` group holding all of them (``biased``: matmuls whose
    bias is their epilogue, which Inductor merges only three at a time)."""
    sets: dict[tuple, list[Group]] = {}
    for g in groups:
        n = graph.nodes[g.nodes[0]]
        if g.kind != "extern" or n.op != "matmul" or len(g.nodes) != 1:
            continue
        x, w = n.inputs
        if x.node in skip or w.node not in skip or graph.type_of(w).rank != 2:
            continue
        key = (_through_views(graph, x), graph.type_of(w).shape[0], graph.type_of(w).dtype)
        sets.setdefault(key, []).append(g)
    merged: dict[int, Group] = {}  # id of a member group -> the merged group
    for members in sets.values():
        with_bias = sum(g.nodes[0] in biased for g in members)
        if len(members) == 2 and with_bias == 0 or len(members) == 3 and with_bias in (0, 3):
            one = Group("extern", [i for g in members for i in g.nodes])
            merged.update((id(g), one) for g in members)
    out, seen = [], set()
    for g in groups:
        g = merged.get(id(g), g)
        if id(g) not in seen:
            seen.add(id(g))
            out.append(g)
    return out


def group_bytes(graph: Graph, group: Group, itemsize: int | None = None) -> float:
    """Bytes a generated kernel moves: each value it reads from outside the group once, each
    value it produces that is used outside the group (or is a graph output) once. Values
    are followed through views. ``itemsize`` overrides the tensors' own (bf16: 2)."""
    inside = set(group.nodes)
    outputs = set(graph.outputs)
    read: set = set()
    total = 0.0
    for i in group.nodes:
        for r in graph.nodes[i].inputs:
            src = _through_views(graph, r)
            if src.node not in inside and src not in read:
                read.add(src)
                total += _bytes(graph.type_of(src), itemsize)
        for k, t in enumerate(graph.nodes[i].types):
            if _escapes(graph, Ref(i, k), inside, outputs):
                total += _bytes(t, itemsize)
    return total


def _is_view_node(graph: Graph, i: int) -> bool:
    n = graph.nodes[i]
    return n.opdef.kind == "compute" and cost_facts(n.op).fusion == "view"


def _through_views(graph: Graph, r: Ref) -> Ref:
    while _is_view_node(graph, r.node) and len(graph.nodes[r.node].inputs) == 1:
        r = graph.nodes[r.node].inputs[0]
    return r


def _escapes(graph: Graph, ref: Ref, inside: set, outputs: set) -> bool:
    """A value (or a view of it) is a graph output or is read by a node outside ``inside``."""
    todo = [ref]
    while todo:
        r = todo.pop()
        if r in outputs:
            return True
        for u, _ in graph.users.get(r, ()):
            if _is_view_node(graph, u):
                todo += [Ref(u, j) for j in range(len(graph.nodes[u].types))]
            elif u not in inside:
                return True
    return False


def _bytes(t, itemsize: int | None) -> float:
    return float(t.numel * (itemsize or DTYPE_BYTES.get(t.dtype, 4)))


def fit_kernel_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``time_us = floor + bytes / bandwidth`` over ``(bytes, time_us)`` points:
    (floor microseconds, bandwidth bytes/s), or None with fewer than 3 points.

    >>> fl, bw = fit_kernel_line([(0, 2.0), (1e6, 3.0), (2e6, 4.0)])
    >>> round(fl, 3), round(bw / 1e12, 3)
    (2.0, 1.0)
    """
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    if sxx <= 0:
        return None
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx
    slope = max(slope, 1e-9)  # us per byte; never a negative bandwidth
    floor = max(my - slope * mx, 0.5)
    return floor, 1e6 / slope
