"""The idle cores measured from the kernel's counters, and what ``spare_core`` makes of them."""

from __future__ import annotations

import os

import pytest

from superopt.driver import command
from superopt.driver.idle import IdleMeter, idle_seconds


def _stat(tmp_path, idle: dict, other: int = 999) -> str:
    """A /proc/stat with the given idle + iowait ticks per core, and a core not ours."""
    lines = ["cpu  1 2 3 4 5 0 0 0 0 0"]
    lines += [f"cpu{k} 10 0 10 {t} 1 0 0 0 0 0" for k, t in idle.items()]
    lines += [f"cpu{other} 10 0 10 123456 7 0 0 0 0 0", "intr 1 2 3", "ctxt 5"]
    p = tmp_path / "stat"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's affinity names the cores")
def test_idle_seconds_sums_only_this_process_cores(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    path = _stat(tmp_path, {k: 100 * (k + 1) for k in mine}, other=max(mine) + 7)
    hz = os.sysconf("SC_CLK_TCK")
    assert idle_seconds(path) == pytest.approx(sum(100 * (k + 1) + 1 for k in mine) / hz)
    assert idle_seconds(str(tmp_path / "missing")) is None
    assert idle_seconds(_stat(tmp_path, {}, other=max(mine) + 7)) is None  # none of our cores listed


class _Fake:
    def __init__(self):
        self.t, self.idle = 0.0, 0.0

    def meter(self) -> IdleMeter:
        return IdleMeter(read=lambda: self.idle, clock=lambda: self.t)


def test_the_meter_measures_over_the_recent_window():
    f = _Fake()
    m = f.meter()
    assert m.cores() is None  # no sample before: nothing to measure from
    f.t, f.idle = 0.5, 0.5
    assert m.cores() is None  # a window of 0.5 s is too short to tell
    f.t, f.idle = 4.0, 4.0
    assert m.cores() == pytest.approx(1.0)  # one core idle since the first sample
    f.t, f.idle = 10.0, 4.0  # then six busy seconds: the window starts at the newest sample 3 s old
    assert m.cores() == pytest.approx(0.0)
    f.t, f.idle = 14.0, 4.0 + 2 * 4.0
    assert m.cores() == pytest.approx(2.0)


def test_the_meter_without_counters_says_nothing():
    m = IdleMeter(read=lambda: None, clock=lambda: 5.0)
    m.mark()
    assert m.cores() is None


class _Says:
    def __init__(self, value):
        self.value = value

    def cores(self):
        return self.value


@pytest.mark.parametrize("idle, spare", [(0.9, True), (1.7, True), (0.2, False), (0.0, False)])
def test_spare_core_follows_the_measured_idle_cores(monkeypatch, idle, spare):
    monkeypatch.delenv("SUPEROPT_SPARE_CORE", raising=False)
    monkeypatch.setattr(command, "METER", _Says(idle))
    monkeypatch.setattr(command.os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # not read where measured
    assert command.spare_core() is spare


def test_spare_core_falls_back_to_the_load_and_obeys_the_environment(monkeypatch):
    monkeypatch.setattr(command, "METER", _Says(None))
    monkeypatch.delenv("SUPEROPT_SPARE_CORE", raising=False)
    monkeypatch.setattr(command.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert command.spare_core() is False
    monkeypatch.setattr(command, "METER", _Says(2.0))
    monkeypatch.setenv("SUPEROPT_SPARE_CORE", "0")
    assert command.spare_core() is False
    monkeypatch.setattr(command, "METER", _Says(0.0))
    monkeypatch.setenv("SUPEROPT_SPARE_CORE", "1")
    assert command.spare_core() is True


class _Running:
    """Stands for a region check forked beside, still running (or done)."""

    def __init__(self, done: bool):
        self.done = done

    def ready(self) -> bool:
        return self.done


def test_fit_threads_follows_the_idle_cores_and_the_work_beside(monkeypatch):
    import torch
    before = torch.get_num_threads()
    monkeypatch.setattr(command, "cores", lambda: 16)
    monkeypatch.setattr(command, "_others", lambda: 0)
    try:
        for idle, beside, want in [(0.0, [], 1), (0.9, [], 2), (2.2, [], 3), (15.0, [], command.DEFAULT_THREADS),
                                   (0.9, [False], 1), (0.9, [True], 2), (2.2, [False, True], 2)]:
            monkeypatch.setattr(command, "METER", _Says(idle))
            jobs = [_Running(done) for done in beside]
            monkeypatch.setattr(command, "RegionsBeside", _Running)
            assert command.fit_threads(None, jobs) == want
            assert torch.get_num_threads() == want
        monkeypatch.setattr(command, "_others", lambda: 7)  # eight runs on 16 cores: their share, 2 each
        monkeypatch.setattr(command, "METER", _Says(8.0))
        assert command.fit_threads(None, []) == 2
        torch.set_num_threads(3)
        assert command.fit_threads(2, []) is None  # --threads given: kept
        monkeypatch.setattr(command, "METER", _Says(None))
        assert command.fit_threads(None, []) is None and torch.get_num_threads() == 3  # nothing measured
    finally:
        torch.set_num_threads(before)


def test_a_save_beside_takes_a_thread_from_the_check(monkeypatch):
    import torch
    before = torch.get_num_threads()
    monkeypatch.setattr(command, "can_fork", lambda: True)
    try:
        for spare, threads, want in [(True, None, 1), (False, None, 2), (True, 2, 2)]:
            monkeypatch.setattr(command, "spare_core", lambda: spare)
            torch.set_num_threads(2)
            assert command._save_beside_check([], threads)() is spare
            assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
