"""The one e-matcher: a compiled pattern (:mod:`superopt.pattern.compile`) in the one e-graph,
with multi-output rules as multi-patterns (:func:`match_pattern`, the search) and one-top
patterns at given classes (:func:`match_classes`: the verifier's axiom directions, the
generator's instance check).

A rule's left side (a :class:`~superopt.pattern.compile.Pattern`) has one or more *tops*: the
operator nodes making its outputs that no other output depends on. A top is matched downwards
from every e-node with its operator: each pattern node binds one e-node (an operator
application), each variable one e-class, consistently; a weight variable binds only classes
known at compile time, and attributes are compared by
:func:`~superopt.pattern.attrs.attrs_match` (an axiom's node: bound by
:func:`~superopt.pattern.attrs.bind_attrs`). A rule with
several tops (two matmuls merged into one) is a multi-pattern: each top is matched on its own
and the matches are joined on the variables they share (Tensat). When two tops have the same
shape (same operators, types and use of the shared variables) the pair is taken in one order
only (the first top's class before the second's), so a merge is not derived twice.

>>> from superopt.ir import GraphBuilder, Rule
>>> from superopt.pattern.compile import RuleSet
>>> from superopt.pattern.egraph import EGraph
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

from typing import NamedTuple

from .attrs import attrs_match, bind_attrs
from .compile import PNode, Pattern
from .egraph import EGraph, ENode
from . import eindex
from .eindex import Index, anchor_keys, candidates, index_by_op, indexed, sig

__all__ = ["EMatch", "Index", "anchor_keys", "index_by_op", "match_pattern", "match_key", "tops_of",
           "is_merge", "height", "match_classes", "near_match", "Reuse", "memos", "seed"]


class EMatch(NamedTuple):
    """``apps[j]``: the e-node pattern node j matched; ``binds[v]``: the class of variable v."""

    pattern: int
    apps: tuple[ENode, ...]
    binds: tuple[int, ...]


def _lift_of(pn: PNode, e: ENode, max_lift: int) -> int | None:
    """The extra leading axes e-node ``e`` has over pattern node ``pn`` (None: no match): one
    number for all its outputs, at most ``max_lift``, its axes and permutations shifted by it."""
    lift = len(e.types[0].shape) - len(pn.types[0].shape)
    if not 0 <= lift <= max_lift:
        return None
    for a, b in zip(pn.types, e.types):
        if a.dtype != b.dtype or len(b.shape) - len(a.shape) != lift:
            return None
    return lift


def _shallow_ok(pn: PNode, e: ENode, max_lift: int) -> bool:
    """Operator, arity, output dtypes and ranks (up to ``max_lift`` extra leading axes) and
    attributes; this runs for every candidate e-node."""
    if e.op != pn.op or len(e.kids) != len(pn.inputs):
        return False
    if pn.types is None:  # an axiom's node: any types, attributes bound by its patterns
        return True
    if len(e.types) != len(pn.types):
        return False
    lift = _lift_of(pn, e, max_lift)
    return lift is not None and attrs_match(pn, e.op, e.attrs, lift)


class _Ctx:
    """One pattern's matching: the bindings so far (undone as the search backs up) and the
    complete matches found (``out``, at most ``limit``: ``full`` then stops every loop)."""

    __slots__ = ("eg", "pat", "apps", "binds", "cap", "held", "env", "out", "limit", "full", "top", "reads")

    def __init__(self, eg: EGraph, pat: Pattern, cap: int | None = None):
        self.eg, self.pat, self.cap, self.held, self.env = eg, pat, cap, 0, {}
        self.reads: list | None = None  # what the matching read of the e-graph, where kept (:class:`Reuse`)
        self.apps: list = [None] * len(pat.pnodes)
        self.binds: list = [None] * len(pat.var_names)
        self.out: list = []
        self.limit, self.full, self.top = 1 << 62, False, -1

    def too_new(self, c: int) -> bool:
        """Class ``c`` is of generation ``cap`` or later: no match may use it (counted)."""
        if self.cap is not None and self.eg.gen[c] >= self.cap:
            self.held += 1
            return True
        return False

    def emit(self) -> None:
        """Every obligation met: keep ``(top class, apps, binds, attribute env)``."""
        self.out.append((self.top, tuple(self.apps), tuple(self.binds), self.env))
        self.full = len(self.out) >= self.limit


def _solve(ctx: _Ctx, todo: tuple) -> None:
    """Satisfy obligations ``(pattern node, class, output)``: that class holds that output
    (depth first, plain recursion: Python's generators cost more than the matching)."""
    if not todo:
        ctx.emit()
        return
    (j, c, k), rest = todo[0], todo[1:]
    bound = ctx.apps[j]
    if bound is not None:
        if ctx.reads is not None:
            ctx.reads.append((c, "*"))  # (whether another output of an application is in c)
        if ctx.eg.lookup(bound._replace(k=k)) == c:
            _solve(ctx, rest)
        return
    pn = ctx.pat.pnodes[j]
    op = pn.op
    if pn.types is None:  # an axiom's node: arity and attributes are all there is to check
        for e in ctx.eg.nodes[c]:
            if e[3] == k and e[0] == op:
                env = _loose_ok(ctx, pn, e)
                if env is not None:
                    _try_loose(ctx, j, e, rest, env)
                    if ctx.full:
                        return
        return
    if ctx.reads is not None:
        ctx.reads.append((c, op))  # (its e-nodes of ``op``)
    for e in ctx.eg.nodes[c]:
        if e[3] == k and e[0] == op:
            _try(ctx, j, e, rest)
            if ctx.full:
                return


_BOTH, _AS_IS = ((0, 1), (1, 0)), (None,)


def _loose_ok(ctx: _Ctx, pn: PNode, e: ENode) -> dict | None:
    """An axiom's node at e-node ``e`` (operator and output checked): the attribute
    environment its attributes bind (:func:`~superopt.pattern.attrs.bind_attrs`), or None."""
    _, attrs, kids, _, _ = e
    if len(kids) != len(pn.inputs):
        return None
    if pn.fixed is not None:  # literals only
        return ctx.env if attrs == pn.fixed else None
    rank = ctx.eg.types[ctx.eg.find(kids[0])].rank if pn.from_end and kids else 0
    return bind_attrs(pn.attr_pats, attrs, ctx.env, rank)


def _try(ctx: _Ctx, j: int, e: ENode, rest: tuple, checked: bool = False, env: dict | None = None) -> None:
    """Bind pattern node j to e-node ``e`` (both argument orders when commutative) and go on;
    ``checked``: ``e`` came from the index under one of j's keys, so its operator, attributes,
    dtypes and ranks are known to fit (an axiom's node: by :func:`_loose_ok`, whose attribute
    environment is ``env``). The innermost loop of every search: written for speed."""
    pat = ctx.pat
    pn = pat.pnodes[j]
    if not checked:
        key = (j, e[0], e[1], len(e[2]), e[4])  # what _shallow_ok reads of ``e``
        fits = pat.shallow.get(key)
        if fits is None:
            fits = pat.shallow[key] = _shallow_ok(pn, e, pat.max_lift)
        if not fits:
            return
    eg, binds, kids, outer = ctx.eg, ctx.binds, e[2], ctx.env
    if env is not None:
        ctx.env = env
    orders = _BOTH if pn.commutative and len(kids) == 2 and kids[0] != kids[1] else _AS_IS
    find, parent, cap, gen, reads = eg.find, eg.parent, ctx.cap, eg.gen, ctx.reads
    var_types, var_weight, types, const, max_lift = pat.var_types, pat.var_weight, eg.types, eg.const, pat.max_lift
    for order in orders:
        log, more, ok = [], [], True
        for pos, spec in enumerate(pn.inputs):
            kid = kids[pos if order is None else order[pos]]
            if parent[kid] != kid:
                kid = find(kid)
            if reads is not None:
                reads.append(kid)  # (its id, generation and constness)
            if cap is not None and gen[kid] >= cap:  # (_Ctx.too_new, inlined)
                ctx.held += 1
                ok = False
                break
            if spec[0] == "n":
                more.append((spec[1], kid, spec[2]))
                continue
            v = spec[1]
            b = binds[v]
            if b is None:
                if var_types is not None:  # (match.compatible, inlined)
                    vt, kt = var_types[v], types[kid]
                    if vt.dtype != kt.dtype or not 0 <= len(kt.shape) - len(vt.shape) <= max_lift or \
                            (var_weight[v] and not const[kid]):
                        ok = False
                        break
                binds[v] = kid
                log.append(v)
            elif b != kid:
                ok = False
                break
        if ok:
            ctx.apps[j] = e
            if more or rest:
                _solve(ctx, tuple(more) + rest)
            else:
                ctx.emit()
            ctx.apps[j] = None
        for v in log:
            binds[v] = None
        if ctx.full:
            break
    ctx.env = outer


def _try_loose(ctx: _Ctx, j: int, e: ENode, rest: tuple, env: dict) -> None:
    """:func:`_try` for an axiom's node, whose variables bind any class (no types, no growth
    bound): the verifier's inner loop, kept apart from the search's checks and lean."""
    pn = ctx.pat.pnodes[j]
    binds, kids, outer, parent = ctx.binds, e[2], ctx.env, ctx.eg.parent
    ctx.env = env
    for seq in ((kids, kids[::-1]) if pn.commutative and len(kids) == 2 and kids[0] != kids[1] else (kids,)):
        log, more, ok = [], None, True
        for spec, kid in zip(pn.inputs, seq):
            if parent[kid] != kid:
                kid = ctx.eg.find(kid)
            if spec[0] == "n":
                if more is None:
                    more = [(spec[1], kid, spec[2])]
                else:
                    more.append((spec[1], kid, spec[2]))
                continue
            v = spec[1]
            b = binds[v]
            if b is None:
                binds[v] = kid
                log.append(v)
            elif b != kid:
                ok = False
                break
        if ok:
            ctx.apps[j] = e
            if more:
                _solve(ctx, tuple(more) + rest)
            elif rest:
                _solve(ctx, rest)
            else:
                ctx.emit()
            ctx.apps[j] = None
        for v in log:
            binds[v] = None
        if ctx.full:
            break
    ctx.env = outer


def match_classes(eg: EGraph, pat: Pattern, classes) -> list[tuple[int, tuple, tuple, dict]]:
    """Every match of a one-top pattern whose top is an e-node (of the top's output) of one of
    the ``classes``, class by class in their order, each class's e-nodes in order, depth first:
    ``(class, apps, binds, attribute env)``. The verifier matches its axiom directions so."""
    top, k = pat.outputs[0]
    pn, ctx = pat.pnodes[top], _Ctx(eg, pat)
    op, nodes, arity, lits, env = pn.op, eg.nodes, len(pn.inputs), pn.fixed, {}
    go = _try_loose if pat.var_types is None else lambda ctx, j, e, rest, env: _try(ctx, j, e, rest, True, env)
    for c in classes:
        ctx.top = c
        for e in nodes[c]:
            e_op, attrs, kids, e_k, _ = e
            if e_op != op or e_k != k or len(kids) != arity:
                continue
            if lits is None:  # (as _loose_ok, inlined: this loop sees every e-node of every root)
                rank = eg.types[eg.find(kids[0])].rank if pn.from_end and kids else 0
                got = bind_attrs(pn.attr_pats, attrs, env, rank)
                if got is not None:
                    go(ctx, top, e, (), got)
            elif attrs == lits:
                go(ctx, top, e, (), env)
    return ctx.out


_ANCESTORS: dict = {}
_PLANS: dict = {}


def _ancestors(pat: Pattern, j: int) -> frozenset:
    """Pattern nodes that pattern node j depends on."""
    key = (pat.memo_key, j)
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


def match_key(pat: Pattern) -> tuple:
    """What a pattern's matches depend on: its nodes (operators, fixed attributes, wiring,
    dtypes and ranks, axes), its variables' dtypes, ranks and weight flags, its outputs and its
    lift. Rules that differ only in sizes and names (one rule stated at two sizes, a rule and
    another with the same left side) have one key and the same matches. The key is a number
    standing for those parts (one per distinct parts in this process)."""
    key = (pat.memo_key, "key", pat.max_lift)
    got = _KEYS.get(key)
    if got is None:
        nodes = tuple((pn.op, pn.fixed, pn.inputs, sig(pn.types), pn.commutative, pn.shifted) for pn in pat.pnodes)
        full = (nodes, sig(pat.var_types), tuple(pat.var_weight), tuple(pat.outputs), pat.max_lift)
        got = _KEYS[key] = _MATCH_KEYS.setdefault(full, len(_MATCH_KEYS))  # a number: keys are hashed often
    return got


_KEYS: dict = {}  # (memo key, "key", lift) -> the pattern's match key
_MATCH_KEYS: dict = {}  # a match key's parts -> its number


def memos(patterns) -> dict:
    """What the matcher works out for each of ``patterns`` before matching it (its plan, its
    tops' index keys and argument needs), worked out now: kept with the compiled rules
    (:mod:`superopt.search.compiled`) so that a search in a new process takes them from there
    (:func:`seed`: 0.01 s of SqueezeNet's search) rather than working them out again."""
    keys: dict = {}
    for p in patterns:
        for t in _plan(p)[0]:
            for key, got in (((p.memo_key, t, p.max_lift), anchor_keys(p, t)),
                             ((p.memo_key, t, "needs"), eindex._child_needs(p, t))):
                keys[key] = got
    return {"plans": {p.memo_key: _PLANS[p.memo_key] for p in patterns}, "keys": keys}


def seed(memo: dict) -> None:
    """Take what :func:`memos` worked out (for patterns compiled by this very code)."""
    for key, got in memo["plans"].items():
        _PLANS.setdefault(key, got)
    for key, got in memo["keys"].items():
        eindex._KEYS.setdefault(key, got)


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
    if pat.memo_key not in _PLANS:
        _PLANS[pat.memo_key] = _make_plan(pat)
    return _PLANS[pat.memo_key]


def _make_plan(pat: Pattern) -> tuple:
    tops = tops_of(pat)
    if len(tops) == 1:
        return tops, (False,)
    seen = [_vars_of(pat, t) for t in tops]
    shared = frozenset(v for v in seen[0] if all(v in s for s in seen[1:]))
    shapes = [_shape(pat, t, shared, {}) for t in tops]
    return tops, tuple(i > 0 and shapes[i] == shapes[0] for i in range(len(tops)))


class Reuse:
    """What a matching of a pattern may take from its earlier ones: ``cache`` (kept by the
    caller, updated here), per top and candidate e-node (by identity; its class kept with it: a
    candidate whose class was merged into another matches again), the partial matches found
    there, the classes the growth bound refused, the search (a number) and the e-graph's
    ``version`` then, whether the bound refused the candidate's own class, and
    what the matching read of the e-graph: classes (their id, generation and constness), a
    class's e-nodes of one operator, and classes whose every e-node counted (the other output of
    an application bound already). ``changed[h]``: per class, the last search that saw a change
    within ``h`` steps below it; ``now``: this search.

    A candidate whose arguments saw no change within the pattern's height below them matches
    as it did (the quick test); else, where nothing it read changed since (the e-graph only
    grows and stamps each change: ``EGraph.op_stamp``, ``attr_stamp``, ``stamp``), it does too:
    a union that brought a class e-nodes of other operators, or a change elsewhere, does not
    make it match again. This is egglog's semi-naive matching at the grain of a candidate (in
    BERT-base 95% of the candidates matched again by the quick test alone gave what they had).
    Its own class matters only where the growth bound refused it (a union may have lowered its
    generation). Either way the same matches, in the same order."""

    __slots__ = ("cache", "changed", "now", "height")

    def __init__(self, cache: dict, changed: list[dict], now: int, height: int):
        self.cache, self.changed, self.now, self.height = cache, changed, now, height


def _top_matches(ctx: _Ctx, top: int, index: dict, limit: int, reuse: Reuse | None = None) -> list[tuple]:
    """Partial matches of one top: (its class, apps, binds); with ``reuse``, a candidate's
    matches are taken from the last search where nothing near it changed."""
    ctx.out, ctx.limit, ctx.full = [], limit, False
    if reuse is not None:
        return _top_matches_reusing(ctx, top, index, limit, reuse)
    for c, e in candidates(ctx.eg, ctx.pat, top, index):
        if ctx.too_new(c):
            continue
        ctx.top = c
        _try(ctx, top, e, (), True)
        if ctx.full:  # the search stopped mid-way (every binding undone on the way back)
            break
    return [m[:3] for m in ctx.out]


def _top_matches_reusing(ctx: _Ctx, top: int, index: dict, limit: int, reuse: Reuse) -> list[tuple]:
    """:func:`_top_matches` in the same order, each candidate's matches reused where nothing
    they read changed since they were found (the e-graph only grows; :class:`Reuse`)."""
    eg = ctx.eg
    cache, out, find, parent, version = reuse.cache.setdefault(top, {}), ctx.out, eg.find, eg.parent, eg.version
    below = reuse.changed[min(reuse.height, len(reuse.changed) - 1)] if reuse.changed else {}
    attr, ops, stamp = eg.attr_stamp, eg.op_stamp, eg.stamp
    for c, e in candidates(eg, ctx.pat, top, index):
        got = cache.get(id(e))  # by identity: hashing an e-node (attributes, types) costs more
        if got is not None:
            when = got[6]
            if got[3] is not e or got[7] != c or (got[4] and attr.get(c, -1) >= when):  # (another e-node at
                #                                   that address, or its class merged into another)
                got = None
            else:
                for k in e[2]:
                    if below.get(k if parent[k] == k else find(k), -1) > got[2]:
                        break  # a change near: what it read, exactly
                else:
                    when = None  # none: as it was
                if when is not None:
                    for r in got[5]:
                        if r.__class__ is int:  # a class: its id, generation, constness
                            if parent[r] != r or attr.get(r, -1) >= when:
                                got = None
                                break
                        elif parent[r[0]] != r[0] or (stamp[r[0]] >= when if r[1] == "*" else ops.get(r, -1) >= when):
                            got = None
                            break
        if got is not None:
            ctx.held += got[1]
            out.extend(got[0])
            if len(out) >= limit:
                del out[limit:]
                ctx.full = True
                break
            continue
        n0, held0 = len(out), ctx.held
        if ctx.too_new(c):
            cache[id(e)] = ((), 1, reuse.now, e, True, (), version, c)
            continue
        ctx.top, ctx.reads = c, []
        _try(ctx, top, e, (), True)
        reads, ctx.reads = ctx.reads, None
        if ctx.full:  # cut short: its list is not whole, so it is not kept
            break
        cache[id(e)] = (tuple(m[:3] for m in out[n0:]), ctx.held - held0, reuse.now, e, False,
                        tuple(dict.fromkeys(reads)), version, c)  # (e kept: its id stays its)
    return [m[:3] for m in out]


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


def match_pattern(eg: EGraph, pat: Pattern, index: dict, limit: int = 10_000, cap: int | None = None,
                  stats: dict | None = None, near: dict | None = None, reuse: Reuse | None = None) -> list[EMatch]:
    """Every match of ``pat`` in ``eg`` (at most ``limit``); ``index`` from :func:`index_by_op`.
    With ``cap``, only matches whose classes (matched and bound) are all of a generation below
    it (``EGraph.gen``): the growth bound of :mod:`superopt.search.saturate`, applied while
    matching so that matches past it are never enumerated; ``stats["held"]`` counts the
    classes refused for it. ``near`` (an index of the classes near what changed) skips a
    pattern with several tops when no top matches there: a new match has a top near a change.
    ``reuse`` (a :class:`Reuse`): each top's candidates far from every change give the matches
    they gave at the last search, without matching them again (the same matches, in the same
    order)."""
    tops = _plan(pat)[0]
    if not all(indexed(pat, t, index) for t in tops) or \
            (near is not None and not any(indexed(pat, t, near) for t in tops)):
        if stats is not None:
            stats["held"] = stats.get("held", 0)
        return []  # a top with no e-node under its keys: no match (most patterns, most iterations)
    ctx = _Ctx(eg, pat, cap)
    try:
        if near is not None and not any(_top_matches(ctx, t, near, 1) for t in _plan(pat)[0]):
            return []
        return _match(ctx, index, limit, reuse)
    finally:
        if stats is not None:
            stats["held"] = stats.get("held", 0) + ctx.held


def near_match(eg: EGraph, pat: Pattern, near: dict, cap: int | None = None) -> bool:
    """Whether some top of ``pat`` matches at an e-node of ``near`` (an index of the classes
    near what changed, :func:`index_by_op`), under the growth bound ``cap``. Where none does,
    every match of ``pat`` is one it had before the change, at the same classes: the e-graph
    only grows, so a match near a change would show here."""
    if not any(indexed(pat, t, near) for t in _plan(pat)[0]):
        return False
    ctx = _Ctx(eg, pat, cap)
    return any(_top_matches(ctx, t, near, 1) for t in _plan(pat)[0])


def _match(ctx: _Ctx, index: dict, limit: int, reuse: Reuse | None = None) -> list[EMatch]:
    pat = ctx.pat
    tops, mirrored = _plan(pat)
    found = _top_matches(ctx, tops[0], index, limit, reuse)
    for t, mirror in zip(tops[1:], mirrored[1:]):
        others = _top_matches(ctx, t, index, limit, reuse)
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
                              if None not in m[1] and None not in m[2]))[:limit]
