"""cuDNN's fused convolution + bias + residual + ReLU: the ``superopt::conv2d_relu`` op, the chains
the IR offers it (:func:`superopt.cost.fusion.conv_relu_chains`), the cost model's choice of them,
the FX code that calls it and the backend that emits it (all on the CPU, where the op runs its
reference)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from superopt.codegen import to_fx
from superopt.driver.backend import CACHE, last_report, superopt_backend
from superopt.codegen.cudnn import reference_conv2d_relu
from superopt.cost import CostModel, Profile, ProfileEntry, constant_nodes, shipped_profile
from superopt.cost.fusion import ConvReluChain, conv_relu_chains
from superopt.ir import GraphBuilder
from superopt.ir.graph import Ref
from superopt.semantics import evaluate

OP = torch.ops.superopt.conv2d_relu.default
RNG = np.random.default_rng(0)


def _fmt(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _canonical_stride(shape, channels_last: bool):
    return torch.empty(shape, memory_format=_fmt(channels_last)).stride()


def _want(x, w, b, z, stride, padding, groups):
    """Written out independently of the module under test."""
    y = F.conv2d(x, w, b, stride, padding, 1, groups)
    return torch.relu(y + z if z is not None else y)


def _args(n, groups, cin_g, cout_g, h, wd, k, stride, padding, bias, residual, seed=0, layout="contiguous"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, groups * cin_g, h, wd, generator=gen)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":  # a non-contiguous view: every other column of a wider tensor
        x = torch.randn(n, groups * cin_g, h, 2 * wd, generator=gen)[..., ::2]
    w = torch.randn(groups * cout_g, cin_g, k[0], k[1], generator=gen)
    oh = (h + 2 * padding[0] - k[0]) // stride[0] + 1
    ow = (wd + 2 * padding[1] - k[1]) // stride[1] + 1
    b = torch.randn(groups * cout_g, generator=gen) if bias else None
    z = torch.randn(n, groups * cout_g, oh, ow, generator=gen) if residual else None
    return x, w, b, z


# ---- 1. the op on the CPU: the reference, in canonical strides --------------------------------------

CASES = [  # n, groups, cin/g, cout/g, h, w, kernel, stride, padding, bias, residual
    (2, 1, 3, 4, 8, 8, (3, 3), (1, 1), (1, 1), True, True),
    (1, 1, 3, 4, 8, 8, (3, 3), (1, 1), (1, 1), True, True),  # batch 1
    (1, 2, 2, 3, 9, 7, (3, 3), (2, 2), (1, 1), False, True),  # stride 2, groups
    (3, 4, 1, 1, 6, 6, (3, 3), (1, 1), (0, 0), True, False),  # depthwise
    (1, 1, 4, 1, 5, 5, (5, 5), (1, 1), (0, 0), True, True),  # one output channel, 1x1 pixels
    (1, 1, 2, 2, 4, 6, (1, 3), (2, 1), (0, 1), False, False),  # rectangular kernel, mixed stride/padding
    (2, 3, 2, 2, 1, 1, (1, 1), (1, 1), (0, 0), True, True),  # 1x1 image and kernel
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_op_on_the_cpu_is_conv_plus_residual_plus_relu_in_canonical_strides(case, channels_last):
    *shape, bias, residual = case
    x, w, b, z = _args(*shape, bias, residual)
    stride, padding, groups = list(case[7]), list(case[8]), case[1]
    before = [t.clone() for t in (x, w, b, z) if t is not None]
    y = torch.ops.superopt.conv2d_relu(x, w, b, z, stride, padding, groups, channels_last)
    want = _want(x, w, b, z, stride, padding, groups)
    assert y.shape == want.shape and y.dtype == want.dtype
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, reference_conv2d_relu(x, w, b, z, stride, padding, groups))
    assert y.stride() == _canonical_stride(y.shape, channels_last)
    assert y.is_contiguous(memory_format=_fmt(channels_last))
    assert (y >= 0).all()
    for t, t0 in zip([t for t in (x, w, b, z) if t is not None], before):  # no input is written
        assert torch.equal(t, t0)
    for t in (x, w, b, z):  # the output is storage of its own
        assert t is None or y.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), groups=st.integers(1, 3), cin_g=st.integers(1, 3), cout_g=st.integers(1, 3),
       h=st.integers(1, 7), wd=st.integers(1, 7), kh=st.integers(1, 3), kw=st.integers(1, 3),
       sh=st.integers(1, 2), sw=st.integers(1, 2), ph=st.integers(0, 2), pw=st.integers(0, 2),
       bias=st.booleans(), residual=st.booleans(), channels_last=st.booleans(),
       layout=st.sampled_from(["contiguous", "channels_last", "strided"]), seed=st.integers(0, 2 ** 16))
def test_the_op_matches_the_reference_on_random_shapes_and_input_layouts(
        n, groups, cin_g, cout_g, h, wd, kh, kw, sh, sw, ph, pw, bias, residual, channels_last, layout, seed):
    if h + 2 * ph < kh or wd + 2 * pw < kw:
        return
    x, w, b, z = _args(n, groups, cin_g, cout_g, h, wd, (kh, kw), (sh, sw), (ph, pw), bias, residual, seed, layout)
    y = torch.ops.superopt.conv2d_relu(x, w, b, z, [sh, sw], [ph, pw], groups, channels_last)
    want = _want(x, w, b, z, (sh, sw), (ph, pw), groups)
    assert y.shape == want.shape
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert y.stride() == _canonical_stride(y.shape, channels_last)


def test_the_op_keeps_the_input_dtype():
    x, w, b, z = (t.to(torch.bfloat16) for t in _args(1, 1, 3, 4, 6, 6, (3, 3), (1, 1), (1, 1), True, True))
    y = torch.ops.superopt.conv2d_relu(x, w, b, z, [1, 1], [1, 1], 1, True)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), _want(x, w, b, z, (1, 1), (1, 1), 1).float(), rtol=2e-2, atol=2e-2)


# ---- 2. the fake implementation ------------------------------------------------------------------


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_fake_implementation_gives_the_real_shape_and_strides(case, channels_last):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    *shape, bias, residual = case
    args = _args(*shape, bias, residual)
    stride, padding, groups = list(case[7]), list(case[8]), case[1]
    real = torch.ops.superopt.conv2d_relu(*args, stride, padding, groups, channels_last)
    with FakeTensorMode() as mode:
        fake_args = [None if t is None else mode.from_tensor(t) for t in args]
        y = torch.ops.superopt.conv2d_relu(*fake_args, stride, padding, groups, channels_last)
    assert isinstance(y, FakeTensor)
    assert y.shape == real.shape and y.stride() == real.stride() and y.dtype == real.dtype
    assert y.stride() == _canonical_stride(real.shape, channels_last)


def test_the_fake_implementation_keeps_dtype_and_ignores_the_input_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(2, 4, 9, 9, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        w = torch.empty(6, 2, 3, 3, dtype=torch.bfloat16)
        y = torch.ops.superopt.conv2d_relu(x, w, None, None, [2, 2], [1, 1], 2, False)
        assert y.shape == (2, 6, 5, 5) and y.dtype == torch.bfloat16
        assert y.stride() == _canonical_stride((2, 6, 5, 5), False)


@pytest.mark.parametrize("case, channels_last", [
    ((1, 2, 2, 3, 7, 7, (3, 3), (2, 2), (1, 1), True, True), True),
    ((1, 2, 2, 3, 7, 7, (3, 3), (2, 2), (1, 1), False, False), False),
    ((2, 3, 2, 2, 1, 1, (1, 1), (1, 1), (0, 0), True, True), True),  # 1x1 pixels: strides set by hand
])
def test_opcheck_passes(case, channels_last):
    """Schema, fake tensor, autograd registration and AOT dispatch (dynamic shapes) checks."""
    *shape, bias, residual = case
    x, w, b, z = _args(*shape, bias, residual)
    torch.library.opcheck(OP, (x, w, b, z, list(case[7]), list(case[8]), case[1], channels_last))


# ---- 3. the chains the IR offers ------------------------------------------------------------------

C = 8


def _conv(b, x, activation="none", name="w"):
    return b.op("conv2d", x, b.weight(name, (C, C, 3, 3)), padding=(1, 1), activation=activation)


def _chains(g):
    return conv_relu_chains(g, constant_nodes(g))


@pytest.mark.parametrize("bias_shape", [(C, 1, 1), (1, C, 1, 1)])
@pytest.mark.parametrize("bias_first", [False, True])
def test_a_conv_bias_relu_chain_is_found(bias_shape, bias_first):
    b = GraphBuilder()
    x = b.input("x", (2, C, 6, 6))
    c, bias = _conv(b, x), b.weight("bias", bias_shape)
    a = b.op("add", bias, c) if bias_first else b.op("add", c, bias)
    r = b.op("relu", a)
    ch = _chains(b.build([r]))
    assert ch == {r.node: ConvReluChain(c.node, bias, None, r.node, (a.node, r.node))}


@pytest.mark.parametrize("order", ["bias, conv+bias", "residual, conv+bias", "bias, residual", "residual first"])
def test_a_conv_bias_residual_relu_chain_is_found_in_any_operand_order(order):
    b = GraphBuilder()
    x = b.input("x", (2, C, 6, 6))
    c, bias = _conv(b, x), b.weight("bias", (C, 1, 1))
    if order == "residual first":  # conv + residual, then + bias
        a1 = b.op("add", x, c)
        a2 = b.op("add", bias, a1)
    else:
        a1 = b.op("add", c, bias) if order != "bias, residual" else b.op("add", bias, c)
        a2 = b.op("add", x, a1) if order == "residual, conv+bias" else b.op("add", a1, x)
    r = b.op("relu", a2)
    ch = _chains(b.build([r]))
    assert ch == {r.node: ConvReluChain(c.node, bias, x, r.node, (a1.node, a2.node, r.node))}


def test_a_bare_conv_relu_and_a_residual_only_chain_are_found():
    b = GraphBuilder()
    x = b.input("x", (1, C, 6, 6))
    c1 = _conv(b, x, name="w1")
    r1 = b.op("relu", c1)
    c2 = _conv(b, r1, name="w2")
    a = b.op("add", c2, r1)
    r2 = b.op("relu", a)
    # the relu's own value may be used anywhere, also as a graph output
    ch = _chains(b.build([r2, r1]))
    assert ch == {r1.node: ConvReluChain(c1.node, None, None, r1.node, (r1.node,)),
                  r2.node: ConvReluChain(c2.node, None, r1, r2.node, (a.node, r2.node))}


NEGATIVE = ["conv used twice", "conv is an output", "add used twice", "add is an output", "fused activation",
            "scalar bias", "full-size constant", "broadcast input", "conv plus itself", "ends in sigmoid",
            "ends in add", "two biases", "two residuals", "per-row constant", "conv of weights"]


@pytest.mark.parametrize("case", NEGATIVE)
def test_no_chain_where_one_call_cannot_compute_it(case):
    b = GraphBuilder()
    x = b.input("x", (2, C, 6, 6))
    c = _conv(b, x, activation="relu" if case == "fused activation" else "none")
    bias = b.weight("bias", (C, 1, 1))
    outs = []
    if case == "conv used twice":
        r = b.op("relu", b.op("add", c, bias))
        outs = [r, b.op("sigmoid", c)]
    elif case == "conv is an output":
        outs = [b.op("relu", c), c]
    elif case == "add used twice":
        a = b.op("add", c, bias)
        outs = [b.op("relu", a), b.op("sigmoid", a)]
    elif case == "add is an output":
        a = b.op("add", c, bias)
        outs = [b.op("relu", a), a]
    elif case == "fused activation":
        outs = [b.op("relu", b.op("add", c, bias))]
    elif case == "scalar bias":
        outs = [b.op("relu", b.op("add", c, b.weight("s", (1, 1, 1))))]
    elif case == "full-size constant":
        outs = [b.op("relu", b.op("add", c, b.weight("k", (C, 6, 6))))]
    elif case == "broadcast input":  # one value per channel, but computed: no constant bias
        outs = [b.op("relu", b.op("add", c, b.input("y", (1, C, 1, 1))))]
    elif case == "conv plus itself":
        outs = [b.op("relu", b.op("add", c, c))]
    elif case == "ends in sigmoid":
        outs = [b.op("sigmoid", b.op("add", b.op("add", c, bias), x))]
    elif case == "ends in add":
        outs = [b.op("add", b.op("add", c, bias), x)]
    elif case == "two biases":
        outs = [b.op("relu", b.op("add", b.op("add", c, bias), b.weight("bias2", (C, 1, 1))))]
    elif case == "two residuals":
        outs = [b.op("relu", b.op("add", b.op("add", c, x), b.input("x2", (2, C, 6, 6))))]
    elif case == "per-row constant":  # one value per row, not per channel
        outs = [b.op("relu", b.op("add", c, b.weight("rows", (1, 1, 6, 1))))]
    elif case == "conv of weights":  # computed from weights alone: folded at compile time
        k = b.op("conv2d", b.weight("img", (1, C, 6, 6)), b.weight("w2", (C, C, 3, 3)), padding=(1, 1))
        outs = [b.op("add", x, b.op("relu", k))]
    assert _chains(b.build(outs)) == {}


def test_skip_is_respected():
    b = GraphBuilder()
    x = b.input("x", (1, C, 6, 6))
    c = _conv(b, x)
    g = b.build([b.op("relu", c)])
    assert _chains(g) and conv_relu_chains(g, constant_nodes(g) | {c.node}) == {}


# ---- 4. the cost model's choice ---------------------------------------------------------------------


def _block(residual: bool, channels: int = C, hw: int = 16):
    """x -> conv 3x3 -> + bias [-> + x] -> relu."""
    b = GraphBuilder()
    x = b.input("x", (1, channels, hw, hw))
    w = b.weight("w", data=RNG.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1)
    c = b.op("conv2d", x, w, padding=(1, 1))
    y = b.op("add", c, b.weight("bias", data=RNG.standard_normal((channels, 1, 1)).astype(np.float32)))
    if residual:
        y = b.op("add", y, x)
    r = b.op("relu", y)
    return b.build([r]), c.node, r.node


def _profile(g, conv: int, graph_us=10.0, nhwc_us=10.0, relu_us=None, nhwc_relu_us=None):
    n = g.nodes[conv]
    p = Profile(device="h100")
    p.add(ProfileEntry("conv2d", dict(n.attr), [list(g.type_of(r).shape) for r in n.inputs], "float32",
                       eager_us=graph_us + 5.0, graph_us=graph_us, nhwc_us=nhwc_us, relu_us=relu_us,
                       nhwc_relu_us=nhwc_relu_us))
    return p


def _model(p, **kw):
    return CostModel("h100", p, mode="inductor", **{"conv_relu": True, **kw})


def _assert_breakdown_sums(m, g):
    bd = m.breakdown(g)
    assert m.graph_cost(g) == pytest.approx(sum(t for _, t in bd.values()))
    return bd


@pytest.mark.parametrize("residual", [False, True])
def test_a_cheap_fused_call_is_chosen_and_priced_as_measured(residual):
    g, conv, relu = _block(residual)
    p = _profile(g, conv, relu_us=1.0, nhwc_relu_us=1.0)
    m, off = _model(p), _model(p, conv_relu=False)
    fused = m.conv_relu_fusions(g)
    assert list(fused) == [relu] and fused[relu].conv == conv
    assert (fused[relu].residual is not None) == residual and fused[relu].bias is not None
    read = 1e6 * g.type_of(Ref(g.inputs[0], 0)).numel * m.itemsize / m.bandwidth if residual else 0.0
    assert m.graph_cost(g) == pytest.approx(1.0 + read)  # the one call is all that runs
    assert m.graph_cost(g) < m.graph_cost(g, conv_relu=False) == pytest.approx(off.graph_cost(g))
    assert m.kernels(g) == 1 and off.kernels(g) == 2
    bd = _assert_breakdown_sums(m, g)
    count, saved = bd["cudnn conv+relu (saved)"]
    assert count == 1 and saved < 0
    assert saved == pytest.approx(m.graph_cost(g) - m.graph_cost(g, conv_relu=False))
    assert "cudnn conv+relu (saved)" not in _assert_breakdown_sums(off, g)


def test_an_expensive_fused_call_is_not_chosen():
    g, conv, relu = _block(True)
    m = _model(_profile(g, conv, relu_us=1000.0, nhwc_relu_us=1000.0))
    assert m.conv_relu_fusions(g) == {}
    assert m.graph_cost(g) == pytest.approx(m.graph_cost(g, conv_relu=False))
    assert m.kernels(g) == 2
    assert "cudnn conv+relu (saved)" not in _assert_breakdown_sums(m, g)


@pytest.mark.parametrize("relu_us", [0.01, 1.0, 5.0, 10.0, 12.0, 15.0, 20.0, 100.0])
def test_fusion_never_makes_a_graph_dearer_and_is_chosen_exactly_when_cheaper(relu_us):
    g, conv, _ = _block(True)
    m = _model(_profile(g, conv, relu_us=relu_us, nhwc_relu_us=relu_us))
    on, off = m.graph_cost(g), m.graph_cost(g, conv_relu=False)
    assert on <= off + 1e-9
    assert bool(m.conv_relu_fusions(g)) == (on < off - 1e-9)
    _assert_breakdown_sums(m, g)


def test_without_a_measured_fused_time_nothing_is_fused():
    g, conv, _ = _block(True)
    m = _model(_profile(g, conv))  # an older profile: no relu_us, no nhwc_relu_us
    assert m.conv_relu_fusions(g) == {} and m.graph_cost(g) == pytest.approx(m.graph_cost(g, conv_relu=False))
    # a convolution the profile lacks is not priced from a neighbour's fused time either
    g2, conv2, _ = _block(True, hw=12)
    assert _model(_profile(g, conv, relu_us=0.01, nhwc_relu_us=0.01)).conv_relu_fusions(g2) == {}


def test_off_by_default_off_without_a_profile_and_off_outside_inductor_mode():
    g, conv, _ = _block(True)
    p = _profile(g, conv, relu_us=0.01, nhwc_relu_us=0.01)
    assert CostModel("h100", p, mode="inductor").conv_relu_fusions(g) == {}  # the default
    assert _model(p, conv_relu=False).conv_relu_fusions(g) == {}
    assert not _model(None).conv_relu and _model(None).conv_relu_fusions(g) == {}
    for mode in ("eager", "graph"):
        m = CostModel("h100", p, mode=mode, conv_relu=True)
        assert not m.conv_relu and m.conv_relu_fusions(g) == {}
        assert "cudnn conv+relu (saved)" not in m.breakdown(g)


def test_the_fused_time_of_the_graph_s_layout_is_used():
    # 128 channels, 3x3: Inductor's own rule runs it channels-last
    g, conv, relu = _block(False, channels=128)
    p = _profile(g, conv, relu_us=0.01, nhwc_relu_us=None)  # measured NCHW only
    rule, choose = _model(p), _model(p, layout="choose")
    assert rule.channels_last_for(g) and rule.conv_relu_fusions(g) == {}
    assert not choose.channels_last_for(g) and list(choose.conv_relu_fusions(g)) == [relu]
    assert list(rule.conv_relu_fusions(g, layout="choose")) == [relu]
    q = _profile(g, conv, graph_us=100.0, nhwc_us=10.0, relu_us=None, nhwc_relu_us=1.0)  # channels-last only
    m = _model(q, layout="choose")
    assert m.channels_last_for(g) and list(m.conv_relu_fusions(g)) == [relu]
    bd = _assert_breakdown_sums(m, g)  # the input's channels-last copy is one line of it
    assert "layout copy" in bd and "cudnn conv+relu (saved)" in bd


def test_chains_sharing_one_epilogue_kernel_are_fused_together():
    """relu(conv1(x)) is the residual of conv2(x): Inductor makes one kernel of both epilogues."""
    b = GraphBuilder()
    x = b.input("x", (1, C, 16, 16))
    c1 = b.op("conv2d", x, b.weight("w1", (C, C, 3, 3)), padding=(1, 1))
    r1 = b.op("relu", c1)
    c2 = b.op("conv2d", x, b.weight("w2", (C, C, 3, 3)), padding=(1, 1))
    r2 = b.op("relu", b.op("add", c2, r1))
    g = b.build([r2])
    p = _profile(g, c1.node, relu_us=1.0, nhwc_relu_us=1.0)  # both convolutions have the same shape
    m, off = _model(p), _model(p, conv_relu=False)
    assert sorted(m.conv_relu_fusions(g)) == sorted([r1.node, r2.node])
    assert off.kernels(g) == 3 and m.kernels(g) == 2
    _assert_breakdown_sums(m, g)


def test_the_shipped_profiles_measured_the_fused_calls():
    for name in ("h100-fp32", "h100-bf16", "h100-tf32"):
        p = shipped_profile(name)
        convs = [e for e in p.entries.values() if e.op == "conv2d"]
        assert convs and all(e.relu_us is not None and e.relu_us > 0 for e in convs)
        assert all(e.nhwc_relu_us is not None and e.nhwc_relu_us > 0 for e in convs)
        floor, bandwidth = p.settings["generated_kernel_line"]
        assert 0 < floor < 10 and 1e11 < bandwidth < 1e13
        pts = sorted(p.settings["generated_kernel_points"])
        m = CostModel("h100", p, mode="inductor")
        assert m.kernel_floor_us == pytest.approx(pts[0][1]) and 1e11 < m.bandwidth < 1e13
        assert m.generated_us(pts[-1][0]) == pytest.approx(max(t for _, t in pts))
    # a ResNet-50 basic block at batch 1 in bf16: the fused call is measured faster
    g, _, relu = _block(True, channels=64, hw=56)
    m = _model(shipped_profile("h100-bf16"), layout="choose")
    assert list(m.conv_relu_fusions(g)) == [relu]
    assert m.graph_cost(g) < m.graph_cost(g, conv_relu=False)


# ---- 5. the FX code -----------------------------------------------------------------------------------


def _residual_net(residual_first: bool = False):
    """h = relu(conv1(x) + b1); y = relu(conv2(h) + b2 + x)."""
    b = GraphBuilder()
    x = b.input("x", (2, C, 8, 8))

    def w(name, shape, scale=0.2):
        return b.weight(name, data=(RNG.standard_normal(shape) * scale).astype(np.float32))
    h = b.op("relu", b.op("add", b.op("conv2d", x, w("w1", (C, C, 3, 3)), padding=(1, 1)), w("b1", (C, 1, 1))))
    c2 = b.op("add", b.op("conv2d", h, w("w2", (C, C, 3, 3)), padding=(1, 1)), w("b2", (1, C, 1, 1)))
    y = b.op("relu", b.op("add", x, c2) if residual_first else b.op("add", c2, x))
    return b.build([y])


def _fused_calls(gm):
    return sum(n.op == "call_function" and n.target in (OP, torch.ops.superopt.conv2d_relu) for n in gm.graph.nodes)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("residual_first", [False, True])
def test_fx_code_with_fused_calls_computes_the_same(channels_last, residual_first):
    g = _residual_net(residual_first)
    chains = _chains(g)
    assert len(chains) == 2 and sum(ch.residual is not None for ch in chains.values()) == 1
    x = torch.randn(2, C, 8, 8)
    plain = to_fx(g)
    fused = to_fx(g, conv_relu=chains, channels_last=channels_last)
    assert _fused_calls(plain) == 0 and _fused_calls(fused) == 2
    assert {torch.relu, torch.conv2d} <= {n.target for n in plain.graph.nodes if n.op == "call_function"}
    # nothing else is computed: the adds and relus are inside the calls
    assert {n.target for n in fused.graph.nodes if n.op == "call_function"} <= {OP, torch.ops.superopt.conv2d_relu}
    want = plain(x)
    got = fused(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.numpy(), evaluate(g, {"x": x.numpy()})[0], rtol=1e-4, atol=1e-4)
    assert got.is_contiguous(memory_format=_fmt(channels_last))
    if channels_last:  # the convolutions' kernels are stored as the calls read them
        ws = [t for t in fused.buffers() if t.dim() == 4]
        assert ws and all(t.is_contiguous(memory_format=torch.channels_last) for t in ws)


def test_fx_code_emits_only_the_chains_it_is_given():
    g = _residual_net()
    chains = _chains(g)
    one = dict([max(chains.items())])  # the residual block's second convolution only
    gm = to_fx(g, conv_relu=one)
    assert _fused_calls(gm) == 1
    x = torch.randn(2, C, 8, 8)
    torch.testing.assert_close(gm(x), to_fx(g)(x), rtol=1e-5, atol=1e-5)
    assert _fused_calls(to_fx(g, conv_relu={})) == 0
    assert _fused_calls(to_fx(g, conv_relu=None, channels_last=True)) == 0
    # the cost model's choice goes in as it is
    conv = next(i for i, n in enumerate(g.nodes) if n.op == "conv2d")
    fusions = _model(_profile(g, conv, relu_us=0.01, nhwc_relu_us=0.01)).conv_relu_fusions(g)
    assert len(fusions) == 2 and _fused_calls(to_fx(g, conv_relu=fusions)) == 2


@pytest.mark.parametrize("channels_last", [False, True])
def test_fx_code_with_a_computed_bias_and_a_shared_kernel(channels_last):
    """The bias a reshape of a weight vector (folded, not a weight node); one kernel for both
    convolutions (stored channels-last once per call)."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 5))
    w = b.weight("w", data=(RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32))
    bias = b.op("reshape", b.weight("b", data=RNG.standard_normal(4).astype(np.float32)), shape=(4, 1, 1))
    r1 = b.op("relu", b.op("add", b.op("conv2d", x, w, padding=(1, 1)), bias))
    r2 = b.op("relu", b.op("add", b.op("conv2d", r1, w, padding=(1, 1)), x))
    g = b.build([r2])
    chains = _chains(g)
    assert len(chains) == 2 and chains[r1.node].bias == bias
    gm = to_fx(g, conv_relu=chains, channels_last=channels_last)
    assert _fused_calls(gm) == 2
    xs = torch.randn(1, 4, 5, 5)
    torch.testing.assert_close(gm(xs), to_fx(g)(xs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pinned_layout_leaves_no_aten_convolution_for_inductor_s_own_rule(channels_last):
    """With ``pin_layout`` every convolution the chains leave is a ``superopt::conv2d`` call in the
    chosen layout (Inductor's layout rule counts aten convolutions only), computing the same."""
    g = _residual_net()
    one = dict([max(_chains(g).items())])  # the first convolution stays a plain one
    gm = to_fx(g, conv_relu=one, channels_last=channels_last, pin_layout=True)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.conv2d not in targets and F.conv2d not in targets
    assert targets.count(torch.ops.superopt.conv2d.default) + targets.count(torch.ops.superopt.conv2d) == 1
    x = torch.randn(2, C, 8, 8)
    torch.testing.assert_close(gm(x), to_fx(g)(x), rtol=1e-5, atol=1e-5)
    y = torch.ops.superopt.conv2d(x, torch.randn(3, C, 3, 3), torch.randn(3), [2, 1], [1, 0], 1, channels_last)
    assert y.is_contiguous(memory_format=_fmt(channels_last)) and y.shape == (2, 3, 4, 6)


@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on the CPU needs a C++ compiler")
def test_inductor_compiles_the_fused_calls():
    g = _residual_net()
    gm = to_fx(g, conv_relu=_chains(g), channels_last=True)
    x = torch.randn(2, C, 8, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(gm, backend="inductor")(x)
    torch.testing.assert_close(got, to_fx(g)(x), rtol=1e-5, atol=1e-5)


# ---- 6. the backend ---------------------------------------------------------------------------------


class _BasicBlock(torch.nn.Module):
    """A ResNet-50 stage-1 basic block at batch 1 (shapes the shipped profile measured)."""

    def __init__(self, c=64):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        for bn in (self.b1, self.b2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 2)
            bn.bias.data.uniform_(-1, 1)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(h)) + x)


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return _BasicBlock().eval()


@pytest.mark.parametrize("conv_relu", [True, False])
def test_the_backend_emits_the_fused_calls_and_matches_eager(block, conv_relu):
    torch._dynamo.reset()
    CACHE.clear()
    opts = {"device": "h100", "dtype": "bf16", "inductor": False, "time_limit": 5, "conv_relu": conv_relu}
    f = torch.compile(block, backend=superopt_backend, options=opts)
    x = torch.randn(1, 64, 56, 56)
    with torch.no_grad():
        got, want = f(x), block(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    rep = last_report()
    module = list(CACHE.values())[-1][0]
    calls = 0 if module is None else _fused_calls(module)
    if conv_relu:
        assert "conv+ReLU fusion" in rep["cost_model"]
        # BN folded into the convolutions: both are conv + bias [+ x] + relu, measured faster fused
        assert rep["conv_relu_fused"] >= 1 and module is not None and calls == rep["conv_relu_fused"]
    else:
        assert rep.get("conv_relu_fused", 0) == 0 and calls == 0
        assert "conv+ReLU" not in rep["cost_model"]
