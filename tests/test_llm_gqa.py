"""The grouped-query attention identity (issue 23): attention over key-value heads repeated per
query group equals ``sdpa`` with ``gqa=1`` over the unrepeated ones. It is a rule of the shipped
database, proven by the verifier from ``specs/llm.axioms``; the search applies it to the Llama
zoo graphs (both ways of writing ``repeat_kv``), the outputs match, and the generated code calls
``F.scaled_dot_product_attention(..., enable_gqa=True)``."""

from __future__ import annotations

import functools

import pytest
import torch

from superopt.codegen import to_fx
from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.models import build
from superopt.rules import RuleDB
from superopt.rules.curated import gqa_attention
from superopt.rules.paths import default_db_path
from superopt.driver import load_model, optimize
from superopt.verify import verify_rules

from zoo_programs import loaded_by_hand


GQA_RULES = [gqa_attention(0), gqa_attention(1), gqa_attention(0, mask=True)]


def test_the_gqa_rules_are_proven_from_the_llm_axioms():
    results = verify_rules(GQA_RULES, timeout_s=30, progress=False)
    assert [r.status for r in results] == ["proven"] * 3
    assert [r.axioms_used for r in results] == [("sdpa_gqa_repeat_kv",)] * 2 + [("sdpa_gqa_repeat_kv_mask",)]
    assert all(r.crosscheck == "passed" for r in results)


def _tiled(mask: bool = False) -> Rule:
    """A wrong twin: the heads tiled (k0 k1 k0 k1 ...) instead of repeated in a row (k0 k0 k1 k1)."""
    n, hkv, r, lq, s, e = 1, 2, 2, 3, 4, 5

    def side(gqa):
        b = GraphBuilder()
        q, k, v = b.input("q", (n, hkv * r, lq, e)), b.input("k", (n, hkv, s, e)), b.input("v", (n, hkv, s, e))
        if not gqa:
            k, v = (b.op("reshape", b.op("expand", b.op("reshape", t, shape=(n, 1, hkv, s, e)),
                                         shape=(n, r, hkv, s, e)), shape=(n, hkv * r, s, e)) for t in (k, v))
        return b.build([b.op("sdpa", q, k, v, scale=0.5, gqa=int(gqa))])
    return Rule(side(False), side(True))


def test_tiling_the_heads_is_not_grouped_query_attention():
    result, = verify_rules([_tiled()], timeout_s=30, progress=False)
    assert result.status != "proven"


def test_the_shipped_database_holds_them_proven():
    ids = {r.id for r in GQA_RULES}
    with RuleDB.open(default_db_path()) as db:
        stored = [s for s in db.query(status="proven") if s.rule.id in ids]
    assert len(stored) == 3
    assert {s.result.axioms_used[0] for s in stored} == {"sdpa_gqa_repeat_kv", "sdpa_gqa_repeat_kv_mask"}


@functools.cache
def _proven_rules():
    with RuleDB.open(default_db_path()) as db:
        return tuple(db.proven_rules())


@pytest.mark.parametrize("name", ["llama_tiny_decode", "llama_tiny_prefill"])
@pytest.mark.parametrize("method", ["saturate", "backtrack"])
def test_the_search_picks_gqa_attention_on_the_llama_blocks(name, method):
    model = load_model(zoo=name)
    assert [n.attr["gqa"] for n in model.graph.nodes if n.op == "sdpa"] == [0]
    best, rep, _ = optimize(model, list(_proven_rules()), CostModel("h100"), budget=100, time_limit=60,
                            progress=False, input_sets=2, method=method, min_gain=0.0)
    assert [n.attr["gqa"] for n in best.nodes if n.op == "sdpa"] == [1]
    assert not any(n.op == "expand" for n in best.nodes)  # the repeated k/v are never materialized
    assert rep.cost_after < rep.cost_before and rep.max_relative_error < 1e-5
    gm = to_fx(best)
    assert "enable_gqa = True" in gm.code
    with torch.no_grad():
        want, got = model.reference(*model.inputs), gm(*model.inputs)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        assert (w - g).abs().max().item() <= 1e-5 * w.abs().max().item()


def test_every_layer_is_rewritten_whichever_way_the_model_is_written():
    model = loaded_by_hand("two_layers", *build("llama_tiny_decode", num_layers=2, kv_repeat="repeat_interleave",
                                                  rotary="positions"))
    best, rep, _ = optimize(model, list(_proven_rules()), CostModel("h100"), time_limit=60, progress=False,
                            input_sets=2, min_gain=0.0)
    assert [n.attr["gqa"] for n in best.nodes if n.op == "sdpa"] == [1, 1]
    assert not any(n.op == "expand" for n in best.nodes) and rep.max_relative_error < 1e-5


def _masked(mask_shape, n=2) -> Rule:
    """The masked GQA identity with the mask at ``mask_shape`` (broadcast to the scores)."""
    hkv, r, lq, s, e = 2, 3, 4, 5, 6

    def side(gqa):
        b = GraphBuilder()
        q, k, v = b.input("q", (n, hkv * r, lq, e)), b.input("k", (n, hkv, s, e)), b.input("v", (n, hkv, s, e))
        m = b.input("m", mask_shape)
        if not gqa:
            k, v = (b.op("reshape", b.op("expand", b.op("reshape", t, shape=(n, hkv, 1, s, e)),
                                         shape=(n, hkv, r, s, e)), shape=(n, hkv * r, s, e)) for t in (k, v))
        return b.build([b.op("sdpa", q, k, v, m, scale=0.125, gqa=int(gqa))])
    return Rule(side(False), side(True))


@pytest.mark.parametrize("mask_shape", [(2, 1, 4, 5), (1, 1, 4, 5), (1, 1, 1, 5), (4, 5), (2, 6, 4, 5)],
                         ids=["hf", "shared-by-the-batch", "one-row", "matrix", "per-query-head"])
def test_the_masked_identity_is_proven_for_every_mask_that_broadcasts_to_the_scores(mask_shape):
    """gpt-fast's mask is [1, 1, l, s], shared by the batch; transformers' [b, 1, l, s]; a
    matrix [l, s] is torch's own attn_mask form. Each instance is proven from the one axiom, and
    the verifier's float64 cross-check agrees; torch agrees too."""
    rule = _masked(mask_shape)
    result, = verify_rules([rule], timeout_s=30, progress=False)
    assert (result.status, result.axioms_used, result.crosscheck) == ("proven", ("sdpa_gqa_repeat_kv_mask",), "passed")
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 4, 6, generator=g), torch.randn(2, 2, 5, 6, generator=g), torch.randn(2, 2, 5, 6, generator=g)
    m = torch.randn(mask_shape, generator=g)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), m,
                                                            scale=0.125)
    got = to_fx(rule.rhs)(q, k, v, m)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.allclose(got, want, atol=1e-6)


def test_a_mask_with_one_entry_per_key_value_head_is_not_read_per_query_head():
    """A wrong twin: a [b, h, l, s] mask (one per key-value head, h < hq) does not broadcast to the
    scores [b, hq, l, s] on the left, so the identity claims nothing; the verifier must not prove it
    where the right side is well-formed only by the mask's own head count."""
    with pytest.raises(Exception):
        _masked((2, 2, 4, 5))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_decode_step_whose_mask_the_batch_shares_gets_gqa_attention(batch):
    """The step building its mask from the cache position ([1, 1, 1, s] at any batch, as gpt-fast's
    does): the identity applies at batch 3 as at batch 1 (it did not: the axiom named the mask
    [b, 1, l, s], so each instance's proof failed and the repeated keys and values stayed)."""
    model = loaded_by_hand("posmask", *build("llama_tiny_decode", batch_size=batch, mask="positions"))
    best, rep, _ = optimize(model, list(_proven_rules()), CostModel("h100"), time_limit=60, progress=False,
                            input_sets=2, min_gain=0.0)
    assert [n.attr["gqa"] for n in best.nodes if n.op == "sdpa"] == [1]
    assert not any(n.op == "expand" for n in best.nodes) and rep.max_relative_error < 1e-5
