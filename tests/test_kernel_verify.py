"""verify_kernel: the generated kernels are proved; forged wrong kernels are each refused."""

import re

import numpy as np
from hypothesis import given, settings, strategies as st

import pytest

from kernel_regions import attention, gate_up, rmsnorm_matmul
from superopt.ir.graph import GraphBuilder
from superopt.ir.rule import Rule
from superopt.kernel import Identity, generate_kernels, parse_program, verify_kernel


@pytest.fixture(scope="module")
def rms():
    region = rmsnorm_matmul()
    best = generate_kernels(region).best
    return region, best


@pytest.fixture(scope="module")
def attn():
    region = attention(causal=1)
    best = generate_kernels(region).best
    return region, best


def _line(text, pattern):
    return next(ln for ln in text.splitlines() if re.search(pattern, ln))


def _refused(region, text, cand, match):
    v = verify_kernel(parse_program(text), region, cand.identities, cand.prep)
    assert v.status != "proved" and re.search(match, v.reason), v.reason
    return v


def test_generated_kernels_are_proved(rms, attn):
    for region, cand in (rms, attn):
        v = verify_kernel(cand.program, region, cand.identities, cand.prep)
        assert v.ok, v.reason
        assert any("fingerprint" in c for c in v.checks) and any("float64: 5 input sets" in c for c in v.checks)
    assert {n.split(":")[0] for n, _ in verify_kernel(rms[1].program, rms[0], rms[1].identities,
                                                      rms[1].prep).identities} == {"mul_rowscale_matmul", "matmul_mul_rows"}


def test_missing_mask_is_refused(rms):
    region, cand = rms
    text = cand.program.text()
    load = _line(text, r"= load x\[M,K\]")
    _refused(region, text.replace(load, load + " mask=0"), cand, "output out0: float64 error nan")


def test_wrong_accumulator_init_is_refused(rms):
    region, cand = rms
    text = cand.program.text()
    acc = _line(text, r"^acc o\d+\[M,N\] = 0.0")
    _refused(region, text.replace(acc, acc.replace("0.0", "1.0")), cand, "fingerprint differs .*seed 0")


def test_dropped_eps_is_refused(rms):
    region, cand = rms
    text = cand.program.text()
    add = _line(text, r"= add r\d+ eps_")
    name, acc = re.search(r"(t\d+) = add (r\d+)", add).groups()
    text = text.replace(add + "\n", "").replace(f"pow {name} ", f"pow {acc} ")
    _refused(region, text, cand, "fingerprint differs")


def test_off_by_one_tile_is_refused():
    region = gate_up(n=24)
    cand = generate_kernels(region).best
    text = cand.program.text().replace("dim N 24", "dim N 16")   # one N tile short of the output
    _refused(region, text, cand, "never written")


def test_wrong_scale_is_refused(attn):
    region, cand = attn
    text = cand.program.text().replace("scale=0.25", "scale=0.5")
    _refused(region, text, cand, "fingerprint differs")


def test_missing_causal_mask_is_refused(attn):
    region, cand = attn
    text = cand.program.text()
    line = _line(text, r"= causal ")
    name, src = re.search(r"(t\d+) = causal (t\d+)", line).groups()
    text = text.replace(line + "\n", "")
    text = re.sub(rf"\b{name}\b", src, text)
    _refused(region, text, cand, "fingerprint differs")


def test_running_max_without_rescale_is_refused():
    """The field sets every max to 0 (so the rescale exp(m_old - m_new) is 1 there and the field
    check passes); the float64 check with the true max catches the missing rescale."""
    region = attention(causal=0)
    cand = generate_kernels(region).best
    text = cand.program.text()
    line = _line(text, r"= mul o ")
    name = line.split("=")[0].strip()
    text = text.replace(line + "\n", "")
    text = re.sub(rf"\b{name}\b", "o", text)
    v = _refused(region, text, cand, "float64 error")
    assert any("fingerprint" in c for c in v.checks)


def test_wrong_gqa_head_mapping_is_refused():
    region = attention(h=4, kvh=2, l=1, interleave=False)   # heads tiled, not interleaved
    rep = generate_kernels(region)
    assert rep.verified == 0 and rep.refused == rep.enumerated - rep.pruned
    assert all("fingerprint differs" in why for _, why in rep.refusals)


def test_an_unproven_identity_refuses_the_kernel(rms, monkeypatch):
    from superopt.verify import Limits, verifier
    real = verifier.verify_rule
    # relu == tanh stops at the 6 rounds of instantiation its 5 s limit reached (the 7th round's
    # matching, over 2972 e-nodes, was cut before adding anything): the same e-graph in 0.4 s
    monkeypatch.setattr(verifier, "verify_rule", lambda rule: real(rule, limits=Limits(rounds=6)))
    region, cand = rms

    def side(op):
        b = GraphBuilder()
        x = b.input("x", (3, 4))
        return b.build([b.op(op, x)])

    bogus = Identity("relu_is_tanh", Rule(side("relu"), side("tanh")))
    v = verify_kernel(cand.program, region, cand.identities + (bogus,), cand.prep)
    assert v.status == "refuted" and "identity relu_is_tanh is not a proven rule" in v.reason


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2 ** 32))
def test_field_dot_through_blas_is_exact(k, seed):
    from superopt.semantics.field import P, _exact, _matmul_limbs, matmul_mod
    rng = np.random.default_rng(seed)
    a = rng.integers(0, P, (2, 3, k))       # batched, as the region's matmuls may be
    b = rng.integers(0, P, (k, 4))
    a[0, 0], b[:, 0] = P - 1, P - 1    # the largest elements
    assert np.array_equal(_matmul_limbs(a, b), _exact(np.matmul, a, b))
    assert np.array_equal(matmul_mod(a, b), _exact(np.matmul, a, b))


def test_a_contraction_too_long_for_one_exact_sum_is_summed_in_pieces():
    """2**20 + 3 terms of the largest elements: one int64 sum of them overflows (the path such
    contractions took before), the pieces do not."""
    from superopt.semantics.field import P, matmul_mod
    k = (1 << 20) + 3
    a, b = np.full((1, k), P - 1, dtype=np.int64), np.full((k, 2), P - 1, dtype=np.int64)
    b[:, 1] = np.arange(k) % P
    want = [(k * (P - 1) * (P - 1)) % P, ((P - 1) * sum(range(k))) % P]
    assert [int(x) for x in matmul_mod(a, b)[0]] == want


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.booleans(), st.integers(0, 2 ** 32))
def test_flattening_a_strided_input_is_row_major_and_the_field_map_keeps_values_in_range(m, n, big, seed):
    import superopt.kernel.semantics as sem
    from superopt.semantics.field import P, to_field
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n))
    old = sem._TORCH_COPY_MIN
    try:
        sem._TORCH_COPY_MIN = 1 if big else old      # small arrays take torch's copy too
        for x in (a, a.T, a[::2], a.T[1:]):
            assert np.array_equal(sem.flat_rows(x, np.float64), x.reshape(-1))
            ints = np.round(x * 1e9).astype(np.int64)
            assert np.array_equal(sem.FieldArith(None, rng).flat_input(ints, ints.shape), np.mod(ints, P).reshape(-1))
    finally:
        sem._TORCH_COPY_MIN = old
    inside = rng.integers(0, P, (m, n))
    assert to_field(inside) is inside                      # already field elements: no copy
    edge = np.array([-1, 0, P - 1, P, 2 * P + 3, -P])
    assert to_field(edge).tolist() == [P - 1, 0, P - 1, 0, 3, 0]


def test_the_float_checks_share_one_float64_copy_of_the_regions_weights(rms):
    region, cand = rms
    memo = {}
    assert verify_kernel(cand.program, region, cand.identities, cand.prep, memo=memo).ok
    envs = [memo["float", k][0] for k in range(5)]
    for name in region.data:
        assert all(e[name] is memo["data"][name] for e in envs) and memo["data"][name].dtype == np.float64


def test_checks_side_by_side_give_the_verdicts_of_checks_in_turn(rms):
    """verify_kernel(threads=...) runs the seeds and input sets in threads: the verdict, its
    reason and its checks are those of the sequential run, for a proved program, one the
    fingerprint refutes and one only the float64 check refutes (the fingerprint line kept)."""
    region, cand = rms
    text = cand.program.text()
    acc = _line(text, r"^acc o\d+\[M,N\] = 0.0")
    load = _line(text, r"= load x\[M,K\]")
    for t in (text, text.replace(acc, acc.replace("0.0", "1.0")), text.replace(load, load + " mask=0")):
        one, four = (verify_kernel(parse_program(t), region, cand.identities, cand.prep, threads=n) for n in (1, 4))
        assert (one.status, one.reason, one.checks) == (four.status, four.reason, four.checks)
        assert one.max_error == four.max_error


def test_side_by_side_checks_report_the_first_failure_in_order():
    import time
    from superopt.kernel.verify import _run_checks

    def fails(msg, wait=0.0):
        def job():
            time.sleep(wait)
            raise ValueError(msg)
        return job
    for threads in (1, 3):
        out = _run_checks([lambda: 1.0, fails("first", 0.2), fails("second"), lambda: 2.0], threads)
        assert out[0] == 1.0 and len(out) == 2 and str(out[1]) == "first"
        assert _run_checks([lambda: 1.0, lambda: 2.0], threads) == [1.0, 2.0]
