"""The queries' rotary embedding in an attention's region and kernel (superopt.kernel.rotary)."""

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel_regions import attention_region, rotary_sdpa, programs_match_in_float64, refused_when_forged, region_ops
from superopt.ir.graph import GraphBuilder
from superopt.kernel import generate_kernels, parse_program
from superopt.kernel.regions import find_regions
from superopt.kernel.rotary import identities, match_rotary
from superopt.kernel.verify import check_identity


@pytest.mark.parametrize("neg,swap,splits", [("smul", False, 1), ("mul", True, 1), ("mul", False, 2),
                                             ("smul", True, 2)])
def test_the_rotation_is_matched_however_its_operands_are_written(neg, swap, splits):
    g = rotary_sdpa(neg=neg, swap=swap, splits=splits)
    sd = next(i for i, n in enumerate(g.nodes) if n.op == "sdpa")
    m = match_rotary(g, g.nodes[sd].inputs[0])
    assert m is not None and m.half == 8
    assert (g.nodes[m.q.node].name, g.nodes[m.cos.node].name, g.nodes[m.sin.node].name) == ("q", "cos", "sin")
    r = attention_region(g)
    assert {"split", "concat", "add", "sdpa"} <= set(region_ops(g, r))


def _rotation(sign=-1.0, order="neg_first", sizes=(8, 8), axis=3):
    b = GraphBuilder()
    q = b.input("q", (1, 2, 1, 16))
    c, s = b.input("cos", (1, 1, 1, 16)), b.input("sin", (1, 1, 1, 16))
    lo, hi = b.op("split", q, axis=axis, sizes=sizes) if axis == 3 else b.op("split", q, axis=1, sizes=(1, 1))
    neg = b.op("smul", hi, b.weight("m", (), np.array(sign, np.float32)))
    cat = b.op("concat", *((neg, lo) if order == "neg_first" else (lo, neg)), axis=3 if axis == 3 else 1)
    e = b.op("add", b.op("mul", q, c), b.op("mul", cat, s))
    return b.build([e])


@pytest.mark.parametrize("kw", [dict(sign=1.0), dict(order="lo_first"), dict(sizes=(4, 12)), dict(axis=1)])
def test_what_is_not_a_rotation_is_not_matched(kw):
    g = _rotation(**kw)
    assert match_rotary(g, g.outputs[0]) is None


def test_a_rotation_read_elsewhere_stays_outside_the_region():
    """Only the attention may read the rotated queries; else the region is the attention alone
    (and without its prologue the region never holds the rotation)."""
    shared = rotary_sdpa(shared=True)
    assert "concat" not in region_ops(shared, attention_region(shared))
    g = rotary_sdpa()
    assert "concat" not in region_ops(g, attention_region(g, prologue=False))


def test_two_attentions_sharing_one_minus_one_each_take_their_rotation():
    """A -1 constant merged into one node for every rotation (as a dedup of equal constants
    makes it) is a weight each region copies: both attentions still take their rotation."""
    b = GraphBuilder()
    m1 = b.weight("minus_one", (), np.array(-1.0, np.float32))
    c, s = b.input("cos", (1, 1, 1, 16)), b.input("sin", (1, 1, 1, 16))
    outs = []
    for layer in range(2):
        q = b.input(f"q{layer}", (1, 2, 1, 16))
        k, v = b.input(f"k{layer}", (1, 2, 9, 16)), b.input(f"v{layer}", (1, 2, 9, 16))
        lo, hi = b.op("split", q, axis=3, sizes=(8, 8))
        e = b.op("add", b.op("mul", q, c), b.op("mul", b.op("concat", b.op("smul", hi, m1), lo, axis=3), s))
        outs.append(b.op("sdpa", e, k, v, scale=0.25))
    g = b.build(outs)
    regions = [r for r in find_regions(g) if r.kind == "attention"]
    assert len(regions) == 2 and all("concat" in region_ops(g, r) for r in regions)


@pytest.mark.parametrize("kw", [dict(), dict(dtype="bfloat16"), dict(l=5, causal=1, mask=False),
                                dict(h=4, kvh=4, l=3, table=(1, 1, None)), dict(d=24)])
def test_rotary_attention_kernels_are_proved(kw):
    region = attention_region(rotary_sdpa(**kw)).graph
    rep = generate_kernels(region)
    assert rep.kind == "attention" and rep.verified >= 1 and rep.refused == 0, rep.refusals
    names = {n.split(":")[0] for n, _ in rep.candidates[0].verdict.identities}
    assert {"rotary halves", "matmul_add_concat"} <= names
    text = rep.candidates[0].program.text()
    assert re.search(r"load q\[.*,D\+\d+\]", text) and re.search(r"load k\[.*,D\+\d+\]", text)


def test_the_identities_are_proven_rules():
    assert all(check_identity(i).startswith("proven") for i in identities())


@pytest.fixture(scope="module")
def decode():
    region = attention_region(rotary_sdpa()).graph
    return region, generate_kernels(region).best


def test_sin_halves_swapped_are_refused(decode):
    def swap(text):
        lo = re.search(r"(\w+) = load sin\[[^\]]*,D\]", text).group(1)
        hi = re.search(r"(\w+) = load sin\[[^\]]*,D\+8\]", text).group(1)
        return re.sub(rf"\b({lo}|{hi})\b(?! =)", lambda m: hi if m.group(1) == lo else lo, text)
    refused_when_forged(*decode, swap)


def test_a_dropped_negation_is_refused(decode):
    def drop(text):
        line = re.search(r"\n  (t\d+) = mul (\w+) minus_one_\d+\n", text)
        return text.replace(line.group(0), "\n").replace(f" {line.group(1)} ", f" {line.group(2)} ")
    refused_when_forged(*decode, drop)


def test_keys_read_unrotated_halves_swapped_are_refused(decode):
    refused_when_forged(*decode, lambda t: t.replace("load k[B,H/2,S,D+8]", "load k[B,H/2,S,D]", 1)
            if "H/2" in t else t.replace("load k[B,H,S,D+8]", "load k[B,H,S,D]", 1))


@settings(max_examples=12, deadline=None)
@given(h=st.sampled_from([2, 4]), l=st.integers(1, 3), s=st.integers(3, 40), half=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 99))
def test_rotary_programs_match_the_graph_in_float64(h, l, s, half, seed):
    """Any shape: the generated program, emulated tile by tile, equals the region's semantics."""
    region = attention_region(rotary_sdpa(h=h, kvh=h // 2, l=l, s=s, d=2 * half)).graph
    programs_match_in_float64(region, seed)


def test_candidates_verified_side_by_side_get_the_verdicts_one_at_a_time_gives(monkeypatch):
    """A large region's translations are verified in threads sharing the region's evidence: the
    same proofs as one after the other, and a forged translation among them still refused."""
    import superopt.kernel.generate as gen
    region = attention_region(rotary_sdpa(h=4, kvh=2, s=23)).graph
    alone = generate_kernels(region)
    monkeypatch.setattr(gen, "SIDE_BY_SIDE_ELEMENTS", 0)
    together = generate_kernels(region)
    assert len(alone.candidates) >= 2 and together.verified == alone.verified and together.refused == 0
    assert [c.program.text() for c in together.candidates] == [c.program.text() for c in alone.candidates]
    assert [c.verdict.checks for c in together.candidates] == [c.verdict.checks for c in alone.candidates]
    cand = alone.candidates[0]
    forged = parse_program(cand.program.text().replace("load k[B,H/2,S,D+8]", "load k[B,H/2,S,D]", 1)
                           if "H/2" in cand.program.text() else
                           cand.program.text().replace("load k[B,H,S,D+8]", "load k[B,H,S,D]", 1))
    found = [(None, c.program, c.identities, c.prep) for c in alone.candidates] + \
        [(None, forged, cand.identities, cand.prep)]
    verdicts = gen._verify_all(region, found, {}, float("inf"))
    assert [v.ok for v in verdicts] == [True] * len(alone.candidates) + [False]
    assert gen._verify_all(region, found[:1], {}, 0.0) == [None]   # past the time limit: not verified
