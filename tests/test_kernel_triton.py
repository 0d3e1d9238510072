"""The Triton lowering: every generated kernel of the tests runs under Triton's interpreter on CPU
tensors and matches the float64 emulator (and so the region).

Triton picks interpreter mode when its language module is imported, and other tests of the
suite may import it first (torch.compile does), so the kernels run in one child process started
with ``TRITON_INTERPRET=1``; this module checks what it reports.
"""

import json
from dataclasses import replace

import numpy as np
import pytest

from kernel_regions import (run_child, attention, gate_up, gqa_sdpa, hf_rmsnorm_swiglu, layernorm_matmul, masked_sdpa, matmul_epilogue,
                            normed_sdpa, program_inputs, rmsnorm_matmul, rotary_sdpa)
from superopt.kernel import (KernelCompileError, TileConfig, compile_program, default_configs, generate_kernels,
                             parse_program, run_reference, to_triton, EXAMPLE)
from superopt.kernel.triton_lower import prepass_split

pytest.importorskip("triton")


REGIONS = {
    "rmsnorm_matmul": lambda: rmsnorm_matmul(m=5, k=40, n=24, epilogue="bias"),
    "rmsnorm_matmul_lanes": lambda: rmsnorm_matmul(m=5, k=64, n=24, epilogue="bias"),   # K % 16 == 0
    "layernorm_matmul_lanes": lambda: layernorm_matmul(m=5, k=48, n=24),
    "gate_up": lambda: gate_up(m=3, k=40, n=24),
    "matmul_epilogue": lambda: matmul_epilogue(m=5, k=24, n=20),
    "attention_causal": lambda: attention(h=2, kvh=2, l=5, s=37, causal=1),
    "attention_gqa_decode": lambda: attention(h=4, kvh=2, l=1, s=37),
    "layernorm_matmul": lambda: layernorm_matmul(m=5, k=40, n=24),
    "hf_rmsnorm_swiglu": lambda: hf_rmsnorm_swiglu(m=3, k=40, n=24),
    "sdpa_gqa": lambda: gqa_sdpa(h=4, kvh=2, l=1, s=37),
    "sdpa_masked": lambda: masked_sdpa(h=4, kvh=2, l=3, s=37, mask_shape=(1, 1, 3, 37)),
    "sdpa_rotary_decode": lambda: rotary_sdpa(h=4, kvh=2, l=1, s=37, d=16),
    "sdpa_rotary_causal": lambda: rotary_sdpa(h=2, kvh=2, l=5, s=37, d=24, mask=False, causal=1),
    "sdpa_normed_rotary_decode": lambda: normed_sdpa(h=4, kvh=2, l=1, s=37, d=16),
    "sdpa_normed_prefill": lambda: normed_sdpa(h=2, kvh=2, l=3, s=37, d=24, rotary=False),
}


def check_regions() -> dict:
    """(In the child.) Every candidate's kernel under two configs, against the emulator."""
    import torch
    out = {}
    for name in sorted(REGIONS):
        region = REGIONS[name]()
        rep = generate_kernels(region)
        errs, prepass = [], 0
        for cand in rep.candidates[:2]:
            ins = program_inputs(region, cand)
            want = run_reference(cand.program, ins)
            cfgs = [default_configs(cand.program)[0], default_configs(cand.program)[-1]]
            if prepass_split(cand.program):   # the norm's statistics in a loop of their own
                cfgs.append(replace(cfgs[-1], prepass=True))
                prepass += 1
            for cfg in cfgs:
                run = compile_program(cand.program, cfg)
                got = run(*[torch.tensor(ins[t.name], dtype=torch.float32) for t in cand.program.inputs])
                errs += [float(np.max(np.abs(g.float().numpy() - w)) / (np.max(np.abs(w)) + 1e-12)) for g, w in zip(got, want)]
        low = any(t.dtype != "float32" for t in rep.candidates[0].program.outputs) if rep.candidates else False
        out[name] = {"candidates": len(rep.candidates), "errors": errs, "tol": 1e-2 if low else 2e-5,
                     "prepass": prepass}
    return out


def check_misc() -> dict:
    """(In the child.) bf16 tensors, and the launcher's checks of its inputs."""
    import torch
    p = parse_program(EXAMPLE.replace("f32", "bf16"))
    run = compile_program(p, default_configs(p)[0])
    x, w = torch.randn(5, 40), torch.randn(40, 24)
    (y,) = run(x.bfloat16(), w.bfloat16())
    ref = torch.relu(x.bfloat16().float() @ w.bfloat16().float())
    errors = []
    for args in ((x,), (x, torch.zeros(41, 24))):
        try:
            run(*args)
        except KernelCompileError as e:
            errors.append(str(e))
    # strided views (a slice, a broadcast) are read in place by a variant compiled for their
    # strides, a transpose is copied; the same results as their row-major copies
    p32 = parse_program(EXAMPLE)
    run32 = compile_program(p32, default_configs(p32)[0])
    base = torch.randn(5, 60)
    views = {"slice": base[:, 10:50], "transpose": torch.randn(40, 5).t(), "broadcast": torch.randn(1, 40).expand(5, 40)}
    view_err = {}
    for name, xv in views.items():
        (yv,) = run32(xv, w)
        (yc,) = run32(xv.contiguous(), w)
        view_err[name] = float((yv - yc).abs().max())
    return {"dtype": str(y.dtype), "err": float((y.float() - ref).abs().max() / ref.abs().max()), "errors": errors,
            "view_err": view_err, "view_variants": sorted(str(k) for k in run32.views)}


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    code = ("import json, test_kernel_triton as t; "
            "print(json.dumps({'regions': t.check_regions(), 'misc': t.check_misc()}))")
    return json.loads(run_child(code, tmp_path_factory.mktemp("interp")).strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_generated_kernels_run_under_the_interpreter(child, name):
    res = child["regions"][name]
    assert res["candidates"] >= 1 and len(res["errors"]) >= 2
    assert max(res["errors"]) < res["tol"], res


@pytest.mark.parametrize("name", ["rmsnorm_matmul_lanes", "layernorm_matmul_lanes", "hf_rmsnorm_swiglu"])
def test_norm_statistics_run_in_a_prepass_loop_with_the_same_results(child, name):
    """The prepass configs of the norm -> matmul regions were among those run and matched."""
    res = child["regions"][name]
    assert res["prepass"] >= 1 and max(res["errors"]) < res["tol"], res


def test_source_is_deterministic_and_masks_edge_tiles():
    p = parse_program(EXAMPLE)
    cfg = TileConfig((("M", 16), ("N", 16), ("K", 16)))
    src = to_triton(p, cfg)
    assert src == to_triton(p, cfg)
    assert "mask=mask_M[:, None] & mask_K[None, :]" in src and "mask_N" in src
    even = to_triton(parse_program(EXAMPLE.replace("dim N 24", "dim N 32").replace("24]", "32]")), cfg)
    assert "mask_N" not in even    # 32 is a multiple of the block: no mask needed on N


def test_bf16_inputs_and_outputs(child):
    assert child["misc"]["dtype"] == "torch.bfloat16" and child["misc"]["err"] < 1e-2


def test_strided_views_are_read_in_place_with_the_same_results(child):
    misc = child["misc"]
    assert set(misc["view_err"]) == {"slice", "transpose", "broadcast"}
    assert all(e == 0.0 for e in misc["view_err"].values()), misc["view_err"]
    # one variant per layout with contiguous rows; a transpose is copied (read in place, every
    # load would gather), and the row-major calls use the launcher itself
    assert len(misc["view_variants"]) == 2


def test_launcher_checks_its_inputs(child):
    first, second = child["misc"]["errors"]
    assert "takes 2 inputs" in first and "input w must have shape" in second


def test_dependent_launch_waits_before_any_memory_access():
    """Under programmatic dependent launch a kernel may start while the previous one still runs:
    every load and store must come after ``gdc_wait`` (a split schedule's ticket too), and
    without ``pdl`` (the default) nothing of it is emitted."""
    import re
    from superopt.kernel.errors import KernelError
    from superopt.kernel.program import EXAMPLE, parse_program
    from superopt.kernel.triton_lower import to_triton
    p = parse_program(EXAMPLE)
    cfg = TileConfig((("M", 16), ("N", 16), ("K", 16)))
    assert "gdc_" not in to_triton(p, cfg)
    for c in (cfg, replace(cfg, split=2)):
        src = to_triton(p, c, pdl=True)
        kernels = src.split("@triton.jit")[1:]
        assert len(kernels) == 1   # a split schedule is one kernel too (test_kernel_split_kernel.py)
        for k in kernels:
            first_access = min(m.start() for m in re.finditer(r"tl\.(load|store|atomic_add)\(", k))
            assert k.index("tl.extra.cuda.gdc_launch_dependents()") < k.index("tl.extra.cuda.gdc_wait()") < first_access
    with pytest.raises(KernelError, match="interpreter"):
        to_triton(p, cfg, interpret=True, pdl=True)


def test_kernel_cache_follows_the_user_cache(tmp_path, monkeypatch):
    """Compiled sources and proved candidates live under ``$XDG_CACHE_HOME/superopt`` like every other
    cache, unless ``$SUPEROPT_KERNEL_CACHE`` names their own folder."""
    from superopt.kernel.compile import cache_dir
    monkeypatch.delenv("SUPEROPT_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "superopt" / "kernels"
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"
