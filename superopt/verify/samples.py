"""Rule sets for testing and benchmarking the verifier without the generator.

* :func:`instance_rules`: each axiom's own instances (both directions), which must be proven
  with that axiom in the core;
* :func:`composed_rules`: hand-made multi-step rules in the style of TASO's (fusing
  convolutions and matmuls, moving transposes, splitting merged operators) and a few wrong ones;
* :func:`enumerated_rules`: a tiny stand-in for the generator: every graph of up to ``max_ops``
  operators over two inputs, bucketed by fingerprint (field semantics); each bucket gives
  candidate rules, as ``superopt generate`` does at N <= 2.

>>> len(composed_rules()) > 20
True
"""

from __future__ import annotations

import itertools

import numpy as np

from ..axioms.instantiate import sample_instances
from ..errors import SuperoptError
from ..ir.graph import GraphBuilder
from ..ir.rule import Rule
from ..semantics.field import Field

__all__ = ["instance_rules", "composed_rules", "enumerated_rules", "WRONG", "STEP_OPS"]


def instance_rules(axioms, seed: int = 0, per_axiom: int = 2) -> list[tuple[str, Rule]]:
    """``(axiom name, rule)`` for instances of every axiom, in both directions."""
    rng = np.random.default_rng(seed)
    out = []
    for ax in axioms:
        for _, _, rule in sample_instances(ax, rng, want=per_axiom):
            out += [(ax.name, rule), (ax.name, rule.reversed())]
    return out


def _rule(sources: dict, left, right) -> Rule:
    sides = []
    for f in (left, right):
        b = GraphBuilder()
        refs = {n: b.input(n, s) for n, s in sources.items()}
        out = f(b, **refs)
        sides.append(b.build(list(out) if isinstance(out, (list, tuple)) and not hasattr(out, "node") else [out]))
    return Rule(*sides)


def _t(b, x):
    return b.op("transpose", x, perm=(1, 0))


MAT = dict(x=(2, 3), y=(3, 4), z=(3, 4))
IMG = dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), v=(3, 2, 3, 3))

#: names of the composed rules that are false (must never be proven)
WRONG = ("wrong_add_mul", "wrong_relu_add", "wrong_matmul_comm", "wrong_concat_swap")


def _matmul_rules():
    mm = lambda b, a, c: b.op("matmul", a, c)
    return {
        "matmul_add_comm": _rule(MAT, lambda b, x, y, z: mm(b, x, b.op("add", y, z)),
                                 lambda b, x, y, z: b.op("add", mm(b, x, z), mm(b, x, y))),
        "transpose_twice_matmul": _rule(dict(x=(2, 3), y=(3, 4)), lambda b, x, y: _t(b, _t(b, mm(b, x, y))),
                                        lambda b, x, y: mm(b, x, y)),
        "transpose_matmul_swap": _rule(dict(x=(2, 3), y=(3, 2)), lambda b, x, y: _t(b, mm(b, _t(b, x), _t(b, y))),
                                       lambda b, x, y: mm(b, y, x)),
        "matmul_split_merge": _rule(dict(x=(2, 3), y=(3, 4), z=(3, 5)),
                                    lambda b, x, y, z: (mm(b, x, y), mm(b, x, z)),
                                    lambda b, x, y, z: b.op("split", mm(b, x, b.op("concat", y, z, axis=1)),
                                                            axis=1, sizes=(4, 5))),
        "matmul_merge_concat": _rule(dict(x=(2, 2), y=(2, 3), z=(2, 2), w=(2, 3)),
                                     lambda b, x, y, z, w: b.op("add", mm(b, x, y), mm(b, z, w)),
                                     lambda b, x, y, z, w: mm(b, b.op("concat", z, x, axis=1),
                                                              b.op("concat", w, y, axis=0))),
        "matmul_assoc_transpose": _rule(dict(x=(2, 3), y=(3, 4), z=(4, 2)),
                                        lambda b, x, y, z: _t(b, mm(b, mm(b, x, y), z)),
                                        lambda b, x, y, z: mm(b, _t(b, z), mm(b, _t(b, y), _t(b, x)))),
        "smul_matmul_move": _rule(dict(x=(2, 3), y=(3, 4), s=()),
                                  lambda b, x, y, s: mm(b, b.op("smul", x, s), y),
                                  lambda b, x, y, s: mm(b, x, b.op("smul", y, s))),
        "wrong_matmul_comm": _rule(dict(x=(3, 3), y=(3, 3)), lambda b, x, y: mm(b, x, y), lambda b, x, y: mm(b, y, x)),
    }


def _conv_rules():
    cv = lambda b, x, w, **k: b.op("conv2d", x, w, **k)
    return {
        "conv_fuse_kernels": _rule(IMG, lambda b, x, w, v: b.op("add", cv(b, x, w, padding=(1, 1)),
                                                                 cv(b, x, v, padding=(1, 1))),
                                   lambda b, x, w, v: cv(b, x, b.op("add", w, v), padding=(1, 1))),
        "conv_relu_concat": _rule(dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), v=(4, 2, 3, 3)),
                                  lambda b, x, w, v: b.op("relu", b.op("concat", cv(b, x, w), cv(b, x, v), axis=1)),
                                  lambda b, x, w, v: cv(b, x, b.op("concat", w, v, axis=0), activation="relu")),
        "conv_split_merge": _rule(dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), v=(4, 2, 3, 3)),
                                  lambda b, x, w, v: (cv(b, x, w, padding=(1, 1), activation="relu"),
                                                      cv(b, x, v, padding=(1, 1), activation="relu")),
                                  lambda b, x, w, v: b.op("split", cv(b, x, b.op("concat", w, v, axis=0),
                                                                      padding=(1, 1), activation="relu"),
                                                          axis=1, sizes=(3, 4))),
        "conv_enlarge_fuse": _rule(dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), v=(3, 2, 1, 1)),
                                   lambda b, x, w, v: b.op("add", cv(b, x, w, padding=(1, 1)), cv(b, x, v)),
                                   lambda b, x, w, v: cv(b, x, b.op("add", w, b.op("enlarge", v, kernel=(3, 3))),
                                                         padding=(1, 1))),
        "conv_batch_merge": _rule(dict(x=(1, 2, 5, 5), y=(2, 2, 5, 5), w=(3, 2, 3, 3)),
                                  lambda b, x, y, w: b.op("concat", cv(b, x, w), cv(b, y, w), axis=0),
                                  lambda b, x, y, w: cv(b, b.op("concat", x, y, axis=0), w)),
        "conv_input_fuse": _rule(dict(x=(1, 2, 5, 5), y=(1, 2, 5, 5), w=(3, 2, 3, 3)),
                                 lambda b, x, y, w: b.op("relu", b.op("add", cv(b, x, w), cv(b, y, w))),
                                 lambda b, x, y, w: cv(b, b.op("add", y, x), w, activation="relu")),
        "conv_identity": _rule(dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3)),
                               lambda b, x, w: cv(b, cv(b, x, b.op("identity_conv", channels=2, kernel=(3, 3)),
                                                    padding=(1, 1)), w),
                               lambda b, x, w: cv(b, x, w)),
        "avgpool_as_conv_concat": _rule(dict(x=(1, 2, 5, 5), y=(1, 3, 5, 5)),
                                        lambda b, x, y: b.op("avgpool2d", b.op("concat", x, y, axis=1),
                                                             kernel=(3, 3), padding=(1, 1)),
                                        lambda b, x, y: b.op("concat", b.op("avgpool2d", x, kernel=(3, 3),
                                                                            padding=(1, 1)),
                                                             cv(b, y, b.op("pool_kernel", channels=3, kernel=(3, 3)),
                                                                padding=(1, 1), groups=3), axis=1)),
        "wrong_relu_add": _rule(dict(x=(2, 3), y=(2, 3)), lambda b, x, y: b.op("relu", b.op("add", x, y)),
                                lambda b, x, y: b.op("add", b.op("relu", x), b.op("relu", y))),
    }


def _elementwise_rules():
    return {
        "add_assoc_comm4": _rule(dict(a=(2,), c=(2,), d=(2,), e=(2,)),
                                 lambda b, a, c, d, e: b.op("add", b.op("add", a, c), b.op("add", d, e)),
                                 lambda b, a, c, d, e: b.op("add", e, b.op("add", d, b.op("add", c, a)))),
        "factor_common": _rule(dict(x=(2, 3), y=(2, 3), z=(2, 3)),
                               lambda b, x, y, z: b.op("add", b.op("mul", z, x), b.op("mul", y, z)),
                               lambda b, x, y, z: b.op("mul", z, b.op("add", y, x))),
        "relu_transpose_concat": _rule(dict(x=(2, 3), y=(2, 3)),
                                       lambda b, x, y: b.op("relu", _t(b, b.op("concat", x, y, axis=0))),
                                       lambda b, x, y: b.op("concat", _t(b, b.op("relu", x)),
                                                            _t(b, b.op("relu", y)), axis=1)),
        "split_concat_roundtrip": _rule(dict(x=(2, 3), y=(4, 3)),
                                        lambda b, x, y: b.op("split", b.op("concat", x, y, axis=0), axis=0, sizes=(2, 4)),
                                        lambda b, x, y: (x, y)),
        "concat_grid": _rule(dict(x=(2, 2), y=(2, 3), z=(1, 2), w=(1, 3)),
                             lambda b, x, y, z, w: b.op("concat", b.op("concat", x, y, axis=1),
                                                        b.op("concat", z, w, axis=1), axis=0),
                             lambda b, x, y, z, w: b.op("concat", b.op("concat", x, z, axis=0),
                                                        b.op("concat", y, w, axis=0), axis=1)),
        "transpose_add_mul": _rule(dict(x=(2, 3), y=(2, 3), z=(2, 3)),
                                   lambda b, x, y, z: _t(b, b.op("mul", b.op("add", x, y), z)),
                                   lambda b, x, y, z: b.op("mul", b.op("add", _t(b, y), _t(b, x)), _t(b, z))),
        "scalar_through_concat": _rule(dict(x=(2, 3), y=(2, 3), s=()),
                                       lambda b, x, y, s: b.op("smul", b.op("concat", x, y, axis=1), s),
                                       lambda b, x, y, s: b.op("concat", b.op("smul", x, s), b.op("smul", y, s),
                                                               axis=1)),
        "matmul_identity_ones": _rule(dict(x=(2, 3)),
                                      lambda b, x: b.op("mul", b.op("matmul", x, b.op("identity_matrix", n=3)),
                                                        b.op("ones", shape=(2, 3))),
                                      lambda b, x: x),
        "wrong_add_mul": _rule(dict(x=(2, 3), y=(2, 3)), lambda b, x, y: b.op("add", x, y),
                               lambda b, x, y: b.op("mul", x, y)),
        "wrong_concat_swap": _rule(dict(x=(2, 3), y=(2, 3)), lambda b, x, y: b.op("concat", x, y, axis=0),
                                   lambda b, x, y: b.op("concat", y, x, axis=0)),
        # true (the cut at 2 falls inside x): split_concat_inside_first_0 proves it
        "split_inside_first_piece": _rule(dict(x=(2, 3), y=(2, 3)),
                                   lambda b, x, y: b.op("split", b.op("concat", x, y, axis=1), axis=1, sizes=(2, 4))[0],
                                   lambda b, x, y: b.op("split", x, axis=1, sizes=(2, 1))[0]),
    }


def composed_rules() -> dict[str, Rule]:
    """Named multi-step rules; the names in :data:`WRONG` are false."""
    return {**_matmul_rules(), **_conv_rules(), **_elementwise_rules()}


#: the operators the stand-in enumerator applies: name -> (operator, arity, attributes)
STEP_OPS = {"add": ("add", 2, {}), "mul": ("mul", 2, {}), "matmul": ("matmul", 2, {}), "relu": ("relu", 1, {}),
            "transpose": ("transpose", 1, {"perm": (1, 0)}), "concat0": ("concat", 2, {"axis": 0}),
            "concat1": ("concat", 2, {"axis": 1})}


def _graphs(max_ops: int, ops):
    """Every graph of up to ``max_ops`` operators over inputs x, y, as lists of steps."""
    frontier = [[]]
    for _ in range(max_ops):
        nxt = []
        for steps in frontier:
            for name in ops:
                for args in itertools.product(range(2 + len(steps)), repeat=STEP_OPS[name][1]):
                    nxt.append(steps + [(name, args)])
        yield from nxt
        frontier = nxt


def _build(shape, steps):
    b = GraphBuilder()
    vals = [b.input("x", shape), b.input("y", shape)]
    for name, args in steps:
        op, _, attrs = STEP_OPS[name]
        vals.append(b.op(op, *[vals[i] for i in args], **attrs))
    return b.build([vals[-1]])


def enumerated_rules(max_ops: int = 2, ops=("add", "mul", "matmul", "transpose", "relu"),
                     shape=(2, 2), seed: int = 0) -> list[Rule]:
    """Candidate rules: graphs with equal fingerprints (each bucket: first graph => others);
    ``ops`` are names of :data:`STEP_OPS`."""
    field, rng = Field(seed), np.random.default_rng(seed)
    env = None
    buckets: dict[tuple, list] = {}
    for steps in _graphs(max_ops, ops):
        if len(steps) > 1 and any(all(i != 2 + j for s in steps[j + 1:] for i in s[1]) for j in range(len(steps) - 1)):
            continue  # a dead intermediate value
        try:
            g = _build(shape, steps)
        except SuperoptError:
            continue
        env = env or field.random_inputs(g, rng)
        (out,) = field.evaluate(g, env)
        buckets.setdefault((out.shape, out.tobytes()), {}).setdefault(g.key(), g)
    rules, seen = [], set()
    for graphs in buckets.values():
        gs = list(graphs.values())
        for other in gs[1:]:
            r = Rule(gs[0], other)
            if r.id not in seen:
                seen.add(r.id)
                rules.append(r)
    return rules
