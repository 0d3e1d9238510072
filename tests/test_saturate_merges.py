"""The merge rounds' refusals (search/saturate.py, ``_Runner._merge``): a merge of operators made
from a common weight, and a merge of the same weights on the same data as an earlier round's."""

from __future__ import annotations

import numpy as np

from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.rules import examples as ex
from superopt.search.compiled import compile_rules
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.report import StopReason
from superopt.search.saturate import saturate

H100 = CostModel("h100")
GATE = InstanceProofs(store=None)  # the proof at each instance, in memory
SHARED, EARLIER = "merge of operators sharing a weight", "merged in an earlier round"


def _side(sources, f):
    b = GraphBuilder()
    v = {n: (b.input if kind == "input" else b.weight)(n, shape) for n, shape, kind in sources}
    out = f(b, v)
    return b.build(out if isinstance(out, list) else [out])


def _merge_as_inputs(kernel: int = 1) -> Rule:
    """conv(x, a), conv(x, b) => the pieces of conv(x, concat(a, b)), with the kernels stated as
    inputs (as the generated rules state them): they bind compile-time classes or data alike."""
    pad = (kernel // 2,) * 2
    src = [("x", (1, 6, 8, 8), "input"), ("a", (4, 6, kernel, kernel), "input"), ("b", (4, 6, kernel, kernel), "input")]
    return Rule(_side(src, lambda b, v: [b.op("conv2d", v["x"], v["a"], padding=pad),
                                         b.op("conv2d", v["x"], v["b"], padding=pad)]),
                _side(src, lambda b, v: list(b.op("split", b.op("conv2d", v["x"], b.op("concat", v["a"], v["b"], axis=0),
                                                                 padding=pad), axis=1, sizes=(4, 4)))))


def _conv_bn():
    """x -> conv 1x1 -> batch norm: folded, the model's convolution and the folded one share w."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8))
    w = b.weight("w", (16, 16, 1, 1), rng.standard_normal((16, 16, 1, 1)).astype(np.float32))
    stats = [b.weight(n, (16,), (np.abs(rng.standard_normal(16)) + (n == "v")).astype(np.float32)) for n in "sbmv"]
    return b.build([b.op("batchnorm", b.op("conv2d", x, w), *stats)])


class _WideCheap(CostModel):
    """H100's prices, but a convolution with more output channels is cheaper (a profile can say
    so where a wider kernel gets a better algorithm)."""

    def node_time(self, op, attrs, ins, outs):
        if op == "conv2d":
            return 100.0 / outs[0].shape[1]
        return super().node_time(op, attrs, ins, outs)


def test_a_merge_of_a_convolution_and_its_folded_form_is_refused():
    rules = [ex.fold_conv_batchnorm((1, 1), (0, 0), 1), _merge_as_inputs()]
    assert compile_rules(rules, _conv_bn()).multi  # the second rule is a merge
    rep = saturate(_conv_bn(), rules, H100, GATE).report
    assert rep.rejected[SHARED] >= 1  # conv(x, w) and conv(x, w * scale): both made from w
    assert not any(t["rewrites"] for t in rep.trace if t["phase"] == "merge")
    assert rep.stop_reason == StopReason.SATURATED


def test_a_merge_sharing_a_weight_is_kept_where_the_wider_operator_is_priced_cheaper():
    rules = [ex.fold_conv_batchnorm((1, 1), (0, 0), 1), _merge_as_inputs()]
    rep = saturate(_conv_bn(), rules, _WideCheap("h100"), GATE).report
    assert any(t["rewrites"] for t in rep.trace if t["phase"] == "merge")  # even half of it pays


def _fire():
    """SqueezeNet's fire module's expansion: conv 1x1 and conv 3x3 of one input, concatenated."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 8, 8))
    k = b.weight("k", (4, 6, 1, 1), rng.standard_normal((4, 6, 1, 1)).astype(np.float32))
    w = b.weight("w", (4, 6, 3, 3), rng.standard_normal((4, 6, 3, 3)).astype(np.float32))
    return b.build([b.op("concat", b.op("conv2d", x, k), b.op("conv2d", x, w, padding=(1, 1)), axis=1)])


def _unmerge() -> Rule:
    """conv(x, concat(a, b)) => concat(conv(x, a), conv(x, b)): a merge reversed (it grows)."""
    src = [("x", (1, 6, 8, 8), "input"), ("a", (4, 6, 3, 3), "weight"), ("b", (4, 6, 3, 3), "weight")]
    return Rule(_side(src, lambda b, v: b.op("conv2d", v["x"], b.op("concat", v["a"], v["b"], axis=0), padding=(1, 1))),
                _side(src, lambda b, v: b.op("concat", b.op("conv2d", v["x"], v["a"], padding=(1, 1)),
                                             b.op("conv2d", v["x"], v["b"], padding=(1, 1)), axis=1)))


def test_the_same_weights_merged_again_in_a_later_round_are_refused():
    # round 1 merges conv(x, k) and conv(x, w) as conv(x, concat(enlarge(k), w)); the phase after
    # it splits that into conv(x, enlarge(k)) and conv(x, w), which round 2 finds as a new match
    # of the 3x3 merge: the same weights on the same data, the same merged operator again
    rules = [ex.merge_convs_enlarged(3), _unmerge(), ex.merge_convs((1, 1), (1, 1), 3)]
    rep = saturate(_fire(), rules, H100, GATE).report
    merges = [t for t in rep.trace if t["phase"] == "merge"]
    assert len(merges) == 2 and merges[0]["rewrites"] >= 1
    assert merges[1]["matches"] >= 1 and merges[1]["rewrites"] == 0 and not merges[1]["changed"]
    assert rep.rejected[EARLIER] >= 1
    assert rep.stop_reason == StopReason.SATURATED


def test_a_merge_sharing_a_weight_on_other_data_stands():
    # conv(x0, w) and conv(x1, w): one weight, two values both needed: the grouped convolution merges them
    src = [("x0", (1, 6, 8, 8), "input"), ("x1", (1, 6, 8, 8), "input"),
           ("a", (4, 6, 1, 1), "input"), ("b", (4, 6, 1, 1), "input")]
    rule = Rule(_side(src, lambda b, v: b.op("concat", b.op("conv2d", v["x0"], v["a"]),
                                             b.op("conv2d", v["x1"], v["b"]), axis=1)),
                _side(src, lambda b, v: b.op("conv2d", b.op("concat", v["x0"], v["x1"], axis=1),
                                             b.op("concat", v["a"], v["b"], axis=0), groups=2)))
    b = GraphBuilder()
    x0, x1 = b.input("x0", (1, 6, 8, 8)), b.input("x1", (1, 6, 8, 8))
    w = b.weight("w", (4, 6, 1, 1), np.random.default_rng(0).standard_normal((4, 6, 1, 1)).astype(np.float32))
    g = b.build([b.op("concat", b.op("conv2d", x0, w), b.op("conv2d", x1, w), axis=1)])
    assert compile_rules([rule], g).multi
    rep = saturate(g, [rule], H100, GATE).report
    assert rep.rejected[SHARED] == 0 and sum(rep.by_rule.values()) == 1
