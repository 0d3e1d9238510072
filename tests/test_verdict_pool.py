"""The whole-model verdict's worker pool (superopt.driver.verdict_pool): every program compiled in
a worker of its own, each timing served by the worker that compiled it, one at a time; a
program no worker holds, or whose worker failed, compiled and timed by the fallback."""

import os
import time

import pytest

from superopt.driver.tune import _variants
from superopt.driver.verdict_pool import TimerPool
from superopt.kernel.model_tuning import ORIGINAL, pick_program


class _FakeTimer:
    """Compiles by sleeping; a timing returns the serving process id (to see where it ran) and
    the interval it ran in (to see that no two overlap)."""

    def __init__(self, fail):
        self.fail, self.built = fail, set()

    def prepare(self, kernels):
        if self.fail is not None and kernels == self.fail:
            raise RuntimeError("Inductor could not compile it")
        time.sleep(0.05)
        self.built.add(kernels)

    def __call__(self, kernels):
        assert kernels in self.built, "timed before compiled"
        t0 = time.monotonic()
        time.sleep(0.02)
        return (os.getpid(), t0, time.monotonic())


def _make(fail=None):
    return _FakeTimer(fail)


def _local(log):
    def fallback(kernels):
        log.append(kernels)
        return (os.getpid(), 0.0, 0.0)
    return fallback


def test_each_program_is_timed_by_the_worker_that_compiled_it():
    here, log = [], []
    variants = [ORIGINAL, frozenset(), frozenset({"a"})]
    with TimerPool(_make, (None,), variants, _local(here), context="fork", log=log.append) as pool:
        assert set(pool.ready) == set(variants)
        got = [pool(v) for v in variants + [ORIGINAL]]
        assert all(pid != os.getpid() for pid, _, _ in got)
        assert got[0][0] == got[3][0] != got[1][0]     # the original's worker served both of its timings
        spans = sorted((a, b) for _, a, b in got)
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))   # one at a time
        assert pool(frozenset({"a", "b"}))[0] == os.getpid()                 # no worker holds it
    assert here == [frozenset({"a", "b"})] and log == []


def test_a_failed_compile_falls_back_to_this_process():
    here, log = [], []
    bad = frozenset({"bad"})
    with TimerPool(_make, (bad,), [frozenset(), bad], _local(here), context="fork", log=log.append) as pool:
        assert set(pool.ready) == {frozenset()}
        assert pool(bad)[0] == os.getpid()
    assert here == [bad] and any("Inductor could not compile it" in m for m in log)


def test_the_workers_stop_on_exit():
    with TimerPool(_make, (None,), [frozenset()], _local([]), context="fork", log=lambda m: None) as pool:
        procs = list(pool._procs)
    assert procs and not any(p.is_alive() for p in procs)


def test_the_picker_decides_the_same_through_the_pool():
    """pick_program over a pool of fixed timings decides as over the timings themselves."""
    times = {ORIGINAL: 100.0, frozenset(): 103.0, frozenset({"a"}): 95.0, frozenset({"b"}): 104.0,
             frozenset({"a", "b"}): 103.5}
    direct = pick_program(["a", "b"], times.__getitem__, log=lambda m: None)
    with TimerPool(_fixed, (times,), _variants(["a", "b"]), times.__getitem__, context="fork",
                   log=lambda m: None) as pool:
        pooled = pick_program(["a", "b"], pool, log=lambda m: None)
    assert pooled == direct and pooled.kernels == frozenset({"a"}) and not pooled.original


class _Fixed:
    def __init__(self, times):
        self.times = times

    def prepare(self, kernels):
        self.times[kernels]

    def __call__(self, kernels):
        return self.times[kernels]


def _fixed(times):
    return _Fixed(times)


@pytest.mark.parametrize("sigs, n", [([], 2), (["a"], 3), (["a", "b", "c"], 6)])
def test_the_variants_compiled_ahead(sigs, n):
    v = _variants(sigs)
    assert len(v) == n == len(set(v)) and v[:2] == [ORIGINAL, frozenset()]


def _blas_env(_):
    return {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@pytest.mark.parametrize("threads", [None, 3])
def test_generation_workers_see_their_blas_threads_and_the_environment_comes_back(monkeypatch, threads):
    """One BLAS thread a worker (``superopt tune``: a worker per core), or the cores shared out
    (the kernel pass's proofs ahead: a few large regions, each BLAS-bound)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from superopt.kernel.model_tuning import blas_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with blas_threads() if threads is None else blas_threads(threads), \
            ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        seen = ex.submit(_blas_env, None).result()
    assert set(seen.values()) == {str(threads or 1)}
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ


class _SlowToExit(_FakeTimer):
    """A worker whose exit waits 60 s for a thread of its own (as one tearing down a compiled
    model and Inductor's compile pool waited 11 s)."""

    def prepare(self, kernels):
        import threading
        threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
        super().prepare(kernels)


def _slow(fail=None):
    return _SlowToExit(fail)


def test_workers_slow_to_exit_are_stopped_after_a_grace():
    from superopt.driver.verdict_pool import QUIT_GRACE_S
    with TimerPool(_slow, (None,), [ORIGINAL, frozenset()], _local([]), context="fork", log=lambda m: None) as pool:
        assert set(pool.ready) == {ORIGINAL, frozenset()}
        procs = list(pool._procs)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < QUIT_GRACE_S + 5 and not any(p.is_alive() for p in procs)
