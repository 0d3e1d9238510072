"""Pruning candidate rules that add nothing to smaller ones.

Steps, in the order the generator runs them (cheap ones first, on the compact graphs):

1. **common subgraph**: both sides contain the same operator on the same input tensors. That
   operator could be a fresh variable, so the rule is an instance of a smaller one (TASO).
2. **common supergraph**: each output of the two sides is made by the same operator with the
   same attributes from inputs that are equal except at one position, where they are
   equivalent: the rule follows from the smaller rule between those inputs (TASO).
3. **renaming**: the same rule up to renaming its input tensors (or with its sides swapped).
4. **instance of a smaller rule**: some rule with fewer operators, or as many operators and
   more variables, becomes this one when its variables are replaced by sub-terms (see
   :mod:`superopt.generate.instances`).
5. **operand permutation**: both sides apply one operator (same attributes), as often, to
   values that depend on data, and nothing else does: the rule only re-associates or commutes
   operands, ``(x + b) + y => (x + y) + b``. Either side costs the same, and with broadcast
   operands such rules match at every bias and residual add of a transformer, multiplying the
   states a search explores for nothing. (Where weights regroup, ``(x + b) + c => x + (b + c)``,
   the right side folds to fewer operators and the rule stays.)
"""

from __future__ import annotations

import itertools

from .expand import Expander, Unpacked, h64

__all__ = ["common_subgraph", "common_supergraph", "renaming_key", "node_values", "operand_permutation"]


def node_values(p: Unpacked, n_src: int) -> list[tuple[int, int]]:
    """For every value id: ``(node, output index)``, ``(-1, source)`` for input tensors."""
    out = [(-1, v) for v in range(n_src)]
    for j in range(len(p.nodes)):
        out.extend((j, i) for i in range(sum(1 for v in p.vnode if v == j)))
    return out


def _source_only(p: Unpacked, n_src: int) -> set[int]:
    return {p.merkle[j] for j, (_, _, ins) in enumerate(p.nodes) if all(v < n_src for v in ins)}


def common_subgraph(a: Unpacked, b: Unpacked, n_src: int) -> bool:
    """Both sides hold one operator (same attributes) on the same input tensors."""
    return not _source_only(a, n_src).isdisjoint(_source_only(b, n_src))


def _one_apart(a: Unpacked, b: Unpacked, na: int, nb: int, commutative: bool) -> bool | None:
    """Nodes with equal operator and attributes: True if their inputs differ at one position by
    equivalent values, False if identical, None otherwise."""
    ia, ib = list(a.nodes[na][2]), list(b.nodes[nb][2])
    if commutative:
        ia.sort(key=lambda v: a.vm[v]), ib.sort(key=lambda v: b.vm[v])
    diff = [(x, y) for x, y in zip(ia, ib) if a.vm[x] != b.vm[y]]
    if not diff:
        return False
    if len(diff) == 1 and a.vh[diff[0][0]] == b.vh[diff[0][1]]:
        return True
    if commutative and len(ia) == 2:  # the equal pair may sit crosswise
        x0, x1 = ia
        y0, y1 = ib
        for (p, q), (r, s) in (((x0, y1), (x1, y0)), ((x1, y0), (x0, y1))):
            if a.vm[p] == b.vm[q] and a.vh[r] == b.vh[s]:
                return True
    return None


def common_supergraph(ex: Expander, a: Unpacked, outs_a, b: Unpacked, outs_b) -> bool:
    """Every output pair comes from the same operator on inputs one equivalence apart (or is
    the same node), and at least one pair is not the same node."""
    where_a, where_b = node_values(a, ex.n_src), node_values(b, ex.n_src)
    apart = False
    for va, vb in zip(outs_a, outs_b):
        (na, ka), (nb, kb) = where_a[va], where_b[vb]
        if na < 0 or nb < 0 or ka != kb or a.nodes[na][:2] != b.nodes[nb][:2]:
            return False
        inst = ex.table.instance(*a.nodes[na][:2])
        r = _one_apart(a, b, na, nb, inst.commutative)
        if r is None:
            return False
        apart |= r
    return apart


def _interchangeable(ex: Expander, used: set[int]) -> list[list[int]]:
    """Groups of input tensors of the same type and role (renaming within a group is free)."""
    groups: dict = {}
    for v in range(ex.n_src):
        groups.setdefault(ex.src_kind[v], []).append(v)
    return [g for g in groups.values() if len(g) > 1 and used.intersection(g)]


def _side_key(ex: Expander, p: Unpacked, outs, vm_src) -> tuple[list[int], list[int]]:
    """Node Merkle hashes (sorted) and output value hashes of ``p`` under renamed inputs."""
    vm = list(vm_src)
    merkles = []
    for j, (op, attrs, ins) in enumerate(p.nodes):
        m = ex._merkle(ex.table.instance(op, attrs), ins, vm)
        merkles.append(m)
        vm.append(m)
        vm.extend(h64(m, i) for i in range(1, p.vnode.count(j)))
    return sorted(merkles), [vm[v] for v in outs]


def renaming_key(ex: Expander, a: Unpacked, outs_a, b: Unpacked, outs_b) -> int:
    """A key shared by a rule and every copy of it with renamed inputs or swapped sides."""
    used = {v for _, _, ins in a.nodes + b.nodes for v in ins if v < ex.n_src}
    used |= {v for v in list(outs_a) + list(outs_b) if v < ex.n_src}
    groups = _interchangeable(ex, used)
    best = None
    for choice in itertools.product(*(itertools.permutations(g) for g in groups)):
        vm_src = list(ex.src_vm)
        for g, perm in zip(groups, choice):
            for src, dst in zip(g, perm):
                vm_src[src] = ex.src_vm[dst]
        ma, oa = _side_key(ex, a, outs_a, vm_src)
        mb, ob = _side_key(ex, b, outs_b, vm_src)
        k = min(h64(len(ma), *ma, *mb, *(x for q in sorted(zip(oa, ob)) for x in q)),
                h64(len(mb), *mb, *ma, *(x for q in sorted(zip(ob, oa)) for x in q)))
        best = k if best is None else min(best, k)
    return best


def _data_ops(g, weights: frozenset) -> list:
    """``(op, attrs)`` of every operator of ``g`` that depends on a data input, sorted."""
    data, out = set(), []
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            if n.name not in weights:
                data.add(i)
        elif any(r.node in data for r in n.inputs):
            data.add(i)
            out.append((n.op, n.attrs))
    return sorted(out, key=repr)


def operand_permutation(rule, weights: frozenset) -> bool:
    """Step 5: both sides are the same single operator, as often, on data (see above).

    >>> from superopt.ir import GraphBuilder, Rule
    >>> def side(f):
    ...     b = GraphBuilder(); x, y, c = b.input("x", (2, 3)), b.input("y", (2, 3)), b.input("c", (3,))
    ...     return b.build([f(b, x, y, c)])
    >>> swap = Rule(side(lambda b, x, y, c: b.op("add", b.op("add", x, c), y)),
    ...             side(lambda b, x, y, c: b.op("add", b.op("add", x, y), c)))
    >>> operand_permutation(swap, frozenset({"c"})), operand_permutation(swap.reversed(), frozenset())
    (True, True)
    >>> fold = Rule(side(lambda b, x, y, c: b.op("mul", b.op("add", x, c), c)),
    ...             side(lambda b, x, y, c: b.op("add", b.op("mul", x, c), b.op("mul", c, c))))
    >>> operand_permutation(fold, frozenset({"c"}))
    False
    """
    lhs, rhs = _data_ops(rule.lhs, weights), _data_ops(rule.rhs, weights)
    return lhs == rhs and len(set(lhs)) == 1
