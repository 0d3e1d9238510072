"""A typed e-graph: the verifier's quantifier instantiation engine.

Z3's own E-matching cannot see shapes: an axiom with a condition such as ``dim(x, a) == p``
is useless on a term that E-matching itself created, and an axiom whose sides are only equal
where both are well-formed would be applied to ill-formed terms. The verifier therefore does
the instantiation itself, on an e-graph whose every class has a concrete :class:`TensorType`
(all terms of a rule have known shapes, and the IR infers the shape of every new term), and
hands Z3 the ground instances it found. Each class keeps the Z3 term it was created with, so
that every equality the e-graph knows is one Z3 can re-derive from the asserted instances
(terms are built lazily: only those a proof's instances and goals mention).

An e-node is the tuple ``(op, output index, normalized attributes, child classes)``; sources
are e-nodes ``(op, 0, name, ())``.

>>> from superopt.ir import TensorType
>>> from superopt.verify.z3enc import Z3Encoding
>>> eg = EGraph(Z3Encoding())
>>> x = eg.source("input", "x", TensorType((2, 3)))
>>> t = eg.add("transpose", 0, (("perm", (1, 0)),), [x])
>>> eg.types[t]
f32[3,2]
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import SuperoptError
from ..ir.ops import get_op, normalize_attrs
from ..ir.types import TensorType
from .z3enc import Z3Encoding

__all__ = ["EGraph", "infer_types", "normalized_attrs"]


@lru_cache(maxsize=65536)
def infer_types(op: str, attrs: tuple, types: tuple) -> tuple[TensorType, ...] | None:
    """Output types of ``op`` on inputs of ``types``, or None when that is ill-formed."""
    opdef = get_op(op)
    try:
        opdef.check_arity(len(types))
        return tuple(opdef.infer(dict(attrs), list(types)))
    except (SuperoptError, KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None


@lru_cache(maxsize=65536)
def normalized_attrs(op: str, raw: tuple) -> tuple | None:
    """``normalize_attrs`` (defaults filled, values checked) of ``(name, value)`` pairs, or None."""
    try:
        return normalize_attrs(get_op(op), dict(raw))
    except SuperoptError:
        return None


class EGraph:
    """Classes of provably equal terms (see the module docstring).

    ``nodes[c]`` and ``types[c]`` are meaningful for a root class ``c = find(c)``; ``term(c)``
    is the Z3 term of the e-node class ``c`` was created with (valid for any ``c``: all members
    of a class are provably equal); ``version`` grows whenever the graph changes.
    """

    def __init__(self, enc: Z3Encoding):
        self.enc = enc
        self._parent: list[int] = []
        self.types: list[TensorType] = []
        self.nodes: list[list[tuple]] = []
        self._created: list[tuple] = []
        self._terms: dict[int, object] = {}
        self._uses: list[list[tuple]] = []
        self.memo: dict[tuple, int] = {}
        self.by_op: dict[str, set[int]] = {}
        self._dirty: list[int] = []
        self.version = 0

    def __len__(self) -> int:
        """The number of e-nodes."""
        return len(self.memo)

    def find(self, c: int) -> int:
        parent = self._parent
        root = c
        while parent[root] != root:
            root = parent[root]
        while parent[c] != root:
            parent[c], c = root, parent[c]
        return root

    def _new_class(self, key: tuple, ty: TensorType) -> int:
        c = len(self._parent)
        self._parent.append(c)
        self.types.append(ty)
        self.nodes.append([key])
        self._created.append(key)
        self._uses.append([])
        self.memo[key] = c
        self.by_op.setdefault(key[0], set()).add(c)
        self.version += 1
        return c

    def source(self, op: str, name: str, ty: TensorType) -> int:
        key = (op, 0, name, ())
        c = self.memo.get(key)
        return self.find(c) if c is not None else self._new_class(key, ty)

    def add(self, op: str, index: int, attrs: tuple, children) -> int:
        """The class of output ``index`` of ``op`` (attributes normalized) on ``children``;
        raises SuperoptError when the term is ill-formed."""
        kids = tuple(self.find(c) for c in children)
        key = (op, index, attrs, kids)
        c = self.memo.get(key)
        if c is not None:
            return self.find(c)
        types = infer_types(op, attrs, tuple(self.types[k] for k in kids))
        if types is None or index >= len(types):
            raise SuperoptError(f"{op} is ill-formed on {[self.types[k] for k in kids]}")
        c = self._new_class(key, types[index])
        for k in set(kids):
            self._uses[k].append((key, c))
        return c

    def term(self, c: int):
        """The Z3 term class ``c`` was created with (built children first, without recursion:
        chains of classes can be thousands deep)."""
        terms, stack = self._terms, [c]
        while stack:
            top = stack[-1]
            if top in terms:
                stack.pop()
                continue
            op, index, attrs, kids = self._created[top]
            missing = [k for k in kids if k not in terms]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            terms[top] = (self.enc.source(op, attrs) if op in ("input", "weight")
                          else self.enc.apply(op, index, attrs, [terms[k] for k in kids]))
        return terms[c]

    def merge(self, a: int, b: int) -> bool:
        """Union two classes; False when they were already one."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        if self.types[a] != self.types[b]:
            raise AssertionError(f"merging classes of types {self.types[a]} and {self.types[b]}")
        if len(self.nodes[a]) < len(self.nodes[b]):
            a, b = b, a
        self._parent[b] = a
        self.nodes[a].extend(self.nodes[b])
        self._uses[a].extend(self._uses[b])
        self.nodes[b], self._uses[b] = [], []
        self._dirty.append(a)
        self.version += 1
        return True

    def _canon(self, key: tuple) -> tuple:
        op, index, attrs, kids = key
        return (op, index, attrs, tuple(self.find(k) for k in kids)) if kids else key

    def rebuild(self) -> None:
        """Restore congruence (equal children give equal parents) and canonical node lists."""
        while self._dirty:
            todo = {self.find(c) for c in self._dirty}
            self._dirty = []
            for c in todo:
                self._repair(c)
        for c in range(len(self._parent)):
            if self._parent[c] == c and len(self.nodes[c]) > 1:
                self.nodes[c] = list(dict.fromkeys(self._canon(k) for k in self.nodes[c]))

    def _repair(self, c: int) -> None:
        uses, self._uses[c] = self._uses[c], []
        for key, _ in uses:
            self.memo.pop(key, None)
        fresh: dict[tuple, int] = {}
        for key, user in uses:
            ck = self._canon(key)
            user = self.find(user)
            for other in (fresh.get(ck), self.memo.get(ck)):
                if other is not None and self.merge(other, user):
                    user = self.find(user)
            fresh[ck] = self.memo[ck] = user
        self._uses[self.find(c)].extend(fresh.items())

    def classes_with(self, op: str) -> set[int]:
        return {self.find(c) for c in self.by_op.get(op, ())}

    def has_ops(self, ops) -> bool:
        return all(op in self.by_op for op in ops)
