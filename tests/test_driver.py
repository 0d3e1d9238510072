"""The one driver: its passes as data, one set of defaults, the CLI writing what the backend runs,
never slower where nothing changes, and the output check catching a forged rule."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

import superopt.driver.passes as passes
from superopt.cli import main
from superopt.cost import choose_cost_model
from superopt.driver import PASSES, Options, OptionError, Pass, optimize
from superopt.driver.backend import CACHE, BackendOptions, last_report, superopt_backend
from superopt.errors import NumericMismatchError
from superopt.ir.rule import Rule
from superopt.rules import examples as ex

ROOT = Path(__file__).resolve().parents[1]
H100, _ = choose_cost_model("h100", "fp32", "inductor")


# ---- passes as data -------------------------------------------------------------------------------

def test_the_pass_list_is_data_and_the_report_lists_it(tiny):
    ran = []
    mine = Pass("count nodes", lambda r: ran.append(len(r.best.nodes)))
    res = optimize(tiny, [ex.merge_matmuls(2)], H100, passes=[*PASSES[:3], mine, *PASSES[3:]])
    assert ran and "count nodes" in res.report.passes and "count nodes" in res.report.seconds
    assert res.report.passes[-1] == "output check"


def test_the_kernel_slot_runs_a_kernel_chooser_where_one_is_installed(tiny, monkeypatch):
    calls = []

    class Report:
        def to_json(self):
            return {"regions": 0}

    def choose(graph, cost_model, device, dtype, profile=None):
        calls.append((device, dtype))
        return graph, Report()
    monkeypatch.setattr(passes, "choose_kernels", choose)
    res = optimize(tiny, [ex.merge_matmuls(2)], H100, dtype="bf16")
    assert calls == [("h100", "bf16")] and "kernels" in res.report.passes and res.report.kernels == {"regions": 0}
    monkeypatch.setattr(passes, "choose_kernels", None)
    assert "kernels (skipped)" in optimize(tiny, [ex.merge_matmuls(2)], H100).report.passes


# ---- one set of defaults ---------------------------------------------------------------------------

def test_the_cli_the_api_and_the_backend_share_the_defaults():
    from superopt.driver.cli import register
    import argparse
    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    args = p.parse_args(["optimize", "m.pt2"])
    d = Options()
    assert (args.search, args.min_gain, args.tolerance, args.input_sets, args.time_limit, args.layout) == \
        (d.search, d.min_gain, d.tolerance, d.input_sets, d.time_limit, d.layout)
    assert BackendOptions.from_dict({}).driver == d


@settings(max_examples=40, deadline=None)
@given(tol=st.floats(allow_nan=True, allow_infinity=True), gain=st.floats(allow_nan=True, allow_infinity=True))
def test_options_are_checked_by_their_ranges(tol, gain):
    ok = math.isfinite(tol) and tol >= 0 and 0 <= gain < 1
    try:
        Options(tolerance=tol, min_gain=gain).check()
        assert ok
    except OptionError:
        assert not ok


# ---- the output check ------------------------------------------------------------------------------

def test_a_forged_wrong_rule_is_caught_by_the_default_check(tiny, monkeypatch):
    """Past a proof gate that admits everything, the default output check (2 input sets) stops
    a rule that drops a ReLU, names it, and nothing is written."""
    from superopt.search.instance_proofs import InstanceProofs
    monkeypatch.setattr(InstanceProofs, "admit", lambda self, rule_id, instance: True)
    right = ex.fuse_conv_relu()
    wrong = Rule(right.lhs, right.lhs.subgraph([right.lhs.nodes[-1].inputs[0]]))
    with pytest.raises(NumericMismatchError, match="nothing was written") as err:
        optimize(tiny, [ex.merge_matmuls(2), wrong], H100, min_gain=0.0)
    assert "--exclude-rule" in str(err.value)


@pytest.mark.parametrize("spare", [False, True])
def test_the_cli_checks_the_program_it_writes_and_refuses_a_forged_wrong_rule(tiny, tmp_path, monkeypatch, capsys,
                                                                              spare):
    """The CLI exports once and checks that program (not a module generated apart from it) on
    the examples, and the rewritten regions on the random input sets asked for: a forged rule
    that drops a ReLU is refused, named, nothing is written; the right rule passes, with every
    input set in the report. With a spare core the region check runs in a second process
    beside the export (superopt.driver.aside), to the same verdicts."""
    import json

    import superopt.driver.command as command
    from superopt.driver.aside import can_fork
    from superopt.search.instance_proofs import InstanceProofs
    monkeypatch.setattr(InstanceProofs, "admit", lambda self, rule_id, instance: True)
    monkeypatch.setattr(command, "spare_core", lambda: spare)
    right = ex.fuse_conv_relu()
    wrong = Rule(right.lhs, right.lhs.subgraph([right.lhs.nodes[-1].inputs[0]]))
    src, out = tmp_path / "tiny.pt2", tmp_path / "tiny.opt.pt2"
    torch.export.save(tiny.program, str(src))
    args = ["optimize", str(src), "-o", str(out), "--device", "h100", "--min-gain", "0", "--input-sets", "3"]
    monkeypatch.setattr(command, "load_rules", lambda *a, **k: [ex.merge_matmuls(2), wrong])
    assert main(args + ["--quiet"]) != 0
    err = capsys.readouterr().err
    assert "computes something else" in err and "--exclude-rule" in err and len(err.strip().splitlines()) == 1
    assert "a rewritten region computes something else" in err  # the region check, here or beside
    assert not out.exists()
    monkeypatch.setattr(command, "load_rules", lambda *a, **k: [ex.merge_matmuls(2)])
    assert main(args + ["--target", "eager", "--json"]) == 0  # eager: the merged matmul is priced cheaper
    rep = json.loads(capsys.readouterr().out)
    assert rep["rewritten"] and out.exists() and "output check" not in rep["passes"]
    # the random sets run through the rewritten regions, the examples through the whole model
    assert list(rep["output_check"]) == ["examples"] and "region check" in rep["passes"]
    assert list(rep["region_check"]["sets"]) == ["normal", "normal x0.01"] and rep["region_check"]["covered"]
    assert rep["region_check"]["region_outputs"] >= 1 and rep["region_check"]["worst"] <= 1e-4
    assert rep["max_relative_error"] <= 1e-4
    assert ("beside" in rep["region_check"]) == (spare and can_fork())
    assert rep["cpu_s"]["run"] > 0 and rep["cpu_s"]["beside"] >= 0
    assert "second process" in rep["region_check"].get("beside", "second process")



def test_the_optimize_command_ends_its_process_at_once_with_its_output_complete(tiny, tmp_path):
    """Run as a command (``python -m superopt``), ``optimize`` skips the interpreter's teardown
    (superopt.cli.end_process): the exit code, the JSON on stdout, the written file and the
    one-line error are as a normal exit leaves them; called as ``main([...])`` it returns."""
    import json

    src, out = tmp_path / "tiny.pt2", tmp_path / "tiny.opt.pt2"
    torch.export.save(tiny.program, str(src))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "superopt", "optimize", str(src), "-o", str(out), "--device", "h100",
           "--min-gain", "0", "--target", "eager", "--threads", "1", "--json"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["output"] == str(out) and out.exists()
    x = torch.randn(1, 4, 8, 8)
    got, want = torch.export.load(str(out)).module()(x), tiny.program.module()(x)
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    bad = subprocess.run(cmd[:4] + [str(tmp_path / "none.pt2")] + cmd[5:], env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr



def test_optimize_runs_with_fewer_garbage_collections_and_puts_the_thresholds_back(tiny, tmp_path, monkeypatch):
    """The command's passes run at GC_THRESHOLDS (full collections of its large heap cost a
    second a run); the thresholds are put back after, also when the run fails."""
    import gc

    import superopt.driver.command as command
    seen = []
    real = command.optimize
    monkeypatch.setattr(command, "optimize", lambda *a, **k: seen.append(gc.get_threshold()) or real(*a, **k))
    before = gc.get_threshold()
    src = tmp_path / "tiny.pt2"
    torch.export.save(tiny.program, str(src))
    args = ["optimize", str(src), "-o", str(tmp_path / "o.pt2"), "--device", "h100", "--threads", "1", "--quiet"]
    assert main(args) == 0
    assert seen == [command.GC_THRESHOLDS] and gc.get_threshold() == before
    assert main(args[:1] + [str(tmp_path / "none.pt2")] + args[2:]) == 2
    assert gc.get_threshold() == before
    with pytest.raises(KeyError), command.fewer_collections((5000, 5, 5)):
        assert gc.get_threshold() == (5000, 5, 5)
        raise KeyError("put back on errors too")
    assert gc.get_threshold() == before


# ---- the CLI writes what the backend runs -------------------------------------------------------

class _Block(torch.nn.Module):
    """conv + bias + ReLU twice, and a residual: cuDNN's fused epilogues are priced cheaper."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.b = torch.nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return torch.relu(self.b(y) + x)


def _fused_calls(code: str) -> int:
    return code.count("superopt.conv2d_relu")


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("block")
    src = d / "block.pt2"
    torch.export.save(torch.export.export(_Block().eval(), (torch.randn(1, 64, 56, 56),)), str(src))
    return d, src


def _write(block, *extra):
    d, src = block
    out = d / f"out{len(extra)}.pt2"
    assert main(["optimize", str(src), "-o", str(out), "--device", "h100", "--dtype", "bf16", "--quiet", *extra]) == 0
    return out


def test_the_written_program_carries_the_fused_calls_the_backend_runs(block, capsys):
    out = _write(block)
    text = capsys.readouterr().out
    program = torch.export.load(str(out))
    written = _fused_calls(str(program.graph))
    assert written >= 1 and "import superopt" in text
    torch._dynamo.reset()
    CACHE.clear()
    m = _Block().eval()
    m.load_state_dict(torch.export.load(str(block[1])).module().state_dict(), strict=False)
    with torch.no_grad():
        torch.compile(m, backend=superopt_backend, options={"device": "h100", "dtype": "bf16", "inductor": False})(
            torch.randn(1, 64, 56, 56))
    module = list(CACHE.values())[-1][0]
    assert module is not None and _fused_calls(module.code) == written == last_report()["conv_relu_fused"]


def test_portable_writes_plain_torch_that_loads_without_superopt(block, capsys):
    out = _write(block, "--portable")
    assert _fused_calls(str(torch.export.load(str(out)).graph)) == 0
    script = (f"import sys, torch; m = torch.export.load({str(out)!r}).module(); m(torch.randn(1, 64, 56, 56)); "
              f"assert 'superopt' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert r.returncode == 0, r.stderr[-1500:]


@pytest.mark.parametrize("order", ["import superopt, torch", "import torch, superopt"])
def test_import_superopt_is_all_a_written_program_needs(block, order):
    out = _write(block)
    src = block[1]
    script = (f"{order}; x = torch.randn(1, 64, 56, 56); "
              f"got = torch.export.load({str(out)!r}).module()(x); want = torch.export.load({str(src)!r}).module()(x); "
              f"torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert r.returncode == 0, r.stderr[-1500:]


# ---- never slower ---------------------------------------------------------------------------------

def test_where_nothing_changes_inductor_gets_exactly_what_torch_compile_gives_it(monkeypatch):
    """No rule applies and there is no convolution: the backend hands Inductor dynamo's own graph
    and example inputs, with the mode's settings only (no freezing or layout flags of its own)."""
    import torch._inductor.compile_fx as cf
    seen = []
    monkeypatch.setattr(cf, "compile_fx", lambda gm, inputs, config_patches=None, **kw:
                        seen.append((gm, list(inputs), dict(config_patches or {}))) or gm.forward)
    got = []

    def spy(gm, inputs, **kw):
        got.append((gm, list(inputs)))
        return superopt_backend(gm, inputs, **kw)
    torch._dynamo.reset()
    CACHE.clear()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    with torch.no_grad():
        torch.compile(m, backend=spy, options={"rules": "examples", "device": "h100"})(torch.randn(2, 8))
    assert last_report()["kept"].startswith("original")
    (gm, inputs, patches), = seen
    assert gm is got[0][0] and all(a is b for a, b in zip(inputs, got[0][1])) and patches == {}


def test_output_check_compares_inputs_updated_in_place():
    """A program that writes into an input (a KV cache) is checked on its own copy of each input
    set, and the inputs as it left them count: forgetting the write, or writing elsewhere, differs."""
    from superopt.driver.outcheck import OutputMismatch, check_outputs, make_input_sets

    def original(x, cache):
        cache[1].copy_(x)
        return x * 2

    sets = make_input_sets((torch.ones(3), torch.zeros(4, 3)), {})
    untouched = [s[1][1].clone() for s in sets]
    assert not isinstance(check_outputs(original, lambda x, c: (c[1].copy_(x), x + x)[1], sets), OutputMismatch)
    forgot = check_outputs(original, lambda x, c: x + x, sets)
    assert isinstance(forgot, OutputMismatch) and forgot.output == 2  # outputs, then x, then the cache
    wrong_row = check_outputs(original, lambda x, c: (c[2].copy_(x), x + x)[1], sets)
    assert isinstance(wrong_row, OutputMismatch) and wrong_row.output == 2
    assert all(torch.equal(s[1][1], u) for s, u in zip(sets, untouched))  # the input sets themselves never change
