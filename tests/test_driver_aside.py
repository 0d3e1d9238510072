"""Work beside ``superopt optimize`` in a forked process (superopt.driver.aside): the child's value
comes back whole, its input error is raised here, anything else (a bug, a crash, no answer in time)
is AsideFailed so that the caller does the work itself; torch runs in the child after the parent
used its threads; and the region check done beside gives what it gives in the process."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from superopt.driver.aside import Aside, AsideFailed, can_fork
from superopt.errors import NumericMismatchError

pytestmark = pytest.mark.skipif(not can_fork(), reason="work beside needs fork (Linux)")


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 3_000_000), st.integers(0, 2**16))
def test_the_value_comes_back_whole_past_the_pipe_buffer(size, seed):
    want = np.random.default_rng(seed).standard_normal(size)
    got = Aside(lambda: {"values": want, "pid": os.getpid()}).result()
    assert got["pid"] != os.getpid() and got["values"].shape == want.shape and (got["values"] == want).all()


def test_an_input_error_in_the_child_is_raised_here_and_a_bug_is_aside_failed():
    def refused():
        raise NumericMismatchError("m: a rewritten region computes something else; nothing was written")
    with pytest.raises(NumericMismatchError, match="nothing was written"):
        Aside(refused).result()
    with pytest.raises(AsideFailed, match="ZeroDivisionError"):
        Aside(lambda: 1 / 0).result()
    with pytest.raises(AsideFailed, match="cannot send"):
        Aside(lambda: (lambda: 0)).result()  # a value pickle cannot send


def test_a_child_that_dies_or_hangs_is_aside_failed_and_gone():
    with pytest.raises(AsideFailed, match="without an answer"):
        Aside(lambda: os.kill(os.getpid(), 9)).result()
    job = Aside(lambda: time.sleep(60))
    t = time.perf_counter()
    with pytest.raises(AsideFailed, match="no answer within"):
        job.result(timeout=0.5)
    assert time.perf_counter() - t < 10
    with pytest.raises(ProcessLookupError):
        os.kill(job._pid, 0)  # killed and reaped


def test_torch_runs_in_the_child_after_the_parent_used_its_threads():
    """With OpenMP a forked child that keeps the parent's thread count waits forever; the child
    runs with one thread."""
    torch.set_num_threads(max(2, torch.get_num_threads()))
    x, w = torch.randn(2, 8, 16, 16), torch.randn(8, 8, 3, 3)
    for _ in range(3):
        torch.nn.functional.conv2d(x, w, padding=1)
        x @ x.transpose(-1, -2)
    want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    got = Aside(lambda: (torch.get_num_threads(), torch.nn.functional.conv2d(x.double(), w.double(), padding=1)))
    threads, value = got.result(timeout=120)
    assert threads == 1 and torch.equal(value, want)


def test_the_region_check_beside_falls_back_to_this_process_when_the_child_fails(tiny):
    """RegionsBeside: the child's answer goes where the check puts it; a child that fails leaves the
    region check to run here, with the same report."""
    from superopt.driver.command import RegionsBeside

    class R:  # the run as the region check pass sees it
        def __init__(self):
            self.model = tiny
            self.report = type("Rep", (), {"region_check": {}})()
    parent = os.getpid()

    def check(r):
        if os.getpid() != parent and fail:
            raise RuntimeError("a bug in the child")
        r.report.region_check = {"covered": True, "worst": 0.0, "where": os.getpid()}
    for fail in (False, True):
        r, memo_before = R(), dict(tiny.memo)
        job = RegionsBeside(r, check)
        job.join()
        job.join()  # once only
        where = r.report.region_check["where"]
        assert (where == parent) == fail and r.report.region_check["covered"]
        assert ("no answer" in r.report.region_check["beside"]) == fail
        assert "examples" in tiny.memo or fail
        tiny.memo.clear()
        tiny.memo.update(memo_before)


@pytest.mark.parametrize("min_gain", ["0.99", "0"])
def test_the_program_saved_beside_the_search_is_the_one_written_and_leaves_no_file_behind(tiny, tmp_path,
                                                                                          monkeypatch, min_gain):
    """With a spare core the model's own program is saved in a second process while the search
    runs: where nothing worth writing is found (min-gain 0.99) that file is the output, byte for
    byte what the write saves; where the program changes (min-gain 0, eager) it is dropped; no
    temporary file is left either way."""
    import superopt.driver.command as command
    from superopt.cli import main
    from superopt.rules import examples as ex
    monkeypatch.setattr(command, "load_rules", lambda *a, **k: [ex.merge_matmuls(2)])
    src = tmp_path / "tiny.pt2"
    torch.export.save(tiny.program, str(src))
    outs = {}
    for spare in (False, True):
        monkeypatch.setattr(command, "spare_core", lambda: spare)
        d = tmp_path / f"spare{spare}"
        d.mkdir()
        out = d / "tiny.opt.pt2"
        args = ["optimize", str(src), "-o", str(out), "--device", "h100", "--target", "eager", "--quiet",
                "--min-gain", min_gain]
        assert main(args) == 0
        assert sorted(p.name for p in d.iterdir()) == ["tiny.opt.pt2"]
        outs[spare] = out.read_bytes()
    if min_gain != "0":
        assert outs[True] == outs[False]


def test_a_save_beside_that_fails_leaves_the_write_to_this_process(tiny, tmp_path, monkeypatch):
    """SavedBeside.place: a child that fails (here: a full disk, faked) gives False and leaves no
    file; the write then saves the program itself."""
    import superopt.driver.command as command

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(command, "write_program", full)
    saver = command.SavedBeside(tiny.program, tmp_path / "m.pt2")
    assert not saver.place(tmp_path / "m.pt2")
    assert list(tmp_path.iterdir()) == []
    saver.discard()


def test_a_fork_that_fails_is_aside_failed_at_once(monkeypatch):
    def no_fork():
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(os, "fork", no_fork)
    job = Aside(lambda: 1)
    with pytest.raises(AsideFailed, match="cannot fork"):
        job.result()
    job.cancel()  # nothing to end


def test_sigterm_ends_the_run_as_an_interrupt_and_leaves_no_file_behind(tmp_path):
    """A run ended by SIGTERM during its search (``timeout``) removes the program it was saving
    beside the search, ends that process, and exits as interrupted."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "SUPEROPT_SPARE_CORE": "1"}
    out = tmp_path / "m.opt.pt2"
    cmd = [sys.executable, "-m", "superopt", "optimize", "--zoo", "bert_base", "--device", "h100", "-o", str(out),
           "--quiet", "--time-limit", "60"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(f.name.endswith(".tmp.pt2") for f in tmp_path.iterdir()):  # saving beside the search
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    # the temporary file appears right after `import torch` (the export forked then); 2 s later
    # the run is in its imports or its search (a SIGTERM swallowed by an import: the test below)
    time.sleep(2.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_a_sigterm_whose_interrupt_was_swallowed_is_raised_again_at_the_next_check():
    """An import's C extension init can clear the KeyboardInterrupt the SIGTERM handler raised
    inside it (numpy.random's, under torch._dynamo): the run must still end, at its next check;
    a nested block keeps the signal, a later run forgets it."""
    import signal
    from superopt.driver.aside import terminate_as_interrupt
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # as on a terminal (a job in
    try:                                                                # the background ignores it)
        _swallowed_then_raised()
    finally:
        signal.signal(signal.SIGINT, before)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # ignored (nohup, `&`): left ignored
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def _swallowed_then_raised():
    import signal
    from superopt.driver.aside import raise_if_terminated, terminate_as_interrupt
    with terminate_as_interrupt():
        raise_if_terminated()  # nothing came
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        except BaseException:  # noqa: BLE001 (what the extension's init does)
            pass
        with terminate_as_interrupt():  # optimize's own block, inside the command's
            with pytest.raises(KeyboardInterrupt):
                raise_if_terminated()
        with pytest.raises(KeyboardInterrupt):
            raise_if_terminated()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with terminate_as_interrupt():
        raise_if_terminated()  # a new run: nothing came
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, swallowed alike
            time.sleep(1)
        except BaseException:  # noqa: BLE001
            pass
        with pytest.raises(KeyboardInterrupt):
            raise_if_terminated()


def _rewritten(tiny):
    """The tiny model optimized to a changed program (eager prices the merged matmul cheaper)."""
    from superopt.cost import choose_cost_model
    from superopt.driver import optimize
    from superopt.rules import examples as ex
    eager, _ = choose_cost_model("h100", "fp32", "eager")
    res = optimize(tiny, [ex.merge_matmuls(2)], eager, min_gain=0.0)
    assert not res.unchanged
    return res


def test_the_program_saved_beside_the_check_is_byte_for_byte_the_one_saved_here(tiny, tmp_path):
    """write_model(save_beside=True): the save runs in a second process while this one checks the
    program; the file is the one the save in this process writes, and no temporary file is left."""
    from superopt.driver.write import write_model
    res = _rewritten(tiny)
    got = {}
    for beside in (False, True):
        d = tmp_path / f"beside{beside}"
        d.mkdir()
        write_model(res, d / "m.pt2", save_beside=beside)
        assert [p.name for p in d.iterdir()] == ["m.pt2"]
        got[beside] = (d / "m.pt2").read_bytes()
    assert got[True] == got[False]
    assert res.report.output_check and res.report.max_relative_error <= 1e-4


def test_the_originals_runs_beside_the_search_reach_the_check_and_the_region_check_skips_them(tiny, tmp_path,
                                                                                               monkeypatch):
    """The process saving the model's program beside the search also runs the original on the
    examples: once it has answered, its outputs are the ones this process would compute, they
    go to the memo after the search, and the region check's process then runs only the regions
    (it is not waited for: a process still running hands nothing over)."""
    import time

    import superopt.driver.command as command
    from superopt.driver.outcheck import examples_reference
    saver = command.SavedBeside(tiny.program, tmp_path / "m.pt2", tiny)
    assert saver.tmp.exists()
    deadline = time.monotonic() + 60
    while not saver._job.ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    got, want = saver.reference(), examples_reference(tiny.reference, tiny.inputs, tiny.kwargs)
    assert list(got) == list(want) == ["examples"]
    leaves = torch.utils._pytree.tree_leaves
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves(got), leaves(want), strict=True))
    assert examples_reference(tiny.reference, tiny.inputs, tiny.kwargs, got) == {}  # what the region check runs
    saver.discard()
    assert not saver.tmp.exists()
    slow = command.SavedBeside(tiny.program, tmp_path / "n.pt2", tiny)
    monkeypatch.setattr(slow._job, "ready", lambda: False)
    assert slow.reference() == {}  # still running: nothing, at once
    slow.discard()


def test_the_save_is_asked_to_go_beside_once_the_module_checked_is_built(tiny, tmp_path, monkeypatch):
    """The module the whole-model check runs is built first, then the save is asked whether it
    goes beside (the region check beside has had that much longer to answer)."""
    import torch

    from superopt.driver.write import write_model
    order = []
    real = torch.export.ExportedProgram.module

    def module(self, *a, **k):
        order.append("module")
        return real(self, *a, **k)
    monkeypatch.setattr(torch.export.ExportedProgram, "module", module)
    write_model(_rewritten(tiny), tmp_path / "m.pt2", save_beside=lambda: order.append("ask") or False)
    assert order[:2] == ["module", "ask"] and (tmp_path / "m.pt2").exists()


def test_a_program_the_check_refuses_is_not_written_and_its_save_beside_is_ended(tiny, tmp_path, monkeypatch):
    """The whole-model check refuses the program (a forged mismatch) while its save runs beside:
    nothing is written, no temporary file is left, the saving process is ended."""
    import superopt.driver.write as write
    from superopt.driver.outcheck import OutputMismatch
    res = _rewritten(tiny)
    ended = []
    cancel = Aside.cancel
    monkeypatch.setattr(Aside, "cancel", lambda self: (ended.append(self._pid), cancel(self)))
    monkeypatch.setattr(write, "check_outputs",
                        lambda *a, **k: OutputMismatch("examples", 0, 1.0, tuple(tiny.inputs), {}))
    with pytest.raises(NumericMismatchError, match="computes something else"):
        write.write_model(res, tmp_path / "m.pt2", save_beside=True)
    assert list(tmp_path.iterdir()) == [] and len(ended) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(ended[0], os.WNOHANG)  # reaped


def test_a_save_beside_the_check_that_fails_is_done_here(tiny, tmp_path, monkeypatch):
    """A saving process that dies without an answer leaves the save to this process: the file is
    written all the same."""
    import superopt.driver.write as write
    res = _rewritten(tiny)
    want = tmp_path / "want.pt2"
    write.write_model(res, want)
    parent = os.getpid()
    real = write.write_program

    def dies_in_child(*a, **k):
        if os.getpid() != parent:
            os._exit(3)
        return real(*a, **k)
    monkeypatch.setattr(write, "write_program", dies_in_child)
    write.write_model(res, tmp_path / "m.pt2", save_beside=True)
    assert (tmp_path / "m.pt2").read_bytes() == want.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2", "want.pt2"]


def _regions_job(tiny, seconds: float):
    """A RegionsBeside whose (stand-in) region check takes ``seconds`` in the child."""
    from superopt.driver.command import RegionsBeside

    class R:
        model = tiny
        report = type("Rep", (), {"region_check": {}})()

    def check(r):
        time.sleep(seconds)
        r.report.region_check = {"covered": True}
    return RegionsBeside(R(), check)


def test_the_written_program_is_saved_here_while_the_region_check_beside_still_runs(tiny):
    """The write asks, once the program is exported, whether to save it beside: not while the
    region check's process still runs (this process would only wait for it), yes once it answered
    (its core is free), and without a region check beside only where a core is idle."""
    import superopt.driver.command as command
    slow, fast = _regions_job(tiny, 60), _regions_job(tiny, 0)
    try:
        deadline = time.monotonic() + 60
        while not fast.ready():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert fast.ready() and not slow.ready()
        assert command._save_beside_check([fast])() is True
        assert command._save_beside_check([fast, slow])() is False
        fast.join()
        assert fast.ready() and fast.r.report.region_check["covered"]
    finally:
        slow.cancel()
        fast.cancel()
    assert slow.ready()  # ended: join would not wait


@pytest.mark.parametrize("promising", [True, False])
def test_the_region_check_starts_beside_right_after_the_search(tiny, tmp_path, monkeypatch, promising):
    """With a spare core and a search that priced its graph cheaper, the region check's process
    is forked right after the search (before keep if cheaper, kernels and layout, which it does not
    depend on): the same file and the same region check as without a spare core. Where the
    region check pass is then skipped (min-gain 0.99: nothing kept), that process is ended."""
    import json

    import superopt.driver.command as command
    from superopt.cli import main
    from superopt.rules import examples as ex
    monkeypatch.setattr(command, "load_rules", lambda *a, **k: [ex.merge_matmuls(2)])
    src = tmp_path / "tiny.pt2"
    torch.export.save(tiny.program, str(src))
    started, cancelled = [], []
    init, cancel = command.RegionsBeside.__init__, command.RegionsBeside.cancel

    def spy_init(self, r, check):
        started.append(list(r.report.passes))
        init(self, r, check)

    def spy_cancel(self):
        cancelled.append(self._done)
        cancel(self)
    monkeypatch.setattr(command.RegionsBeside, "__init__", spy_init)
    monkeypatch.setattr(command.RegionsBeside, "cancel", spy_cancel)
    got = {}
    for spare in (False, True):
        monkeypatch.setattr(command, "spare_core", lambda: spare)
        out, rep = tmp_path / f"spare{spare}.pt2", tmp_path / f"spare{spare}.json"
        args = ["optimize", str(src), "-o", str(out), "--device", "h100", "--target", "eager", "--quiet",
                "--min-gain", "0" if promising else "0.99", "--report", str(rep)]
        if not promising:
            monkeypatch.setattr(command, "_promising", lambda r: True)  # a guess the keep pass proves wrong
        assert main(args) == 0
        got[spare] = out.read_bytes(), json.loads(rep.read_text())
    assert started == [["fold + merge duplicates"]]  # forked once, between the search and its pass
    (plain, rep0), (beside, rep1) = got[False], got[True]
    assert plain == beside
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp.pt2")]
    if promising:
        assert rep1["passes"][-1] == "region check" and "in a second process" in rep1["region_check"]["beside"]
        assert {k: v for k, v in rep1["region_check"].items() if k != "beside"} == rep0["region_check"]
    else:
        assert rep1["passes"][-1] == "region check (skipped)" and not rep1["region_check"]
        assert cancelled and not cancelled[0]  # ended before it was joined
