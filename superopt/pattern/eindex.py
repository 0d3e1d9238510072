"""The e-matcher's index of the one e-graph: every e-node filed under its operator, the
attributes a pattern fixes, its outputs' dtypes and ranks and its axes (:func:`index_by_op`),
so that a pattern's top looks up exactly the e-nodes it can match (:func:`anchor_keys`), and
the candidates of a top (:func:`candidates`): those whose argument classes have the operators,
ranks and constness the pattern needs there, shared by the patterns with the same needs.

>>> from superopt.ir import GraphBuilder
>>> from superopt.pattern.egraph import EGraph
>>> b = GraphBuilder(); x = b.input("x", (8, 8))
>>> eg = EGraph(); _ = eg.add_graph(b.build([b.op("relu", b.op("relu", x))]))
>>> sorted(key[0] for key in index_by_op(eg))
['input', 'relu']
"""

from __future__ import annotations

from .attrs import facets, shift, window_attrs
from .compile import Pattern
from .egraph import EGraph, ENode

__all__ = ["Index", "index_by_op", "narrowed", "anchor_keys", "candidates", "indexed", "sig"]


def sig(types) -> tuple:
    return tuple((t.dtype, len(t.shape)) for t in types)



class Index(dict):
    """Index key -> [(class, e-node)] (:func:`index_by_op`), and ``memo``: the candidates each
    top key and argument needs gave (:func:`candidates`), valid while the e-graph is unchanged;
    ``wider``: the index this one is a part of (:func:`narrowed`), None for one built whole."""

    def __init__(self):
        super().__init__()
        self.memo: dict = {}
        self.wider: Index | None = None
        self.only: set[int] | frozenset = frozenset()


def narrowed(wide: Index, only: set[int]) -> Index:
    """``index_by_op(eg, only)`` from ``wide``, an index of the same e-graph (unchanged since)
    over classes that include ``only``: the same lists in the same order (both are in class
    order), each made by keeping ``wide``'s entries of those classes; where ``wide`` knows a
    top's candidates, this one's are those kept likewise (:func:`candidates`), so the e-nodes
    under a key are not checked again for a narrower level near a change (the search's indexes,
    one per level, are nested)."""
    out = Index()
    for key, entries in wide.items():
        kept = [x for x in entries if x[0] in only]
        if kept:
            out[key] = kept
    out.wider, out.only = wide, only
    return out


_INDEX_KEYS: dict = {}  # (op, attrs, types) -> index key: facets and signatures of e-nodes seen


def index_by_op(eg: EGraph, only: set[int] | None = None) -> Index:
    """Every e-node by operator, the attributes a pattern fixes, its outputs' dtypes and ranks
    and its axes, with its class (of the classes in ``only`` when given): a pattern node looks
    up exactly the e-nodes it can match (:func:`anchor_keys`). A convolution or pool is filed
    twice: with its windows free and with them (patterns of either kind). Build a new one after
    the e-graph changes."""
    out = Index()
    all_nodes = eg.nodes
    # classes are made with increasing ids and a union drops the merged one, so the e-graph's
    # order is the ids' order: a subset is walked in that order too
    items = all_nodes.items() if only is None else ((c, all_nodes[c]) for c in sorted(only) if c in all_nodes)
    keys = _INDEX_KEYS
    if len(keys) > 200_000:
        keys.clear()
    for c, nodes in items:
        for e in nodes:
            head = (e[0], e[1], e[4])
            got_keys = keys.get(head)
            if got_keys is None:  # a window operator: also under its windows (literal-window patterns)
                got_keys = keys[head] = tuple(dict.fromkeys(
                    (e[0], *facets(e[0], e[1], w), sig(e[4])) for w in ((False, True) if window_attrs(e[0]) else (False,))))
            for key in got_keys:
                got = out.get(key)
                if got is None:
                    out[key] = [(c, e)]
                else:
                    got.append((c, e))
    return out


_KEYS: dict = {}


def anchor_keys(pat: Pattern, j: int) -> tuple:
    """The index keys of pattern node j, one per lift from 0 to the pattern's ``max_lift``."""
    key = (pat.memo_key, j, pat.max_lift)
    if key not in _KEYS:
        pn = pat.pnodes[j]
        _KEYS[key] = tuple((pn.op, pn.fixed, tuple(shift(v, carries, lift) for _, v, carries in pn.shifted),
                            tuple((t.dtype, len(t.shape) + lift) for t in pn.types))
                           for lift in range(pat.max_lift + 1))
    return _KEYS[key]



def candidates(eg: EGraph, pat: Pattern, top: int, index: dict) -> list[tuple[int, ENode]]:
    """The e-nodes under the top's index keys whose argument classes may match, with their
    classes. Many patterns share a top's key and argument needs (128 of Inception's patterns
    start at a rank-4 add), so an :class:`Index` keeps the list for the next one."""
    needs = _child_needs(pat, top)
    pn = pat.pnodes[top]
    swap = pn.commutative and len(pn.inputs) == 2
    keys = anchor_keys(pat, top)
    memo = getattr(index, "memo", None)
    tag = pat.shallow.get(("candidates", top))  # the memo's key, a small int (hashing the keys costs)
    if tag is None:
        tag = pat.shallow[("candidates", top)] = _CANDIDATE_TAGS.setdefault((keys, needs, swap, pat.max_lift),
                                                                             len(_CANDIDATE_TAGS))
        _FIT_TAGS[tag] = _FIT_NUMBERS.setdefault((needs, swap, pat.max_lift), len(_FIT_NUMBERS))
    got = None if memo is None else memo.get(tag)
    if got is None and getattr(index, "wider", None) is not None:  # a part of a wider index whose candidates
        wide, only = index.wider.memo.get(tag), index.only      # are known: those of its classes
        if wide is not None:
            got = memo[tag] = [x for x in wide if x[0] in only]
    if got is None:
        # an e-node's argument classes that fit once fit for good (classes only gain operators
        # and constness; their types never change), and so does a misfit by rank in every order
        # (a quarter of ResNeXt-50's misfits); any other misfit holds until one of them is
        # touched (``EGraph.stamp``: a union, a new e-node or new constness): kept in the e-graph
        find, arity, got, stamp, now, parent = eg.find, len(needs), [], eg.stamp, eg.version, eg.parent
        # per argument needs (shared by the tops of other keys with the same needs: the check
        # reads nothing else): argument classes -> True (fit), False (misfit for good) or a misfit's version
        fits = eg.fits.get(_FIT_TAGS[tag])
        if fits is None:
            fits = eg.fits[_FIT_TAGS[tag]] = {}
        for key in keys:
            for c, e in index.get(key, ()):
                kids = e[2]
                if len(kids) != arity:
                    continue
                known = fits.get(kids)
                if known is True:
                    got.append((c if parent[c] == c else find(c), e))
                    continue
                if known is False:
                    continue
                if known is not None:  # a misfit: does it hold? (none of its classes touched since)
                    for k in kids:
                        if stamp[k if parent[k] == k else find(k)] >= known:
                            known = None
                            break
                if known is None:
                    if _children_may_match(eg, e, needs, swap, pat.max_lift):
                        fits[kids] = True
                        got.append((c if parent[c] == c else find(c), e))
                    else:
                        fits[kids] = False if _misfit_for_good(eg, kids, needs, swap, pat.max_lift) else now
        if memo is not None:
            memo[tag] = got
    return got


_CANDIDATE_TAGS: dict = {}  # (top's keys, argument needs, commutative, lift) -> a number
_FIT_NUMBERS: dict = {}  # (argument needs, commutative, lift) -> a number: what the argument check reads
_FIT_TAGS: dict = {}  # a candidates tag -> its argument check's number


def _child_needs(pat: Pattern, j: int) -> tuple:
    """Per argument of pattern node j: (operator or None for a variable, rank, compile-time):
    what its class must have for a match (a node over weights alone is known at compile time)."""
    key = (pat.memo_key, j, "needs")
    if key not in _KEYS:
        const: list[bool] = []
        for pn in pat.pnodes:
            const.append(all(pat.var_weight[s[1]] if s[0] == "v" else const[s[1]] for s in pn.inputs))
        needs = []
        for spec in pat.pnodes[j].inputs:
            if spec[0] == "n":
                needs.append((pat.pnodes[spec[1]].op, len(pat.pnodes[spec[1]].types[spec[2]].shape), const[spec[1]]))
            else:
                needs.append((None, len(pat.var_types[spec[1]].shape), pat.var_weight[spec[1]]))
        _KEYS[key] = tuple(needs)
    return _KEYS[key]


def _children_may_match(eg: EGraph, e: ENode, needs: tuple, swap: bool, max_lift: int) -> bool:
    """A quick necessary condition before matching downwards from ``e``: each argument class
    has the rank, constness and an e-node of the operator the pattern wants there (either order
    when commutative)."""
    if _kids_fit(eg, e.kids, needs, max_lift):
        return True
    return swap and _kids_fit(eg, e.kids[::-1], needs, max_lift)


def _misfit_for_good(eg: EGraph, kids: tuple, needs: tuple, swap: bool, max_lift: int) -> bool:
    """Some argument class has a rank the pattern cannot take, in every order: a class's type
    never changes (a union joins classes of one type), so these classes never fit."""
    return not _ranks_fit(eg, kids, needs, max_lift) and not (swap and _ranks_fit(eg, kids[::-1], needs, max_lift))


def _ranks_fit(eg: EGraph, kids: tuple, needs: tuple, max_lift: int) -> bool:
    parent, find, types = eg.parent, eg.find, eg.types
    for kid, (_, rank, _) in zip(kids, needs):
        if not 0 <= len(types[kid if parent[kid] == kid else find(kid)].shape) - rank <= max_lift:
            return False
    return True


def _kids_fit(eg: EGraph, kids: tuple, needs: tuple, max_lift: int) -> bool:
    parent, find, consts, types, ops = eg.parent, eg.find, eg.const, eg.types, eg.ops_of
    for kid, (op, rank, const) in zip(kids, needs):
        c = kid if parent[kid] == kid else find(kid)
        if const and not consts[c]:
            return False
        if not 0 <= len(types[c].shape) - rank <= max_lift:
            return False
        if op is not None and op not in ops(c):
            return False
    return True



def indexed(pat: Pattern, top: int, index: dict) -> bool:
    """Some e-node is filed under one of the top's index keys."""
    return any(key in index for key in anchor_keys(pat, top))
