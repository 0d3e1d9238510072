"""Hypothesis strategies for random well-formed graphs, shared by the IR and semantics tests."""

from __future__ import annotations

from hypothesis import strategies as st

from superopt.errors import SuperoptError
from superopt.ir import GraphBuilder

__all__ = ["random_graphs", "LINEAR_OPS", "ALL_SIMPLE_OPS"]

#: operators that are exact over the integers (so float64 and the field agree on them)
LINEAR_OPS = ("add", "mul", "matmul", "transpose", "concat", "split", "reshape", "smul")
ALL_SIMPLE_OPS = LINEAR_OPS + ("relu", "sigmoid", "tanh", "gelu", "softmax", "layernorm")


def _try_op(b: GraphBuilder, draw, op, values):
    pick = lambda: values[draw(st.integers(0, len(values) - 1))]
    x = pick()
    shape = b.type_of(x).shape
    if op in ("add", "mul", "matmul"):
        return b.add(op, [x, pick()])
    if op == "smul":
        return b.add(op, [x, b.input(f"s{len(b.nodes)}", ())])
    if op == "transpose":
        return b.add(op, [x], {"perm": tuple(reversed(range(len(shape))))})
    if op == "concat":
        return b.add(op, [x, pick()], {"axis": draw(st.integers(0, max(0, len(shape) - 1)))})
    if op == "split":
        if not shape or shape[-1] < 2:
            raise SuperoptError("too small to split")
        k = draw(st.integers(1, shape[-1] - 1))
        return b.add(op, [x], {"axis": len(shape) - 1, "sizes": (k, shape[-1] - k)})
    if op == "reshape":
        return b.add(op, [x], {"shape": tuple(reversed(shape))})
    if op in ("softmax",):
        return b.add(op, [x], {"axis": 0})
    return b.add(op, [x])


@st.composite
def random_graphs(draw, ops=ALL_SIMPLE_OPS, max_nodes=6, names=("x", "y", "z")):
    """A random graph over 2-3 inputs of shapes [2,2]/[2,3]/[3,2] with up to ``max_nodes`` ops."""
    b = GraphBuilder()
    shapes = [(2, 2), (2, 3), (3, 2)]
    n_in = draw(st.integers(1, len(names)))
    values = [b.input(names[i], shapes[draw(st.integers(0, 2))]) for i in range(n_in)]
    for _ in range(draw(st.integers(1, max_nodes))):
        op = draw(st.sampled_from(ops))
        try:
            values.extend(_try_op(b, draw, op, values))
        except SuperoptError:
            continue
    outs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True))
    return b.build(outs)
