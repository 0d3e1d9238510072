"""Running the enumeration's chunks: in this process, on a local process pool, or on Dask.

A runner maps a function over argument tuples and yields results as they finish; the caller
keys them by chunk number, so the merge order (and the rule set) never depends on which worker
finished first. Dask is imported only when asked for (``pip install superopt[distributed]``).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

from ..cliargs import cores
from .errors import GenerateError, MissingDependencyError

__all__ = ["Runner", "SerialRunner", "PoolRunner", "DaskRunner", "make_runner", "default_workers", "guard_workers",
           "stop_workers"]


def ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which stops the pool and reports once (the
    terminal sends SIGINT to every process of the group; workers would each print a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_workers() -> int:
    """All local cores this process may use."""
    return cores()


_PR_SET_PDEATHSIG = 1
_FORK_HOOK: list = []


def _detach_worker() -> None:
    """In every process forked under :func:`guard_workers`: a process group of its own (a Ctrl-C
    at the terminal reaches the parent only, which ends the workers), SIGINT ignored, and (Linux)
    SIGTERM when the parent dies, so that no worker outlives it even when it is killed."""
    if not _FORK_HOOK or not _FORK_HOOK[0]:
        return
    try:
        os.setpgrp()
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: the parent's handler still ends them
        pass


def stop_workers(grace_s: float = 2.0) -> int:
    """Terminate this process's child processes (then kill those still there after
    ``grace_s``); returns how many there were."""
    children = multiprocessing.active_children()
    for p in children:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)
    return len(children)


#: seconds an interrupted command has to unwind (a pool's shutdown can wait on a queue whose
#: reader was terminated) before it exits regardless
EXIT_GRACE_S = 5.0


def _hard_exit() -> None:
    stop_workers(0.0)
    sys.stderr.write("superopt: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


@contextmanager
def guard_workers():
    """Run a command whose workers must never outlive it: processes forked inside are detached
    (:func:`_detach_worker`), and Ctrl-C terminates them at once, before the pools' own
    shutdown waits for tasks that would never see the signal, then raises KeyboardInterrupt.
    Every child still running when the block ends is terminated."""
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_detach_worker)
        _FORK_HOOK.append(False)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None

    def interrupted(signum, frame):
        stop_workers(0.5)
        watchdog = threading.Timer(EXIT_GRACE_S, _hard_exit)
        watchdog.daemon = True
        watchdog.start()
        raise KeyboardInterrupt
    if _FORK_HOOK:
        _FORK_HOOK[0] = True
    if main:
        signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        if _FORK_HOOK:
            _FORK_HOOK[0] = False
        if main:
            signal.signal(signal.SIGINT, previous)
        stop_workers()


class Runner:
    """Maps ``fn`` over argument tuples; ``describe`` says where it runs."""

    workers = 1
    client = None

    def map(self, fn: Callable, args: Iterable[tuple]) -> Iterator:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SerialRunner(Runner):
    """In this process, one task after the other."""

    def map(self, fn, args):
        for a in args:
            yield fn(*a)

    def describe(self) -> str:
        return "this process"


class PoolRunner(Runner):
    """A local process pool; at most ``2 * workers`` tasks in flight (bounded memory)."""

    def __init__(self, workers: int):
        self.workers = workers
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                                         initializer=ignore_sigint)

    def map(self, fn, args):
        pending = set()
        for a in args:
            pending.add(self._pool.submit(fn, *a))
            if len(pending) >= 2 * self.workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            yield from (f.result() for f in done)

    def describe(self) -> str:
        return f"{self.workers} local processes"

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise MissingDependencyError("Dask is not installed; pip install 'superopt[distributed]' "
                                     "(or run without --scheduler / --dask-workers)") from None
    return distributed


class DaskRunner(Runner):
    """A Dask cluster: an existing scheduler (``address``) or a local one of ``n_workers``
    single-threaded worker processes started here (and stopped by :meth:`close`)."""

    def __init__(self, address: str | None = None, n_workers: int | None = None):
        distributed = _dask()
        self._cluster = None
        try:
            if address:
                self.client = distributed.Client(address, timeout="20s")
            else:
                self._cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1,
                                                         processes=True, dashboard_address=None)
                self.client = distributed.Client(self._cluster)
        except (OSError, TimeoutError) as e:
            raise GenerateError(f"cannot reach the Dask scheduler {address}: {e}") from None
        self.workers = max(1, len(self.client.scheduler_info().get("workers", {})))
        self._as_completed = distributed.as_completed

    def map(self, fn, args):
        futures = [self.client.submit(fn, *a, pure=False) for a in args]
        for fut in self._as_completed(futures):
            yield fut.result()
            fut.release()

    def describe(self) -> str:
        return f"Dask at {self.client.scheduler.address} ({self.workers} workers)"

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_runner(workers: int | None = None, scheduler: str | None = None, dask_workers: int | None = None) -> Runner:
    """Dask when a scheduler or a local Dask cluster is asked for, else a process pool of
    ``workers`` (default: every local core), else (one worker) this process."""
    if scheduler or dask_workers:
        if dask_workers is not None and dask_workers < 1:
            raise GenerateError(f"--dask-workers must be at least 1, got {dask_workers}")
        return DaskRunner(scheduler, dask_workers)
    n = default_workers() if workers is None else workers
    if n < 1:
        raise GenerateError(f"--workers must be at least 1, got {n}")
    if n > cores():
        raise GenerateError(f"--workers {n} on a machine with {cores()} cores: each worker holds its own memory and "
                            f"more than one per core only slows the work; give at most {cores()}")
    return SerialRunner() if n == 1 else PoolRunner(n)
