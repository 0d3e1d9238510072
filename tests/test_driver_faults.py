"""Faults and bad input as classes: Ctrl-C leaves no process behind, numbers are checked where
they are parsed, resource limits are refused before work with what fits, out-of-memory is one
line, and every rule id a report prints can be shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from superopt.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("superopt: error:"), err
    return err[0]


def _children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(d))
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts processes through /proc (Linux)")
def test_ctrl_c_in_generate_ends_it_promptly_and_leaves_no_process(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it, at several moments."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen_any = 0
    for delay in (3.0, 5.0, 7.0):
        cmd = [sys.executable, "-m", "superopt", "generate", "--max-ops", "3", "--ops", "taso", "--workers", "2",
               "--quiet", "-o", str(tmp_path / f"r{delay}.db")]
        p = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        seen: set[int] = set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < delay and p.poll() is None:
            seen |= _children(p.pid)
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGINT)
        t1 = time.monotonic()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"generate still running 20 s after Ctrl-C at {delay} s")
        time.sleep(0.3)
        left = [c for c in seen if _running(c)]
        assert left == [], f"processes left behind after Ctrl-C at {delay} s: {left}"
        # 130: the CLI's own message; -SIGINT: interrupted while still importing torch (a loaded machine)
        assert time.monotonic() - t1 < 10 and p.returncode in (0, 130, -signal.SIGINT), p.stderr.read().decode()[-500:]
        seen_any += len(seen)
    assert seen_any > 0  # the workers were there to be stopped


@pytest.mark.parametrize("argv, flag", [
    (["optimize", "--zoo", "squeezenet1_1", "--tolerance", "-1"], "--tolerance"),
    (["optimize", "--zoo", "squeezenet1_1", "--tolerance", "nan"], "--tolerance"),
    (["optimize", "--zoo", "squeezenet1_1", "--min-gain", "inf"], "--min-gain"),
    (["optimize", "--zoo", "squeezenet1_1", "--time-limit", "0"], "--time-limit"),
    (["optimize", "--zoo", "squeezenet1_1", "--input-sets", "9"], "--input-sets"),
    (["optimize", "--zoo", "squeezenet1_1", "--budget", "0"], "--budget"),
    (["generate", "--workers", "100000"], "--workers"),
    (["generate", "--timeout", "nan"], "--timeout"),
])
def test_numeric_options_are_refused_where_they_are_parsed(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and flag in _err(capsys)


def test_workers_beyond_the_cores_say_what_fits(capsys):
    from superopt.cliargs import cores
    with pytest.raises(SystemExit):
        main(["generate", "--workers", str(cores() + 1)])
    assert f"give at most {cores()}" in _err(capsys)


def test_a_batch_that_cannot_fit_is_refused_before_any_work(monkeypatch, tmp_path, capsys):
    import superopt.driver.model as model
    monkeypatch.setattr(model, "available_memory", lambda: 2 << 30)
    monkeypatch.setattr(model, "export_module", lambda *a: pytest.fail("exported before the memory check"))
    assert main(["optimize", "--zoo", "squeezenet1_1", "--batch-size", "100000", "-o", str(tmp_path / "o.pt2")]) == 2
    err = _err(capsys)
    assert "--batch-size 100000" in err and "a batch of at most" in err and not (tmp_path / "o.pt2").exists()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_containers_memory_limit_counts_as_what_is_free(version, tmp_path):
    """In a cgroup the kernel kills a process over the limit without a word; the batch check sees it."""
    from superopt.driver.model import cgroup_headroom
    gib = 1 << 30
    v2 = version == "v2"
    membership = tmp_path / "cgroup"
    membership.write_text("0::/job\n" if v2 else "5:cpu:/\n4:memory:/job\n")
    group = tmp_path / "fs" / ("job" if v2 else "memory/job")
    group.mkdir(parents=True)
    limit, used = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    (group / limit).write_text(f"{4 * gib}\n")
    (group / used).write_text(f"{3 * gib}\n")
    (group / "memory.stat").write_text(f"anon 1\ninactive_file {gib // 2}\n")
    assert cgroup_headroom(tmp_path / "fs", membership) == gib + gib // 2  # page cache can be reclaimed
    (group / limit).write_text("max\n" if v2 else "9223372036854771712\n")
    assert cgroup_headroom(tmp_path / "fs", membership) is None  # no limit
    assert cgroup_headroom(tmp_path / "fs", tmp_path / "missing") is None


def test_the_batch_check_takes_the_smaller_of_free_memory_and_the_cgroup_headroom(monkeypatch):
    import superopt.driver.model as model
    monkeypatch.setattr(model, "cgroup_headroom", lambda: 1 << 20)
    assert model.available_memory() == 1 << 20
    monkeypatch.setattr(model, "cgroup_headroom", lambda: None)
    assert model.available_memory() > 1 << 20


def test_out_of_memory_anywhere_is_one_line(monkeypatch, tmp_path, capsys):
    import superopt.driver.command as command

    def oom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 123 bytes.\nmore lines")
    monkeypatch.setattr(command, "load_model", oom)
    assert main(["optimize", "--zoo", "squeezenet1_1", "-o", str(tmp_path / "o.pt2")]) == 2
    assert "out of memory" in _err(capsys)


def test_a_bug_that_is_not_out_of_memory_keeps_its_traceback(monkeypatch, tmp_path):
    import superopt.driver.command as command
    monkeypatch.setattr(command, "load_model", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["optimize", "--zoo", "squeezenet1_1", "-o", str(tmp_path / "o.pt2")])


class _Fire(torch.nn.Module):
    """SqueezeNet's fire module, small: two convolutions of one input, concatenated."""

    def __init__(self):
        super().__init__()
        self.s = torch.nn.Conv2d(8, 4, 1)
        self.a, self.b = torch.nn.Conv2d(4, 8, 1), torch.nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.s(x))
        return torch.cat([torch.relu(self.a(y)), torch.relu(self.b(y))], 1)


def test_every_rule_id_the_report_prints_can_be_shown(tmp_path, capsys):
    torch.manual_seed(0)
    src = tmp_path / "fire.pt2"
    torch.export.save(torch.export.export(_Fire().eval(), (torch.randn(1, 8, 16, 16),)), str(src))
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.pt2"), "--device", "h100", "--min-gain", "0",
                 "--json"]) == 0
    applied = json.loads(capsys.readouterr().out)["search"]["rules_applied"]
    assert applied and any(k.endswith("~") for k in applied)
    for label in applied:
        assert main(["rules", "show", label]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"rule {label}:"), out[:200]


@pytest.mark.parametrize("zoo", ["llama_tiny_decode", "gpt2_tiny_block", "squeezenet1_1"])
def test_the_memory_estimate_counts_what_a_real_build_holds(zoo):
    """The batch check builds the model on the meta device (no weights drawn): the bytes it counts
    are those of the model built for real."""
    import superopt.driver.model as model
    from superopt.models.zoo import build
    real, inputs = build(zoo, batch_size=1, seed=0)
    weights = sum(p.numel() * p.element_size() for p in real.parameters())
    values = model._forward_bytes(real, inputs) + sum(x.numel() * x.element_size() for x in inputs
                                                      if isinstance(x, torch.Tensor))
    assert model._batch_one_bytes(zoo, 0) == (weights, values)
