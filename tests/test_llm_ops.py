"""The LLM operators (issue 23): mean, sum, rsqrt, silu, gelu_tanh, cast, expand, slice,
index_copy and grouped-query sdpa. The float64 reference, the torch lowering and torch itself
agree; the fingerprint field keeps the identities the axioms use; bad shapes are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from superopt.errors import ShapeError
from superopt.ir import GraphBuilder
from superopt.semantics import evaluate
from superopt.semantics.field import P, Field, to_field
from superopt.semantics.reference import random_inputs
from superopt.semantics.torch_lowering import run


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def _agree(g, seed, rtol=1e-10):
    env = random_inputs(g, np.random.default_rng(seed))
    want = evaluate(g, env)
    got = run(g, env, dtype=torch.float64)
    for w, t in zip(want, got):
        np.testing.assert_allclose(t.numpy(), w, rtol=rtol, atol=1e-12)
    return env, want


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(-4, 3), st.integers(0, 1), st.sampled_from(["mean", "sum"]), st.integers(0, 2**31))
def test_reductions_match_numpy_and_torch(shape, axis, keepdim, op, seed):
    b = GraphBuilder()
    x = b.input("x", shape)
    if not -len(shape) <= axis < len(shape):
        with pytest.raises(ShapeError, match="out of range"):
            b.op(op, x, axis=axis, keepdim=keepdim)
        return
    g = b.build([b.op(op, x, axis=axis, keepdim=keepdim)])
    env, (y,) = _agree(g, seed)
    np.testing.assert_allclose(y, getattr(env["x"], op)(axis=axis, keepdims=bool(keepdim)))
    assert g.nodes[-1].attr["axis"] == axis % len(shape)  # one spelling of each axis


@settings(max_examples=30, deadline=None)
@given(shapes, st.integers(0, 2**31))
def test_elementwise_functions_match_torch(shape, seed):
    b = GraphBuilder()
    x = b.input("x", shape)
    g = b.build([b.op("silu", x), b.op("gelu_tanh", x), b.op("rsqrt", x), b.op("cast", x, dtype="bfloat16"),
                 b.op("cos", x), b.op("sin", x)])
    env, (silu, gelu, rsqrt, cast, cos, sin) = _agree(g, seed)
    t = torch.from_numpy(env["x"])
    np.testing.assert_allclose(silu, F.silu(t).numpy(), rtol=1e-12)
    np.testing.assert_allclose(gelu, F.gelu(t, approximate="tanh").numpy(), rtol=1e-12, atol=1e-15)
    assert (env["x"] > 0).all()  # rsqrt's input is drawn positive
    np.testing.assert_allclose(rsqrt, torch.rsqrt(t).numpy(), rtol=1e-12)
    np.testing.assert_array_equal(cast, env["x"])
    assert g.type_of(g.outputs[3]).dtype == "bfloat16"
    np.testing.assert_allclose(cos, np.cos(env["x"]))
    np.testing.assert_allclose(sin, torch.sin(t).numpy())


def test_cast_reads_floats_and_int64_only():
    b = GraphBuilder()
    pos = b.input("pos", (2, 3), "int64")
    g = b.build([b.op("cast", pos, dtype="float32")])
    env = {"pos": np.arange(6).reshape(2, 3)}
    np.testing.assert_array_equal(evaluate(g, env)[0], env["pos"])
    got, = run(g, env, dtype=torch.float64)
    assert got.dtype == torch.float64 and got.tolist() == env["pos"].tolist()
    with pytest.raises(ShapeError, match="cast converts"):
        b.op("cast", b.input("m", (2,), "bool"), dtype="float32")


def test_gelu_tanh_is_not_exact_gelu():
    x = np.linspace(-3, 3, 13)
    b = GraphBuilder()
    xi = b.input("x", x.shape)
    tanh, erf = evaluate(b.build([b.op("gelu_tanh", xi), b.op("gelu", xi)]), {"x": x})
    assert 1e-5 < np.abs(tanh - erf).max() < 1e-2


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(0, 2), st.data())
def test_expand_matches_torch_expand(shape, extra, data):
    target = tuple(data.draw(st.integers(1, 3)) for _ in range(extra)) + tuple(
        data.draw(st.integers(1, 3)) if d == 1 else d for d in shape)
    b = GraphBuilder()
    g = b.build([b.op("expand", b.input("x", shape), shape=target)])
    env, (y,) = _agree(g, data.draw(st.integers(0, 2**31)))
    np.testing.assert_array_equal(y, torch.from_numpy(env["x"]).expand(target).numpy())


def test_expand_refuses_shrinking_and_fewer_axes():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    for bad in ((4, 3), (3,), (2, 1)):
        with pytest.raises(ShapeError, match="cannot expand"):
            b.op("expand", x, shape=bad)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(0, 8), st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31))
def test_slice_matches_python_slicing(n, start, end, step, seed):
    b = GraphBuilder()
    x = b.input("x", (2, n))
    if not 0 <= start < end <= n:
        with pytest.raises(ShapeError, match="slice"):
            b.op("slice", x, axis=1, start=start, end=end, step=step)
        return
    g = b.build([b.op("slice", x, axis=-1, start=start, end=end, step=step)])
    env, (y,) = _agree(g, seed)
    np.testing.assert_array_equal(y, env["x"][:, start:end:step])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2**31))
def test_index_copy_writes_the_rows_it_is_given(n, k, axis, seed):
    k = min(k, n)
    shape = [2, 3, 2]
    shape[axis] = n
    src_shape = list(shape)
    src_shape[axis] = k
    b = GraphBuilder()
    g = b.build([b.op("index_copy", b.input("x", tuple(shape)), b.input("i", (k,), "int64"),
                      b.input("s", tuple(src_shape)), axis=axis)])
    env, (y,) = _agree(g, seed)
    assert len(set(env["i"].tolist())) == k and env["i"].max() < n  # distinct, in range
    want = torch.from_numpy(env["x"]).index_copy(axis, torch.from_numpy(env["i"]), torch.from_numpy(env["s"]))
    np.testing.assert_array_equal(y, want.numpy())
    f = Field(seed % 7)  # the field writes the same positions
    fenv = f.random_inputs(g, np.random.default_rng(seed))
    fenv["i"] = env["i"]
    out, = f.evaluate(g, fenv)
    keep = np.ones(n, bool)
    keep[env["i"]] = False
    kept = np.flatnonzero(keep)
    np.testing.assert_array_equal(np.take(out, kept, axis), np.take(fenv["x"], kept, axis))


def test_index_copy_refuses_a_wrong_source():
    b = GraphBuilder()
    x, i = b.input("x", (2, 8, 4)), b.input("i", (1,), "int64")
    with pytest.raises(ShapeError, match="needs a source"):
        b.op("index_copy", x, i, b.input("s", (2, 2, 4)), axis=1)
    with pytest.raises(ShapeError, match="1-D int64"):
        b.op("index_copy", x, b.input("f", (1,)), b.input("t", (2, 1, 4)), axis=1)


def _gqa(b, q, k, v, repeat):
    """attention over k, v with their heads repeated ``repeat`` times each (HF's repeat_kv)."""
    def rep(t):
        n, h, s, d = b.type_of(t).shape
        e = b.op("expand", b.op("reshape", t, shape=(n, h, 1, s, d)), shape=(n, h, repeat, s, d))
        return b.op("reshape", e, shape=(n, h * repeat, s, d))
    return b.op("sdpa", q, rep(k), rep(v), scale=0.3, causal=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4),
       st.integers(0, 2**31))
def test_gqa_attention_equals_attention_over_repeated_heads(n, hkv, r, lq, lk, seed):
    b = GraphBuilder()
    q, k, v = b.input("q", (n, hkv * r, lq, 3)), b.input("k", (n, hkv, lk, 3)), b.input("v", (n, hkv, lk, 2))
    g = b.build([b.op("sdpa", q, k, v, scale=0.3, gqa=1), _gqa(b, q, k, v, r)])
    env, (fused, repeated) = _agree(g, seed)
    np.testing.assert_allclose(fused, repeated, rtol=1e-12, atol=1e-14)
    t = [torch.from_numpy(env[c]) for c in "qkv"]
    np.testing.assert_allclose(fused, F.scaled_dot_product_attention(*t, scale=0.3, enable_gqa=True).numpy(),
                               rtol=1e-10, atol=1e-12)
    f = Field(seed % 5)  # exactly equal in the field too: the identity is one the verifier may use
    a, c = f.evaluate(g, f.random_inputs(g, np.random.default_rng(seed)))
    np.testing.assert_array_equal(a, c)


def test_gqa_needs_the_flag_and_a_divisor():
    b = GraphBuilder()
    q, k = b.input("q", (1, 6, 2, 4)), b.input("k", (1, 4, 3, 4))
    with pytest.raises(ShapeError, match="gqa=1"):
        b.op("sdpa", q, b.input("k2", (1, 2, 3, 4)), b.input("v2", (1, 2, 3, 4)), scale=1.0)
    with pytest.raises(ShapeError, match="divides"):
        b.op("sdpa", q, k, k, scale=1.0, gqa=1)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_field_mean_is_the_exact_average(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-9, 10, (rows, cols)) * cols  # divisible by the count: the average is an integer
    b = GraphBuilder()
    g = b.build([b.op("mean", b.input("x", (rows, cols)), axis=1), b.op("sum", b.input("y", (rows, cols)), axis=0)])
    m, s = Field(seed % 3).evaluate(g, {"x": x, "y": x})
    np.testing.assert_array_equal(m, to_field(x.sum(1, keepdims=True) // cols))
    np.testing.assert_array_equal(s, to_field(x.sum(0, keepdims=True)))
    assert ((m >= 0) & (m < P)).all()


def test_field_functions_are_distinct_and_nonlinear():
    f = Field(0)
    x = np.arange(50)
    outs = [f.table[op]({}, x) for op in ("rsqrt", "silu", "gelu_tanh", "cos", "sin")]
    assert not np.array_equal(outs[3], outs[4])
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[1], outs[2])
    assert not np.array_equal(f.table["silu"]({}, x + x), np.mod(2 * outs[1], P))


# ---- attention masks built in the graph (transformers' decode export) ---------------------

@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(0, 7), st.sampled_from(["lt", "le", "gt", "ge", "eq", "ne"]),
       st.sampled_from(["and", "or"]), st.sampled_from(["float32", "bfloat16"]))
def test_a_mask_from_positions_is_what_torch_sdpa_does_with_it(n, pos, cmp, fn, dtype):
    """``compare`` of key indices with a position, ``logical`` of two such masks and ``mask_bias``
    (0 / -inf) give what torch's comparisons, ``&`` / ``|`` and a boolean ``attn_mask`` give:
    in the float64 reference and in the torch lowering."""
    b = GraphBuilder()
    keys, at, lo = b.input("keys", (1, 1, 1, n), "int64"), b.input("at", (1, 1, 1, 1), "int64"), b.input("lo", (), "int64")
    mask = b.op("logical", b.op("compare", keys, at, cmp=cmp), b.op("compare", keys, lo, cmp="ge"), fn=fn)
    g = b.build([mask, b.op("mask_bias", mask, dtype=dtype)])
    assert g.type_of(g.outputs[0]).dtype == "bool" and g.type_of(g.outputs[1]).dtype == dtype
    k, p, low = torch.arange(n).view(1, 1, 1, n), torch.tensor(pos).view(1, 1, 1, 1), torch.tensor(1)
    m = getattr(torch, cmp)(k, p)
    m = (m & (k >= low)) if fn == "and" else (m | (k >= low))
    env = {"keys": k.numpy(), "at": p.numpy(), "lo": low.numpy()}
    ref = evaluate(g, env)
    assert np.array_equal(ref[0] != 0, m.numpy())
    assert np.array_equal(ref[1], np.where(m.numpy(), 0.0, -np.inf))
    got = run(g, env, dtype=torch.float64)
    assert torch.equal(got[0], m) and torch.equal(got[1].float(), torch.zeros(m.shape).masked_fill(~m, float("-inf")))
    q, kv = torch.randn(1, 2, 1, 4), torch.randn(1, 2, n, 4)
    if m.any():  # a row with no key left is NaN either way
        want = F.scaled_dot_product_attention(q, kv, kv, attn_mask=m)
        assert torch.allclose(F.scaled_dot_product_attention(q, kv, kv, attn_mask=got[1].float()), want, atol=1e-6)


def test_mask_operators_refuse_what_they_do_not_build():
    b = GraphBuilder()
    x, i = b.input("x", (2, 3)), b.input("i", (2, 3), "int64")
    with pytest.raises(ShapeError, match="one numeric dtype"):
        b.op("compare", x, i, cmp="le")
    with pytest.raises(ShapeError, match="boolean"):
        b.op("logical", x, x, fn="and")
    with pytest.raises(ShapeError, match="boolean mask"):
        b.op("mask_bias", x, dtype="float32")


def test_field_mask_functions_are_deterministic_and_read_both_operands():
    f = Field(0)
    rng = np.random.default_rng(0)
    x, y, z = (rng.integers(0, P, 6) for _ in range(3))
    cmp = f.table["compare"]
    assert np.array_equal(cmp({"cmp": "le"}, x, y), cmp({"cmp": "le"}, x, y))
    assert not np.array_equal(cmp({"cmp": "le"}, x, y), cmp({"cmp": "le"}, x, z))
    assert not np.array_equal(cmp({"cmp": "le"}, x, y), cmp({"cmp": "lt"}, x, y))
    assert not np.array_equal(cmp({"cmp": "le"}, x, y), cmp({"cmp": "le"}, y, x))


def test_a_written_mask_runs_on_the_device_its_inputs_are_on():
    """The program written on the CPU makes the mask's additive form where the mask is (an
    exported ``zeros`` would carry the CPU it was traced on into a GPU run): checked on ``meta``."""
    from superopt.codegen.export import to_exported_program
    b = GraphBuilder()
    keys, at = b.input("keys", (1, 1, 1, 6), "int64"), b.input("at", (1, 1, 1, 1), "int64")
    g = b.build([b.op("mask_bias", b.op("compare", keys, at, cmp="le"), dtype="bfloat16")])
    ep = to_exported_program(g, [torch.arange(6).view(1, 1, 1, 6), torch.tensor(3).view(1, 1, 1, 1)])
    out = ep.module().to("meta")(torch.zeros(1, 1, 1, 6, dtype=torch.int64, device="meta"),
                                 torch.zeros(1, 1, 1, 1, dtype=torch.int64, device="meta"))
    assert out.device.type == "meta" and out.dtype == torch.bfloat16
