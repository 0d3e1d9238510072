"""Finding a pattern in a state: operators, attributes and variables bound consistently.

A match maps every pattern node to a distinct graph node with the same operator and equal
fixed attributes, and every variable to one graph value of the same rank and dtype (any
sizes; a rank-generic pattern also takes values with extra leading axes, its axes and
permutations shifted), where a weight variable binds only compile-time values. Commutative operators are tried in both argument orders. Matching
is structural only; whether the match can be rewritten (an intermediate value used outside
it, a cycle, shapes of the right side) is decided when rewriting, since that changes as the
graph around the match changes.

Matching grows from an *anchor*, a pattern node mapped to a graph node, along the pattern's
edges: inputs are followed directly, users through the graph's user lists. The first state of
a search is matched with one anchor per pattern (its rarest operator); later states only at
the nodes a rewrite created or changed.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..ir.graph import Ref
from ..ir.types import TensorType
from .attrs import attrs_match
from .compile import Pattern, RuleSet

__all__ = ["Match", "match_at", "match_all", "match_near", "compatible"]


class Match(NamedTuple):
    """``nodes[j]`` is the graph node of pattern node j; ``binds[v]`` the value of variable v."""

    pattern: int
    nodes: tuple[int, ...]
    binds: tuple[Ref, ...]


def compatible(rule_t: TensorType, model_t: TensorType, max_lift: int = 0) -> bool:
    """Same dtype, and the same rank up to ``max_lift`` extra leading axes (sizes may differ:
    the instance proof decides whether the rule holds at the match's sizes and ranks)."""
    return rule_t.dtype == model_t.dtype and 0 <= len(model_t.shape) - len(rule_t.shape) <= max_lift


class _Ctx:
    __slots__ = ("state", "pat", "nodes", "binds", "used", "pending")

    def __init__(self, state, pat):
        self.state, self.pat = state, pat
        self.nodes = [None] * len(pat.pnodes)
        self.binds = [None] * len(pat.var_names)
        self.used: set[int] = set()
        self.pending: dict[int, int] = {}  # pattern node -> graph node an edge forces


def _shallow_ok(pn, n, max_lift: int) -> bool:
    """Operator, arity, output count, fixed attributes and output ranks agree (up to extra
    leading axes, under which axes and permutations shift)."""
    if n.op != pn.op or len(n.inputs) != len(pn.inputs) or len(n.types) != len(pn.types):
        return False
    if not max_lift:
        return attrs_match(pn, n.op, n.attrs) and all(
            a.dtype == b.dtype and len(a.shape) == len(b.shape) for a, b in zip(pn.types, n.types))
    lift = len(n.types[0].shape) - len(pn.types[0].shape)
    return attrs_match(pn, n.op, n.attrs, lift) and all(
        compatible(a, b, max_lift) and b.rank - a.rank == lift for a, b in zip(pn.types, n.types))


def _node_ok(ctx: _Ctx, j: int, m: int) -> bool:
    return m not in ctx.used and _shallow_ok(ctx.pat.pnodes[j], ctx.state.nodes[m], ctx.pat.max_lift)


def _bind_inputs(ctx: _Ctx, j: int, m: int, order) -> list | None:
    """Bind pattern node j's inputs to graph node m's (in ``order``); returns an undo log."""
    pn, n, st = ctx.pat.pnodes[j], ctx.state.nodes[m], ctx.state
    log = []
    for pos, spec in enumerate(pn.inputs):
        r = n.inputs[order[pos]]
        if spec[0] == "v":
            v = spec[1]
            if ctx.binds[v] is None:
                pat = ctx.pat
                if not compatible(pat.var_types[v], st.type_of(r), pat.max_lift) or \
                        (pat.var_weight[v] and not st.const[r.node]):
                    return _undo(ctx, log)
                ctx.binds[v] = r
                log.append(("v", v))
            elif ctx.binds[v] != r:
                return _undo(ctx, log)
        else:
            k, idx = spec[1], spec[2]
            if r.index != idx:
                return _undo(ctx, log)
            if ctx.nodes[k] is not None:
                if ctx.nodes[k] != r.node:
                    return _undo(ctx, log)
            elif k in ctx.pending:
                if ctx.pending[k] != r.node:
                    return _undo(ctx, log)
            else:
                ctx.pending[k] = r.node
                log.append(("p", k))
    return log


def _undo(ctx: _Ctx, log) -> None:
    for kind, k in log:
        if kind == "v":
            ctx.binds[k] = None
        else:
            del ctx.pending[k]
    return None


def _assign(ctx: _Ctx, j: int, m: int) -> Iterator[Match]:
    if not _node_ok(ctx, j, m):
        return
    pn = ctx.pat.pnodes[j]
    orders = [(0, 1), (1, 0)] if pn.commutative and len(pn.inputs) == 2 else [tuple(range(len(pn.inputs)))]
    for order in orders:
        log = _bind_inputs(ctx, j, m, order)
        if log is None:
            continue
        ctx.nodes[j] = m
        ctx.used.add(m)
        forced = ctx.pending.pop(j, None)
        yield from _extend(ctx)
        if forced is not None:
            ctx.pending[j] = forced
        ctx.used.discard(m)
        ctx.nodes[j] = None
        _undo(ctx, log)


def _extend(ctx: _Ctx) -> Iterator[Match]:
    for j, m in ctx.pending.items():
        if ctx.nodes[j] is None:
            yield from _assign(ctx, j, m)
            return
    pat, st = ctx.pat, ctx.state
    for j, m in enumerate(ctx.nodes):
        if m is None:
            via = _link(ctx, j)
            if via is None:
                continue
            for u in st.users.get(via.node, ()):
                if via in st.nodes[u].inputs:
                    yield from _assign(ctx, j, u)
            return
    yield Match(pat.index, tuple(ctx.nodes), tuple(ctx.binds))


def _link(ctx: _Ctx, j: int) -> Ref | None:
    """A value already matched that unmatched pattern node j takes as an input."""
    for spec in ctx.pat.pnodes[j].inputs:
        if spec[0] == "v" and ctx.binds[spec[1]] is not None:
            return ctx.binds[spec[1]]
        if spec[0] == "n" and ctx.nodes[spec[1]] is not None:
            return Ref(ctx.nodes[spec[1]], spec[2])
    return None


def match_at(state, pat: Pattern, j: int, m: int) -> Iterator[Match]:
    """Every match of ``pat`` that maps pattern node ``j`` to graph node ``m``."""
    if _shallow_ok(pat.pnodes[j], state.nodes[m], pat.max_lift):
        yield from _assign(_Ctx(state, pat), j, m)


def match_all(state, rules: RuleSet, by_op: dict[str, list[int]] | None = None) -> list[Match]:
    """Every match of every pattern in ``state`` (one anchor per pattern: its rarest operator)."""
    if by_op is None:
        by_op = {}
        for i, n in state.nodes.items():
            by_op.setdefault(n.op, []).append(i)
    found: dict[Match, None] = {}
    for pat in rules.patterns:
        j = min(range(len(pat.pnodes)), key=lambda k: len(by_op.get(pat.pnodes[k].op, ())))
        for m in by_op.get(pat.pnodes[j].op, ()):
            found.update(dict.fromkeys(match_at(state, pat, j, m)))
    return list(found)


def match_near(state, rules: RuleSet, touched) -> list[Match]:
    """Every match that maps some pattern node to one of the ``touched`` graph nodes."""
    found: dict[Match, None] = {}
    for m in touched:
        for p, j in rules.anchored_at(state.nodes[m]):
            found.update(dict.fromkeys(match_at(state, rules.patterns[p], j, m)))
    return list(found)
