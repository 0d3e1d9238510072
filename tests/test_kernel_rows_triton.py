"""Row-owning kernels under Triton's interpreter (a child process with ``TRITON_INTERPRET=1``, as
``test_kernel_triton.py`` explains): post-LN and pre-LN, N padded (24, 40, 33), unsplit and
split, against the float64 emulator; and a graph whose row region the kernel pass replaced,
its kernel node run through Triton, against the original graph."""

import json

import pytest

from kernel_regions import run_child

pytest.importorskip("triton")

CODE = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
from kernel_regions import program_inputs, residual_layernorm
from superopt.kernel import TileConfig, compile_program, default_configs, generate_kernels, run_reference

out = {}
for name, kw in {"post_ln": dict(m=9, k=32, n=40), "pre_ln": dict(m=8, k=64, n=24, pre_ln=True),
                 "pre_ln_odd": dict(m=17, k=40, n=33, pre_ln=True), "both_norms": dict(m=9, k=48, n=40, prologue=True)}.items():
    region = residual_layernorm(**kw)
    cand = generate_kernels(region).best
    ins = program_inputs(region, cand)
    errs = []
    cfgs = [default_configs(cand.program)[0], default_configs(cand.program)[-1]]
    cfgs.append(TileConfig(cfgs[0].blocks, split=2))
    for cfg in cfgs:
        want = run_reference(cand.program, ins, cfg)
        got = compile_program(cand.program, cfg)(*[torch.tensor(ins[t.name], dtype=torch.float32)
                                                   for t in cand.program.inputs])
        errs += [float(np.max(np.abs(g.numpy() - w)) / np.max(np.abs(w))) for g, w in zip(got, want)]
    out[name] = {"errors": errs, "outputs": len(cand.program.outputs), "configs": [c.text() for c in cfgs]}
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """One child process runs both parts (each child pays for importing torch and Triton)."""
    return json.loads(run_child(CODE + GRAPH, tmp_path_factory.mktemp("rows")).strip().splitlines()[-1])


def test_row_kernels_run_under_the_interpreter(child):
    res = child["kernels"]
    assert set(res) == {"post_ln", "pre_ln", "pre_ln_odd", "both_norms"}
    for name, r in res.items():
        assert len(r["errors"]) == 3 * r["outputs"] and max(r["errors"]) < 2e-5, (name, r)
        assert any("split=2" in c for c in r["configs"])
    assert res["pre_ln"]["outputs"] == 2


GRAPH = r"""
from test_kernel_rows import _block
from superopt.codegen.fx import to_fx
from superopt.kernel import default_configs
from superopt.kernel.choose import cached_candidates, choose_kernels
from superopt.kernel.profile import KernelEntry, KernelProfile, region_signature
from superopt.kernel.regions import canonical_region, row_regions
from superopt.kernel.tune import config_text
import superopt.kernel.torch_op as t

g = _block(pre_ln=True)
(row,) = row_regions(g).values()
canon = canonical_region(row.graph)[0]
prog = cached_candidates(canon)[0][0].program
prof = KernelProfile()
prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog.text(), config_text(default_configs(prog)[-1]), 1.0, 3.0))
h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
x = torch.randn(9, 24)
got, want = to_fx(h)(x), to_fx(g)(x)
print(json.dumps({"kernels": out, "graph": {"chosen": rep.chosen, "launched": t._launcher.cache_info().currsize,
                                             "err": float((got - want).abs().max() / want.abs().max())}}))
"""


def test_a_chosen_row_kernel_runs_in_the_graph(child):
    res = child["graph"]
    assert res["chosen"] == 1 and res["launched"] == 1 and res["err"] < 1e-5, res
