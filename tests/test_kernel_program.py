"""The kernel program form: validation, text round trip, the float64 emulator, the configs."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.kernel import EXAMPLE, KernelError, KernelParseError, TileConfig, default_configs, parse_program
from superopt.kernel.emulate import default_emulation_config
from superopt.kernel.semantics import run_reference

UNARY = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
         "neg": lambda x: -x, "silu": lambda x: x / (1 + np.exp(-x)),
         "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))}


def _program(m, k, n, ops, consts):
    """EXAMPLE's matmul with an epilogue chain of unary ops and products by constants."""
    lines = ["kernel p", f"dim M {m}", f"dim K {k}", f"dim N {n}", f"input x f32[{m},{k}]", f"input w f32[{k},{n}]",
             f"output y f32[{m},{n}]", "grid M N", "loop K", "acc acc[M,N] = 0", "body:", "  a = load x[M,K]",
             "  b = load w[K,N]", "  c = dot a b", "  d = add acc c", "  update acc d", "post:"]
    prev = "acc"
    for i, (op, c) in enumerate(zip(ops, consts)):
        lines.append(f"  u{i} = {op} {prev}")
        lines.append(f"  v{i} = mul u{i} {c}")
        prev = f"v{i}"
    lines.append(f"  store y[M,N] {prev}")
    return "\n".join(lines) + "\n"


def _const():
    return st.one_of(st.fractions(min_value=-4, max_value=4, max_denominator=50).filter(lambda f: f.denominator > 1),
                     st.floats(-4, 4, allow_nan=False).map(lambda f: float(np.float32(f))))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 50), st.integers(1, 40),
       st.lists(st.sampled_from(sorted(UNARY)), max_size=4), st.lists(_const(), min_size=4, max_size=4))
def test_text_round_trips_and_emulator_matches_numpy(m, k, n, ops, consts):
    p = parse_program(_program(m, k, n, ops, consts))
    assert parse_program(p.text()) == p
    assert p.text() == parse_program(p.text()).text()
    rng = np.random.default_rng(m * 100 + k)
    x, w = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    want = x @ w
    for op, c in zip(ops, consts):
        want = UNARY[op](want) * float(c)
    for cfg in (default_emulation_config(p), default_configs(p)[-1]):
        (got,) = run_reference(p, {"x": x, "w": w}, cfg)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_fractions_print_exactly():
    p = parse_program(_program(2, 3, 4, ["relu"], [Fraction(1, 3)]))
    assert "mul u0 1/3" in p.text() and parse_program(p.text()) == p


@pytest.mark.parametrize("edit, message", [
    ("  c = dot a b", "dot needs a[X,K] and b[K,Y]"),
    ("  update acc d", "accumulators ['acc'] must each be updated exactly once"),
    ("  b = load w[K,N]", "'e = add q b': uses 'q' before it is defined"),
    ("  store y[M,N] r", "output 'y' is never stored"),
])
def test_validation_names_the_statement(edit, message):
    bad = {"  c = dot a b": "  c = dot b a", "  update acc d": "", "  b = load w[K,N]": "  b = load w[K,N]\n  e = add q b",
           "  store y[M,N] r": ""}[edit]
    with pytest.raises(KernelError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_program(EXAMPLE.replace(edit, bad))


def test_validation_rejects_out_of_range_and_loop_tiles_after_the_loop():
    with pytest.raises(KernelError, match="outside an axis of size 40"):
        parse_program(EXAMPLE.replace("a = load x[M,K]", "a = load x[M,K+1]"))
    with pytest.raises(KernelError, match="not visible after the loop"):
        parse_program(EXAMPLE.replace("r = relu acc", "r = relu c"))


def test_parse_errors_name_the_line():
    with pytest.raises(KernelParseError, match="line 2"):
        parse_program("kernel k\nbogus 3\n")
    with pytest.raises(KernelParseError, match="starts with 'kernel NAME'"):
        parse_program("dim M 3\n")


def test_configs_cover_the_tiled_dims_and_divide_unmasked_loads():
    p = parse_program(EXAMPLE.replace("b = load w[K,N]", "b = load w[K,N] mask=0").replace("40", "48"))
    cs = default_configs(p)
    assert all({d for d, _ in c.blocks} == {"M", "N", "K"} for c in cs)
    assert all(48 % c.block("K") == 0 and 48 % c.block("N") == 0 for c in cs)
    with pytest.raises(KernelError, match="no block size for dim 'Q'"):
        TileConfig((("M", 16),)).block("Q")


def test_a_row_reduction_over_k_is_kept_in_lanes_when_every_loop_block_divides_k():
    """RMSNorm's sum of squares: per-lane sums through the loop and one row sum after it where
    K is a multiple of 16 (no cross-lane reduction per iteration); a loop block that does not
    divide K is refused for such a program, and the tuner never offers one; K = 40 keeps a row
    sum per tile."""
    from kernel_regions import rmsnorm_matmul
    from superopt.kernel import default_configs, generate_kernels
    from superopt.kernel.errors import KernelError
    from superopt.kernel.triton_lower import block_sizes, lane_accumulators
    lanes = generate_kernels(rmsnorm_matmul(m=3, k=96, n=16)).candidates[0].program
    assert lane_accumulators(lanes) and lanes.tile_dims(lane_accumulators(lanes)[0]) == ("M", "K")
    assert any(s.op == "sum" and s.args[0] in lane_accumulators(lanes) for s in lanes.post)
    assert not any(s.op == "sum" for s in lanes.body)
    assert all(96 % c.block("K") == 0 for c in default_configs(lanes))
    with pytest.raises(KernelError, match="does not divide"):
        block_sizes(lanes, TileConfig((("M", 16), ("N", 16), ("K", 64))))
    rows = generate_kernels(rmsnorm_matmul(m=3, k=40, n=16)).candidates[0].program
    assert not lane_accumulators(rows) and any(s.op == "sum" for s in rows.body)


def test_a_lane_accumulator_starts_at_zero_and_is_read_after_the_loop_only_by_its_sum():
    text = EXAMPLE.replace("acc acc[M,N] = 0", "acc acc[M,N] = 0\nacc lanes[M,K] = 0")
    text = text.replace("  update acc d\n", "  update acc d\n  e = add lanes a\n  update lanes e\n")
    with pytest.raises(KernelError, match="must start at 0"):
        parse_program(text.replace("lanes[M,K] = 0", "lanes[M,K] = 1"))
    stored = text.replace("output y f32[5,24]", "output y f32[5,24]\noutput z f32[5,40]")
    with pytest.raises(KernelError, match="read outside the loop only by"):
        parse_program(stored + "  store z[M,K] lanes\n")
    summed = parse_program(text + "  s = sum lanes dim=K\n  t = add r s\n  store y[M,N] t\n")
    assert summed.tile_dims("s") == ("M",)


def test_a_prepass_loop_takes_the_accumulators_that_need_no_dot_and_nothing_else():
    """RMSNorm -> matmul: the sum of squares moves to a loop of its own (with its own load of
    x), the matmul stays; online softmax (the max feeds the sum's rescale) and a plain matmul
    have nothing to move, and a prepass config of them is refused. The tuner offers prepass
    configs only where a loop can be separated; the config's text and JSON keep it."""
    from dataclasses import replace
    from kernel_regions import attention, matmul_epilogue, rmsnorm_matmul
    from superopt.kernel import generate_kernels, to_triton
    from superopt.kernel.errors import KernelError
    from superopt.kernel.triton_lower import prepass_split
    from superopt.kernel.tune import config_text, parse_config, tuning_space
    norm = generate_kernels(rmsnorm_matmul(m=1, k=1024, n=64), verify=False).candidates[0].program
    first, second = prepass_split(norm)
    assert not any(s.op == "dot" for s in first) and any(s.op == "dot" for s in second)
    moved = {s.out for s in first if s.op == "update"}
    assert moved and not moved & {s.out for s in second if s.op == "update"}
    assert not any(isinstance(a, str) and a in moved for s in second for a in s.args)
    assert any(s.op == "load" for s in first) and any(s.op == "load" for s in second)
    space = tuning_space(norm, 8)
    assert any(c.prepass for c in space) and not any(c.prepass and c.split > 1 for c in space)
    cfg = next(c for c in space if c.prepass)
    assert parse_config(config_text(cfg)) == cfg and cfg.text().endswith(" prepass")
    assert to_triton(norm, cfg).count("for t_K in") == 2
    assert to_triton(norm, replace(cfg, prepass=False)).count("for t_K in") == 1
    for other in (generate_kernels(attention(h=2, kvh=2, l=5, s=37), verify=False).candidates[0].program,
                  generate_kernels(matmul_epilogue(m=5, k=24, n=20), verify=False).candidates[0].program):
        assert prepass_split(other) is None
        assert not any(c.prepass for c in tuning_space(other, 8))
        with pytest.raises(KernelError, match="prepass"):
            to_triton(other, replace(tuning_space(other, 8)[0], prepass=True))
    with pytest.raises(KernelError, match="both split"):
        TileConfig((("K", 64),), split=2, prepass=True)


def test_a_tile_that_feeds_a_dot_and_elementwise_work_is_loaded_once_for_each():
    """The sum of squares reads its own load of x (no layout conversion of the dot's operand)."""
    from kernel_regions import rmsnorm_matmul
    from superopt.kernel import default_configs, generate_kernels, to_triton
    norm = generate_kernels(rmsnorm_matmul(m=3, k=96, n=16), verify=False).candidates[0].program
    src = to_triton(norm, default_configs(norm)[-1])
    x = next(s.out for s in norm.body if s.op == "load" and s.tensor == "x")
    assert src.count(f"v_{x}__e = tl.load(") == 1 and src.count(f"v_{x}__e") >= 3
    assert not any("__e" in line for line in src.splitlines() if "tl.dot(" in line)
