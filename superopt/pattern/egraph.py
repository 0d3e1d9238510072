"""The one typed e-graph: classes of equal tensor values, hash-consed e-nodes, rebuilding; the
search's, the verifier's and the generator's instance check's, each with its analyses as plug-ins.

Every e-class holds values of one tensor type (the type is no plug-in: matching, instantiation
and unions all read it). What else a class knows comes from its *analyses* (egg's
``Analysis``): an object with ``make(eg, c, e)`` (class ``c`` made by e-node ``e``),
``join(eg, a, b)`` (``b`` merged into ``a``) and ``repair(eg, c, e)`` (``e`` found in ``c``
while rebuilding; True when ``c``'s data changed, so that its users are repaired too). The
search uses :class:`Constness` (``const``: a weight, a constant, or an operator on such classes
only: it costs nothing and is folded after extraction; the default); the verifier the Z3 terms of
``superopt.verify.z3enc.Z3Terms``; the instance check none. An :class:`ENode` is output ``k`` of
operator ``op`` with ``attrs`` on the child classes ``kids``; ``types`` are the types of all the operator's outputs, so the
outputs of one ``split`` are e-nodes of one *application* ``(op, attrs, kids)`` that runs once.
Inputs, weights and opaque operators are e-nodes like the others, but no rule matches them:
opaque ones stay leaves of the rewriting, keep their call and are never merged with an equal
call (they carry their node's index, :data:`OPAQUE_MARK`). Unions are deferred and repaired
by :meth:`EGraph.rebuild` (egg's rebuilding: congruence closure over the parents' lists).

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (2, 4))
>>> eg = EGraph(); roots = eg.add_graph(b.build([b.op("relu", b.op("relu", x))]))
>>> len(eg), eg.class_count, eg.types[roots[0]]
(3, 3, f32[2,4])
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator, NamedTuple, Sequence

from ..errors import SuperoptError
from ..ir.graph import Graph
from ..ir.ops import get_op
from ..ir.types import TensorType

__all__ = ["ENode", "EGraph", "Constness", "OPAQUE_MARK", "real_attrs", "scc_ranks", "infer_types", "node_const"]

#: an attribute only opaque e-nodes carry (the node's index in the model), so that two equal
#: calls stay two: an opaque call may not be pure, so it is never merged with another
OPAQUE_MARK = "#node"


def real_attrs(attrs: tuple) -> tuple:
    """The attributes of an e-node as the operator has them (the opaque mark left out)."""
    return attrs if not attrs or attrs[-1][0] != OPAQUE_MARK else attrs[:-1]


class ENode(NamedTuple):
    """Output ``k`` of ``op`` with ``attrs`` applied to the classes ``kids`` (see the module)."""

    op: str
    attrs: tuple
    kids: tuple[int, ...]
    k: int
    types: tuple[TensorType, ...]

    @property
    def app(self) -> tuple:
        """The operator application this output belongs to (it runs once for all its outputs)."""
        return self.op, self.attrs, self.kids


def _const_op(op: str) -> str:
    """``source``, ``constant``, ``compute`` or ``opaque``: how constness flows through ``op``."""
    if op == "weight":
        return "constant"
    return get_op(op).kind


@lru_cache(maxsize=65536)
def infer_types(op: str, attrs: tuple, types: tuple) -> tuple[TensorType, ...] | None:
    """Output types of ``op`` on inputs of ``types``, or None when that is ill-formed."""
    opdef = get_op(op)
    try:
        opdef.check_arity(len(types))
        return tuple(opdef.infer(dict(attrs), list(types)))
    except (SuperoptError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None


def node_const(eg: "EGraph", e: ENode) -> bool:
    """E-node ``e`` is known at compile time: a weight, a constant, or an operator on such classes."""
    kind = _const_op(e.op)
    return kind == "constant" or (kind == "compute" and bool(e.kids) and all(eg.const[eg.find(k)] for k in e.kids))


class Constness:
    """The search's analysis: ``eg.const[c]``, whether class ``c`` is known at compile time (it
    holds one e-node that is; a union keeps the larger answer)."""

    def make(self, eg: "EGraph", c: int, e: ENode) -> None:
        eg.const[c] = node_const(eg, e)

    def join(self, eg: "EGraph", a: int, b: int) -> None:
        const_b = eg.const.pop(b)
        eg.const[a] = eg.const[a] or const_b

    def repair(self, eg: "EGraph", c: int, e: ENode) -> bool:
        if not eg.const[c] and node_const(eg, e):
            eg.const[c] = True
            return True
        return False


class EGraph:
    """See the module docstring. Class ids are ints; :meth:`find` gives the canonical one.
    ``analyses``: the plug-ins (default: :class:`Constness`); ``version`` grows with every
    change; ``by_op``: the classes made with each operator."""

    def __init__(self, analyses: Sequence | None = None):
        self.analyses = (Constness(),) if analyses is None else tuple(analyses)
        self._repairing = tuple(an for an in self.analyses if getattr(an, "repairs", True))
        self.version = 0
        self.by_op: dict[str, set[int]] = {}
        self.parent: list[int] = []
        self.nodes: dict[int, list[ENode]] = {}     # canonical class -> its e-nodes
        self.parents: dict[int, list[tuple[ENode, int]]] = {}
        self.types: dict[int, TensorType] = {}
        self.const: dict[int, bool] = {}
        self.memo: dict[ENode, int] = {}
        self.origin: dict[ENode, str] = {}          # e-node -> the rule that added it
        self._pending: list[int] = []
        self.touched: set[int] = set()  # classes with a new e-node, a union or new constness
        self.stamp: dict[int, int] = {}  # class -> ``version`` when it was last touched
        self.op_stamp: dict[tuple[int, str], int] = {}  # (class, operator) -> ``version`` when a union
        #                                                 last brought it an e-node of that operator
        self.attr_stamp: dict[int, int] = {}  # class -> ``version`` when its generation or constness last changed
        self._interned: dict[tuple, tuple] = {}  # types tuples, one object per value (fast compares)
        self.gen: dict[int, int] = {}  # canonical class -> its generation (see :meth:`add`)
        self._ops: dict[int, frozenset] = {}  # :meth:`ops_of`'s cache
        self._stale: set[int] = set()  # classes whose e-nodes may be non-canonical or repeated
        self._types: dict[tuple, tuple] = {}  # (op, attrs, kids) -> output types, for add_term
        self.size = 0
        self.fits: dict = {}  # the e-matcher's: a pattern top's needs -> argument classes -> whether they fit

    def __len__(self) -> int:
        return self.size

    @property
    def class_count(self) -> int:
        return len(self.nodes)

    # ---- union-find ---------------------------------------------------------------------------
    def find(self, c: int) -> int:
        root = c
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[c] != root:
            self.parent[c], c = root, self.parent[c]
        return root

    def canonical(self, e: ENode) -> ENode:
        """``e`` with its kids' canonical classes (``e`` itself when they are)."""
        old = e[2]
        if not old:
            return e
        find, parent = self.find, self.parent
        for c in old:  # most e-nodes are canonical already: no new tuple
            if parent[c] != c:
                break
        else:
            return e
        kids = tuple([c if parent[c] == c else find(c) for c in old])
        return e if kids == old else e._replace(kids=kids)

    # ---- adding -------------------------------------------------------------------------------
    def lookup(self, e: ENode) -> int | None:
        """The class of ``e``; between rebuilds the memo holds e-nodes as they were added, so an
        e-node whose kids were merged since is found under its old form too."""
        c = self.memo.get(self.canonical(e))
        if c is None:
            c = self.memo.get(e)
        return None if c is None else self.find(c)

    def add(self, e: ENode, origin: str = "", gen: int = 0) -> int:
        """The class of ``e``, made if new (``origin``: the rule that adds it; ``gen``: the new
        class's generation, how many growing rewrites it took to make it, see
        :mod:`superopt.search.saturate`; a union keeps the lower one)."""
        e = self.canonical(e)
        c = self.memo.get(e)
        return self.find(c) if c is not None else self._new(e, origin, gen)

    def _new(self, e: ENode, origin: str = "", gen: int = 0) -> int:
        """A new class for the canonical e-node ``e``, which no class holds (its types tuple
        interned: equal types are then one object, and compare by identity in every lookup)."""
        op, _, kids, k, types = e
        same = self._interned.setdefault(types, types)
        if same is not types:
            e = e._replace(types=same)
        c = len(self.parent)
        self.parent.append(c)
        self.nodes[c], self.parents[c] = [e], []
        self.types[c] = types[k]
        self.gen[c] = gen
        self.memo[e] = c
        self.origin[e] = origin
        self.touched.add(c)
        self.stamp[c] = self.version
        self.size += 1
        self.version += 1
        got = self.by_op.get(op)
        if got is None:
            self.by_op[op] = {c}
        else:
            got.add(c)
        parents = self.parents
        for kid in (set(kids) if len(kids) > 1 else kids):
            parents[kid].append((e, c))
        for an in self.analyses:
            an.make(self, c, e)
        return c

    def _node_const(self, e: ENode) -> bool:
        return node_const(self, e)

    def add_term(self, op: str, k: int, attrs: tuple, kids: Sequence[int]) -> int:
        """The class of output ``k`` of ``op`` (attributes normalized) on the classes ``kids``,
        its types inferred; raises SuperoptError when the term is ill-formed (the verifier's
        way to add: axioms build terms whose shapes nobody has checked)."""
        find = self.find
        kids = tuple([find(c) for c in kids])
        key = (op, attrs, kids)  # a class's type never changes: the key stays valid after unions
        types = self._types.get(key)
        if types is None:
            types = self._types[key] = infer_types(op, attrs, tuple(self.types[c] for c in kids))
        if types is None or k >= len(types):
            raise SuperoptError(f"{op} is ill-formed on {[self.types[c] for c in kids]}")
        e = ENode(op, attrs, kids, k, types)
        c = self.memo.get(e)
        return self.find(c) if c is not None else self._new(e)

    def add_app(self, op: str, attrs: tuple, kids: Sequence[int], types: tuple, origin: str = "",
                gen: int = 0) -> list[int]:
        """The classes of all outputs of one operator application."""
        kids = tuple(kids)
        return [self.add(ENode(op, attrs, kids, k, types), origin, gen) for k in range(len(types))]

    def add_graph(self, g: Graph) -> list[int]:
        """Add every node of ``g``; the classes of its outputs."""
        cls: dict[tuple[int, int], int] = {}
        for i, n in enumerate(g.nodes):
            attrs = n.attrs + ((OPAQUE_MARK, i),) if n.op == "opaque" else n.attrs
            outs = self.add_app(n.op, attrs, [cls[(r.node, r.index)] for r in n.inputs], n.types)
            cls.update({(i, k): c for k, c in enumerate(outs)})
        return [cls[(r.node, r.index)] for r in g.outputs]

    # ---- merging ------------------------------------------------------------------------------
    def union(self, a: int, b: int) -> bool:
        """Merge two classes (repaired at the next :meth:`rebuild`); False if already one."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        if self.types[a] != self.types[b]:
            raise AssertionError(f"union of {self.types[a]!r} and {self.types[b]!r}")  # internal invariant
        if len(self.parents[a]) < len(self.parents[b]):
            a, b = b, a
        version, op_stamp = self.version, self.op_stamp
        for e in self.nodes[b]:  # what a matcher that read class a for these operators would see anew
            op_stamp[(a, e[0])] = version
        const_a, gen_a = self.const.get(a), self.gen[a]
        self.parent[b] = a
        self.nodes[a] += self.nodes.pop(b)
        self.parents[a] += self.parents.pop(b)
        for an in self.analyses:
            an.join(self, a, b)
        self.gen[a] = min(gen_a, self.gen.pop(b))
        if self.gen[a] != gen_a or self.const.get(a) != const_a:
            self.attr_stamp[a] = version
        self.types.pop(b)
        self._ops.pop(a, None)
        self._pending.append(a)
        self._stale.add(a)
        self.touched.add(a)
        self.stamp[a] = self.version
        self.version += 1
        return True

    def rebuild(self) -> None:
        """Restore the invariants: hash-consing up to congruence, constness, deduplicated nodes."""
        while self._pending:
            todo = {self.find(c) for c in self._pending}
            self._pending = []
            for c in todo:
                self._repair(self.find(c))
        for c in {self.find(c) for c in self._stale}:  # only these can hold a stale e-node
            before = self.nodes[c]
            self.nodes[c] = list(dict.fromkeys(self.canonical(e) for e in before))
            self.size += len(self.nodes[c]) - len(before)
        self._stale = set()

    def _repair(self, c: int) -> None:
        seen: dict[ENode, int] = {}
        for e, pc in self.parents[c]:
            e2 = self.canonical(e)
            if e2 is not e:
                self.memo.pop(e, None)
                if e2 not in self.origin:
                    self.origin[e2] = self.origin.get(e, "")
            pc = self.find(pc)
            other = seen.get(e2)
            if other is not None:
                if self.find(other) != pc:
                    self.union(other, pc)
            elif e2 is not e:  # (an unchanged e-node's own entry is its class: nothing to join)
                other = self.memo.get(e2)
                if other is not None and self.find(other) != pc:
                    self.union(other, pc)
            seen[e2] = self.find(pc)
            self.memo[e2] = seen[e2]
            self._stale.add(seen[e2])
            for an in self._repairing:
                if an.repair(self, self.find(pc), e2):
                    self._pending.append(self.find(pc))
                    self.touched.add(self.find(pc))
                    self.stamp[self.find(pc)] = self.attr_stamp[self.find(pc)] = self.version
        self.parents[c] = [(e, self.find(p)) for e, p in seen.items()]

    # ---- reading ------------------------------------------------------------------------------
    def ops_of(self, c: int) -> frozenset:
        """The operators of class ``c``'s e-nodes (cached until the e-graph next changes)."""
        c = self.find(c)
        got = self._ops.get(c)
        if got is None:
            got = self._ops[c] = frozenset(e.op for e in self.nodes[c])
        return got

    def classes(self) -> Iterator[int]:
        return iter(list(self.nodes))

    def classes_with(self, op: str) -> set[int]:
        """The classes that hold an e-node of ``op``."""
        return {self.find(c) for c in self.by_op.get(op, ())}

    def has_ops(self, ops) -> bool:
        return all(op in self.by_op for op in ops)

    def take_dirty_levels(self, depth: int) -> list[set[int]]:
        """The classes touched since the last call, and for each ``h`` up to ``depth`` those and
        their users up to ``h`` levels up: where a pattern of height ``h`` can have a match it
        did not have before."""
        dirty = {self.find(c) for c in self.touched}
        self.touched = set()
        levels, frontier = [set(dirty)], dirty
        for _ in range(depth):
            up = {self.find(p) for c in frontier for _, p in self.parents[c]} - dirty
            dirty |= up
            frontier = up
            levels.append(set(dirty))
        return levels

    def reachable(self, roots: Sequence[int]) -> list[int]:
        """Classes some root depends on (through any of their e-nodes), roots first."""
        seen, order, stack = set(), [], [self.find(r) for r in roots]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            order.append(c)
            stack.extend(self.find(k) for e in self.nodes[c] for k in e.kids)
        return order

    def weights_in(self, c: int, memo: dict) -> frozenset:
        """Names of the weights a compile-time class is computed from (through any of its
        compile-time e-nodes); empty for other classes. ``memo`` is the caller's cache."""
        c = self.find(c)
        if c in memo:
            return memo[c]
        memo[c] = frozenset()  # cut cycles
        out: set = set()
        if self.const[c]:
            for e in self.nodes[c]:
                if e.op == "weight":
                    out.add(dict(e.attrs)["name"])
                elif self._node_const(e):
                    for k in e.kids:
                        out |= self.weights_in(k, memo)
        memo[c] = frozenset(out)
        return memo[c]

    def ranks(self) -> dict[int, int]:
        """Each class's rank (:func:`scc_ranks` over the classes and their e-nodes' children):
        a class can depend only on classes of lower or equal rank."""
        return scc_ranks(list(self.nodes), {c: list({self.find(k) for e in nodes for k in e.kids})
                                            for c, nodes in self.nodes.items()})

    def depends_on(self, start: Sequence[int], targets: set[int], rank: dict | None = None,
                   budget: int = 256) -> bool:
        """Whether a class in ``start`` may depend on (or be) one in ``targets``: a rewrite that
        makes ``targets`` from ``start`` would close a cycle. Classes known at compile time are
        not entered (extraction builds them from compile-time e-nodes only), and after
        ``budget`` classes the answer is no: this only spares the e-graph useless e-nodes, as
        extraction never picks a cycle. ``rank`` (from :meth:`ranks`, maybe older than the
        last rewrites) answers no at once when every start class ranks below every target."""
        targets = {self.find(t) for t in targets}
        if rank:
            tr = [rank.get(t) for t in targets]
            sr = [rank.get(self.find(c)) for c in start if not self.const[self.find(c)]]
            if None not in tr and None not in sr and (not sr or max(sr) < min(tr)):
                return False
        seen, stack = set(), [self.find(c) for c in start]
        find, parent, nodes, const, push = self.find, self.parent, self.nodes, self.const, stack.append
        while stack and len(seen) < budget:
            c = stack.pop()
            if c in targets:
                return True
            if c in seen or const[c]:
                continue
            seen.add(c)
            for e in nodes[c]:
                for k in e[2]:
                    push(k if parent[k] == k else find(k))
        return False


def scc_ranks(nodes: Sequence[int], succ: dict[int, list[int]]) -> dict[int, int]:
    """Each node's strongly connected part, numbered in a topological order of the parts with
    the successors first (so one rank per part, and a node reaches only nodes of lower or equal
    rank): Tarjan's algorithm without recursion."""
    index, low, on, stack, rank, count, parts = {}, {}, set(), [], {}, 0, 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = count
                count += 1
                stack.append(v)
                on.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on.discard(w)
                    rank[w] = parts
                    if w == v:
                        break
                parts += 1
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return rank
