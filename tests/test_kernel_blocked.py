"""``blocked`` tile configs (superopt.kernel.program.TileConfig): a streaming kernel reads its
compile-time weights (``X__t``) from a tile-blocked copy, each loop tile one contiguous run.
The configs read and print as data, take only the loads that qualify, are offered with the
streaming and gemv configs, the copy is a permutation of the weight with each tile where the
kernel reads it, and every kernel runs under Triton's interpreter on the blocked copy exactly
as the same config does on the weight itself (plain, prepass and gemv configs, bf16 storage)."""

from dataclasses import replace

import numpy as np
import pytest

from kernel_regions import child_check, hf_rmsnorm_swiglu, rmsnorm_matmul, streaming_program
from superopt.kernel import TileConfig, generate_kernels, to_triton
from superopt.kernel.triton_lower import blocked_arrays, blocked_loads, tma_loads
from superopt.kernel.tune import (config_text, gemv_configs, parse_config, specialize, stream_configs, transposed,
                                  tuning_space)


def test_blocked_configs_read_and_print_as_data():
    c = TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, blocked=True)
    assert c.text() == "M=16 N=64 K=256 warps=4 stages=3 blocked" and parse_config(config_text(c)) == c
    assert "blocked" not in config_text(replace(c, blocked=False))
    assert parse_config(config_text(replace(c, gemv=True, blocks=(("M", 1), ("N", 8), ("K", 512))))).blocked
    split = replace(c, split=2)
    assert split.text().endswith("split=2 blocked") and parse_config(config_text(split)) == split
    both = TileConfig((("M", 16), ("N", 64), ("K", 256)), 4, 3, tma=True, blocked=True)
    assert both.text().endswith("tma blocked") and parse_config(config_text(both)) == both


def test_only_compile_time_weights_read_in_whole_tiles_are_blocked():
    p, names = streaming_program(rmsnorm_matmul(m=3, k=1024, n=64))
    cfg = replace(stream_configs(p)[4], blocked=True)           # N=64 K=256
    loads = blocked_loads(p, cfg)
    assert loads == {f"{names[0]}__t": (cfg.block("N"), cfg.block("K"), 1)}      # not x, not the 1-d loads
    assert blocked_loads(p, replace(cfg, blocked=False)) == {}
    src = to_triton(p, cfg)
    assert f"(i_N * {1024 // cfg.block('K')} + t_K) * {cfg.block('K') * cfg.block('N')}" in src
    both = replace(cfg, tma=True)                                # the input tile through a descriptor
    assert set(tma_loads(p, both)) == {"x"} and blocked_loads(p, both) == loads
    ragged, _ = streaming_program(rmsnorm_matmul(m=3, k=1024, n=40))    # 40 columns: the last tile past the edge
    assert blocked_loads(ragged, replace(stream_configs(ragged)[1], blocked=True)) == {}
    plain = specialize(generate_kernels(rmsnorm_matmul(m=3, k=1024, n=64), verify=False).candidates[0].program, "bf16")
    assert blocked_loads(plain, cfg) == {}                       # a weight read at run time keeps its layout


def test_the_blocked_copy_puts_every_tile_where_the_kernel_reads_it():
    p, names = streaming_program(rmsnorm_matmul(m=3, k=1024, n=64))
    name = f"{names[0]}__t"
    w = np.random.default_rng(0).standard_normal((64, 1024))    # F.linear's [N, K]: K the loop
    for bk, bn in ((256, 64), (128, 16), (512, 32)):
        cfg = TileConfig((("M", 16), ("N", bn), ("K", bk)), 4, 3, blocked=True)
        got = blocked_arrays(p, cfg, {name: w, "x": "left alone"})
        flat = got[name].reshape(-1)
        assert got[name].shape == w.shape and got["x"] == "left alone"
        assert np.array_equal(np.sort(flat), np.sort(w.reshape(-1)))            # a permutation
        n_k = 1024 // bk
        for i_n, t_k in ((0, 0), (64 // bn - 1, n_k - 1), (64 // bn // 2, n_k // 3)):
            start = (i_n * n_k + t_k) * bk * bn                                  # the kernel's address
            tile = flat[start:start + bk * bn].reshape(bn, bk)
            assert np.array_equal(tile, w[i_n * bn:(i_n + 1) * bn, t_k * bk:(t_k + 1) * bk])
    # a compile-time weight stored [K, N] (the loop its first axis): still a grid tile's run at a time
    q = transposed(p, [name])
    cfg = TileConfig((("M", 16), ("N", 16), ("K", 256)), 4, 3, blocked=True)
    assert blocked_loads(q, cfg) == {f"{name}__t": (256, 16, 0)}
    flat = blocked_arrays(q, cfg, {f"{name}__t": w.T})[f"{name}__t"].reshape(-1)
    start = (2 * 4 + 3) * 256 * 16
    assert np.array_equal(flat[start:start + 256 * 16].reshape(256, 16), w.T[3 * 256:4 * 256, 2 * 16:3 * 16])


def test_offered_as_the_streaming_and_prepass_configs_twins_where_a_weight_qualifies():
    p, _ = streaming_program(rmsnorm_matmul(m=3, k=1024, n=64))
    space = tuning_space(p, 12)
    blocked = [c for c in space if c.blocked]
    assert blocked and {replace(c, blocked=False, tma=False, swap=False) for c in blocked} <= set(space)   # twins
    assert any(c.prepass for c in blocked) and all(blocked_loads(p, c) for c in blocked)
    assert any(c.tma for c in blocked) and all(c.tma == bool(tma_loads(p, replace(c, tma=True))) for c in blocked)
    assert all(not blocked_loads(p, replace(c, blocked=True)) for c in space if c.tma and not c.blocked)  # one twin
    run_time = specialize(generate_kernels(rmsnorm_matmul(m=3, k=1024, n=64), verify=False).candidates[0].program,
                          "bf16")
    assert not [c for c in tuning_space(run_time, 12) if c.blocked] and [c for c in tuning_space(run_time, 12) if c.tma]


def check_blocked() -> dict:
    """(In a child with TRITON_INTERPRET=1.) Each region's first two candidates with their
    weights transposed, in float32 and bf16 storage, under blocked streaming, prepass and gemv
    configs given the blocked copies: the largest difference from the same config without
    ``blocked`` given the weights themselves (the same arithmetic on the same values: none
    expected), and the worst error against the float64 reference."""
    import torch
    from kernel_regions import program_inputs, relative_errors
    from superopt.kernel import compile_program, run_reference
    out = {}
    for name, region in (("rmsnorm_bias", rmsnorm_matmul(m=3, k=1024, n=64, epilogue="bias")),
                         ("swiglu", hf_rmsnorm_swiglu(m=5, k=1024, n=32)),
                         ("one_row", rmsnorm_matmul(m=1, k=1024, n=64))):
        errs, diffs, runs = [], [], 0
        for cand in generate_kernels(region).candidates[:2]:
            ins = program_inputs(region, cand)
            names = [t.name for t in cand.program.inputs if len(t.shape) == 2 and t.shape[0] == 1024]
            prog = transposed(cand.program, names)
            back = transposed(prog, [f"{n}__t" for n in names])    # stored [K, N]: the loop axis first
            env = dict(ins, **{f"{n}__t": ins[n].T.copy() for n in names}, **{f"{n}__t__t": ins[n] for n in names})
            want = run_reference(prog, env)
            for p in (prog, specialize(prog, "bf16"), back):
                space = [c for c in tuning_space(p, 12) if c.blocked]
                gemv = [replace(c, blocked=True) for c in gemv_configs(p)]
                picked = [c for c in space if not c.prepass][:1] + [replace(c, tma=False) for c in space][:1] + \
                    [c for c in space if c.prepass][:1] + gemv[:1]
                for cfg in picked:
                    xs = [torch.tensor(env[t.name], dtype=torch.float32) for t in p.inputs]
                    phys = blocked_arrays(p, cfg, {t.name: env[t.name] for t in p.inputs})
                    bs = [torch.tensor(phys[t.name], dtype=torch.float32) for t in p.inputs]
                    got = compile_program(p, cfg)(*bs)
                    plain = compile_program(p, replace(cfg, blocked=False))(*xs)
                    diffs += relative_errors(got, plain)
                    errs += relative_errors(got, want)
                    runs += 1
        out[name] = {"runs": runs, "diff": max(diffs), "err": max(errs)}
    return out


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_blocked_kernels_run_under_the_interpreter_as_the_plain_config_does(tmp_path):
    got = child_check("test_kernel_blocked", "check_blocked", tmp_path)
    for name, r in got.items():
        assert r["runs"] >= 4 and r["diff"] <= 1e-6 and r["err"] < 3e-2, (name, r)
