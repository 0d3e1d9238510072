"""The classic substitutions every generation over TASO's operators must find, as rules.

Each entry names the operators and input tensors it needs and the smallest N that finds it, so
tests can run each one on a small operator set and scripts can check a full run.
:func:`find_classics` compares up to renaming, direction and the order of the outputs.

>>> ops, inputs, n, rule = CLASSICS["Tr Tr x -> x"]
>>> find_classics([rule.reversed()])["Tr Tr x -> x"]
True
"""

from __future__ import annotations

import itertools

from ..ir import GraphBuilder, Rule

__all__ = ["CLASSICS", "find_classics", "rule_ids"]

_IMG, _KER, _X, _W = (2, 4, 5, 5), (4, 4, 3, 3), (2, 4), (4, 4)


def _graph(inputs, body):
    b = GraphBuilder()
    refs = {n: b.input(n, s) for n, s in inputs}
    out = body(b, refs)
    return b.build(out if isinstance(out, list) else [out])


def _conv(b, x, w, **kw):
    return b.op("conv2d", x, w, padding=(1, 1), **kw)


def _halves(b, ref, axis):
    return list(b.op("split", ref, axis=axis, sizes=(4, 4)))


def _build() -> dict:
    img = [("x", _IMG), ("w1", _KER), ("w2", _KER)]
    mm2 = [("x", _X), ("w1", _W), ("w2", _W)]
    cat = [("x", _X), ("y", _W), ("z", _X), ("w", _W)]
    xyz = [("x", _X), ("y", _X), ("z", _X)]
    tr = lambda b, x: b.op("transpose", x, perm=(1, 0))  # noqa: E731
    two_convs = lambda b, r: [_conv(b, r["x"], r["w1"]), _conv(b, r["x"], r["w2"])]  # noqa: E731
    one_conv = lambda b, r: _halves(b, _conv(b, r["x"], b.op("concat", r["w1"], r["w2"], axis=0)), 1)  # noqa: E731
    return {
        "relu(conv) -> conv with fused relu": ("conv2d,relu", "x=2x4x5x5,w1=4x4x3x3:w", 2, Rule(
            _graph(img[:2], lambda b, r: b.op("relu", _conv(b, r["x"], r["w1"]))),
            _graph(img[:2], lambda b, r: _conv(b, r["x"], r["w1"], activation="relu")))),
        "two matmuls on one input -> one matmul and split": ("matmul,concat,split", "x=2x4,w1=4x4:w,w2=4x4:w", 3, Rule(
            _graph(mm2, lambda b, r: [b.op("matmul", r["x"], r["w1"]), b.op("matmul", r["x"], r["w2"])]),
            _graph(mm2, lambda b, r: _halves(b, b.op("matmul", r["x"], b.op("concat", r["w1"], r["w2"], axis=1)), 1)))),
        "conv + conv -> conv of summed kernels": ("conv2d,add", "x=2x4x5x5,w1=4x4x3x3:w,w2=4x4x3x3:w", 3, Rule(
            _graph(img, lambda b, r: b.op("add", _conv(b, r["x"], r["w1"]), _conv(b, r["x"], r["w2"]))),
            _graph(img, lambda b, r: _conv(b, r["x"], b.op("add", r["w1"], r["w2"]))))),
        "two convs on one input -> one conv and split": ("conv2d,concat,split", "x=2x4x5x5,w1=4x4x3x3:w,w2=4x4x3x3:w",
                                                         3, Rule(_graph(img, two_convs), _graph(img, one_conv))),
        "Tr Tr x -> x": ("transpose", "x=2x4", 2, Rule(
            _graph([("x", _X)], lambda b, r: tr(b, tr(b, r["x"]))), _graph([("x", _X)], lambda b, r: r["x"]))),
        "mm + mm -> mm of concatenations": ("matmul,add,concat", "x=2x4,z=2x4,y=4x4:w,w=4x4:w", 3, Rule(
            _graph(cat, lambda b, r: b.op("add", b.op("matmul", r["x"], r["y"]), b.op("matmul", r["z"], r["w"]))),
            _graph(cat, lambda b, r: b.op("matmul", b.op("concat", r["x"], r["z"], axis=1),
                                          b.op("concat", r["y"], r["w"], axis=0))))),
        "(x + y) * z -> x * z + y * z": ("add,mul", "x=2x4,y=2x4,z=2x4", 3, Rule(
            _graph(xyz, lambda b, r: b.op("mul", b.op("add", r["x"], r["y"]), r["z"])),
            _graph(xyz, lambda b, r: b.op("add", b.op("mul", r["x"], r["z"]), b.op("mul", r["y"], r["z"]))))),
    }


#: name -> (operators, inputs, N, rule): the classics of the issue, smallest operator sets
CLASSICS: dict[str, tuple] = _build()


def rule_ids(rule: Rule) -> set[str]:
    """Ids of ``rule`` in both directions and in every consistent order of its outputs."""
    out = set()
    for perm in itertools.permutations(range(len(rule.lhs.outputs))):
        r = Rule(rule.lhs.with_outputs([rule.lhs.outputs[i] for i in perm]),
                 rule.rhs.with_outputs([rule.rhs.outputs[i] for i in perm]))
        out |= {r.id, r.reversed().id}
    return out


def find_classics(rules) -> dict[str, bool]:
    """For each classic, whether ``rules`` holds it (up to renaming, direction, output order)."""
    have = set().union(*(rule_ids(r) for r in rules)) if rules else set()
    return {name: bool(rule_ids(rule) & have) for name, (_, _, _, rule) in CLASSICS.items()}
