"""Rules compiled for matching: the left side as a small pattern graph, indexed by operator.

A :class:`Pattern` lists the left side's operator nodes (``PNode``) and its variables (the
rule's inputs and weights). A variable that is a *weight* in the rule only binds values known
at compile time (weights and what is computed from them alone); an *input* binds anything.
Attributes must be equal, except those that carry shapes (split sizes, reshape targets, the
sizes of constants), which follow the shapes of the match, and the rule's parameters (kinds in
``PARAMETERS``: real-valued ones such as eps, a convolution's stride, padding and groups),
which bind exactly to the match's values.
A rule whose operators all map batch axes through (elementwise, matmul, softmax, layernorm,
concat, split, transpose) may also match values with up to ``max_lift`` extra leading axes;
its axes and permutations then shift (``shift``). Rules that cannot be matched (no operator on the left, a left output that is a bare variable,
opaque operators, a left side in pieces that share nothing, a variable no left operator uses)
are skipped with a reason.

>>> from superopt.ir import GraphBuilder, Rule
>>> def side(f):
...     b = GraphBuilder(); x = b.input("x", (2, 4))
...     return b.build([f(b, x)])
>>> rs = RuleSet([Rule(side(lambda b, x: b.op("relu", b.op("relu", x))), side(lambda b, x: b.op("relu", x)))])
>>> len(rs.patterns), [j for _, j in rs.by_op["relu"]]
(1, [0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..ir.graph import Graph
from ..ir.ops import REGISTRY, get_op
from ..ir.rule import Rule
from ..ir.types import TensorType
from .attrs import SHAPE_ATTRS, ALit, compile_attrs, facets, param_attrs, split_attrs, window_attrs

__all__ = ["reachable_rules", "PNode", "Pattern", "RuleSet", "compile_pattern", "compile_term", "compile_output", "MAX_LIFT",
           "rule_form"]

#: how many extra leading batch axes a match may add to a rule's values, by default. Lifting
#: works in both searches (``RuleSet(rules, max_lift=2)``, tests/test_search_lift.py) and is
#: sound (each lifted instance is proven at its own ranks and sizes), but with the shipped
#: database (rules at ranks 3 and 4) it makes every rank-3 rule a candidate at every rank-4
#: node: BERT's saturation took 1.9x longer for the same 10.30% less cost (backtracking with
#: the older concrete database: 8x for 10.30% -> 10.46%). Raise it once the database holds the
#: rank-1 and rank-2 rules models need at higher ranks.
MAX_LIFT = 0


@dataclass(frozen=True)
class PNode:
    """One operator of a pattern. ``inputs`` are ``("v", var)`` or ``("n", pnode, output)``;
    ``shifted`` holds ``(name, value, carries)`` of the axis and permutation attributes. A node
    compiled from an axiom term has no ``types`` (it matches at any shapes); its ``fixed`` is
    all its attributes when they are literals, else None and ``attr_pats`` binds them
    (:func:`~superopt.pattern.attrs.compile_attrs`)."""

    op: str
    fixed: tuple
    inputs: tuple
    types: tuple[TensorType, ...] | None
    commutative: bool
    shifted: tuple = ()
    attr_pats: tuple | None = None
    from_end: bool = False  # an axiom's node with a negative literal axis: it reads its first input's rank
    windows: bool = False  # its windows (stride, padding, groups) are literals in ``fixed`` (:class:`RuleSet`)


@dataclass
class Pattern:
    """A rule's left side, ready to match (see the module docstring), or an axiom's term
    (:func:`compile_term`: no rule, no types)."""

    rule: Rule | None
    index: int
    rule_id: str
    pnodes: list[PNode]
    var_names: list[str]
    var_types: list[TensorType] | None
    var_weight: list[bool]
    outputs: list[tuple[int, int]]
    node_users: list[list[tuple[int, int]]] = field(default_factory=list)
    var_users: list[list[tuple[int, int]]] = field(default_factory=list)
    max_lift: int = 0  # > 0 only when every operator of both sides maps batch axes through

    @property
    def multi_output(self) -> bool:
        return len(self.outputs) > 1

    may_close_cycle: bool = False  # outputs from several nodes: a bound value may depend on one
    #: the e-matcher's memo: (node, operator, attributes, arity, types) -> whether it fits there
    shallow: dict = field(default_factory=dict, repr=False, compare=False)
    #: what the matcher's process-wide memos (plans, index keys) key this pattern by: its rule,
    #: and whether its windows are literals (one rule compiles both ways in one process where two
    #: rule sets differ: a memo by rule alone gave the second the first one's index keys)
    memo_key: str = ""

    def __post_init__(self):
        if not self.memo_key:
            self.memo_key = self.rule_id


def _lhs_nodes(lhs: Graph):
    """Map lhs node index -> ('v', var) or ('n', pnode); returns the map and var lists."""
    where, names, types, weight = {}, [], [], []
    for i, n in enumerate(lhs.nodes):
        if n.name is not None:
            where[i] = ("v", len(names))
            names.append(n.name), types.append(n.types[0]), weight.append(n.op == "weight")
    return where, names, types, weight


def compile_pattern(rule: Rule, index: int, max_lift: int = MAX_LIFT, windows: bool = False) -> Pattern | str:
    """The pattern of ``rule``'s left side, or a string saying why it cannot be matched;
    ``max_lift``: extra leading axes it may match when its operators allow; ``windows``: its
    windows are literals, not parameters."""
    lhs = rule.lhs
    where, names, types, weight = _lhs_nodes(lhs)
    pnodes: list[PNode] = []
    for i, n in enumerate(lhs.nodes):
        if n.name is not None:
            continue
        if n.opdef.kind == "opaque":
            return "opaque operator on the left side"
        ins = tuple(where[r.node] if where[r.node][0] == "v" else ("n", where[r.node][1], r.index) for r in n.inputs)
        lit = windows and bool(window_attrs(n.op))
        fixed, shifted = split_attrs(n.opdef, n.attrs, lit)
        where[i] = ("n", len(pnodes))
        pnodes.append(PNode(n.op, fixed, ins, n.types, n.opdef.commutative, shifted, windows=lit))
    if not pnodes:
        return "no operator on the left side"
    outputs = []
    for r in lhs.outputs:
        if where[r.node][0] == "v":
            return "a left output is a bare variable"
        outputs.append((where[r.node][1], r.index))
    pat = Pattern(rule, index, rule.id, pnodes, names, types, weight, outputs,
                  memo_key=rule.id + ("#windows" if any(pn.windows for pn in pnodes) else ""))
    if all(n.opdef.lifts for g in (rule.lhs, rule.rhs) for n in g.nodes if n.name is None):
        pat.max_lift = max_lift
    pat.may_close_cycle = len({j for j, _ in outputs}) > 1
    _link_users(pat)
    if not all(pat.var_users):
        return "a variable that no operator on the left side uses"
    if not _connected(pat):
        return "the left side is in pieces that share no variable"
    return pat


def compile_term(term, attr_pats: dict, pattern_id: str) -> Pattern:
    """The pattern of an axiom's term: a call (``op``, ``args``, ``index``) or a variable
    (``name``); ``attr_pats[id(call)]``: the call's attribute patterns in sorted name order.
    Arguments are matched in order (commutativity is an axiom), variables bind any class, and
    ``pattern_id`` names it in the matchers' caches."""
    pnodes: list[PNode] = []
    names: dict[str, int] = {}

    def walk(t) -> tuple:
        if not hasattr(t, "op"):
            return "v", names.setdefault(t.name, len(names))
        ins = tuple(walk(a) for a in t.args)
        pats = attr_pats[id(t)]
        keys = sorted(a.name for a in get_op(t.op).attrs)
        if all(type(p) is ALit and not (k == "axis" and isinstance(p.value, int) and p.value < 0)
               for k, p in zip(keys, pats)):  # literals only: one comparison with the e-node's
            pnodes.append(PNode(t.op, tuple((k, p.value) for k, p in zip(keys, pats)), ins, None, False, (), ()))
        else:
            compiled = compile_attrs(keys, pats)
            pnodes.append(PNode(t.op, None, ins, None, False, (), compiled, bool(compiled[1])))
        return "n", len(pnodes) - 1, t.index

    top = walk(term)
    pat = Pattern(None, -1, pattern_id, pnodes, list(names), None, [False] * len(names), [(top[1], top[2])])
    _link_users(pat)
    return pat


def compile_output(g: Graph, out, pattern_id: str) -> Pattern:
    """The pattern of the term that makes output ``out`` (a ``Ref``, not a bare variable) of
    graph ``g``, matched exactly: every attribute a literal, variables (``g``'s inputs and
    weights, by name) of their own dtype and rank (the caller checks the full type),
    commutative operators in either order. The generator's instance check uses it."""
    pnodes: list[PNode] = []
    names: dict[str, int] = {}
    types: list[TensorType] = []

    def walk(ref) -> tuple:
        n = g.nodes[ref.node]
        if n.name is not None:
            if n.name not in names:
                names[n.name] = len(names)
                types.append(n.types[0])
            return "v", names[n.name]
        ins = tuple(walk(r) for r in n.inputs)
        pnodes.append(PNode(n.op, n.attrs, ins, None, n.opdef.commutative, (), ()))
        return "n", len(pnodes) - 1, ref.index

    top = walk(out)
    pat = Pattern(None, -1, pattern_id, pnodes, list(names), types, [False] * len(names), [(top[1], top[2])])
    _link_users(pat)
    return pat


def _link_users(pat: Pattern) -> None:
    pat.node_users = [[] for _ in pat.pnodes]
    pat.var_users = [[] for _ in pat.var_names]
    for j, pn in enumerate(pat.pnodes):
        for pos, spec in enumerate(pn.inputs):
            (pat.var_users[spec[1]] if spec[0] == "v" else pat.node_users[spec[1]]).append((j, pos))


def _connected(pat: Pattern) -> bool:
    """Every pattern node reachable from node 0 through shared nodes or variables."""
    seen, stack = {0}, [0]
    while stack:
        j = stack.pop()
        near = [s[1] for s in pat.pnodes[j].inputs if s[0] == "n"] + [u for u, _ in pat.node_users[j]]
        near += [u for s in pat.pnodes[j].inputs if s[0] == "v" for u, _ in pat.var_users[s[1]]]
        for k in near:
            if k not in seen:
                seen.add(k)
                stack.append(k)
    return len(seen) == len(pat.pnodes)


class RuleSet:
    """Compiled patterns of a list of rules, with an index from operator to pattern nodes;
    ``max_lift``: extra leading batch axes a rank-generic rule may match (see ``MAX_LIFT``)."""

    def __init__(self, rules: Iterable[Rule], max_lift: int = MAX_LIFT):
        self.patterns: list[Pattern] = []
        self.skipped: list[tuple[Rule, str]] = []
        self.by_op: dict[str, list[tuple[int, int]]] = {}
        self.by_anchor: dict[tuple, list[tuple[int, int]]] = {}
        kept = self._one_per_form(rules, max_lift)
        for index, (rule, windows, pat) in enumerate(kept):
            if windows:  # compiled with its windows as parameters: again, with them literal
                pat = compile_pattern(rule, index, max_lift, windows)
            pat.index = index
            self.patterns.append(pat)
            for j, pn in enumerate(pat.pnodes):
                self.by_op.setdefault(pn.op, []).append((pat.index, j))
                exact = () if pat.max_lift else tuple(v for _, v, _ in pn.shifted)
                self.by_anchor.setdefault((pn.op, pn.fixed, exact), []).append((pat.index, j))

    def _one_per_form(self, rules: Iterable[Rule], max_lift: int) -> list[tuple[Rule, bool, Pattern]]:
        """The rules worth matching, in order, each with whether its windows are literals and its
        pattern compiled with them as parameters: one
        rule per form (:func:`rule_form`: the same rewrite up to sizes, names and windows) where
        the form's rules hold at two or more values of each window (stride, padding, groups)
        and carry them through (:func:`_windows_carried`): the windows are then parameters;
        else one per form and windows (the windows literal, as every other attribute)."""
        seen: set[str] = set()
        by_form: dict[tuple, list[tuple[int, Rule, dict]]] = {}
        for k, rule in enumerate(rules):
            if rule.id in seen:
                continue
            seen.add(rule.id)
            pat = compile_pattern(rule, 0, max_lift)
            if isinstance(pat, str):
                self.skipped.append((rule, pat))
                continue
            by_form.setdefault(rule_form(pat), []).append((k, rule, _window_values(rule), pat))
        kept = []
        for items in by_form.values():
            names = {name for _, _, wv, _ in items for name in wv}
            generic = all(len({wv.get(name) for _, _, wv, _ in items}) > 1 for name in names) and \
                all(_windows_carried(rule) for _, rule, _, _ in items)
            first: dict = {}
            for k, rule, wv, pat in items:
                key = () if generic else tuple(sorted(wv.items()))
                if key in first:  # the same rewrite at other sizes, names (or windows): it would add nothing
                    self.skipped.append((rule, f"the same rewrite as rule {first[key].id} up to sizes"
                                               f"{', names and windows' if generic and names else ' and names'}"))
                    continue
                first[key] = rule
                kept.append((k, rule, bool(names) and not generic, pat))
        return [(rule, windows, pat) for _, rule, windows, pat in sorted(kept, key=lambda t: t[0])]

    def anchored_at(self, node) -> list[tuple[int, int]]:
        """(pattern, pattern node) pairs whose operator and fixed attributes are the node's
        (axes and permutations too, unless the pattern is rank-generic: they shift)."""
        out = []
        for windows in (False, True) if window_attrs(node.op) else (False,):
            fixed, moved = facets(node.op, node.attrs, windows)
            out += self.by_anchor.get((node.op, fixed, moved), [])
            if moved:
                out += self.by_anchor.get((node.op, fixed, ()), [])
        return out

    def __len__(self) -> int:
        return len(self.patterns)

    def ops(self) -> Sequence[str]:
        return sorted(self.by_op)


def _window_values(rule: Rule) -> dict[str, tuple]:
    """Window attribute (stride, padding, groups...) -> its values on the rule's left side, node
    by node: a form found at two values of each is a family over them, else its windows are
    literals (as every attribute but sizes and parameters)."""
    out: dict[str, list] = {}
    for n in rule.lhs.nodes:
        if n.name is None:
            for k in window_attrs(n.op):
                out.setdefault(k, []).append(n.attr[k])
    return {k: tuple(v) for k, v in out.items()}


def _windows_carried(rule: Rule) -> bool:
    """Every window of the right side is one of the left side's (same attribute, same value): the
    rule carries its windows through. A rule that sets one (a 1x1 kernel enlarged to 3x3 gets
    padding 1 from padding 0) holds at the windows it was found at, not as a family over them."""
    lhs = {(k, n.attr[k]) for n in rule.lhs.nodes if n.name is None for k in window_attrs(n.op)}
    return all((k, n.attr[k]) in lhs for n in rule.rhs.nodes if n.name is None for k in window_attrs(n.op))


def _sig(types) -> tuple:
    return tuple((t.dtype, len(t.shape)) for t in types)


def rule_form(pat: Pattern) -> tuple:
    """A compiled rule up to sizes and names: its left side as the matcher reads it (operators,
    fixed attributes, wiring, dtypes and ranks, axes, variables' weight flags, lift) and its
    right side with every attribute but sizes (which the right side takes from the match).
    Parameters read as the left side's parameter they are (their first place there), so rules
    that differ only in the values of their parameters are one form.
    Two rules of one form match at the same places and write the same nodes there."""
    var = {name: v for v, name in enumerate(pat.var_names)}
    params: dict = {}  # (attribute, value) -> its number, in the left side's order
    lhs_params = [tuple(params.setdefault((k, n.attr[k]), len(params)) for k in param_attrs(n.op))
                  for n in pat.rule.lhs.nodes if n.name is None]
    rhs = []
    for n in pat.rule.rhs.nodes:
        if n.name is not None:
            rhs.append(("v", var.get(n.name, n.name), n.op))
        else:
            sizes = set(SHAPE_ATTRS.get(n.op, ()))
            own = set(param_attrs(n.op))
            rhs.append((n.op, tuple((k, ("p", params[(k, v)]) if k in own and (k, v) in params else v)
                                    for k, v in n.attrs if k not in sizes),
                        tuple((r.node, r.index) for r in n.inputs), _sig(n.types)))
    lhs = tuple((pn.op, pn.fixed, pn.inputs, _sig(pn.types), pn.shifted, ps) for pn, ps in zip(pat.pnodes, lhs_params))
    return (lhs, _sig(pat.var_types), tuple(pat.var_weight), tuple(pat.outputs), pat.max_lift,
            tuple(rhs), tuple((r.node, r.index) for r in pat.rule.rhs.outputs))


def reachable_rules(rules: Sequence[Rule], graph: Graph) -> list[Rule]:
    """The rules that can ever match in a search from ``graph``: those whose left side uses only
    operators the graph has or that the right side of another such rule introduces (a fixpoint;
    constants count as always there). Dropping the others changes no result and saves their
    matching: most generated rules use operators a given model never contains.

    >>> from superopt.rules.examples import fuse_conv_relu
    >>> from superopt.ir import GraphBuilder
    >>> b = GraphBuilder(); x = b.input("x", (2, 2))
    >>> reachable_rules([fuse_conv_relu()], b.build([b.op("relu", x)]))
    []
    """
    have = {n.op for n in graph.nodes} | {name for name, d in REGISTRY.items() if d.kind == "constant"}
    # each rule's operators, read once (the fixpoint's passes compare sets only: 0.014 s a search)
    pending = [(k, frozenset(n.op for n in r.lhs.nodes if n.name is None),
                frozenset(n.op for n in r.rhs.nodes if n.name is None)) for k, r in enumerate(rules)]
    kept: set[int] = set()
    changed = True
    while changed:
        changed, rest = False, []
        for k, lhs, rhs in pending:
            if lhs <= have:
                kept.add(k)
                if not rhs <= have:
                    changed = True
                    have |= rhs
            else:
                rest.append((k, lhs, rhs))
        pending = rest
    return [r for k, r in enumerate(rules) if k in kept]  # in the given order, for determinism
