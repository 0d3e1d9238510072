"""``tma`` tile configs (superopt.kernel.program.TileConfig): a streaming kernel's loop tiles of
2-d tensors loaded through tensor descriptors (Hopper's TMA), whose boxes past a tensor's edge
read zeros as the masked loads do. The configs read and print as data, are offered with the
streaming configs, take only the loads that qualify, and every kernel runs under Triton's
interpreter equal to the program's float64 reference (edge tiles, plain and transposed
weights, bf16 storage); compiled for sm_90 the weight stream is a bulk tensor copy."""

from dataclasses import replace

import pytest

from kernel_regions import child_check, hf_rmsnorm_swiglu, rmsnorm_matmul, skip_without_nvidia_backend
from superopt.kernel import KernelError, TileConfig, generate_kernels, to_triton
from superopt.kernel.triton_lower import tma_loads
from superopt.kernel.tune import config_text, parse_config, specialize, stream_configs, transposed, tuning_space


def _program(region, i=0):
    return generate_kernels(region, verify=False).candidates[i].program


def _weight(p):
    return next(t.name for t in p.inputs if len(t.shape) == 2 and t.shape[0] == 1024)


def test_tma_configs_read_and_print_as_data_and_refuse_gemv():
    c = TileConfig((("M", 16), ("N", 32), ("K", 256)), 4, 4, tma=True)
    assert c.text() == "M=16 N=32 K=256 warps=4 stages=4 tma" and parse_config(config_text(c)) == c
    assert "tma" not in config_text(replace(c, tma=False))
    split = replace(c, split=2)
    assert split.text().endswith("split=2 tma") and parse_config(config_text(split)) == split
    with pytest.raises(KernelError, match="tma"):
        TileConfig((("M", 16), ("N", 32), ("K", 256)), 4, 4, tma=True, gemv=True)


def test_offered_for_streaming_kernels_with_loads_that_qualify():
    p = specialize(_program(rmsnorm_matmul(m=3, k=1024, n=40)), "bf16")
    space = tuning_space(p, 12)
    tma = [c for c in space if c.tma]
    assert tma and {replace(c, tma=False) for c in tma} <= set(space)      # each a streaming config's twin
    assert all(tma_loads(p, c) for c in tma)
    assert not [c for c in tuning_space(_program(rmsnorm_matmul(m=3, k=40, n=24)), 12) if c.tma]  # not streaming


def test_only_whole_tiles_of_2d_tensors_at_tile_starts_take_a_descriptor():
    p = specialize(_program(rmsnorm_matmul(m=3, k=1024, n=40)), "bf16")
    cfg = replace(stream_configs(p)[1], tma=True)
    boxes = tma_loads(p, cfg)
    w = _weight(p)
    assert boxes == {"x": (16, cfg.block("K")), w: (cfg.block("K"), cfg.block("N"))}
    assert tma_loads(p, replace(cfg, tma=False)) == {}
    src = to_triton(p, cfg)
    assert f"d_x.load([i_M * 16, t_K * {cfg.block('K')}])" in src and f"d_{w}.load([" in src
    assert "c_" not in "".join(boxes) and "p_c + (offs_K)" in src       # 1-d loads stay pointer loads
    narrow = replace(cfg, blocks=(("M", 16), ("N", 4), ("K", 256)))       # an 8-byte box row: too narrow
    assert w not in tma_loads(p, narrow)
    odd = specialize(_program(rmsnorm_matmul(m=3, k=1028, n=40)), "bf16")  # x's 2,056-byte rows: not 16-byte aligned
    odd_boxes = tma_loads(odd, replace(stream_configs(odd)[1], tma=True))
    assert "x" not in odd_boxes and len(odd_boxes) == 1                   # the weight's 80-byte rows still are


def check_tma() -> dict:
    """(In a child with TRITON_INTERPRET=1.) Each region's first two candidates, in float32 and
    in bf16 storage, plain, with their 2-d weights transposed and with their inputs in reverse
    order, under three tma configs: the
    worst relative error against the float64 reference, and the largest difference from the
    same config without tma (the same arithmetic on the same values: none expected)."""
    import torch
    from kernel_regions import program_inputs, relative_errors
    from superopt.kernel import compile_program, run_reference
    out = {}
    for name, region in (("rmsnorm_bias", rmsnorm_matmul(m=3, k=1024, n=40, epilogue="bias")),
                         ("swiglu", hf_rmsnorm_swiglu(m=5, k=1024, n=24))):
        errs, diffs, runs, described = {"float32": [], "bf16": []}, [], 0, 0
        for cand in generate_kernels(region).candidates[:2]:
            ins = program_inputs(region, cand)
            names = [t.name for t in cand.program.inputs if len(t.shape) == 2 and t.shape[0] == 1024]
            # the inputs also in reverse order: the descriptors follow the program's input order,
            # whatever order the body loads them in
            backwards = replace(cand.program, inputs=cand.program.inputs[::-1])
            for prog in (cand.program, transposed(cand.program, names), backwards):
                env = dict(ins, **{f"{n}__t": ins[n].T.copy() for n in names})
                want = run_reference(prog, env)
                for kind, p in (("float32", prog), ("bf16", specialize(prog, "bf16"))):
                    xs = [torch.tensor(env[t.name], dtype=torch.float32) for t in p.inputs]
                    for cfg in [replace(c, tma=True) for c in stream_configs(p)][:3]:
                        described += bool(tma_loads(p, cfg))
                        got = compile_program(p, cfg)(*xs)
                        plain = compile_program(p, replace(cfg, tma=False))(*xs)
                        errs[kind] += relative_errors(got, want)
                        diffs += relative_errors(got, plain)
                        runs += 1
        out[name] = {"runs": runs, "described": described, "err": max(errs["float32"]),
                     "err_bf16": max(errs["bf16"]), "diff": max(diffs)}
    return out


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_tma_kernels_run_under_the_interpreter_equal_to_the_reference(tmp_path):
    got = child_check("test_kernel_tma", "check_tma", tmp_path)
    for name, r in got.items():
        assert r["runs"] >= 18 and r["described"] >= r["runs"] // 2, (name, r)   # most take a descriptor
        assert r["diff"] <= 1e-6 and r["err"] < 1e-2 and r["err_bf16"] < 3e-2, (name, r)   # swiglu rounds to bf16 inside


def check_ptx() -> dict:
    """(In the child, compiled for sm_90.) Whether the loop's tiles are bulk tensor copies."""
    from superopt.kernel.compile import compile_ptx
    p = specialize(_program(rmsnorm_matmul(m=3, k=1024, n=40)), "bf16")
    cfg = replace(stream_configs(p)[1], tma=True)
    ptx = compile_ptx(p, cfg)
    plain = compile_ptx(p, replace(cfg, tma=False))
    return {"tma": ptx.count("cp.async.bulk.tensor"), "plain": plain.count("cp.async.bulk.tensor")}


def test_ptx_streams_the_tiles_with_bulk_tensor_copies(tmp_path):
    skip_without_nvidia_backend()
    got = child_check("test_kernel_tma", "check_ptx", tmp_path, interpret=False)
    assert got["tma"] >= 1 and got["plain"] == 0, got
