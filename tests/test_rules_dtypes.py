"""Rules at the dtypes a model computes in: a model exported in bf16 (its values bf16, a norm's
statistics in float32) met no rule at all, since rules are found and stored at float32 and the
matcher binds a variable to a value of its own dtype only. The search now also takes each float32
rule stated at the graph's half-precision dtypes (:func:`superopt.rules.load.at_dtypes`)."""

from __future__ import annotations

import functools

import pytest
import torch

from superopt.cost import CostModel
from superopt.driver import LoadedModel, optimize
from superopt.models import build
from superopt.rules.curated import gqa_attention
from superopt.rules.load import RuleList, at_dtypes, load_rules
from superopt.verify import verify_rules

from zoo_programs import loaded_by_hand


@functools.cache
def _rules():
    return load_rules()


def test_a_rule_at_bf16_is_the_rule_with_its_float32_values_in_bf16_and_is_proven():
    rule = gqa_attention(0, mask=True)
    rules = at_dtypes(RuleList([rule], {rule.id: "gqa"}), {"bfloat16"})
    assert len(rules) == 2 and rules[0] is rule
    half = rules[1]
    assert half.id == f"{rule.id}@bfloat16" and rules.labels[half.id] == "gqa"
    assert {t.dtype for g in (half.lhs, half.rhs) for n in g.nodes for t in n.types} == {"bfloat16"}
    assert half.lhs.nodes[-1].op == rule.lhs.nodes[-1].op and len(half.lhs.nodes) == len(rule.lhs.nodes)
    result, = verify_rules([half], timeout_s=30, progress=False)
    assert result.status == "proven" and result.crosscheck == "passed"


def test_nothing_is_added_for_a_float32_graph_and_the_database_digest_changes_with_the_dtypes():
    rules = _rules()
    assert at_dtypes(rules, set()) is rules and at_dtypes(rules, {"float32", "int64"}) is rules
    half = at_dtypes(rules, {"bfloat16"})
    assert len(rules) < len(half) <= 2 * len(rules)
    assert half.digest != rules.digest and half.digest_count == len(half) and half.source == rules.source
    assert all(half.labels[r.id] == rules.labels[r.id.split("@")[0]] for r in half[len(rules):])
    assert at_dtypes(rules, {"bfloat16"})[len(rules):] == half[len(rules):]   # the same list, cached


def _bf16_step(**kw) -> LoadedModel:
    module, inputs = build("llama_tiny_decode", **kw)
    module = module.to(torch.bfloat16)
    inputs = tuple(i.to(torch.bfloat16) if i.is_floating_point() else i for i in inputs)
    return loaded_by_hand("llama_tiny_decode/bf16", module, inputs)


@pytest.mark.parametrize("kw", [{}, {"mask": "positions", "cache": "buffers"}], ids=["caches-passed-in", "executorch-form"])
def test_a_decode_step_exported_in_bf16_gets_grouped_query_attention_and_its_outputs_hold(kw):
    model = _bf16_step(**kw)
    assert {n.types[0].dtype for n in model.graph.nodes if n.op == "sdpa"} == {"bfloat16"}
    best, rep, _ = optimize(model, _rules(), CostModel("h100"), time_limit=60, progress=False, input_sets=2,
                            min_gain=0.0, dtype="bf16")
    assert [n.attr["gqa"] for n in best.nodes if n.op == "sdpa"] == [1]
    assert not any(n.op == "expand" and n.types[0].rank == 5 for n in best.nodes)   # the repeated keys and values
    assert rep.cost_after < rep.cost_before and rep.search["instance_proofs"]["refused"] == 0
    assert rep.max_relative_error is not None and rep.max_relative_error < 5e-2   # within bf16's own error
