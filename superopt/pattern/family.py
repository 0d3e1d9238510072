"""A rule's parametric form: its shape without sizes and attributes, and when one rule covers another.

A rule found at small concrete shapes stands for a family: every size is a variable (equal
sizes share one; 1 stays 1, since size 1 broadcasts), every size-carrying attribute (split
sizes, reshape targets, constants' sizes, kernel extents) follows those variables, every
attribute of a kind in ``PARAMETERS`` (eps; a convolution's stride, padding and groups) is a
parameter (equal values share one), and the other attributes (activation, axis, permutation)
are fixed.

* :func:`shape_key` names the family's *shape*: the operators and their wiring, with sizes,
  ranks and attributes erased. Rules that differ only in sizes or attributes share it.
* :func:`covers` says whether rule ``a``'s family holds rule ``b``: same shape, and ``b``'s
  sizes and attributes are one assignment of ``a``'s parameters. A database may keep ``a``
  and drop ``b``; the search proves each instance it applies (``search/instance_proofs.py``),
  so covering is about reach, not soundness.

The generator (upstream of the search), the database and the search all import this module;
parameters bind as everywhere (:mod:`superopt.pattern.attrs`).

>>> from superopt.ir import GraphBuilder, Rule
>>> def ln(n, eps):
...     sides = []
...     for rhs in (False, True):
...         b = GraphBuilder(); x, y = b.input("x", (n, 8)), b.input("y", (n, 8))
...         if rhs:
...             sides.append(b.build([b.op("layernorm", b.op("concat", x, y, axis=0), eps=eps)]))
...         else:
...             sides.append(b.build([b.op("concat", b.op("layernorm", x, eps=eps), b.op("layernorm", y, eps=eps), axis=0)]))
...     return Rule(*sides)
>>> shape_key(ln(2, 1e-5)) == shape_key(ln(4, 1e-6)), covers(ln(2, 1e-5), ln(4, 1e-6)), covers(ln(1, 1e-5), ln(4, 1e-5))
(True, True, False)
"""

from __future__ import annotations

import hashlib
import itertools
from math import factorial

from ..ir.graph import Graph
from ..ir.ops import get_op
from ..ir.rule import Rule
from .attrs import PARAMETERS, bind_params

__all__ = ["shape_key", "covers", "MAX_ORDERS"]

#: variable orders tried when variables cannot be told apart by how they are used
MAX_ORDERS = 720

def _var_names(rule: Rule) -> list[str]:
    g = rule.lhs
    return [g.nodes[i].name for i in g.inputs + g.weights]


def _terms(g: Graph, order: dict[str, int]) -> list:
    """Per node: its erased term (a nested tuple) under a variable order."""
    out: list = []
    for n in g.nodes:
        if n.name is not None:
            out.append(("w" if n.op == "weight" else "v", order[n.name]))
            continue
        args = [(out[r.node], r.index) for r in n.inputs]
        if n.opdef.commutative:
            args.sort(key=repr)
        out.append((n.op, tuple(args)))
    return out


def _erased(rule: Rule, order: dict[str, int]) -> str:
    sides = []
    for g in (rule.lhs, rule.rhs):
        t = _terms(g, order)
        sides.append(tuple((t[r.node], r.index) for r in g.outputs))
    return repr(tuple(sides))


def _usage(rule: Rule) -> dict[str, str]:
    """How each variable is used, with the variables themselves erased: tells most apart."""
    use: dict[str, list] = {name: [] for name in _var_names(rule)}
    for side, g in enumerate((rule.lhs, rule.rhs)):
        for n in g.nodes:
            for pos, r in enumerate(n.inputs):
                src = g.nodes[r.node]
                if src.name is not None:
                    use[src.name].append((side, n.op, -1 if n.opdef.commutative else pos))
        for k, r in enumerate(g.outputs):
            if g.nodes[r.node].name is not None:
                use[g.nodes[r.node].name].append((side, "out", k))
    return {name: repr((rule.lhs.nodes[rule.lhs.by_name[name]].op, sorted(u))) for name, u in use.items()}


def _orders(rule: Rule):
    """Candidate variable orders: sorted by usage, every order within ties (bounded)."""
    usage = _usage(rule)
    names = sorted(_var_names(rule), key=lambda v: (usage[v], v))
    groups = [list(g) for _, g in itertools.groupby(names, key=usage.__getitem__)]
    total = 1
    for g in groups:
        total *= factorial(len(g))
    if total > MAX_ORDERS:
        groups = [[v] for v in names]
    for combo in itertools.product(*(itertools.permutations(g) for g in groups)):
        flat = [v for g in combo for v in g]
        yield {v: k for k, v in enumerate(flat)}


def _canonical(rule: Rule) -> tuple[str, list[dict]]:
    """The smallest erased form and every variable order that gives it."""
    best, orders = None, []
    for order in _orders(rule):
        e = _erased(rule, order)
        if best is None or e < best:
            best, orders = e, [order]
        elif e == best:
            orders.append(order)
    return best, orders


def shape_key(rule: Rule) -> str:
    """The rule's shape with sizes, ranks and attributes erased (16 hex digits)."""
    return hashlib.blake2b(_canonical(rule)[0].encode(), digest_size=8).hexdigest()


# ---- covering ------------------------------------------------------------------------------------

def _walk(g: Graph, order: dict[str, int]) -> list:
    """Nodes in a traversal that depends only on the erased structure and the variable order:
    (variable index or None, node) for every node reached from the outputs, depth first."""
    seen: set = set()
    out: list = []
    terms = _terms(g, order)

    def visit(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        n = g.nodes[i]
        ins = list(n.inputs)
        if n.name is None and n.opdef.commutative:
            ins.sort(key=lambda r: repr((terms[r.node], r.index)))
        for r in ins:
            visit(r.node)
        out.append((order.get(n.name) if n.name is not None else None, n))

    for r in g.outputs:
        visit(r.node)
    return out


class _Unifier:
    """A's parameters bound to B's values: sizes (1 stays 1) and attribute parameters, each a
    function."""

    def __init__(self, parameters):
        self.parameters = parameters
        self.sizes: dict[int, int] = {}
        self.params: dict | None = {}

    def size(self, a: int, b: int) -> bool:
        if a == 1 and b != 1:
            return False
        return self.sizes.setdefault(a, b) == b

    def shape(self, a, b) -> bool:
        return len(a) == len(b) and all(self.size(x, y) for x, y in zip(a, b))

    def attrs(self, op: str, a: dict, b: dict) -> bool:
        for attr in get_op(op).attrs:
            x, y = a.get(attr.name), b.get(attr.name)
            if attr.carries in ("size", "kernel"):
                ok = self.shape(x, y) if isinstance(x, tuple) else self.size(x, y)
            elif attr.carries in self.parameters:
                self.params = bind_params([((attr.name, x), y)], self.params)
                ok = self.params is not None
            else:
                ok = x == y
            if not ok:
                return False
        return True


def _unify(a_nodes: list, b_nodes: list, parameters) -> bool:
    if len(a_nodes) != len(b_nodes):
        return False
    u = _Unifier(parameters)
    for (va, na), (vb, nb) in zip(a_nodes, b_nodes):
        if va != vb or na.op != nb.op or len(na.types) != len(nb.types):
            return False
        if not all(u.shape(x.shape, y.shape) for x, y in zip(na.types, nb.types)):
            return False
        if na.name is None and not u.attrs(na.op, na.attr, nb.attr):
            return False
    return True


def covers(a: Rule, b: Rule, parameters=None) -> bool:
    """Whether ``b`` is an instance of ``a``'s parametric form (see the module docstring):
    the same shape, ``a``'s sizes map to ``b``'s as a function (1 only to 1), size-carrying
    attributes follow that map, attributes of the ``parameters`` kinds (default
    ``PARAMETERS``: what the search binds) map as a function per attribute, the rest are equal."""
    parameters = PARAMETERS if parameters is None else parameters
    key_a, orders_a = _canonical(a)
    key_b, orders_b = _canonical(b)
    if key_a != key_b:
        return False
    oa = orders_a[0]
    walk_a = [_walk(g, oa) for g in (a.lhs, a.rhs)]
    for ob in orders_b:
        walk_b = [_walk(g, ob) for g in (b.lhs, b.rhs)]
        if _unify(walk_a[0] + walk_a[1], walk_b[0] + walk_b[1], parameters):
            return True
    return False
