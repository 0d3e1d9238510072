"""Textbook rewrites written by hand: examples for ``superopt optimize --example-rules`` and tests.

These are the wins every graph compiler wants (fuse a relu into a convolution, merge two
matmuls or convolutions of one input, fold a batch norm into a convolution, move a bias or an
activation across a split). They are *not* shipped in ``rules/default.db``: the generator finds
each of them (or, for the batch-norm fold, the search composes it from generated rules and the
one curated rule of :mod:`superopt.rules.curated`), and the database credits the generated
rule. They stay as small, readable fixtures; ``superopt optimize --example-rules`` verifies them
before applying them, and an unproven one is never applied. Each is a :class:`~superopt.ir.Rule`
at small shapes, so they exercise the re-derivation of sizes exactly as generated rules do.

>>> rules = example_rules()
>>> len(rules) > 10
True
>>> fuse_conv_relu().text()
"relu(conv2d[padding=(1,1)](x, w)) => conv2d[activation='relu', padding=(1,1)](x, w)"
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..ir.graph import GraphBuilder, Ref
from ..ir.rule import Rule

__all__ = ["example_rules", "fuse_conv_relu", "merge_matmuls", "merge_convs", "fold_conv_batchnorm",
           "merge_split_bias", "merge_split_unary", "merge_convs_enlarged", "concat_of_split", "CONV_SETTINGS"]

#: (stride, padding, kernel) of the convolution rules
CONV_SETTINGS = (((1, 1), (0, 0), 1), ((1, 1), (1, 1), 3), ((2, 2), (0, 0), 1), ((2, 2), (1, 1), 3))
_N, _C, _O, _HW = 1, 6, 4, 8


def _rule(sources: Sequence[tuple], lhs: Callable, rhs: Callable) -> Rule:
    """``sources``: (name, shape, 'input'|'weight'); ``lhs``/``rhs``: (builder, vars) -> outputs."""
    def side(f):
        b = GraphBuilder()
        v = {name: (b.input if kind == "input" else b.weight)(name, shape) for name, shape, kind in sources}
        out = f(b, v)
        return b.build([out] if isinstance(out, Ref) else list(out))
    return Rule(side(lhs), side(rhs))


def _conv_sources(kernel: int, weights=("w",)) -> list[tuple]:
    return [("x", (_N, _C, _HW, _HW), "input")] + [(w, (_O, _C, kernel, kernel), "weight") for w in weights]


def fuse_conv_relu(stride=(1, 1), padding=(1, 1), kernel=3) -> Rule:
    """relu(conv(x, w)) => conv(x, w, activation=relu)."""
    a = dict(stride=stride, padding=padding)
    return _rule(_conv_sources(kernel), lambda b, v: b.op("relu", b.op("conv2d", v["x"], v["w"], **a)),
                 lambda b, v: b.op("conv2d", v["x"], v["w"], activation="relu", **a))


def merge_matmuls(rank: int = 2) -> Rule:
    """matmul(x, w1), matmul(x, w2) => the two pieces of matmul(x, concat(w1, w2))."""
    x_shape = (2, 6) if rank == 2 else (1,) * (rank - 2) + (2, 6)
    src = [("x", x_shape, "input"), ("w1", (6, 4), "weight"), ("w2", (6, 4), "weight")]

    def rhs(b, v):
        y = b.op("matmul", v["x"], b.op("concat", v["w1"], v["w2"], axis=1))
        return b.op("split", y, axis=rank - 1, sizes=(4, 4))
    return _rule(src, lambda b, v: [b.op("matmul", v["x"], v["w1"]), b.op("matmul", v["x"], v["w2"])], rhs)


def merge_convs(stride=(1, 1), padding=(0, 0), kernel=1) -> Rule:
    """conv(x, w1), conv(x, w2) => the two pieces of conv(x, concat(w1, w2)) (channels)."""
    a = dict(stride=stride, padding=padding)

    def rhs(b, v):
        y = b.op("conv2d", v["x"], b.op("concat", v["w1"], v["w2"], axis=0), **a)
        return b.op("split", y, axis=1, sizes=(_O, _O))
    return _rule(_conv_sources(kernel, ("w1", "w2")),
                 lambda b, v: [b.op("conv2d", v["x"], v["w1"], **a), b.op("conv2d", v["x"], v["w2"], **a)], rhs)


def merge_convs_enlarged(kernel: int = 3) -> Rule:
    """conv1x1(x, w1), conv kxk(x, w2) => pieces of conv kxk(x, concat(enlarge(w1), w2)) (TASO)."""
    pad = (kernel // 2, kernel // 2)
    src = [("x", (_N, _C, _HW, _HW), "input"), ("w1", (_O, _C, 1, 1), "weight"), ("w2", (_O, _C, kernel, kernel), "weight")]

    def lhs(b, v):
        return [b.op("conv2d", v["x"], v["w1"]), b.op("conv2d", v["x"], v["w2"], padding=pad)]

    def rhs(b, v):
        w = b.op("concat", b.op("enlarge", v["w1"], kernel=(kernel, kernel)), v["w2"], axis=0)
        return b.op("split", b.op("conv2d", v["x"], w, padding=pad), axis=1, sizes=(_O, _O))
    return _rule(src, lhs, rhs)


def concat_of_split(axis: int = 1) -> Rule:
    """concat(pieces of split(y)) => y."""
    src = [("y", (_N, 2 * _O, _HW, _HW), "input")]
    return _rule(src, lambda b, v: b.op("concat", *b.op("split", v["y"], axis=axis, sizes=(_O, _O)), axis=axis),
                 lambda b, v: v["y"])


def fold_conv_batchnorm(stride=(1, 1), padding=(1, 1), kernel=3) -> Rule:
    """batchnorm(conv(x, w)) => conv(x, w * scale) + shift (axiom batchnorm_conv_fold)."""
    a = dict(stride=stride, padding=padding)
    src = _conv_sources(kernel) + [(n, (_O,), "weight") for n in ("s", "b", "m", "v")]

    def rhs(b, v):
        zero = b.op("zeros", shape=(_O,))
        scale = b.op("batchnorm", b.op("ones", shape=(1, _O)), v["s"], zero, zero, v["v"])
        w = b.op("mul", v["w"], b.op("reshape", scale, shape=(_O, 1, 1, 1)))
        shift = b.op("batchnorm", b.op("zeros", shape=(1, _O)), v["s"], v["b"], v["m"], v["v"])
        return b.op("add", b.op("conv2d", v["x"], w, **a), b.op("reshape", shift, shape=(_O, 1, 1)))
    return _rule(src, lambda b, v: b.op("batchnorm", b.op("conv2d", v["x"], v["w"], **a), v["s"], v["b"], v["m"], v["v"]),
                 rhs)


def merge_split_bias(image: bool = True) -> Rule:
    """add(piece 0, b1), add(piece 1, b2) => the pieces of add(y, concat(b1, b2))."""
    if image:
        y, bias, axis = (_N, 2 * _O, _HW, _HW), (_O, 1, 1), 1
    else:
        y, bias, axis = (1, 2, 2 * _O), (_O,), 2
    src = [("y", y, "input"), ("b1", bias, "weight"), ("b2", bias, "weight")]

    def lhs(b, v):
        p0, p1 = b.op("split", v["y"], axis=axis, sizes=(_O, _O))
        return [b.op("add", p0, v["b1"]), b.op("add", p1, v["b2"])]

    def rhs(b, v):
        return b.op("split", b.op("add", v["y"], b.op("concat", v["b1"], v["b2"], axis=0)), axis=axis, sizes=(_O, _O))
    return _rule(src, lhs, rhs)


def merge_split_unary(op: str = "relu", image: bool = True) -> Rule:
    """op(piece 0), op(piece 1) => the pieces of op(y)."""
    y, axis = ((_N, 2 * _O, _HW, _HW), 1) if image else ((1, 2, 2 * _O), 2)

    def lhs(b, v):
        return [b.op(op, p) for p in b.op("split", v["y"], axis=axis, sizes=(_O, _O))]
    return _rule([("y", y, "input")], lhs,
                 lambda b, v: b.op("split", b.op(op, v["y"]), axis=axis, sizes=(_O, _O)))


def example_rules() -> list[Rule]:
    """All of the above, convolution rules at every setting of :data:`CONV_SETTINGS`."""
    rules = []
    for stride, padding, kernel in CONV_SETTINGS:
        rules += [fuse_conv_relu(stride, padding, kernel), merge_convs(stride, padding, kernel),
                  fold_conv_batchnorm(stride, padding, kernel)]
    rules += [merge_convs_enlarged(3), concat_of_split(1), merge_matmuls(2), merge_matmuls(3), merge_split_bias(True), merge_split_bias(False)]
    rules += [merge_split_unary(op, image) for op in ("relu", "gelu") for image in (True, False)]
    return rules
