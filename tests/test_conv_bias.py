"""conv2d_bias, a convolution with a bias operand and a fused ReLU (issue 25): its semantics
agree, its axioms hold, torch convolutions with a bias import as it, the generated rules that
make it are proven and applied with the output check passing, and a wrong rule is refused."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from superopt.axioms import load_axioms
from superopt.axioms.check import check_axiom
from superopt.codegen import to_fx
from superopt.cost import CostModel
from superopt.errors import ShapeError
from superopt.ir import GraphBuilder, Rule
from superopt.rules import RuleDB
from superopt.rules.load import DEFAULT_RULES, load_rules
from superopt.rules.paths import default_db_path
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.saturate import saturate
from superopt.semantics import evaluate
from superopt.semantics.field import Field
from superopt.semantics.reference import random_inputs
from superopt.semantics.torch_lowering import run
from superopt.verify import verify_rules

H100 = CostModel("h100")


def _conv_bias(act="none", stride=(1, 1), padding=(1, 1), groups=1, bias_shape=(6,)):
    b = GraphBuilder()
    x, w = b.input("x", (2, 4, 5, 7)), b.input("w", (6, 4 // groups, 3, 3))
    return b.build([b.op("conv2d_bias", x, w, b.input("b", bias_shape), stride=stride, padding=padding,
                         groups=groups, activation=act)])


def _defined(act="none", stride=(1, 1), padding=(1, 1), groups=1):
    """The same as conv2d + add of the bias as [6, 1, 1] (+ relu): the definition."""
    b = GraphBuilder()
    x, w, bias = b.input("x", (2, 4, 5, 7)), b.input("w", (6, 4 // groups, 3, 3)), b.input("b", (6,))
    y = b.op("add", b.op("conv2d", x, w, stride=stride, padding=padding, groups=groups),
             b.op("reshape", bias, shape=(6, 1, 1)))
    return b.build([b.op("relu", y) if act == "relu" else y])


CASES = [("none", (1, 1), (1, 1), 1), ("relu", (2, 2), (0, 1), 2), ("relu", (1, 1), (1, 1), 1)]


@pytest.mark.parametrize("act, stride, padding, groups", CASES)
def test_the_three_semantics_agree_with_torch_and_the_definition(act, stride, padding, groups):
    g = _conv_bias(act, stride, padding, groups)
    env = random_inputs(g, np.random.default_rng(0))
    want, = evaluate(g, env)
    got, = run(g, env, dtype=torch.float64)
    x, w, b = (torch.from_numpy(env[n]) for n in "xwb")
    direct = F.conv2d(x, w, b, stride, padding, 1, groups)
    direct = torch.relu(direct) if act == "relu" else direct
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(direct.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(evaluate(_defined(act, stride, padding, groups), env)[0], want, rtol=1e-12, atol=1e-12)
    field = Field(seed=3)
    fenv = field.random_inputs(g, np.random.default_rng(1))
    assert np.array_equal(field.evaluate(g, fenv)[0], field.evaluate(_defined(act, stride, padding, groups), fenv)[0])


def test_a_bias_of_another_shape_is_a_shape_error_that_says_what_it_must_be():
    with pytest.raises(ShapeError, match=r"bias must be \[6\]"):
        _conv_bias(bias_shape=(6, 1, 1))


@pytest.mark.parametrize("name", ["conv2d_bias_def", "conv2d_bias_add_channel", "conv2d_bias_relu"])
def test_its_axioms_hold_numerically(name):
    axiom, = [a for a in load_axioms() if a.name == name]
    res = check_axiom(axiom)
    assert res.problem == "" and res.instances >= 20 and res.max_error < 1e-9


# ---- import ------------------------------------------------------------------------------------

def _loaded(module, x):
    from superopt.driver import LoadedModel
    from superopt.frontend import import_program
    from superopt.frontend.torch_import import export_module
    ep = export_module(module.eval(), (x,))
    g, _, sig = import_program(ep)
    return LoadedModel("conv_bias", g, module, (x,), signature=sig, program=ep)


@pytest.mark.parametrize("as_one", [False, True])
def test_a_torch_convolution_with_a_bias_imports_and_round_trips(as_one, monkeypatch):
    """By default as conv2d and the bias add (the search then has both forms: SqueezeNet 1.1 was
    searched better so, see docs/search.md), with ``CONV_BIAS_IMPORT`` as one conv2d_bias node."""
    from superopt.frontend import aten
    monkeypatch.setattr(aten, "CONV_BIAS_IMPORT", as_one)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, stride=2), nn.ReLU(), nn.Conv2d(8, 4, 1, bias=False))
    x = torch.randn(2, 3, 9, 9)
    g = _loaded(module, x).graph
    ops = [n.op for n in g.nodes if n.opdef.kind == "compute"]
    assert ops == (["conv2d_bias", "relu", "conv2d"] if as_one else ["conv2d", "add", "relu", "conv2d"])
    with torch.no_grad():
        assert torch.allclose(to_fx(g)(x), module(x), atol=1e-5)


# ---- rules -------------------------------------------------------------------------------------

@functools.cache
def _proven_rules():
    with RuleDB.open(default_db_path()) as db:
        return tuple(db.proven_rules())


def test_the_shipped_database_makes_it_from_a_convolution_and_its_bias_and_fuses_the_relu():
    texts = {r.text() for r in _proven_rules()}
    assert ("add(conv2d[padding=(1,1)](x0, w0), b0) => "
            "conv2d_bias[padding=(1,1)](x0, w0, reshape[shape=(6)](b0))") in texts
    assert "conv2d_bias(x0, w0, reshape[shape=(6)](b0)) => add(b0, conv2d(x0, w0))" in texts
    assert "relu(conv2d_bias(x0, w0, v0)) => conv2d_bias[activation='relu'](x0, w0, v0)" in texts


def test_conv_batchnorm_relu_becomes_one_kernel_with_the_output_check_passing():
    from superopt.driver import optimize
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    module = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, bias=False), bn, nn.ReLU())
    model = _loaded(module, torch.randn(1, 4, 8, 8))
    best, rep, _ = optimize(model, load_rules(DEFAULT_RULES, False, True), H100, time_limit=60, progress=False,
                            input_sets=2, min_gain=0.0)
    runs = [n for i, n in enumerate(best.nodes) if n.opdef.kind == "compute" and i in best.live()
            and not all(best.nodes[r.node].op == "weight" or best.nodes[r.node].opdef.kind == "constant"
                        for r in n.inputs)]
    assert [(n.op, n.attr.get("activation")) for n in runs] == [("conv2d_bias", "relu")], best
    assert rep.cost_after < rep.cost_before and rep.max_relative_error < 1e-5


def _rule(left, right) -> Rule:
    sides = []
    for f in (left, right):
        b = GraphBuilder()
        x, w, u = b.input("x", (2, 4, 5, 7)), b.input("w", (6, 4, 3, 3)), b.input("u", (6, 1, 1))
        sides.append(b.build([f(b, x, w, u)]))
    return Rule(*sides)


def _vector(b, u):
    return b.op("reshape", u, shape=(6,))


TRUE = _rule(lambda b, x, w, u: b.op("relu", b.op("add", b.op("conv2d", x, w, padding=(1, 1)), u)),
             lambda b, x, w, u: b.op("conv2d_bias", x, w, _vector(b, u), padding=(1, 1), activation="relu"))
#: the bias after the ReLU, not before it
FORGED = _rule(lambda b, x, w, u: b.op("add", b.op("relu", b.op("conv2d", x, w, padding=(1, 1))), u),
               lambda b, x, w, u: b.op("conv2d_bias", x, w, _vector(b, u), padding=(1, 1), activation="relu"))


def test_the_fusion_is_proven_and_a_forged_one_is_not():
    good, bad = verify_rules([TRUE, FORGED], timeout_s=10, progress=False)
    assert (good.status, good.crosscheck) == ("proven", "passed")
    assert bad.status != "proven"


def test_the_search_never_applies_the_forged_rule():
    """The saturation's proof gate proves each instance before it is used: the forged rule's
    instance is refused, so the graph keeps its ReLU before the bias."""
    b = GraphBuilder()
    x, w, u = b.input("x", (2, 4, 5, 7)), b.input("w", (6, 4, 3, 3)), b.input("u", (6, 1, 1))
    g = b.build([b.op("add", b.op("relu", b.op("conv2d", x, w, padding=(1, 1))), u)])
    res = saturate(g, [FORGED], H100, InstanceProofs(store=None))
    assert res.report.rejected.get("instance not proven", 0) >= 1
    assert not any(n.op == "conv2d_bias" for n in res.graph.nodes)
    env = random_inputs(g, np.random.default_rng(0))
    np.testing.assert_allclose(evaluate(res.graph, env)[0], evaluate(g, env)[0])


# ---- cuDNN's fused call (the superopt backend's conv_relu) ----------------------------------------

@pytest.mark.parametrize("channels_last", [False, True])
def test_its_relu_and_residual_chains_run_as_the_fused_cudnn_call(channels_last):
    """conv2d_bias with its relu is a chain by itself, conv2d_bias + residual + relu one too: both
    emitted as ``superopt::conv2d_relu`` (its reference off CUDA), equal to the plain code."""
    from superopt.cost.fusion import conv_relu_chains
    from superopt.cost.model import constant_nodes
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (2, 4, 6, 6))
    w1, w2 = (b.weight(n, data=rng.standard_normal((4, 4, 3, 3)).astype(np.float32)) for n in ("w1", "w2"))
    b1, b2 = (b.weight(n, data=rng.standard_normal(4).astype(np.float32)) for n in ("b1", "b2"))
    h = b.op("conv2d_bias", x, w1, b1, padding=(1, 1), activation="relu")
    y = b.op("relu", b.op("add", b.op("conv2d_bias", h, w2, b2, padding=(1, 1)), x))
    g = b.build([y])
    chains = conv_relu_chains(g, constant_nodes(g))
    kinds = sorted((ch.relu == ch.conv, ch.residual is not None) for ch in chains.values())
    assert kinds == [(False, True), (True, False)]  # + residual + relu; with its own relu
    gm = to_fx(g, conv_relu=chains, channels_last=channels_last)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "conv2d_relu" in str(n.target)]
    xs = torch.randn(2, 4, 6, 6)
    assert len(calls) == 2
    torch.testing.assert_close(gm(xs), to_fx(g)(xs), rtol=1e-5, atol=1e-5)
