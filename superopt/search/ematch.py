"""Finding a rule's left side in an e-graph: e-matching, with multi-output rules as multi-patterns.

A rule's left side (a :class:`~superopt.search.pattern.Pattern`) has one or more *tops*: the
operator nodes making its outputs that no other output depends on. A top is matched downwards
from every e-node with its operator: each pattern node binds one e-node (an operator
application), each variable one e-class, consistently; a weight variable binds only classes
known at compile time, and attributes are compared by :func:`attrs_match` alone. A rule with
several tops (two matmuls merged into one) is a multi-pattern: each top is matched on its own
and the matches are joined on the variables they share (Tensat). When two tops have the same
shape (same operators, types and use of the shared variables) the pair is taken in one order
only (the first top's class before the second's), so a merge is not derived twice.

>>> from superopt.ir import GraphBuilder, Rule
>>> from superopt.search.pattern import RuleSet
>>> from superopt.search.egraph import EGraph
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (2, 4))
...     return b.build([f(b, x)])
>>> rs = RuleSet([Rule(side(lambda b, x: b.op("relu", b.op("relu", x))), side(lambda b, x: b.op("relu", x)))])
>>> b = GraphBuilder(); x = b.input("img", (8, 8))
>>> eg = EGraph(); _ = eg.add_graph(b.build([b.op("relu", b.op("relu", b.op("relu", x)))]))
>>> len(match_pattern(eg, rs.patterns[0], index_by_op(eg)))
2
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator, NamedTuple

from .egraph import EGraph, ENode
from .match import compatible
from .pattern import PNode, Pattern, free_attrs, shifted_attrs

__all__ = ["EMatch", "attrs_match", "index_by_op", "match_pattern", "tops_of", "is_merge", "height"]


class EMatch(NamedTuple):
    """``apps[j]``: the e-node pattern node j matched; ``binds[v]``: the class of variable v."""

    pattern: int
    apps: tuple[ENode, ...]
    binds: tuple[int, ...]


@lru_cache(maxsize=65536)
def _fixed(op: str, attrs: tuple) -> tuple:
    """The attributes a pattern node keeps in ``PNode.fixed``: all but sizes and parameters
    (which follow the match) and axes/permutations (kept in ``PNode.shifted``), as
    :func:`superopt.search.pattern.compile_pattern` splits them."""
    skip = set(free_attrs(op)) | set(shifted_attrs(op))
    return tuple(kv for kv in attrs if kv[0] not in skip) if skip else attrs


def attrs_match(pn: PNode, e: ENode) -> bool:
    """The one place attributes are matched: every attribute the pattern fixes equals the
    e-node's, and so does every axis and permutation (saturation adds no leading axes). Sizes
    and real values follow the match; the right side binds them exactly and the proof gate
    checks the instance."""
    if _fixed(e.op, e.attrs) != pn.fixed:
        return False
    if not pn.shifted:
        return True
    attr = dict(e.attrs)
    return all(attr.get(k) == v for k, v, _ in pn.shifted)


def _shallow_ok(pn: PNode, e: ENode) -> bool:
    """Operator, arity, attributes, and each output's dtype and rank (:func:`compatible` with
    no lifted axes, inlined: this runs for every candidate e-node)."""
    if e.op != pn.op or len(e.kids) != len(pn.inputs) or len(e.types) != len(pn.types) or not attrs_match(pn, e):
        return False
    for a, b in zip(pn.types, e.types):
        if a.dtype != b.dtype or len(a.shape) != len(b.shape):
            return False
    return True


def index_by_op(eg: EGraph, only: set[int] | None = None) -> dict[tuple, list[tuple[int, ENode]]]:
    """Every e-node by operator and the attributes a pattern fixes, with its class (of the
    classes in ``only`` when given)."""
    out: dict[tuple, list] = {}
    for c, nodes in eg.nodes.items():
        if only is not None and c not in only:
            continue
        for e in nodes:
            out.setdefault((e.op, _fixed(e.op, e.attrs)), []).append((c, e))
    return out


class _Ctx:
    __slots__ = ("eg", "pat", "apps", "binds")

    def __init__(self, eg: EGraph, pat: Pattern):
        self.eg, self.pat = eg, pat
        self.apps: list = [None] * len(pat.pnodes)
        self.binds: list = [None] * len(pat.var_names)


def _solve(ctx: _Ctx, todo: tuple) -> Iterator[None]:
    """Satisfy obligations ``(pattern node, class, output)``: that class holds that output."""
    if not todo:
        yield None
        return
    (j, c, k), rest = todo[0], todo[1:]
    bound = ctx.apps[j]
    if bound is not None:
        if ctx.eg.lookup(bound._replace(k=k)) == c:
            yield from _solve(ctx, rest)
        return
    op = ctx.pat.pnodes[j].op
    for e in ctx.eg.nodes[c]:
        if e.k == k and e.op == op:
            yield from _try(ctx, j, e, rest)


def _try(ctx: _Ctx, j: int, e: ENode, rest: tuple) -> Iterator[None]:
    """Bind pattern node j to e-node ``e`` (both argument orders when commutative)."""
    pn, eg, binds, pat = ctx.pat.pnodes[j], ctx.eg, ctx.binds, ctx.pat
    if not _shallow_ok(pn, e):
        return
    orders = [(0, 1), (1, 0)] if pn.commutative and len(pn.inputs) == 2 and e.kids[0] != e.kids[1] else [None]
    for order in orders:
        log, more, ok = [], [], True
        for pos, spec in enumerate(pn.inputs):
            kid = eg.find(e.kids[pos if order is None else order[pos]])
            if spec[0] == "n":
                more.append((spec[1], kid, spec[2]))
                continue
            v = spec[1]
            if binds[v] is None:
                if not compatible(pat.var_types[v], eg.types[kid]) or (pat.var_weight[v] and not eg.const[kid]):
                    ok = False
                    break
                binds[v] = kid
                log.append(v)
            elif binds[v] != kid:
                ok = False
                break
        if ok:
            ctx.apps[j] = e
            yield from _solve(ctx, tuple(more) + rest)
            ctx.apps[j] = None
        for v in log:
            binds[v] = None


_ANCESTORS: dict = {}
_PLANS: dict = {}


def _ancestors(pat: Pattern, j: int) -> frozenset:
    """Pattern nodes that pattern node j depends on."""
    key = (pat.rule_id, j)
    if key not in _ANCESTORS:
        _ANCESTORS[key] = _walk_up(pat, j)
    return _ANCESTORS[key]


def _walk_up(pat: Pattern, j: int) -> frozenset:
    out: set = set()
    stack = [j]
    while stack:
        for spec in pat.pnodes[stack.pop()].inputs:
            if spec[0] == "n" and spec[1] not in out:
                out.add(spec[1])
                stack.append(spec[1])
    return frozenset(out)


def tops_of(pat: Pattern) -> tuple[int, ...]:
    """The output nodes no other output node depends on (one, except for multi-patterns)."""
    outs = sorted({j for j, _ in pat.outputs})
    return tuple(j for j in outs if not any(j in _ancestors(pat, o) for o in outs if o != j))


def height(pat: Pattern) -> int:
    """Edges on the longest path from a top down to a pattern node."""
    memo: dict[int, int] = {}
    for j, pn in enumerate(pat.pnodes):
        memo[j] = max((memo[s[1]] + 1 for s in pn.inputs if s[0] == "n"), default=0)
    return max(memo.values())


def is_merge(pat: Pattern) -> bool:
    """Several tops that share no operator (joined through variables only): such a rule merges
    unrelated operators, the source of blow-ups and cycles, so it runs in bounded rounds."""
    tops = tops_of(pat)
    if len(tops) < 2:
        return False
    seen: set = set()
    for t in tops:
        mine = _ancestors(pat, t) | {t}
        if seen & mine:
            return False
        seen |= mine
    return True


def _shape(pat: Pattern, j: int, shared: frozenset, private: dict) -> tuple:
    """Pattern node j's subtree with private variables named by first use (for symmetry)."""
    pn = pat.pnodes[j]
    args = []
    for spec in pn.inputs:
        if spec[0] == "n":
            args.append((_shape(pat, spec[1], shared, private), spec[2]))
        elif spec[1] in shared:
            args.append(("s", spec[1]))
        else:
            args.append(("p", private.setdefault(spec[1], len(private)), pat.var_types[spec[1]],
                         pat.var_weight[spec[1]]))
    return pn.op, pn.fixed, pn.types, tuple(args)


def _vars_of(pat: Pattern, j: int) -> frozenset:
    return frozenset(s[1] for k in _ancestors(pat, j) | {j} for s in pat.pnodes[k].inputs if s[0] == "v")


def _plan(pat: Pattern) -> tuple:
    """Tops, and for each later top whether it mirrors the first (then matched in order)."""
    if pat.rule_id not in _PLANS:
        _PLANS[pat.rule_id] = _make_plan(pat)
    return _PLANS[pat.rule_id]


def _make_plan(pat: Pattern) -> tuple:
    tops = tops_of(pat)
    if len(tops) == 1:
        return tops, (False,)
    seen = [_vars_of(pat, t) for t in tops]
    shared = frozenset(v for v in seen[0] if all(v in s for s in seen[1:]))
    shapes = [_shape(pat, t, shared, {}) for t in tops]
    return tops, tuple(i > 0 and shapes[i] == shapes[0] for i in range(len(tops)))


def _top_matches(eg: EGraph, pat: Pattern, top: int, index: dict, limit: int) -> list[tuple]:
    """Partial matches of one top: (its class, apps, binds)."""
    ctx, out = _Ctx(eg, pat), []
    pn = pat.pnodes[top]
    for c, e in index.get((pn.op, pn.fixed), ()):
        for _ in _try(ctx, top, e, ()):
            out.append((eg.find(c), tuple(ctx.apps), tuple(ctx.binds)))
            if len(out) >= limit:
                return out
    return out


def _join(a: tuple, b: tuple) -> tuple | None:
    """Two partial matches agreeing wherever both bind (apps compared as applications, the
    output aside), merged."""
    apps, binds = list(a[1]), list(a[2])
    for j, e in enumerate(b[1]):
        if e is None:
            continue
        if apps[j] is None:
            apps[j] = e
        elif apps[j].app != e.app:
            return None
    for v, c in enumerate(b[2]):
        if c is None:
            continue
        if binds[v] is None:
            binds[v] = c
        elif binds[v] != c:
            return None
    return a[0], tuple(apps), tuple(binds)


def _key(m: tuple, nodes: list, shared: list) -> tuple:
    return tuple(m[1][j].app for j in nodes) + tuple(m[2][v] for v in shared)


def match_pattern(eg: EGraph, pat: Pattern, index: dict, limit: int = 10_000) -> list[EMatch]:
    """Every match of ``pat`` in ``eg`` (at most ``limit``); ``index`` from :func:`index_by_op`."""
    tops, mirrored = _plan(pat)
    found = _top_matches(eg, pat, tops[0], index, limit)
    for t, mirror in zip(tops[1:], mirrored[1:]):
        others = _top_matches(eg, pat, t, index, limit)
        if not found or not others:
            return []
        shared = [v for v in range(len(pat.var_names)) if found[0][2][v] is not None and others[0][2][v] is not None]
        nodes = [j for j in range(len(pat.pnodes)) if found[0][1][j] is not None and others[0][1][j] is not None]
        by_key: dict = {}
        for o in others:
            by_key.setdefault(_key(o, nodes, shared), []).append(o)
        joined = []
        for f in found:
            for o in by_key.get(_key(f, nodes, shared), ()):
                if mirror and not f[0] < o[0]:
                    continue
                m = _join(f, o)
                if m is not None:
                    joined.append(m)
            if len(joined) >= limit:
                break
        found = joined
    return list(dict.fromkeys(EMatch(pat.index, m[1], m[2]) for m in found
                              if None not in m[1] and None not in m[2]))
