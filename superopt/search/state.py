"""The search's working form of a graph: nodes by stable id, users, costs and a cheap hash.

A :class:`State` is a graph whose nodes keep their ids across rewrites, so a rewritten graph
shares everything unchanged with its parent and only its changed region is re-priced,
re-hashed and re-matched. ``Node.inputs`` hold ``Ref(id, output)``. Alongside: each node's
users, whether it is known at compile time (``const``: weights, constants and what is
computed from them alone, which costs nothing), its cost, a rank (a topological order) and
its signatures.

The dedup key. ``Graph.key()`` hashes every node from all its ancestors, so a rewrite near the
inputs re-hashes the whole graph. The search instead uses a Weisfeiler-Lehman hash of depth
``DEPTH``: a node's signature at level k hashes its operator and its inputs' signatures at
level k-1; the key is the sum over nodes of the top level plus the outputs' signatures. It
does not depend on node order or ids, and a rewrite changes only nodes within ``DEPTH`` hops
downstream. Two graphs may share a key without being equal (graphs that agree on every
``DEPTH``-deep neighbourhood, such as ``matmul(relu(relu(relu(x))), relu(relu(relu(y))))`` and
the same with x and y swapped), so equal keys are confirmed by :class:`ExactForms`, which
compares the graphs themselves.

>>> from superopt.ir import GraphBuilder
>>> from superopt.cost import CostModel
>>> b = GraphBuilder(); x = b.input("x", (2, 4))
>>> s = State.from_graph(b.build([b.op("relu", b.op("relu", x))]), CostModel("h100"))
>>> len(s.nodes), s.to_graph().nodes[-1].op
(3, 'relu')
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Iterable

from ..cost.model import CostModel, is_constant_op
from ..ir.graph import Graph, GraphBuilder, Node, Ref

__all__ = ["State", "ExactForms", "DEPTH", "MASK", "node_sigs", "sigs_of", "output_hash", "topo_ranks", "node_const"]

DEPTH = 3
MASK = (1 << 64) - 1
_MASK128 = (1 << 128) - 1


def node_sigs(node: Node, input_sigs: Iterable[tuple]) -> tuple:
    """Signatures of ``node`` at levels 0..DEPTH from its inputs' signatures."""
    comm = node.opdef.commutative if node.name is None else False
    return sigs_of(hash((node.op, node.attrs)), comm, input_sigs, [r.index for r in node.inputs])


def sigs_of(base: int, commutative: bool, input_sigs: Iterable[tuple], indices) -> tuple:
    """Signatures from an operator's own hash ``base`` and its inputs' signatures."""
    ins = list(zip(input_sigs, indices))
    out = [base]
    for k in range(DEPTH):
        args = [(s[k], i) for s, i in ins]
        if commutative:
            args.sort()
        out.append(hash((base, tuple(args))))
    return tuple(out)


def output_hash(outputs: Iterable[Ref], sigs) -> int:
    return hash(tuple((sigs[r.node][DEPTH], r.index) for r in outputs))


def node_const(node: Node, const) -> bool:
    """Known at compile time: a weight, a constant, or an operator on such values only."""
    if is_constant_op(node):
        return True
    return bool(node.inputs) and node.opdef.kind == "compute" and all(const[r.node] for r in node.inputs)


def topo_ranks(nodes: dict[int, Node]) -> dict[int, float]:
    """A topological order of the nodes as ranks 0, 1, 2, ... (Kahn's algorithm)."""
    indeg = {i: len({r.node for r in n.inputs}) for i, n in nodes.items()}
    users: dict[int, set] = {}
    for i, n in nodes.items():
        for p in {r.node for r in n.inputs}:
            users.setdefault(p, set()).add(i)
    ready = sorted(i for i, d in indeg.items() if d == 0)
    rank: dict[int, float] = {}
    while ready:
        i = ready.pop()
        rank[i] = float(len(rank))
        for u in sorted(users.get(i, ())):
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(rank) != len(nodes):
        raise AssertionError("the search made a cyclic graph")  # internal invariant
    return rank


class State:
    """A graph in the search (see the module docstring). Treat as immutable once built.

    ``nodes``, ``users`` and ``sigs`` belong to the state. ``const``, ``ncost`` and ``rank`` are
    shared along a line of descent: node ids are never reused and an id's entries never change
    (a rewrite keeps re-wired nodes' constness, cost and rank), so a child only adds its new
    ids; a state whose ranks or constness must be recomputed gets fresh tables. They may hold
    ids the state does not have; look them up by the state's ids only.
    """

    __slots__ = ("nodes", "users", "outputs", "sigs", "const", "ncost", "rank", "cost", "key_sum", "key", "out_hash",
                 "data", "matches", "plans", "parent", "step", "depth", "cids", "form", "fkey")

    def __init__(self):
        self.cids = self.form = self.fkey = None  # ExactForms' tables and hash, made on demand
        self.matches: list = []
        self.plans: dict = {}
        self.parent: State | None = None
        self.step = None
        self.depth = 0

    @staticmethod
    def from_graph(graph: Graph, cost: CostModel) -> "State":
        """The state of ``graph`` after dropping dead operators; ids are node indices."""
        s = State()
        g = graph.prune()
        s.nodes = dict(enumerate(g.nodes))
        s.outputs, s.data = g.outputs, g.data
        s.users = {i: () for i in s.nodes}
        for i, n in s.nodes.items():
            for p in dict.fromkeys(r.node for r in n.inputs):
                s.users[p] += (i,)
        s.const, s.ncost, s.sigs = {}, {}, {}
        for i, n in s.nodes.items():
            s.const[i] = node_const(n, s.const)
            s.sigs[i] = node_sigs(n, [s.sigs[r.node] for r in n.inputs])
            s.ncost[i] = s.price(n, cost)
        s.rank = {i: float(i) for i in s.nodes}
        s.cost = sum(s.ncost.values())
        s.key_sum = sum(v[DEPTH] for v in s.sigs.values()) & MASK
        s.out_hash = output_hash(s.outputs, s.sigs)
        s.key = hash((s.key_sum, s.out_hash))
        return s

    def type_of(self, r: Ref):
        return self.nodes[r.node].types[r.index]

    def price(self, n: Node, cost: CostModel, const: bool | None = None, types=None) -> float:
        """The cost of node ``n`` here (0 for sources and compile-time values)."""
        if n.name is not None or (const if const is not None else node_const(n, self.const)):
            return 0.0
        ins = types if types is not None else [self.type_of(r) for r in n.inputs]
        return cost.node_time(n.op, n.attrs, ins, n.types)

    def recompute(self, cost: CostModel) -> None:
        """Re-derive ranks, constness, costs and the key from scratch (after unusual rewrites)."""
        self.rank = topo_ranks(self.nodes)
        order = sorted(self.nodes, key=self.rank.__getitem__)
        self.const, self.ncost = {}, {}
        for i in order:
            n = self.nodes[i]
            self.const[i] = node_const(n, self.const)
            self.ncost[i] = self.price(n, cost, self.const[i])
        self.cost = sum(self.ncost.values())
        self.out_hash = output_hash(self.outputs, self.sigs)
        self.key = hash((self.key_sum, self.out_hash))

    def to_graph(self) -> Graph:
        """The graph of this state, nodes in rank order, dead operators dropped. The inputs come
        first in their declared order (their ids: rewrites never make inputs), so the program's
        signature survives any rewrite."""
        inputs = sorted(i for i, n in self.nodes.items() if n.op == "input")
        rest = sorted((i for i, n in self.nodes.items() if n.op != "input"), key=self.rank.__getitem__)
        order = inputs + rest
        b = GraphBuilder()
        remap: dict[Ref, Ref] = {}
        for i in order:
            n = self.nodes[i]
            if n.name is not None and n.name in self.data:
                b.data[n.name] = self.data[n.name]
            b.nodes.append(Node(n.op, tuple(remap[r] for r in n.inputs), n.attrs, n.types))
            remap.update({Ref(i, k): Ref(len(b.nodes) - 1, k) for k in range(len(n.types))})
        return b.build([remap[r] for r in self.outputs]).prune()

    def history(self) -> list:
        """The rewrite steps from the first state to this one, oldest first."""
        steps, s = [], self
        while s is not None and s.step is not None:
            steps.append(s.step)
            s = s.parent
        return steps[::-1]


class ExactForms:
    """The exact identity of the graphs of one search, to confirm that two graphs with one key
    are the same graph.

    Every graph of a search is the first graph with some of its nodes removed, some re-wired
    (same id, other inputs) and some new. A graph's form records exactly that: the removed
    first-graph ids, the re-wired ones with their new contents, the multiset of new nodes, and
    the outputs. New nodes are named by an interned id of their operator, attributes and
    inputs (commutative inputs sorted; first-graph nodes by their id, new ones by their
    interned id), so the form costs time in the size of the change, not of the graph, and a dict
    compares the tuples: no hash is trusted. Equal forms mean equal graphs (up to node ids and
    the order of commutative inputs); a graph reached two ways may rarely get two forms (a node
    removed and then made again), which only costs the search a repeated graph.

    >>> from superopt.ir import GraphBuilder
    >>> from superopt.cost import CostModel
    >>> def g(swap):
    ...     b = GraphBuilder(); x = b.input("x", (4, 4)); y = b.input("y", (4, 4))
    ...     r = lambda v: b.op("relu", b.op("relu", b.op("relu", v)))
    ...     a, c = r(x), r(y)
    ...     return State.from_graph(b.build([b.op("matmul", *((c, a) if swap else (a, c)))]), CostModel("h100"))
    >>> one, two = g(False), g(True)
    >>> forms = ExactForms(one)
    >>> one.key == two.key, forms.of_state(one) == forms.of_state(two)
    (True, False)
    """

    def __init__(self, first: State):
        self.first = first.nodes
        self._ids: dict = {}
        self._elems: dict = {}  # element of a form -> its random 128-bit value (exact lookup)
        self._rng = random.Random(0)

    # ---- the exact hash: a form as a sum of its elements' random values ----------------------
    def _v(self, elem) -> int:
        v = self._elems.get(elem)
        if v is None:
            v = self._elems[elem] = self._rng.getrandbits(128)
        return v

    def key_of(self, st: State) -> tuple:
        """The exact hash of ``st``'s form: the sum (mod 2**128) of a random 128-bit value per
        element of the form (each new node's interned name, each removed first-graph id, each
        re-wired node's contents; elements are looked up exactly, so only two different sums
        can collide, with probability 2**-128 per pair) with the outputs as they are."""
        if st.fkey is None:
            form = self.of_state(st)
            rel, count, removed, content = st.cids
            total = sum(self._v(("n", name)) * k for name, k in count.items())
            total += sum(self._v(("r", i)) for i in removed)
            total += sum(self._v(("c", i, c)) for i, c in content.items())
            st.fkey = total & _MASK128, form[0]
        return st.fkey

    def key_after(self, st: State, plan) -> tuple:
        """:meth:`key_of` of the graph ``plan`` makes from ``st``, unbuilt, in time of the size of
        the change (no table of ``st`` is copied)."""
        base, _ = self.key_of(st)
        rel0, _, _, content0 = st.cids
        rel, content = _Overlay(rel0), _Overlay(content0)
        delta = 0
        for i in plan.removed:
            if i in rel:
                delta -= self._v(("n", rel[i]))
                rel.drop(i)
            if i in content:
                delta -= self._v(("c", i, content[i]))
                content.drop(i)
            if i in self.first:
                delta += self._v(("r", i))
        for nid, n in plan.new:
            name = self._intern(n, rel)
            rel[nid] = name
            delta += self._v(("n", name))
        delta += self._redirect(st, plan, rel, content)
        outs = [plan.replace.get(r, r) for r in st.outputs]
        return (base + delta) & _MASK128, tuple((rel[r.node] if r.node in rel else r.node, r.index) for r in outs)

    def _redirect(self, st: State, plan, rel: "_Overlay", content: "_Overlay") -> int:
        """The hash change from re-wired nodes and the new nodes renamed after them."""
        delta, nodes = 0, dict(plan.new)
        nodes.update(plan.redirected)
        work = list(plan.redirected)
        while work:
            u = work.pop()
            n = nodes.get(u) or st.nodes[u]
            if u in self.first:
                old = content[u] if u in content else None
                new = None if n is self.first[u] or n == self.first[u] else self._content(n, rel)
                if old != new:
                    delta += (self._v(("c", u, new)) if new is not None else 0) - \
                             (self._v(("c", u, old)) if old is not None else 0)
                    content.set_or_drop(u, new)
                continue
            name = self._intern(n, rel)
            old = rel[u] if u in rel else None
            if old != name:
                delta += self._v(("n", name)) - (self._v(("n", old)) if old is not None else 0)
                rel[u] = name
                work.extend(x for x in st.users.get(u, ()) if x not in plan.removed)
        return delta

    def of_state(self, st: State) -> tuple:
        """The form of ``st`` (cached on it; see also :meth:`inherit`)."""
        if st.form is None:
            new = {i: n for i, n in st.nodes.items() if i not in self.first}
            rel: dict = {}
            for i in new:
                self._name(i, new, rel)
            content = {i: self._content(n, rel) for i, n in st.nodes.items()
                       if i in self.first and n is not self.first[i] and n != self.first[i]}
            st.cids = (rel, Counter(rel.values()), frozenset(self.first.keys() - st.nodes.keys()), content)
            st.form = self._form(st.cids, st.outputs)
        return st.form

    def inherit(self, child: State, st: State, plan) -> None:
        """Give ``child`` (``st`` after ``plan``) its form from its parent's, if that is known."""
        if st.cids is not None and child.form is None:
            if st.fkey is not None and child.fkey is None:
                child.fkey = self.key_after(st, plan)  # in time of the change, not of the graph
            child.cids = self._tables(st, plan)
            child.form = self._form(child.cids, child.outputs)

    def after(self, st: State, plan) -> tuple:
        """The form of the graph that ``plan`` (a rewrite's plan) makes from ``st``, unbuilt."""
        self.of_state(st)
        return self._form(self._tables(st, plan), [plan.replace.get(r, r) for r in st.outputs])

    def _tables(self, st: State, plan) -> tuple:
        """The child's tables from the parent's: only the changed nodes and the new or re-wired
        nodes whose inputs' names changed are named again."""
        rel0, count0, removed0, content0 = st.cids
        gone = plan.removed
        rel, content, count = dict(rel0), dict(content0), count0.copy()
        for i in gone:
            if i in rel:
                _drop(count, rel.pop(i))
            content.pop(i, None)
        nodes = dict(plan.new)
        for nid, n in plan.new:
            self._rename(nid, n, rel, count)
        work = list(plan.redirected)
        nodes.update(plan.redirected)
        while work:
            u = work.pop()
            n = nodes.get(u) or st.nodes[u]
            if u in self.first:
                if n is self.first[u] or n == self.first[u]:
                    content.pop(u, None)
                else:
                    content[u] = self._content(n, rel)
            elif self._rename(u, n, rel, count):
                work.extend(x for x in st.users.get(u, ()) if x not in gone)
        return rel, count, removed0 | {i for i in gone if i in self.first}, content

    def _rename(self, i: int, n: Node, rel: dict, count: Counter) -> bool:
        """(Re)name new node ``i``; True when its name changed."""
        name = self._intern(n, rel)
        old = rel.get(i)
        if old == name:
            return False
        if old is not None:
            _drop(count, old)
        rel[i] = name
        count[name] += 1
        return True

    def _intern(self, n: Node, rel: dict) -> int:
        return -1 - self._ids.setdefault((n.op, n.attrs, self._args(n, rel)), len(self._ids))

    def _content(self, n: Node, rel: dict) -> tuple:
        return n.op, n.attrs, self._args(n, rel)

    @staticmethod
    def _args(n: Node, rel: dict) -> tuple:
        get = rel.get
        args = [(get(r.node, r.node), r.index) for r in n.inputs]
        return tuple(sorted(args) if len(args) > 1 and n.name is None and n.opdef.commutative else args)

    @staticmethod
    def _form(tables: tuple, outputs) -> tuple:
        rel, count, removed, content = tables
        return tuple((rel[r.node] if r.node in rel else r.node, r.index) for r in outputs), count, removed, content

    def _name(self, i: int, new: dict, rel: dict) -> None:
        """Interned ids (negative) of new node ``i`` and the new nodes it uses (no recursion)."""
        stack = [i]
        while stack:
            j = stack[-1]
            if j in rel:
                stack.pop()
                continue
            n = new[j]
            todo = [r.node for r in n.inputs if r.node in new and r.node not in rel]
            if todo:
                stack.extend(todo)
                continue
            rel[j] = self._intern(n, rel)
            stack.pop()


class _Overlay:
    """A dict seen through changes, without copying it: reads fall through to ``base``."""

    __slots__ = ("base", "over")
    _GONE = object()

    def __init__(self, base: dict):
        self.base, self.over = base, {}

    def __contains__(self, k) -> bool:
        v = self.over.get(k, None)
        if v is not None:
            return v is not self._GONE
        return k in self.base

    def __getitem__(self, k):
        v = self.over.get(k, None)
        if v is None:
            return self.base[k]
        if v is self._GONE:
            raise KeyError(k)
        return v

    def get(self, k, default=None):
        v = self.over.get(k)
        if v is None:
            return self.base.get(k, default)
        return default if v is self._GONE else v

    def __setitem__(self, k, v) -> None:
        self.over[k] = v

    def drop(self, k) -> None:
        self.over[k] = self._GONE

    def set_or_drop(self, k, v) -> None:
        self.over[k] = self._GONE if v is None else v


def _drop(count: Counter, name: int) -> None:
    count[name] -= 1
    if not count[name]:
        del count[name]
