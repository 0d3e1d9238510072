"""``swap`` tile configs (superopt.kernel.program.TileConfig): a loop's ``acc + dot x y`` taken as
``dot(yᵀ, xᵀ)`` into an accumulator kept transposed until after the loop. The configs read and
print as data; only an accumulator whose one use in the loop is that sum is swapped (an online
softmax's rescaled output and an accumulator read elsewhere in the loop are not); the tuner
offers them as the blocked twins of wide column tiles; and every swapped kernel runs under
Triton's interpreter as the same config does unswapped (plain, prepass, blocked, tma, split;
one and two dots), equal to the float64 reference."""

from dataclasses import replace

import pytest

from kernel_regions import (child_check, gqa_sdpa, hf_rmsnorm_swiglu, rmsnorm_matmul, skip_without_nvidia_backend,
                            streaming_program)
from superopt.kernel import KernelError, TileConfig, generate_kernels, to_triton
from superopt.kernel.program import EXAMPLE, parse_program
from superopt.kernel.triton_lower import swapped_accs
from superopt.kernel.tune import config_text, parse_config, specialize, transposed, tuning_space


def test_swap_configs_read_and_print_as_data_and_refuse_gemv():
    c = TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, tma=True, blocked=True, swap=True)
    assert c.text().endswith("tma blocked swap") and parse_config(config_text(c)) == c
    assert "swap" not in config_text(replace(c, swap=False))
    assert parse_config(config_text(replace(c, swap=False))) == replace(c, swap=False)
    with pytest.raises(KernelError, match="swap"):
        TileConfig((("M", 1), ("N", 8), ("K", 512)), 4, 3, gemv=True, swap=True)


def test_only_an_accumulator_summing_one_dot_is_swapped():
    p = parse_program(EXAMPLE)
    cfg = TileConfig((("M", 16), ("N", 16), ("K", 16)), swap=True)
    assert swapped_accs(p, cfg) == {"acc": "c"} and swapped_accs(p, replace(cfg, swap=False)) == {}
    src = to_triton(p, cfg)
    assert "tl.full((16, 16)" in src and "tl.dot(tl.trans(" in src and "v_acc = tl.trans(v_acc)" in src
    # the accumulator read again in the loop (by a second accumulator's sum): left as it is
    twice = parse_program(EXAMPLE.replace("acc acc[M,N] = 0\n", "acc acc[M,N] = 0\nacc s[M,N] = 0\n")
                          .replace("  update acc d\n", "  f = add s acc\n  update acc d\n  update s f\n")
                          .replace("  r = relu acc\n", "  q = add acc s\n  r = relu q\n"))
    assert swapped_accs(twice, cfg) == {}
    # the dot's sum feeds something else too: not swapped
    used = parse_program(EXAMPLE.replace("output y f32[5,24]\n", "output y f32[5,24]\noutput z f32[5,24]\n")
                         .replace("  update acc d\n", "  update acc d\n  store z[M,N] d\n"))
    assert swapped_accs(used, cfg) == {}
    # an online softmax's output accumulator is rescaled (o·alpha + p·v): never swapped
    att = specialize(generate_kernels(gqa_sdpa(h=4, kvh=2, l=1, s=64, d=16), verify=False).candidates[0].program,
                     "bf16")
    assert att.loop and swapped_accs(att, TileConfig(tuple((d, 16) for d, t in att.grid if t) +
                                                     ((att.loop, 16),), swap=True)) == {}


def test_offered_as_the_blocked_twins_of_wide_column_tiles():
    p, _ = streaming_program(rmsnorm_matmul(m=3, k=1024, n=128))
    space = tuning_space(p, 12)
    swapped = [c for c in space if c.swap]
    assert swapped and all(c.blocked and swapped_accs(p, c) for c in swapped)
    assert all(c.block("N") >= 64 for c in swapped)
    assert all(not c.swap for c in space if c.blocked and c.block("N") < 64)
    assert len(space) == len(set(space))


def check_swap() -> dict:
    """(In a child with TRITON_INTERPRET=1.) For each region's first candidate, float32 and
    bf16 storage: plain, prepass, blocked + tma, split, split blocked + tma and split tma
    configs, each with ``swap`` and
    without; the largest relative difference between the two, and the worst error against the
    float64 reference."""
    import torch
    from kernel_regions import program_inputs, relative_errors
    from superopt.kernel import compile_program, run_reference
    from superopt.kernel.triton_lower import blocked_arrays
    out = {}
    for name, region in (("rmsnorm_bias", rmsnorm_matmul(m=3, k=1024, n=64, epilogue="bias")),
                         ("swiglu", hf_rmsnorm_swiglu(m=5, k=1024, n=64)),
                         ("one_row", rmsnorm_matmul(m=1, k=1024, n=64))):
        cand = generate_kernels(region).candidates[0]
        ins = program_inputs(region, cand)
        names = [t.name for t in cand.program.inputs if len(t.shape) == 2 and t.shape[0] == 1024]
        prog = transposed(cand.program, names)
        env = dict(ins, **{f"{n}__t": ins[n].T.copy() for n in names})
        want = run_reference(prog, env)
        errs, diffs, swapped = [], [], 0
        for p in (prog, specialize(prog, "bf16")):
            base = TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3)
            for cfg in (base, replace(base, prepass=True), replace(base, tma=True, blocked=True),
                        replace(base, split=2), replace(base, tma=True, blocked=True, split=2),
                        replace(base, tma=True, split=2)):
                cfg_swap = replace(cfg, swap=True)
                phys = blocked_arrays(p, cfg, {t.name: env[t.name] for t in p.inputs})
                xs = [torch.tensor(phys[t.name], dtype=torch.float32) for t in p.inputs]
                got = compile_program(p, cfg_swap)(*xs)
                plain = compile_program(p, cfg)(*xs)
                swapped += bool(swapped_accs(p, cfg_swap))
                diffs += relative_errors(got, plain)
                errs += relative_errors(got, want)
        out[name] = {"swapped": swapped, "diff": max(diffs), "err": max(errs)}
    return out


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_swapped_kernels_run_under_the_interpreter_as_the_unswapped_config_does(tmp_path):
    got = child_check("test_kernel_swap", "check_swap", tmp_path)
    for name, r in got.items():
        assert r["swapped"] >= 12 and r["diff"] <= 1e-5 and r["err"] < 3e-2, (name, r)


def check_ptx() -> dict:
    """(In a child, compiled for sm_90.) How each form's tensor-core dot is issued: Hopper's
    ``wgmma`` (operands from shared memory, M >= 64) or the register ``mma.sync``."""
    from superopt.kernel.compile import compile_ptx
    p, _ = streaming_program(rmsnorm_matmul(m=3, k=1024, n=64))
    cfg = TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, tma=True, blocked=True, swap=True)
    out = {}
    for name, c in (("swap", cfg), ("plain", replace(cfg, swap=False))):
        ptx = compile_ptx(p, c)
        out[name] = {"wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync")}
    return out


def test_ptx_a_swapped_dot_is_a_warpgroup_mma(tmp_path):
    skip_without_nvidia_backend()
    got = child_check("test_kernel_swap", "check_ptx", tmp_path, interpret=False)
    assert got["swap"]["wgmma"] > 0 and got["swap"]["mma_sync"] == 0, got
    assert got["plain"]["wgmma"] == 0 and got["plain"]["mma_sync"] > 0, got
