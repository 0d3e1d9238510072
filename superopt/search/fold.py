"""Weight folding: compute at compile time what depends only on weights and constants.

Every operator whose inputs are all weights with data, constants, or values folded already
is evaluated with the float64 reference semantics; the values the rest of the graph uses
become new weights (stored in the dtype of the value, float32 for models), named
``folded_<k>``. Operators that only move values (:data:`EXACT_IN_OWN_DTYPE`: concat, split,
reshape, ...) run in their inputs' own dtype, which gives the same bits as float64 and back at a
fraction of the memory traffic (Llama-3-8B's merged gate/up weights: 470 MB of float32 instead of
940 MB of float64 made and cast back), and so does a product of two float32 values that only
moves on to a float32 weight (rounded once either way); other arithmetic gets float64 inputs,
and its result, where it only moves on to float32 weights, is rounded to float32 at once (the
batch-norm scale folded into a convolution's weights, then concatenated and padded in float32). Weights no operator uses
any more are dropped. Weights without data (as in
rules and tests) cannot be folded: what depends on them stays (it still costs nothing in the
search, which prices compile-time values at zero).

>>> import numpy as np
>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (2, 3))
>>> w1 = b.weight("w1", data=np.ones((3, 2), np.float32)); w2 = b.weight("w2", data=np.ones((3, 2), np.float32))
>>> g = b.build([b.op("matmul", x, b.op("concat", w1, w2, axis=1))])
>>> f = fold_constants(g)
>>> [n.op for n in f.nodes], f.data["folded_0"].shape
(['weight', 'input', 'matmul'], (3, 4))
"""

from __future__ import annotations

import numpy as np

from ..cost.model import is_constant_op
from ..ir.graph import Graph, GraphBuilder, Ref
from ..semantics.reference import REFERENCE

__all__ = ["fold_constants", "foldable_nodes", "EXACT_IN_OWN_DTYPE", "ROUNDED_ONCE"]

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": np.float32,
              "int64": np.int64, "bool": np.bool_}

#: operators whose reference semantics only select, copy or pad with zeros the values of their
#: inputs: evaluated in the inputs' own dtype, they give exactly what float64 and back gives
EXACT_IN_OWN_DTYPE = frozenset({"concat", "split", "reshape", "transpose", "slice", "expand", "enlarge"})

#: operators whose result on two float32 operands, computed in float32, is their float64 result
#: rounded once to float32 (the product of two float32 values is exact in float64): evaluated so
#: where that value only moves on to a float32 weight (:func:`_rounded_once_ok`)
ROUNDED_ONCE = frozenset({"mul"})

#: REFERENCE's "mul" and "add" as the numpy ufuncs they are, run in float64 with numpy casting the
#: operands as it goes (no float64 copy of a float32 weight first) and, where the result is
#: rounded to float32 anyway, casting it into a float32 array as it goes: the same values
_UFUNCS = {"mul": np.multiply, "add": np.add}


def foldable_nodes(g: Graph) -> set[int]:
    """Operators computable at compile time: inputs all weights with data, constants or foldable."""
    ok: set[int] = set()
    for i, n in enumerate(g.nodes):
        if n.op == "weight":
            if n.name in g.data:
                ok.add(i)
        elif is_constant_op(n) or (n.inputs and n.opdef.kind == "compute" and all(r.node in ok for r in n.inputs)):
            ok.add(i)
    return ok


def _frontier(g: Graph, ok: set[int]) -> list[Ref]:
    """Folded values that a non-folded operator or a graph output uses (operators only)."""
    used = set()
    for i, n in enumerate(g.nodes):
        if i not in ok:
            used.update(r for r in n.inputs if r.node in ok)
    used.update(r for r in g.outputs if r.node in ok)
    return sorted(r for r in used if g.nodes[r.node].op != "weight")


def _rounded_once_ok(g: Graph, need: set[int], wanted: list[Ref]) -> set[int]:
    """Nodes whose values reach the folded weights through layout operators only, each as a
    float32 weight: rounding such a value to float32 where it is computed gives the bits that
    rounding its float64 value at the end gives."""
    f32 = {r for r in wanted if _NP_DTYPES.get(g.type_of(r).dtype, np.float32) is np.float32}
    users: dict[int, list[int]] = {}
    for j in need:
        for r in g.nodes[j].inputs:
            users.setdefault(r.node, []).append(j)
    wanted_set, ok = set(wanted), set()
    for i in sorted(need, reverse=True):
        outs = [Ref(i, k) for k in range(len(g.nodes[i].types))]
        if any(r in wanted_set and r not in f32 for r in outs):
            continue
        if all(g.nodes[j].op in EXACT_IN_OWN_DTYPE and j in ok for j in users.get(i, ())):
            ok.add(i)
    return ok


def _own_dtype(n, i: int, args: list, rounded_ok: set[int]) -> bool:
    """Whether ``n`` (node ``i``) is evaluated on ``args`` as they are, not in float64."""
    if n.op in EXACT_IN_OWN_DTYPE:
        return len({a.dtype for a in args}) == 1
    return n.op in ROUNDED_ONCE and i in rounded_ok and all(a.dtype == np.float32 for a in args)


def _evaluate(g: Graph, ok: set[int], wanted: list[Ref]) -> dict[Ref, np.ndarray]:
    vals: dict[int, tuple] = {}
    need = set(r.node for r in wanted)
    for i in range(len(g.nodes) - 1, -1, -1):
        if i in need:
            need.update(r.node for r in g.nodes[i].inputs)
    rounded_ok = _rounded_once_ok(g, need, wanted)
    for i, n in enumerate(g.nodes):
        if i not in need:
            continue
        if n.op == "weight":
            vals[i] = (np.asarray(g.data[n.name]),)  # in its own dtype until arithmetic needs float64
        else:
            vals[i] = _compute(n, i, [vals[r.node][r.index] for r in n.inputs], rounded_ok)
    return {r: vals[r.node][r.index] for r in wanted}


def _compute(n, i: int, args: list, rounded_ok: set[int]) -> tuple:
    """Node ``i``'s values: in its inputs' dtype (:func:`_own_dtype`), else in float64; where they
    only move on to float32 weights (``rounded_ok``), rounded to float32 at once, as at the end."""
    rounded = i in rounded_ok and n.op not in EXACT_IN_OWN_DTYPE
    if _own_dtype(n, i, args, rounded_ok):
        out = REFERENCE[n.op](n.attr, *args)
    elif n.op in _UFUNCS and len(args) == 2:
        dest = np.empty(np.broadcast_shapes(args[0].shape, args[1].shape), np.float32) if rounded else None
        out = _UFUNCS[n.op](*args, out=dest, dtype=np.float64, casting="unsafe")
    else:
        out = REFERENCE[n.op](n.attr, *(np.asarray(a, dtype=np.float64) for a in args))
    out = out if isinstance(out, tuple) else (out,)
    if rounded:
        out = tuple(v.astype(np.float32) if v.dtype == np.float64 else v for v in out)
    return out


def fold_constants(g: Graph) -> Graph:
    """``g`` with its compile-time operators replaced by weights (see the module docstring)."""
    ok = foldable_nodes(g)
    wanted = _frontier(g, ok)
    if not wanted:
        return _drop_unused_weights(g)
    values = _evaluate(g, ok, wanted)
    taken = {id(a) for a in g.data.values()}
    names = set(g.by_name)
    b = GraphBuilder()
    remap: dict[Ref, Ref] = {}
    k = 0
    for r in wanted:
        while f"folded_{k}" in names:
            k += 1
        t = g.type_of(r)
        remap[r] = b.weight(f"folded_{k}", t.shape, _fresh(values[r], _NP_DTYPES.get(t.dtype, np.float32), taken),
                            t.dtype)
        names.add(f"folded_{k}")
    for i, n in enumerate(g.nodes):
        if i in ok and n.op != "weight":
            continue
        b.copy_nodes(g, [i], remap)
    return _drop_unused_weights(b.build([remap[r] for r in g.outputs]))


def _fresh(v: np.ndarray, dtype, taken: set[int]) -> np.ndarray:
    """``v`` as a new weight's data in ``dtype``: itself where it is an array of that dtype made
    by the fold and given to no other weight (``taken``: ids of those given), else a copy."""
    if v.dtype == dtype and v.flags.owndata and id(v) not in taken:
        taken.add(id(v))
        return v
    return v.astype(dtype)


def _drop_unused_weights(g: Graph) -> Graph:
    g = g.prune()
    used = {r.node for n in g.nodes for r in n.inputs} | {r.node for r in g.outputs}
    keep = [i for i, n in enumerate(g.nodes) if n.op != "weight" or i in used]
    if len(keep) == len(g.nodes):
        return g
    b = GraphBuilder()
    remap = b.copy_nodes(g, keep)
    return b.build([remap[r] for r in g.outputs])
