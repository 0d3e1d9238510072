"""The three semantics against each other: field vs float64 on linear graphs, torch vs float64
on every operator, and the properties the fingerprint semantics promises."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphs import LINEAR_OPS, random_graphs
from superopt.ir import GraphBuilder, REGISTRY
from superopt.semantics import P, REFERENCE, Field, evaluate, random_inputs, to_field
from superopt.semantics.torch_lowering import LOWERING, run


@settings(max_examples=80, deadline=None)
@given(random_graphs(ops=LINEAR_OPS), st.integers(0, 2**32 - 1))
def test_field_equals_float64_on_linear_graphs(g, seed):
    rng = np.random.default_rng(seed)
    env = {k: rng.integers(-9, 10, v.shape).astype(np.float64) for k, v in random_inputs(g, rng).items()}
    ref = evaluate(g, env)
    fld = Field(seed).evaluate(g, env)
    for a, b in zip(ref, fld):
        assert np.array_equal(to_field(np.round(a).astype(np.int64)), b)


def _conv_graph(stride=(1, 1), padding=(1, 1), groups=1, activation="none", k=(3, 3)):
    b = GraphBuilder()
    x = b.input("x", (2, 4, 6, 5))
    w = b.input("w", (6, 4 // groups) + k)
    return b.build([b.op("conv2d", x, w, stride=stride, padding=padding, groups=groups, activation=activation)])


@pytest.mark.parametrize("kw", [{}, {"stride": (2, 2)}, {"padding": (0, 1), "k": (1, 3)}, {"groups": 2},
                                {"stride": (2, 1), "padding": (2, 0), "k": (5, 1)}])
def test_field_conv_is_exact(kw):
    g = _conv_graph(**kw)
    rng = np.random.default_rng(1)
    env = {"x": rng.integers(-5, 6, (2, 4, 6, 5)), "w": rng.integers(-5, 6, g.nodes[1].types[0].shape)}
    a = evaluate(g, env)[0]
    assert np.array_equal(to_field(np.round(a).astype(np.int64)), Field().evaluate(g, env)[0])


def test_field_large_values_do_not_overflow():
    b = GraphBuilder()
    x, y = b.input("x", (3, 300)), b.input("y", (300, 2))
    g = b.build([b.op("matmul", x, y)])
    f = Field()
    env = {"x": np.full((3, 300), P - 1), "y": np.full((300, 2), P - 1)}
    assert (f.evaluate(g, env)[0] == 300 % P).all()  # (-1)(-1) summed 300 times


def _unary(op, **attrs):
    b = GraphBuilder()
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    return b.build([b.op(op, b.op("add", x, y), **attrs)]), b


def test_field_nonlinear_functions_are_not_linear():
    f = Field(0)
    rng = np.random.default_rng(0)
    for op in ("relu", "sigmoid", "tanh", "gelu"):
        g, _ = _unary(op)
        env = f.random_inputs(g, rng)
        lhs = f.evaluate(g, env)[0]
        rhs = np.mod(f.fn(op, env["x"]) + f.fn(op, env["y"]), P)
        assert not np.array_equal(lhs, rhs)
        assert np.array_equal(f.evaluate(g, env)[0], lhs)  # deterministic
    assert not np.array_equal(f.fn("relu", np.arange(10)), f.fn("tanh", np.arange(10)))
    assert not np.array_equal(Field(0).fn("relu", np.arange(10)), Field(1).fn("relu", np.arange(10)))


def test_field_keeps_layout_identities_of_maxpool_softmax_layernorm():
    f = Field(3)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, P, (1, 2, 5, 5)), rng.integers(0, P, (1, 3, 5, 5))
    pool = f.table["maxpool2d"]
    a = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1)}
    assert np.array_equal(pool(a, np.concatenate([x, y], 1)), np.concatenate([pool(a, x), pool(a, y)], 1))
    sm, ln = f.table["softmax"], f.table["layernorm"]
    u, v = rng.integers(0, P, (2, 4)), rng.integers(0, P, (3, 4))
    assert np.array_equal(sm({"axis": 1}, np.concatenate([u, v])), np.concatenate([sm({"axis": 1}, u), sm({"axis": 1}, v)]))
    at = {"ndim": 1, "eps": 1e-5}
    assert np.array_equal(ln(at, np.concatenate([u, v])), np.concatenate([ln(at, u), ln(at, v)]))
    assert not np.array_equal(sm({"axis": 0}, np.concatenate([u, v]))[:2], sm({"axis": 0}, u))


def _example(op):
    """A small graph using ``op`` and the inputs it needs."""
    b = GraphBuilder()
    img = lambda n, s: b.input(n, s)
    if op in ("identity_matrix", "identity_conv", "ones", "zeros", "pool_kernel"):
        attrs = {"identity_matrix": {"n": 3}, "identity_conv": {"channels": 4, "kernel": (3, 3), "groups": 2},
                 "ones": {"shape": (2, 3)}, "zeros": {"shape": (3, 2)}, "pool_kernel": {"channels": 2, "kernel": (3, 3)}}[op]
        return b.build([b.op(op, **attrs)])
    if op in ("add", "mul"):
        return b.build([b.op(op, img("x", (2, 3, 4)), img("y", (3, 1)))])
    if op == "smul":
        return b.build([b.op(op, img("x", (2, 3)), img("s", ()))])
    if op == "matmul":
        return b.build([b.op(op, img("x", (2, 3, 4)), img("y", (4, 5)))])
    if op == "conv2d":
        return b.build([b.op(op, img("x", (1, 4, 7, 6)), img("w", (6, 2, 3, 3)), stride=(2, 1), padding=(1, 1),
                             groups=2, activation="relu")])
    if op == "conv2d_bias":
        return b.build([b.op(op, img("x", (1, 4, 7, 6)), img("w", (6, 2, 3, 3)), img("b", (6,)), stride=(2, 1),
                             padding=(1, 1), groups=2, activation="relu")])
    if op == "enlarge":
        return b.build([b.op(op, img("w", (2, 2, 1, 3)), kernel=(5, 5))])
    if op == "transpose":
        return b.build([b.op(op, img("x", (2, 3, 4)), perm=(2, 0, 1))])
    if op == "reshape":
        return b.build([b.op(op, img("x", (2, 3, 4)), shape=(6, 4))])
    if op == "concat":
        return b.build([b.op(op, img("x", (2, 3)), img("y", (2, 2)), img("z", (2, 1)), axis=1)])
    if op == "split":
        return b.build(list(b.op(op, img("x", (2, 6)), axis=1, sizes=(1, 2, 3))))
    if op in ("avgpool2d", "maxpool2d"):
        return b.build([b.op(op, img("x", (1, 2, 7, 6)), kernel=(3, 2), stride=(2, 2), padding=(1, 1))])
    if op == "batchnorm":
        vec = [img(n, (3,)) for n in ("scale", "bias", "mean", "var")]
        return b.build([b.op(op, img("x", (2, 3, 4, 4)), *vec, eps=1e-3)])
    if op == "softmax":
        return b.build([b.op(op, img("x", (2, 3, 4)), axis=1)])
    if op == "layernorm":
        return b.build([b.op(op, img("x", (2, 3, 4)), ndim=2)])
    if op == "sdpa":
        q, k, v, m = img("q", (2, 3, 4)), img("k", (2, 5, 4)), img("v", (2, 5, 6)), img("m", (3, 5))
        return b.build([b.op(op, q, k, v, scale=0.5), b.op(op, q, k, v, scale=1.0, causal=1),
                        b.op(op, q, k, v, m, scale=0.25)])
    if op == "embedding":
        return b.build([b.op(op, img("w", (7, 3)), b.input("ids", (2, 4), "int64"))])
    if op == "pow":
        return b.build([b.op(op, img("x", (2, 3)), exponent=3), b.op(op, img("y", (2, 3)), exponent=-1)])
    if op in LLM_EXAMPLES:  # the LLM operators (issue 23)
        return LLM_EXAMPLES[op](b)
    return b.build([b.op(op, img("x", (2, 3, 4)))])


LLM_EXAMPLES = {
    "mean": lambda b: b.build([b.op("mean", b.input("x", (2, 3, 4)), axis=1, keepdim=0)]),
    "sum": lambda b: b.build([b.op("sum", b.input("x", (2, 3, 4)), axis=-1)]),
    "cast": lambda b: b.build([b.op("cast", b.input("x", (2, 3)), dtype="float32")]),
    "expand": lambda b: b.build([b.op("expand", b.input("x", (3, 1)), shape=(2, 3, 4))]),
    "slice": lambda b: b.build([b.op("slice", b.input("x", (2, 7)), axis=1, start=1, end=7, step=2)]),
    "index_copy": lambda b: b.build([b.op("index_copy", b.input("x", (2, 5, 3)), b.input("i", (2,), "int64"),
                                          b.input("s", (2, 2, 3)), axis=1)]),
    "compare": lambda b: b.build([b.op("compare", b.input("x", (2, 3)), b.input("y", (3,)), cmp="le")]),
    "logical": lambda b: b.build([b.op("logical", b.op("compare", b.input("x", (2, 3)), b.input("y", (3,)), cmp="le"),
                                       b.op("compare", b.input("z", (2, 1)), b.input("w", (2, 3)), cmp="gt"),
                                       fn="and")]),
    "mask_bias": lambda b: b.build([b.op("mask_bias", b.op("compare", b.input("x", (2, 3)), b.input("y", (3,)),
                                                           cmp="ne"), dtype="float32")]),
    "clamp": lambda b: b.build([b.op("clamp", b.input("x", (2, 3)), lo=-0.5, hi=0.75)]),
}


COMPUTE_OPS = sorted(n for n, d in REGISTRY.items() if d.kind in ("compute", "constant"))


def test_every_operator_has_all_three_semantics():
    assert set(COMPUTE_OPS) <= set(REFERENCE)
    assert set(COMPUTE_OPS) <= set(Field().table)
    assert set(COMPUTE_OPS) <= set(LOWERING)


@pytest.mark.parametrize("op", COMPUTE_OPS)
def test_torch_lowering_matches_reference(op):
    g = _example(op)
    rng = np.random.default_rng(0)
    env = random_inputs(g, rng)
    ref = evaluate(g, env)
    got = run(g, env, dtype=torch.float64)
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        assert a.shape == tuple(b.shape) == g.type_of(g.outputs[0]).shape or len(ref) > 1
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", COMPUTE_OPS)
def test_field_semantics_gives_declared_shapes(op):
    g = _example(op)
    f = Field()
    outs = f.evaluate(g, f.random_inputs(g, np.random.default_rng(0)))
    assert [o.shape for o in outs] == [g.type_of(r).shape for r in g.outputs]
    assert all(((o >= 0) & (o < P)).all() for o in outs)


def test_batchnorm_variance_drawn_positive():
    g = _example("batchnorm")
    env = random_inputs(g, np.random.default_rng(0))
    assert (env["var"] > 0).all() and np.isfinite(evaluate(g, env)[0]).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 5),
       st.integers(1, 4), st.booleans(), st.integers(0, 2**31))
def test_grouped_query_sdpa_equals_sdpa_over_repeated_heads(b, hkv, r, lq, s, d, masked, seed):
    """sdpa with gqa broadcasts each key/value head over its query heads without copying them:
    equal to sdpa over k and v with their heads repeated (repeat_interleave), in float64 and
    exactly in the field."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((b, hkv * r, lq, d)), rng.standard_normal((b, hkv, s, d)), rng.standard_normal((b, hkv, s, d))
    mask = rng.standard_normal((b, 1, lq, s)) if masked else None
    rep = lambda x: np.repeat(x, r, axis=-3)
    extra = (mask,) if masked else ()
    for causal in (0, 1):
        a = {"scale": 0.5, "causal": causal, "gqa": 1}
        got = REFERENCE["sdpa"](a, q, k, v, *extra)
        want = REFERENCE["sdpa"](dict(a, gqa=0), q, rep(k), rep(v), *extra)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        f = Field(seed % 7)
        fq, fk, fv = (rng.integers(0, P, x.shape) for x in (q, k, v))
        fextra = (rng.integers(0, P, mask.shape),) if masked else ()
        assert np.array_equal(f.table["sdpa"](a, fq, fk, fv, *fextra),
                              f.table["sdpa"](dict(a, gqa=0), fq, rep(fk), rep(fv), *fextra))
