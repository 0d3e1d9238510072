"""``gemv`` tile configs (superopt.kernel.program.TileConfig): a one-row streaming kernel's dots
computed as products summed over the contraction, its rows in one-row tiles, so that its column
tiles may be narrower than ``tl.dot``'s 16. The configs are offered only where they apply, are
refused by the lowering elsewhere, read and print as data, and every one runs under Triton's
interpreter equal to the program's float64 reference (plain and transposed weights)."""

import json

import numpy as np
import pytest

from kernel_regions import attention, hf_rmsnorm_swiglu, rmsnorm_matmul, run_child
from superopt.kernel import KernelError, TileConfig, generate_kernels, to_triton
from superopt.kernel.tune import config_text, gemv_configs, parse_config, stream_configs, transposed, tuning_space


def _program(region):
    return generate_kernels(region, verify=False).candidates[0].program


def test_gemv_configs_read_and_print_as_data():
    c = TileConfig((("M", 1), ("N", 8), ("K", 512)), 2, 4, gemv=True)
    assert c.text() == "M=1 N=8 K=512 warps=2 stages=4 gemv"
    assert parse_config(config_text(c)) == c
    plain = TileConfig((("M", 16), ("N", 64), ("K", 256)), 2, 4)
    assert "gemv" not in config_text(plain) and parse_config(config_text(plain)) == plain


def test_offered_for_one_row_streaming_kernels_only():
    one = _program(rmsnorm_matmul(m=1, k=1024, n=40))
    cfgs = gemv_configs(one)
    assert cfgs and all(c.gemv and c.block("M") == 1 and c.block("N") <= 32 for c in cfgs)
    space = tuning_space(one, 12)
    assert set(cfgs) <= set(space)
    # 5 column tiles of 8 leave the GPU idle: the loop is also cut across programs
    assert {c.split for c in space if c.gemv} >= {1, 2}
    five = _program(rmsnorm_matmul(m=5, k=1024, n=40))
    assert stream_configs(five) and not gemv_configs(five)             # rows > 1: tl.dot's tiles
    assert not gemv_configs(_program(rmsnorm_matmul(m=1, k=40, n=24)))  # too short to stream
    assert not gemv_configs(_program(attention(h=4, kvh=2, l=1, s=37)))


def test_the_lowering_refuses_gemv_where_rows_are_tiled_by_more_than_one():
    five = _program(rmsnorm_matmul(m=5, k=1024, n=40))
    with pytest.raises(KernelError, match="gemv"):
        to_triton(five, TileConfig((("M", 16), ("N", 16), ("K", 256)), 4, 3, gemv=True))


def test_the_source_has_no_tensor_core_dot_and_streams_the_weights_once():
    p = _program(rmsnorm_matmul(m=1, k=1024, n=40))
    w = next(t.name for t in p.inputs if len(t.shape) == 2 and t.shape[0] == 1024)
    for prog, axis in ((p, "axis=0"), (transposed(p, [w]), "axis=1")):
        src = to_triton(prog, gemv_configs(prog)[0])
        assert "tl.dot" not in src and f"{axis})[None, :]" in src
        loads = [ln for ln in src.splitlines() if "tl.load(" in ln]
        assert [ln for ln in loads if w in ln and "evict_first" in ln]       # the weight tile
        assert not [ln for ln in loads if "p_x " in ln and "evict_first" in ln]   # the row, read by all


def check_gemv() -> dict:
    """(In a child with TRITON_INTERPRET=1.) Each region's first two candidates, plain and with
    their 2-d weights transposed, under three gemv configs and two split ones: the worst
    relative error against the float64 reference."""
    import torch
    from kernel_regions import program_inputs
    from superopt.kernel import compile_program, run_reference
    out = {}
    for name, region in (("rmsnorm_bias", rmsnorm_matmul(m=1, k=1024, n=40, epilogue="bias")),
                         ("swiglu", hf_rmsnorm_swiglu(m=1, k=1024, n=24))):
        errs, runs, low = [], 0, False
        for cand in generate_kernels(region).candidates[:2]:
            ins = program_inputs(region, cand)
            names = [t.name for t in cand.program.inputs if len(t.shape) == 2 and t.shape[0] == 1024]
            for prog in (cand.program, transposed(cand.program, names)):
                env = dict(ins, **{f"{n}__t": ins[n].T.copy() for n in names})
                want = run_reference(prog, env)
                splits = [c for c in tuning_space(prog, 12) if c.gemv and c.split > 1]
                for cfg in gemv_configs(prog)[:3] + splits[:2]:
                    got = compile_program(prog, cfg)(*[torch.tensor(env[t.name], dtype=torch.float32)
                                                       for t in prog.inputs])
                    errs += [float(np.max(np.abs(g.float().numpy() - w)) / np.max(np.abs(w))) for g, w in zip(got, want)]
                    low |= any(g.dtype != torch.float32 for g in got)
                    runs += 1
        out[name] = {"runs": runs, "err": max(errs), "tol": 1e-2 if low else 2e-5}   # bf16 outputs: rounding
    return out


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_gemv_kernels_run_under_the_interpreter_equal_to_the_reference(tmp_path):
    code = "import json, test_kernel_gemv as t; print(json.dumps(t.check_gemv()))"
    got = json.loads(run_child(code, tmp_path).strip().splitlines()[-1])
    for name, r in got.items():
        assert r["runs"] >= 10 and r["err"] < r["tol"], (name, r)
