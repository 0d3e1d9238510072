"""Bias and affine epilogues emitted with their matmul / convolution / layer norm as one call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from superopt.codegen import to_fx
from superopt.codegen.epilogue import find_epilogues
from superopt.ir import GraphBuilder
from superopt.semantics import evaluate

RNG = np.random.default_rng(0)


def _w(b, name, shape):
    return b.weight(name, data=RNG.standard_normal(shape).astype(np.float32))


def _calls(gm):
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]


def _check(g, inputs):
    gm = to_fx(g)
    got = gm(*[torch.from_numpy(x) for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    want = evaluate(g, dict(zip(g.input_names, inputs)))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-4, atol=1e-4)
    return gm


def test_matmul_bias_becomes_one_linear_with_the_weights_in_linear_layout():
    b = GraphBuilder()
    x = b.input("x", (2, 5, 8))
    y = b.op("add", b.op("matmul", x, _w(b, "w", (8, 6))), _w(b, "bias", (6,)))
    gm = _check(b.build([b.op("relu", y)]), [RNG.standard_normal((2, 5, 8)).astype(np.float32)])
    assert _calls(gm).count("linear") == 1 and "matmul" not in _calls(gm) and "add" not in _calls(gm)
    assert dict(gm.named_buffers())["w"].shape == (6, 8) and dict(gm.named_buffers())["bias"].shape == (6,)


def test_conv_bias_and_layernorm_affine_fold_into_their_calls():
    b = GraphBuilder()
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("add", b.op("conv2d", x, _w(b, "k", (4, 3, 3, 3)), padding=(1, 1)), _w(b, "cb", (4, 1, 1)))
    z = b.op("add", b.op("mul", b.op("layernorm", y, ndim=1), _w(b, "g", (6,))), _w(b, "beta", (6,)))
    gm = _check(b.build([z]), [RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)])
    assert sorted(_calls(gm)) == ["conv2d", "layer_norm"]


@pytest.mark.parametrize("case", ["shared", "output", "not_a_vector", "activation", "data_bias"])
def test_no_fold_where_another_user_or_a_broadcast_needs_the_inner_value(case):
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    if case == "activation":
        x4 = b.input("x4", (1, 3, 6, 6))
        c = b.op("conv2d", x4, _w(b, "k", (4, 3, 3, 3)), padding=(1, 1), activation="relu")
        outs = [b.op("add", c, _w(b, "cb", (4, 1, 1)))]
    else:
        m = b.op("matmul", x, _w(b, "w", (8, 6)))
        bias = (_w(b, "bias", (4, 6)) if case == "not_a_vector" else b.input("bias", (6,)) if case == "data_bias"
                else _w(b, "bias", (6,)))
        y = b.op("add", m, bias)
        outs = [y, b.op("relu", m)] if case == "shared" else [y, m] if case == "output" else [y]
    g = b.build(outs)
    fused, folded = find_epilogues(g)
    assert not fused and not folded
    inputs = [RNG.standard_normal(g.nodes[i].types[0].shape).astype(np.float32) for i in g.inputs]
    _check(g, inputs)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), k=st.integers(1, 6), n=st.integers(1, 6), lead=st.integers(0, 2),
       bias_rank=st.integers(1, 3), order=st.booleans(), affine=st.sampled_from(["none", "scale", "shift", "both"]))
def test_fused_code_matches_the_reference(rows, k, n, lead, bias_rank, order, affine):
    b = GraphBuilder()
    shape = (2,) * lead + (rows, k)
    x = b.input("x", shape)
    m = b.op("matmul", x, _w(b, "w", (k, n)))
    bias = _w(b, "bias", (1,) * (bias_rank - 1) + (n,))
    y = b.op("add", bias, m) if order else b.op("add", m, bias)
    y = b.op("layernorm", y, ndim=1)
    if affine in ("scale", "both"):
        y = b.op("mul", _w(b, "g", (n,)), y) if order else b.op("mul", y, _w(b, "g", (n,)))
    if affine in ("shift", "both"):
        y = b.op("add", y, _w(b, "beta", (1, n)))
    _check(b.build([y]), [RNG.standard_normal(shape).astype(np.float32)])


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 3), length=st.integers(1, 5), dim=st.integers(1, 4), scale=st.sampled_from([None, 0.5]),
       mask=st.sampled_from([None, "full", "row"]), keys=st.sampled_from(["transpose", "given"]),
       axis_last=st.booleans())
def test_attention_written_out_becomes_one_sdpa_call_and_matches(heads, length, dim, scale, mask, keys, axis_last):
    b = GraphBuilder()
    q = b.input("q", (2, heads, length, dim))
    v = b.input("v", (2, heads, length, dim))
    if keys == "transpose":
        kt = b.op("transpose", b.input("k", (2, heads, length, dim)), perm=(0, 1, 3, 2))
    else:
        kt = b.input("kt", (2, heads, dim, length))
    s = b.op("matmul", q, kt)
    if scale is not None:
        s = b.op("smul", s, b.weight("scale", data=np.array(scale, np.float32)))
    if mask is not None:
        s = b.op("add", b.input("mask", (1, 1, length, length) if mask == "full" else (1, 1, 1, length)), s)
    p = b.op("softmax", s, axis=3 if axis_last else 2)
    g = b.build([b.op("matmul", p, v)])
    inputs = [RNG.standard_normal(g.nodes[i].types[0].shape).astype(np.float32) for i in g.inputs]
    gm = _check(g, inputs)
    assert (_calls(gm).count("scaled_dot_product_attention") == 1) == axis_last
    assert ("softmax" in _calls(gm)) != axis_last
    kept = to_fx(g, attention=False)  # float32 under Inductor: the ops, not the memory-efficient kernel
    assert "scaled_dot_product_attention" not in _calls(kept) and "softmax" in _calls(kept)


@pytest.mark.parametrize("nested", [False, True])
def test_a_merged_matmul_cut_into_biased_pieces_is_one_linear(nested):
    """The sibling-matmul merge leaves ``split(x W)`` with a bias add per piece: one linear with
    the biases concatenated, its pieces handed to the adds' users."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4))
    m = b.op("matmul", x, _w(b, "w", (4, 9)))
    if nested:
        first, rest = b.op("split", m, axis=2, sizes=(2, 7))
        pieces = [first, *b.op("split", rest, axis=2, sizes=(3, 4))]
    else:
        pieces = list(b.op("split", m, axis=2, sizes=(2, 3, 4)))
    outs = [b.op("relu", b.op("add", p, _w(b, f"b{k}", (p_size,))))
            for k, (p, p_size) in enumerate(zip(pieces, (2, 3, 4)))]
    g = b.build(outs)
    gm = _check(g, [RNG.standard_normal((2, 3, 4)).astype(np.float32)])
    assert _calls(gm).count("linear") == 1 and "add" not in _calls(gm) and "split" not in _calls(gm)


def test_pieces_with_another_use_stay_apart():
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    p, q = b.op("split", b.op("matmul", x, _w(b, "w", (4, 5))), axis=1, sizes=(2, 3))
    g = b.build([b.op("add", p, _w(b, "b0", (2,))), b.op("add", q, _w(b, "b1", (3,))), q])
    gm = _check(g, [RNG.standard_normal((3, 4)).astype(np.float32)])
    assert "linear" not in _calls(gm)
