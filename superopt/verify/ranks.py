"""Proofs for every rank: a rule over batch-generic operators holds under any number of extra
leading axes.

A rule is stated at concrete shapes. Its *batch inputs* are its inputs of the largest rank (the
activations; lower-rank inputs are weights, biases and scales that broadcast). Lifting the rule
by ``k`` gives those inputs ``k`` extra leading axes, keeps the others as they are, and shifts
the axis and permutation attributes of every node that reads a lifted value (axes counted from
the end, as the search's lifting does: ``superopt.pattern.attrs.shift``).

The rule is proven **for all ranks** (``all_ranks``) when

1. every node that reads a lifted value maps the prefix through *per batch element*: an
   elementwise operator whose other operands are no higher than the lifted one's own rank (they
   broadcast over the prefix, which is replication), a batched matmul whose lifted right operand
   is a matrix, concat with every piece lifted, split, transpose, softmax, layer norm, scalar
   multiplication by an unlifted scalar; then the lifted graph computes, for each index of the
   prefix, the rule's own graph on that slice, so both sides agree at every ``k`` iff they agree
   at ``k = 0``;
2. each output is lifted on both sides or on neither (else the sides' types differ once lifted);
3. TensorRight's check (POPL 2025): the lifted rule is proven by the same verifier at every
   ``k`` up to a bound derived from the rule, the number of distinct roles the prefix axes play
   in it (batch axis of a lifted operand; broadcast axis of an unlifted one): a rule whose
   prefix only ever is a batch axis has bound 1, one where it also meets broadcasting operands
   bound 2. These proofs check the classification of step 1 on the rule itself.

Rules outside this class (a convolution, pooling or batch norm reads a lifted value; a reshape
fixes a shape) are proven per instance at the point of use, as before.

>>> from superopt.ir import GraphBuilder, Rule
>>> def side(swap):
...     b = GraphBuilder(); x, y = b.input("x", (3, 4)), b.input("y", (4,))
...     return b.build([b.op("add", *((y, x) if swap else (x, y)))])
>>> rank_plan(Rule(side(False), side(True)))
(('x',), 2)
"""

from __future__ import annotations

from ..errors import SuperoptError
from ..ir.graph import Graph, GraphBuilder
from ..ir.ops import attrs_carrying, get_op
from ..ir.rule import Rule

__all__ = ["batch_inputs", "lift_graph", "lift_rule", "rank_plan", "LiftError"]

#: operators that map a lifted operand through per batch element, beyond the elementwise ones
_PER_BATCH = frozenset({"matmul", "concat", "split", "transpose", "softmax", "layernorm", "smul"})


class LiftError(SuperoptError):
    """The rule is not over batch-generic operators: it cannot be lifted to more leading axes."""


def batch_inputs(rule: Rule) -> tuple[str, ...]:
    """The rule's inputs of the largest rank, in name order (the ones a lift gives new axes)."""
    ranks = {}
    for g in (rule.lhs, rule.rhs):
        for i in g.inputs:
            ranks[g.nodes[i].name] = g.nodes[i].types[0].rank
    top = max(ranks.values(), default=0)
    return tuple(sorted(n for n, r in ranks.items() if r == top and r > 0))


def _shift(value, carries: str, k: int):
    if carries == "axis":
        return value + k
    return tuple(range(k)) + tuple(p + k for p in value)


def _node_attrs(n, lifted: list[bool], ranks: list[int], k: int) -> tuple[dict, str]:
    """The node's attributes under the lift and the role the prefix plays for it, or LiftError."""
    opdef = get_op(n.op)
    if not any(lifted):
        return dict(n.attrs), ""
    if not (opdef.elementwise or n.op in _PER_BATCH):
        raise LiftError(f"{n.op} does not map extra leading axes through per batch element")
    role = "batch"
    if opdef.elementwise and not all(lifted):
        if any(r > max(q for q, f in zip(ranks, lifted) if f) for r, f in zip(ranks, lifted) if not f):
            raise LiftError(f"{n.op}: an unlifted operand is of a higher rank than the lifted one")
        role = "batch+broadcast"  # a batch axis of the lifted operand and a broadcast one of the others
    if n.op == "matmul" and lifted[1] and ranks[1] < 2:
        raise LiftError("matmul: a lifted right operand must be a matrix")
    if n.op == "concat" and not all(lifted):
        raise LiftError("concat of lifted and unlifted pieces")
    if n.op == "smul" and lifted[1]:
        raise LiftError("smul: the scalar cannot be lifted")
    if n.op == "matmul" and not all(lifted):
        role = "batch+broadcast"
    attrs = dict(n.attrs)
    for name in attrs_carrying(n.op, "axis", "perm"):
        attrs[name] = _shift(attrs[name], opdef.attr_index[name].carries, k)
    return attrs, role


def lift_graph(g: Graph, names, k: int, size: int = 2) -> tuple[Graph, tuple[bool, ...], set[str]]:
    """``g`` with the inputs ``names`` given ``k`` leading axes of ``size``: the lifted graph,
    whether each output is lifted, and the roles the prefix plays; LiftError outside the class."""
    b, refs, lifted, roles = GraphBuilder(), {}, {}, set()
    for i, n in enumerate(g.nodes):
        if n.name is not None:
            up = n.name in names
            shape = (size,) * k + n.types[0].shape if up else n.types[0].shape
            refs[(i, 0)] = (b.input if n.op == "input" else b.weight)(n.name, shape)
            lifted[(i, 0)] = up
            continue
        flags = [lifted[(r.node, r.index)] for r in n.inputs]
        ranks = [g.nodes[r.node].types[r.index].rank for r in n.inputs]
        attrs, role = _node_attrs(n, flags, ranks, k)
        if role:
            roles.update(role.split("+"))
        try:
            out = b.add(n.op, [refs[(r.node, r.index)] for r in n.inputs], attrs)
        except SuperoptError as e:
            raise LiftError(f"lifted by {k}: {e}") from None
        for j, ref in enumerate(out):
            refs[(i, j)], lifted[(i, j)] = ref, any(flags)
    outs = [refs[(r.node, r.index)] for r in g.outputs]
    return b.build(outs), tuple(lifted[(r.node, r.index)] for r in g.outputs), roles


def lift_rule(rule: Rule, k: int, names=None) -> Rule:
    """The rule with its batch inputs given ``k`` leading axes; LiftError outside the class."""
    names = batch_inputs(rule) if names is None else tuple(names)
    lhs, lo, _ = lift_graph(rule.lhs, names, k)
    rhs, ro, _ = lift_graph(rule.rhs, names, k)
    if lo != ro:
        raise LiftError("an output is lifted on one side only")
    return Rule(lhs, rhs)


def rank_plan(rule: Rule) -> tuple[tuple[str, ...], int] | str:
    """``(batch inputs, rank bound)`` of a rule over batch-generic operators, else why not: the
    bound is the number of distinct roles the prefix axes play (see the module docstring)."""
    names = batch_inputs(rule)
    if not names:
        return "no input to lift"
    try:
        roles, outs = set(), []
        for g in (rule.lhs, rule.rhs):
            _, flags, r = lift_graph(g, names, 1)
            roles |= r
            outs.append(flags)
    except LiftError as e:
        return str(e)
    if outs[0] != outs[1]:
        return "an output is lifted on one side only"
    if not any(outs[0]):
        return "no output depends on the lifted inputs"
    return names, max(1, len(roles))
