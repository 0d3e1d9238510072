"""Building a rule's right side at the shapes of a match.

Rules are generated at small concrete shapes; a match binds their variables to values of
other sizes. The right side is rebuilt node by node at the match's shapes, re-inferring every
type. Attributes that carry sizes are re-derived through a *dimension map*, which pairs each
size of the rule with the size it stands for in the match (axis by axis over every matched
value, and over the sizes held by left-side attributes):

* ``split`` sizes: from the matched left outputs a piece stands for, else through the map,
  at most one piece from the rest of the axis;
* ``reshape`` targets: through the map, at most one entry from the element count;
* sizes of constants (``identity_matrix``, ``ones``, ``identity_conv``, ``pool_kernel``) and
  ``enlarge`` kernels: through the map.

A rule size may stand for several sizes of the match (a rule at 4x4 kernels matched by a
64 -> 256 convolution): every choice is tried, and the match is rewritten only when exactly
one choice gives a right side that is well-shaped and whose outputs' types equal the left's
(1 always stands for 1). Parameters (eps; a convolution's stride, padding, groups) bind exactly:
each distinct value of
the rule is a parameter, bound to the match's value, and a parameter that meets two different
values is no match; the right side takes the bound values. Results are cached by the types and
free attributes of the match. Nothing here makes a rewrite sound at the match's sizes: that is
the instance proof's job (:mod:`superopt.search.instance_proofs`), which sees the instance
that :func:`instance_rule` builds.
"""

from __future__ import annotations

import itertools
from typing import Iterator, NamedTuple

from ..errors import SuperoptError
from ..ir.graph import Graph, GraphBuilder, Ref, make_node
from ..ir.rule import Rule
from ..ir.ops import get_op
from ..ir.types import TensorType
from .attrs import bind_params, free_attrs, param_attrs, shift, shifted_attrs
from .compile import Pattern
from .match import Match

__all__ = ["TNode", "Template", "Instantiator", "dim_map", "rebuild", "instance_of", "instance_rule", "template_graph", "MAX_CHOICES"]

#: at most this many size choices are tried per right-side node
MAX_CHOICES = 64


class TNode(NamedTuple):
    """A right-side node at the match's shapes; inputs ``("v", var)`` or ``("n", tnode, output)``.

    Also what the rewriter needs per node, computed once per template: input types, cost when
    it runs, the hash of its operator and attributes, and flags.
    """

    op: str
    attrs: tuple
    inputs: tuple
    types: tuple
    in_types: tuple = ()
    cost: float = 0.0
    base: int = 0
    commutative: bool = False
    constant: bool = False
    compute: bool = True


class Template(NamedTuple):
    nodes: tuple[TNode, ...]
    outputs: tuple


def dim_map(pairs) -> dict[int, set]:
    """Rule size -> the set of sizes it stands for, from ``(rule shape, match shape)`` pairs
    (aligned from the last axis: a match's extra leading axes stand for no rule size)."""
    out: dict[int, set] = {}
    for a, b in pairs:
        for x, y in zip(reversed(a), reversed(b)):
            out.setdefault(int(x), set()).add(int(y))
    return out


def _candidates(dm, a: int) -> list[int]:
    """The sizes rule size ``a`` may stand for (1 always stands for 1)."""
    return [1] if a == 1 else sorted(dm.get(a, ()))


def _fill_one(sizes: list, total: int) -> list | None:
    """Infer at most one unknown (None) entry so that the entries add up to total."""
    unknown = [k for k, v in enumerate(sizes) if v is None]
    if len(unknown) > 1:
        return None
    if unknown:
        rest = total - sum(v for v in sizes if v is not None)
        if rest <= 0:
            return None
        sizes[unknown[0]] = rest
    return sizes if sum(sizes) == total else None


class Instantiator:
    """Right sides at match shapes, with a cache (see the module docstring); with a cost model,
    templates carry each node's cost."""

    def __init__(self, cost=None):
        self.cost = cost
        self._cache: dict = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(pat: Pattern, state, match: Match) -> tuple:
        """What the right side depends on: the variables' types, the matched nodes' types and
        their free attributes (the fixed ones equal the pattern's)."""
        var_t = tuple(state.type_of(r) for r in match.binds)
        node_sizes = tuple((state.nodes[m].types, _free_values(state.nodes[m])) for m in match.nodes)
        return (pat.index, var_t, node_sizes)

    def template(self, pat: Pattern, state, match: Match) -> Template | None:
        key = self.key(pat, state, match)
        if key in self._cache:
            self.hits += 1
            return self._cache[key]
        self.misses += 1
        _, var_t, node_sizes = key
        out_t = [state.nodes[match.nodes[j]].types[k] for j, k in pat.outputs]
        res = _build(pat, var_t, node_sizes, out_t)
        self._cache[key] = res if res is None else _annotate(res, var_t, self.cost)
        return self._cache[key]


def _annotate(tpl: Template, var_t, cost) -> Template:
    """Add input types, costs, hashes and flags to every node of a template."""
    nodes = []
    for t in tpl.nodes:
        in_t = tuple(var_t[s[1]] if s[0] == "v" else nodes[s[1]].types[s[2]] for s in t.inputs)
        opdef = get_op(t.op)
        price = cost.node_time(t.op, t.attrs, in_t, t.types) if cost is not None else 0.0
        nodes.append(t._replace(in_types=in_t, cost=price, base=hash((t.op, t.attrs)), commutative=opdef.commutative,
                                constant=opdef.kind == "constant", compute=opdef.kind == "compute"))
    return Template(tuple(nodes), tpl.outputs)


def _free_values(node) -> tuple:
    names = free_attrs(node.op)
    return tuple(node.attr[k] for k in names) if names else ()


def _pairs(pat: Pattern, var_t, node_sizes):
    """(rule, match) pairs of shapes and size attributes, and of parameters."""
    pairs = [(a.shape, b.shape) for a, b in zip(pat.var_types, var_t)]
    reals = []
    compute = [n for n in pat.rule.lhs.nodes if n.name is None]
    for n, pn, (types, values) in zip(compute, pat.pnodes, node_sizes):
        pairs += [(a.shape, b.shape) for a, b in zip(pn.types, types)]
        for name, b in zip(free_attrs(n.op), values):
            a = n.attr[name]
            if name in param_attrs(n.op):
                reals.append(((name, a), b))
            else:
                pairs.append(((a,), (b,)) if isinstance(a, int) else (a, b))
    return pairs, reals


class _Ctx(NamedTuple):
    rhs: object
    var_index: dict
    var_t: tuple
    dm: dict
    reals: dict
    out_of: dict
    out_t: list | None


def _build(pat: Pattern, var_t, node_sizes, out_t) -> Template | None:
    """The right side at the match's shapes: the one well-typed choice of sizes, else None
    (also when one parameter of the rule meets two values in the match)."""
    pairs, reals = _pairs(pat, var_t, node_sizes)
    params = bind_params(reals)
    if params is None:
        return None
    return rebuild(pat.rule.rhs, pat.var_names, var_t, dim_map(pairs), params, list(out_t))


def rebuild(side, var_names, var_t, dm, reals=None, out_t=None) -> Template | None:
    """One side of a rule with its variables at types ``var_t`` and its sizes mapped through
    ``dm``: the one well-typed choice (with outputs of types ``out_t`` when given), else None."""
    out_of = {}  # (node, output) -> the type that output must have
    for k, r in enumerate(side.outputs):
        if out_t is not None:
            out_of.setdefault((r.node, r.index), out_t[k])
    ctx = _Ctx(side, {name: v for v, name in enumerate(var_names)}, tuple(var_t), dm, reals or {}, out_of,
               None if out_t is None else list(out_t))
    found: dict[Template, None] = {}
    _grow(ctx, 0, [], {}, found)
    return next(iter(found)) if len(found) == 1 else None


def _grow(ctx: _Ctx, i: int, nodes: list, where: dict, found: dict) -> None:
    """Depth-first over the right side's nodes and the size choices of each; collects templates."""
    if len(found) > 1:
        return
    if i == len(ctx.rhs.nodes):
        outs = tuple(_spec(where, r) for r in ctx.rhs.outputs)
        got = [ctx.var_t[s[1]] if s[0] == "v" else nodes[s[1]].types[s[2]] for s in outs]
        if ctx.out_t is None or got == ctx.out_t:
            found[Template(tuple(nodes), outs)] = None
        return
    n = ctx.rhs.nodes[i]
    if n.name is not None:
        where[i] = ("v", ctx.var_index[n.name])
        _grow(ctx, i + 1, nodes, where, found)
        return
    ins = tuple(_spec(where, r) for r in n.inputs)
    in_t = [ctx.var_t[s[1]] if s[0] == "v" else nodes[s[1]].types[s[2]] for s in ins]
    lift = in_t[0].rank - ctx.rhs.type_of(n.inputs[0]).rank if ins else 0
    for attrs in _attr_options(n, i, ctx, in_t, lift):
        try:
            node = make_node(n.op, [Ref(0, 0)] * len(ins), in_t, attrs)
        except SuperoptError:
            continue
        where[i] = ("n", len(nodes))
        nodes.append(TNode(n.op, node.attrs, ins, node.types))
        _grow(ctx, i + 1, nodes, where, found)
        nodes.pop()


def _spec(where: dict, r: Ref) -> tuple:
    s = where[r.node]
    return s if s[0] == "v" else ("n", s[1], r.index)


def _attr_options(n, i: int, ctx: _Ctx, in_t: list[TensorType], lift: int) -> Iterator[dict]:
    """The node's attributes with each size-carrying one re-derived, every consistent way, and
    its axes and permutations shifted by ``lift`` extra leading axes."""
    names = free_attrs(n.op)
    dm = ctx.dm
    base = dict(n.attrs)
    if lift:
        if lift < 0 or not n.opdef.lifts:
            return
        base.update((k, shift(base[k], n.opdef.attr_index[k].carries, lift)) for k in shifted_attrs(n.op))
    choices = []
    for name in names:
        val = n.attr[name]
        if name in param_attrs(n.op):
            opts = [ctx.reals.get((name, val), val)]
        elif n.op == "split":
            opts = _split_options(base["axis"], n.attr["sizes"], i, dm, in_t[0], ctx.out_of)
        elif n.op == "reshape":
            opts = _reshape_options(val, dm, in_t[0].numel)
        elif isinstance(val, tuple):
            opts = [tuple(c) for c in itertools.islice(itertools.product(*(_candidates(dm, a) for a in val)), MAX_CHOICES)]
        else:
            opts = _candidates(dm, val)
        choices.append(opts)
    for combo in itertools.islice(itertools.product(*choices), MAX_CHOICES):
        attrs = dict(base)
        attrs.update(zip(names, combo))
        yield attrs


def _split_options(axis: int, sizes, i, dm, x: TensorType, out_of) -> list[tuple]:
    axis = axis % x.rank
    per = []
    for k, s in enumerate(sizes):
        t = out_of.get((i, k))
        per.append([t.shape[axis]] if t is not None and t.rank == x.rank else _candidates(dm, s) or [None])
    out = []
    for combo in itertools.islice(itertools.product(*per), MAX_CHOICES):
        sizes = _fill_one(list(combo), x.shape[axis])
        if sizes:
            out.append(tuple(sizes))
    return out


def _reshape_options(shape, dm, numel: int) -> list[tuple]:
    per = [_candidates(dm, a) or [None] for a in shape]
    out = []
    for combo in itertools.islice(itertools.product(*per), MAX_CHOICES):
        new = list(combo)
        unknown = [k for k, v in enumerate(new) if v is None]
        known = 1
        for v in new:
            known *= 1 if v is None else v
        if len(unknown) > 1 or known == 0:
            continue
        if unknown:
            if numel % known:
                continue
            new[unknown[0]] = numel // known
        elif known != numel:
            continue
        out.append(tuple(new))
    return out


def _side(pat: Pattern, var_t, nodes, outs) -> Graph:
    """A graph over the rule's variables at types ``var_t`` with ``nodes`` as ``(op, attrs,
    inputs)`` (inputs as in a pattern: ``("v", var)`` or ``("n", node, output)``)."""
    b = GraphBuilder()
    refs = [(b.weight if w else b.input)(name, t.shape, dtype=t.dtype)
            for name, t, w in zip(pat.var_names, var_t, pat.var_weight)]
    made: list[tuple] = []
    for op, attrs, ins in nodes:
        made.append(b.add(op, [refs[s[1]] if s[0] == "v" else made[s[1]][s[2]] for s in ins], dict(attrs)))
    return b.build([refs[s[1]] if s[0] == "v" else made[s[1]][s[2]] for s in outs])


def template_graph(tpl: Template, pat: Pattern, var_t) -> Graph:
    """A template as a graph over the rule's variables at types ``var_t``."""
    return _side(pat, var_t, [(t.op, t.attrs, t.inputs) for t in tpl.nodes], tpl.outputs)


def instance_of(pat: Pattern, var_t, node_attrs, tpl: Template) -> Rule:
    """The rule as one match applies it: the pattern's nodes with the matched nodes' real
    attributes ``node_attrs`` (one per pattern node) over the rule's variables at types
    ``var_t``, rewritten to ``tpl``. This is what must be proven; both searches build it here."""
    lhs = _side(pat, var_t, [(pn.op, attrs, pn.inputs) for pn, attrs in zip(pat.pnodes, node_attrs)],
                [("n", j, k) for j, k in pat.outputs])  # commutative operators: the pattern's order
    return Rule(lhs, template_graph(tpl, pat, var_t))


def instance_rule(pat: Pattern, state, match: Match, tpl: Template) -> Rule:
    """:func:`instance_of` for a match in a search state."""
    return instance_of(pat, [state.type_of(r) for r in match.binds],
                       [state.nodes[m].attrs for m in match.nodes], tpl)