"""The output check on the rewritten regions (driver/regions.py): regions found from the
e-classes, a wrong claim refused, a claim true only at the model's own values run again from the
graph inputs, and a forged rule stopped by the region check alone."""

from __future__ import annotations

import pytest

from superopt.cost import choose_cost_model
from superopt.driver import PASSES, optimize
from superopt.driver.regions import RegionCheck, RegionMismatch, check_rewrites, rewritten_regions
from superopt.errors import NumericMismatchError
from superopt.ir import GraphBuilder, Rule
from superopt.ir.graph import Ref
from superopt.rules import examples as ex

H100, _ = choose_cost_model("h100", "fp32", "inductor")
EAGER, _ = choose_cost_model("h100", "fp32", "eager")  # the merged matmul is priced cheaper


def _graph(body):
    b = GraphBuilder()
    x = b.input("x", (64,))
    return b.build([body(b, x)])


def _classes(g, names):
    """``Ref -> class`` from one class name per node, in node order."""
    return {Ref(i, 0): c for i, c in enumerate(names)}


def _deep_relu(b, x):
    z = b.op("relu", b.op("relu", x))
    return b.op("add", z, z)


def _flat_relu(b, x):
    y = b.op("relu", x)
    return b.op("add", y, y)


def test_an_unchanged_graph_has_no_region():
    old = _graph(_deep_relu)
    cls = _classes(old, [1, 2, 3, 4])
    assert rewritten_regions(old, old, cls, cls).pairs == []
    assert check_rewrites(old, old, cls, cls, {}, 1e-4).outputs == 0


def test_a_wrong_claim_is_refused_naming_the_operators():
    old = _graph(lambda b, x: b.op("mul", b.op("sigmoid", x), x))
    new = _graph(lambda b, x: b.op("mul", b.op("relu", x), x))
    res = check_rewrites(old, new, _classes(old, [1, 2, 3]), _classes(new, [1, 2, 3]), {}, 1e-4)
    assert isinstance(res, RegionMismatch) and res.ops == ("relu", "sigmoid") and res.input_set == "normal"


def test_a_region_is_the_rewritten_part_only():
    """tanh(x) + x -> x + tanh(x) under a ReLU that both graphs compute alike: one region output,
    one operator, drawn at the classes of x and tanh(x)."""
    old = _graph(lambda b, x: b.op("relu", b.op("add", b.op("tanh", x), x)))
    new = _graph(lambda b, x: b.op("relu", b.op("add", x, b.op("tanh", x))))
    cls_old, cls_new = _classes(old, [1, 2, 3, 4]), _classes(new, [1, 2, 3, 4])
    reg = rewritten_regions(old, new, cls_old, cls_new)
    assert len(reg.pairs) == 1 and reg.nodes == 1 and reg.boundary == 2
    res = check_rewrites(old, new, cls_old, cls_new, {}, 1e-4)
    assert isinstance(res, RegionCheck) and not res.from_inputs and res.worst < 1e-6
    # a region that computes another value is refused on the first set
    bad = _graph(lambda b, x: b.op("relu", b.op("mul", x, b.op("tanh", x))))
    assert isinstance(check_rewrites(old, bad, cls_old, cls_new, {}, 1e-4), RegionMismatch)


def test_a_claim_true_only_at_the_models_values_is_run_from_the_graph_inputs():
    """relu(y) = y holds where y = relu(x) (as the search may know it), not for any y: drawn at
    y the region differs, from the graph input x it agrees."""
    old, new = _graph(_deep_relu), _graph(_flat_relu)
    cls_old, cls_new = _classes(old, [1, 2, 2, 3]), _classes(new, [1, 2, 3])
    reg = rewritten_regions(old, new, cls_old, cls_new)
    assert len(reg.pairs) == 1 and reg.boundary == 1  # drawn at relu(x), not at relu(relu(x))
    res = check_rewrites(old, new, cls_old, cls_new, {}, 1e-4)
    assert isinstance(res, RegionCheck) and res.from_inputs and set(res.sets) == {"normal", "normal x0.01",
                                                                                  "normal x30", "integers"}
    wrong = _graph(lambda b, x: b.op("add", b.op("relu", x), x))  # relu(x) + x: not relu(x) + relu(x)
    res = check_rewrites(old, wrong, cls_old, _classes(wrong, [1, 2, 3]), {}, 1e-4)
    assert isinstance(res, RegionMismatch)


def test_the_region_check_alone_stops_a_forged_rule_and_passes_the_right_ones(tiny, monkeypatch):
    """Past a gate that admits everything, a rule that drops a ReLU is stopped by the region
    check (the whole-model check left out), named; the right rules pass, the report saying on
    which sets and that it covered the graph written."""
    from superopt.search.instance_proofs import InstanceProofs
    monkeypatch.setattr(InstanceProofs, "admit", lambda self, rule_id, instance: True)
    regions_only = [p for p in PASSES if p.name != "output check"]
    right = ex.fuse_conv_relu()
    wrong = Rule(right.lhs, right.lhs.subgraph([right.lhs.nodes[-1].inputs[0]]))
    with pytest.raises(NumericMismatchError, match="rewritten region") as err:
        optimize(tiny, [ex.merge_matmuls(2), wrong], H100, passes=regions_only, min_gain=0.0)
    assert "--exclude-rule" in str(err.value) and "nothing was written" in str(err.value)
    res = optimize(tiny, [ex.merge_matmuls(2)], EAGER, passes=regions_only, min_gain=0.0, input_sets=3)
    check = res.report.region_check
    assert res.report.rewritten and check["covered"] and list(check["sets"]) == ["normal", "normal x0.01"]
    assert check["region_outputs"] >= 1 and check["worst"] <= 1e-4
    full = optimize(tiny, [ex.merge_matmuls(2)], EAGER, min_gain=0.0, input_sets=1)  # the examples alone
    assert "region check (skipped)" in full.report.passes and list(full.report.output_check) == ["examples"]


@pytest.mark.parametrize("scale", [1.0, 0.01, 30.0])
def test_boundary_values_are_float32_values_so_every_run_sees_the_same_inputs(scale):
    """The normal draws at a region's boundary are float32 values held in float64: the original's
    float64 and float32 runs and the rewritten one get the very same numbers, at the set's scale."""
    import torch

    from superopt.driver.regions import _draw
    old = _graph(lambda b, x: b.op("relu", b.op("add", b.op("tanh", x), x)))
    new = _graph(lambda b, x: b.op("relu", b.op("add", x, b.op("tanh", x))))
    regions = rewritten_regions(old, new, _classes(old, [1, 2, 3, 4]), _classes(new, [1, 3, 2, 4]))
    assert regions.boundary >= 1
    env = _draw(regions, torch.Generator().manual_seed(1234), scale, {})
    for k in range(regions.boundary):
        v = env[f"b{k}"]
        assert v.dtype == torch.float64 and torch.equal(v.to(torch.float32).to(torch.float64), v)
        assert 0.2 * scale < float(v.std()) < 5 * scale
