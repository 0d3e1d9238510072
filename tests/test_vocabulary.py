"""The generator's vocabulary speaks real models: broadcast operands, rank-3 and rank-4 data,
registry roles; the classic identities are in the shipped database at the ranks models use and
apply to small models; batch norm after a biased convolution and a ConvNeXt block's layer scale
fold into weights with generated rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from superopt.cost import CostModel
from superopt.frontend import from_module
from superopt.generate import Settings, generate
from superopt.generate.classics import rule_ids
from superopt.generate.families import FAMILIES, SHIPPED
from superopt.generate.opsets import OpTable, broadcast_ok, parse_inputs
from superopt.ir import GraphBuilder, Rule, TensorType, get_op
from superopt.rules import RuleDB
from superopt.search import fold_constants, search
from superopt.driver import LoadedModel, optimize, relative_error
from superopt.rules.load import DEFAULT_RULES, load_rules
from superopt.semantics import evaluate

H100 = CostModel("h100")
RNG = np.random.default_rng(0)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def shipped():
    """Ids (both directions) of the proven rules of the shipped database, and the rules."""
    with RuleDB.open(DEFAULT_RULES) as db:
        rules = db.proven_rules()
    return set().union(*(rule_ids(r) for r in rules)), load_rules(DEFAULT_RULES)


def _side(inputs, body):
    """Generated rules have every tensor as an input node (the flag says which are weights
    only for the reader)."""
    b = GraphBuilder()
    refs = {n: b.input(n, s) for n, s, _ in inputs}
    out = body(b, refs)
    return b.build(out if isinstance(out, list) else [out])


def _rule(inputs, lhs, rhs) -> Rule:
    return Rule(_side(inputs, lhs), _side(inputs, rhs))


# ---- the vocabulary -----------------------------------------------------------------------------

def test_broadcast_operands_are_biases_and_scales_only():
    t = TensorType
    assert broadcast_ok(t((2, 6, 5, 7)), t((6, 1, 1))) and broadcast_ok(t((6, 1, 1)), t((2, 6, 5, 7)))
    assert broadcast_ok(t((2, 3, 7)), t((7,))) and broadcast_ok(t((6, 1, 1, 1)), t((6, 4, 3, 3)))
    assert not broadcast_ok(t((2, 1)), t((1, 3)))          # an outer sum grows both
    assert not broadcast_ok(t((2, 6, 5, 7)), t(()))        # a scalar scale is smul
    assert not broadcast_ok(t((2, 6, 5, 7)), t((4, 1, 1)))  # channels differ


def test_elementwise_operators_take_a_bias():
    table = OpTable(("add", "mul"), parse_inputs("x=2x6x5x7,b=6x1x1:w"))
    img, bias = TensorType((2, 6, 5, 7)), TensorType((6, 1, 1))
    assert [out for _, out in table.apply("add", (img, bias))] == [(img,)]
    assert table.apply("add", (img, TensorType((4, 1, 1)))) == ()


def test_roles_come_from_the_registry():
    assert get_op("conv2d").roles == ("data", "weight")
    table = OpTable(("conv2d", "reshape"), parse_inputs("x=2x4x5x7,w=6x4x3x3:w"), weight_ops=("reshape",))
    assert table.roles_allow("conv2d", (False, True)) and not table.roles_allow("conv2d", (True, True))
    assert table.roles_allow("reshape", (True,)) and not table.roles_allow("reshape", (False,))


@pytest.mark.parametrize("name", SHIPPED)
def test_family_sizes_are_distinct_per_role(name):
    """Within a family, the axes of the data inputs have sizes no other axis has (up to a
    merged output, whose size is a sum): a lifted rule cannot tie two sizes by accident."""
    fam = FAMILIES[name]
    data = [s.shape for s in fam.inputs if not s.weight]
    first = data[0]
    assert len(set(first)) == len(first), f"{name}: {first} repeats a size"
    assert len({s.name for s in fam.inputs}) == len(fam.inputs)
    # at least two data inputs, but conv2d_bias's families: with a second image their sums of
    # convolutions only grow the e-graph (docs/rules.md, "The rules of conv2d_bias")
    assert sum(not s.weight for s in fam.inputs) >= (1 if name in ("cnn_bias", "cnn_bias_relu") else 2)


def test_last_axis_rules_at_rank_3():
    rules = generate(Settings.make(max_ops=3, ops="gelu,concat", inputs="x=2x3x5,y=2x3x5"),
                     workers=1, progress=False).rules
    texts = [r.text() for r in rules]
    assert any("concat[axis=2]" in t and "gelu" in t for t in texts), texts


# ---- the classic identities in the shipped database ----------------------------------------------

_IMG, _KER, _VEC = (2, 4, 5, 7), (6, 4, 3, 3), (4, 1, 1)
_SEQ, _W, _FEAT = (2, 3, 5), (5, 7), (5,)

CLASSICS = {
    "rank 4: mul distributes over add": _rule(
        [("x0", _IMG, False), ("x1", _IMG, False), ("c0", _VEC, True)],
        lambda b, r: b.op("mul", b.op("add", r["x0"], r["x1"]), r["c0"]),
        lambda b, r: b.op("add", b.op("mul", r["x0"], r["c0"]), b.op("mul", r["x1"], r["c0"]))),
    "rank 4: relu through concat": _rule(
        [("x0", _IMG, False), ("x1", _IMG, False)],
        lambda b, r: b.op("concat", b.op("relu", r["x0"]), b.op("relu", r["x1"]), axis=1),
        lambda b, r: b.op("relu", b.op("concat", r["x0"], r["x1"], axis=1))),
    "rank 4: conv of a sum": _rule(
        [("x0", _IMG, False), ("x1", _IMG, False), ("w0", _KER, True)],
        lambda b, r: b.op("conv2d", b.op("add", r["x0"], r["x1"]), r["w0"], padding=(1, 1)),
        lambda b, r: b.op("add", b.op("conv2d", r["x0"], r["w0"], padding=(1, 1)),
                          b.op("conv2d", r["x1"], r["w0"], padding=(1, 1)))),
    "rank 4: concat of two convs of one image": _rule(
        [("x0", _IMG, False), ("w0", _KER, True), ("w1", _KER, True)],
        lambda b, r: b.op("concat", b.op("conv2d", r["x0"], r["w0"]), b.op("conv2d", r["x0"], r["w1"]), axis=1),
        lambda b, r: b.op("conv2d", r["x0"], b.op("concat", r["w0"], r["w1"], axis=0))),
    "rank 3: mul distributes over add": _rule(
        [("x0", _SEQ, False), ("x1", _SEQ, False), ("g0", _FEAT, True)],
        lambda b, r: b.op("mul", b.op("add", r["x0"], r["x1"]), r["g0"]),
        lambda b, r: b.op("add", b.op("mul", r["x0"], r["g0"]), b.op("mul", r["x1"], r["g0"]))),
    "rank 3: gelu through last-axis concat": _rule(
        [("x0", _SEQ, False), ("x1", _SEQ, False)],
        lambda b, r: b.op("concat", b.op("gelu", r["x0"]), b.op("gelu", r["x1"]), axis=2),
        lambda b, r: b.op("gelu", b.op("concat", r["x0"], r["x1"], axis=2))),
    "rank 3: linear of a sum": _rule(
        [("x0", _SEQ, False), ("x1", _SEQ, False), ("w0", _W, True)],
        lambda b, r: b.op("matmul", b.op("add", r["x0"], r["x1"]), r["w0"]),
        lambda b, r: b.op("add", b.op("matmul", r["x0"], r["w0"]), b.op("matmul", r["x1"], r["w0"]))),
    "rank 3: concat of two linears of one input": _rule(
        [("x0", _SEQ, False), ("w0", _W, True), ("w1", _W, True)],
        lambda b, r: b.op("concat", b.op("matmul", r["x0"], r["w0"]), b.op("matmul", r["x0"], r["w1"]), axis=2),
        lambda b, r: b.op("matmul", r["x0"], b.op("concat", r["w0"], r["w1"], axis=1))),
}


@pytest.mark.parametrize("name", list(CLASSICS))
def test_classic_identity_is_shipped_and_proven(name, shipped):
    ids, _ = shipped
    assert rule_ids(CLASSICS[name]) & ids, f"{name}: {CLASSICS[name].text()} is not a proven rule of {DEFAULT_RULES}"


def _check(g, res):
    res.graph.check()
    env = {n.name: np.random.default_rng(1).standard_normal(n.types[0].shape) for n in g.nodes if n.op == "input"}
    assert relative_error(evaluate(fold_constants(res.graph), env), evaluate(g, env)) < 1e-5
    assert res.report.cost_after < res.report.cost_before


def test_fire_module_merges_at_rank_4(shipped):
    """SqueezeNet's fire module: two convs with bias and relu of one image, concatenated."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 14, 14))
    e1 = b.op("add", b.op("conv2d", x, b.weight("w1", data=_w(32, 16, 1, 1))), b.weight("b1", data=_w(32, 1, 1)))
    e3 = b.op("add", b.op("conv2d", x, b.weight("w3", data=_w(32, 16, 3, 3)), padding=(1, 1)),
              b.weight("b3", data=_w(32, 1, 1)))
    g = b.build([b.op("concat", b.op("relu", e1), b.op("relu", e3), axis=1)])
    res = search(g, shipped[1], H100, budget=300, progress=False)
    _check(g, res)
    # backtracking: one merged conv2d, its bias add and relu, or (since conv2d_bias) each branch one
    # conv2d_bias with its relu and the concat; three kernels either way
    assert len([n for n in fold_constants(res.graph).nodes if n.name is None]) == 3
    assert res.report.cost_after < 0.45 * res.report.cost_before
    # saturation sees both moves: the merged convolution with its bias and relu, one kernel
    from superopt.search.instance_proofs import InstanceProofs
    from superopt.search.saturate import saturate
    best = fold_constants(saturate(g, shipped[1], H100, InstanceProofs(store=None)).graph)
    assert [(n.op, n.attr.get("activation")) for n in best.nodes if n.name is None] == [("conv2d_bias", "relu")]


def test_query_key_linears_merge_at_rank_3(shipped):
    b = GraphBuilder()
    x = b.input("x", (1, 16, 32))
    q = b.op("add", b.op("matmul", x, b.weight("wq", data=_w(32, 32))), b.weight("bq", data=_w(32)))
    k = b.op("add", b.op("matmul", x, b.weight("wk", data=_w(32, 32))), b.weight("bk", data=_w(32)))
    g = b.build([b.op("gelu", q), b.op("gelu", k)])
    res = search(g, shipped[1], H100, budget=300, progress=False)
    _check(g, res)
    assert [n.op for n in fold_constants(res.graph).nodes if n.name is None].count("matmul") == 1


# ---- folding constant scales into weights, through optimize ----------------------------------------

def _optimize(module, inputs, rules, alpha=1.05):
    graph, _ = from_module(module.eval(), inputs, source="test")
    return optimize(LoadedModel("test", graph, module, inputs), rules, H100, alpha=alpha, budget=300,
                    progress=False)


class _ConvBiasBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 16, 3, padding=1, bias=True), nn.BatchNorm2d(16)
        with torch.no_grad():
            self.bn.running_mean.normal_(), self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5), self.bn.bias.normal_()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_with_bias_then_batchnorm_folds(shipped):
    """batch norm -> per-channel affine (curated), the scale into the kernel, the biases summed
    and made the convolution's bias operand with the relu fused (generated): the search composes
    the fold. A one-layer model needs a wider alpha to pass
    the affine step, which costs one more kernel before the fold takes two away."""
    torch.manual_seed(0)
    out, rep, _ = _optimize(_ConvBiasBN(), (torch.randn(1, 8, 12, 12),), shipped[1], alpha=1.5)
    # (the relu too, since conv2d_bias: one kernel)
    assert [(n.op, n.attr.get("activation")) for n in out.nodes if n.name is None] == [("conv2d_bias", "relu")]
    assert rep.max_relative_error < 1e-4


def test_convnext_block_layer_scale_folds(shipped):
    from superopt.models.convnext import convnext_block
    torch.manual_seed(0)
    out, rep, _ = _optimize(convnext_block(16), (torch.randn(1, 16, 10, 10),), shipped[1])
    assert rep.cost_after < rep.cost_before and rep.max_relative_error < 1e-4
    assert [n.op for n in out.nodes if n.name is None].count("mul") < 2  # the layer scale is gone
