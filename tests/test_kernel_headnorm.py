"""A per-head RMSNorm of the queries in an attention's region and kernel (superopt.kernel.headnorm)."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from kernel_regions import attention_region, normed_sdpa, programs_match_in_float64, refused_when_forged, region_ops
from superopt.kernel import generate_kernels
from superopt.kernel.headnorm import identities, match_head_norm
from superopt.kernel.regions import find_regions
from superopt.kernel.verify import check_identity


@pytest.mark.parametrize("kw", [dict(), dict(swap=True), dict(casts=True), dict(rotary=False),
                                dict(transposed=False), dict(casts=True, swap=True, rotary=False)])
def test_the_norm_is_matched_however_it_is_written_and_taken_into_the_region(kw):
    g = normed_sdpa(**kw)
    r = attention_region(g)
    assert {"pow", "mean", "rsqrt", "sdpa"} <= set(region_ops(g, r))
    assert ("transpose" in region_ops(g, r)) == kw.get("transposed", True)
    assert "pow" not in region_ops(g, attention_region(g, prologue=False))


def test_what_is_not_a_head_norm_is_not_matched():
    from superopt.ir.graph import GraphBuilder
    b = GraphBuilder()
    x = b.input("x", (1, 1, 4, 8))
    ms = b.op("mean", b.op("pow", x, exponent=3.0), axis=3, keepdim=1)   # not a square
    y = b.op("mul", b.weight("w", (8,)), b.op("mul", x, b.op("rsqrt", b.op("add", ms, b.weight("e", ())))))
    g = b.build([b.op("transpose", y, perm=(0, 2, 1, 3))])
    assert match_head_norm(g, g.outputs[0]) is None
    b = GraphBuilder()
    x, z = b.input("x", (1, 1, 4, 8)), b.input("z", (1, 1, 4, 8))
    ms = b.op("mean", b.op("pow", z, exponent=2.0), axis=3, keepdim=1)    # the scale of another tensor
    y = b.op("mul", b.weight("w", (8,)), b.op("mul", x, b.op("rsqrt", b.op("add", ms, b.weight("e", ())))))
    g = b.build([y])
    assert match_head_norm(g, g.outputs[0]) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_upcast_another_region_took_is_read_as_the_source(dtype):
    """HF's bf16 export upcasts q_proj's output to float32 before the norm; the linear region
    before it may take that cast into its epilogue: the attention's region then reads the
    float32 value and still holds the norm."""
    g = normed_sdpa(casts=True, projected=True, dtype=dtype)
    regions = find_regions(g)
    att = next(r for r in regions if r.kind == "attention")
    assert {"pow", "rsqrt"} <= set(region_ops(g, att))
    covered = [i for r in regions for i in r.nodes if g.nodes[i].op == "cast"]
    assert len(covered) == len(set(covered))    # each cast in one region
    rep = generate_kernels(att.graph)
    assert rep.verified >= 1 and rep.refused == 0, rep.refusals


def test_normalized_queries_read_elsewhere_stay_outside_the_region():
    g = normed_sdpa(shared=True)
    r = attention_region(g)
    assert "rsqrt" not in region_ops(g, r) and "concat" in region_ops(g, r)


@pytest.mark.parametrize("kw", [dict(), dict(dtype="bfloat16"), dict(rotary=False), dict(transposed=False),
                                dict(l=3, h=2, kvh=2), dict(d=24), dict(casts=True)])
def test_normed_attention_kernels_are_proved(kw):
    region = attention_region(normed_sdpa(**kw)).graph
    rep = generate_kernels(region)
    assert rep.kind == "attention" and rep.verified >= 1 and rep.refused == 0, rep.refusals
    text = rep.candidates[0].program.text()
    assert re.search(r"= rsqrt ", text) and "load q_norm[" in text
    names = {n.split(":")[0] for n, _ in rep.candidates[0].verdict.identities}
    assert ({"head norm halves", "sum_concat"} <= names) == kw.get("rotary", True)


def test_the_identities_are_proven_rules():
    assert all(check_identity(i).startswith("proven") for i in identities())


@pytest.fixture(scope="module")
def decode():
    region = attention_region(normed_sdpa()).graph
    return region, generate_kernels(region).best


def test_weight_halves_swapped_are_refused(decode):
    refused_when_forged(*decode, lambda t: t.replace("load q_norm[D]", "load q_norm[X]").replace("load q_norm[D+8]", "load q_norm[D]")
            .replace("load q_norm[X]", "load q_norm[D+8]"))


def test_a_sum_of_squares_over_one_half_is_refused(decode):
    def one_half(text):   # the two halves' sums of squares added: the low half's twice
        lo, hi = re.findall(r"(t\d+) = sum ", text)[:2]
        return text.replace(f"add {lo} {hi}", f"add {lo} {lo}", 1)
    refused_when_forged(*decode, one_half)


def test_a_mean_over_the_half_width_is_refused(decode):
    refused_when_forged(*decode, lambda t: t.replace(" 1/16\n", " 1/8\n", 1))


@settings(max_examples=10, deadline=None)
@given(h=st.sampled_from([2, 4]), l=st.integers(1, 3), s=st.integers(3, 40), half=st.sampled_from([2, 4, 8]),
       rotary=st.booleans(), seed=st.integers(0, 99))
def test_normed_programs_match_the_graph_in_float64(h, l, s, half, rotary, seed):
    """Any shape: the generated program, emulated tile by tile, equals the region's semantics."""
    region = attention_region(normed_sdpa(h=h, kvh=h // 2, l=l, s=s, d=2 * half, rotary=rotary)).graph
    programs_match_in_float64(region, seed)
