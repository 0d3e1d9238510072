"""Running the enumeration's chunks: in this process, on a local process pool, or on Dask.

A runner maps a function over argument tuples and yields results as they finish; the caller
keys them by chunk number, so the merge order (and the rule set) never depends on which worker
finished first. Dask is imported only when asked for (``pip install superopt[distributed]``).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Iterable, Iterator

from .errors import GenerateError, MissingDependencyError

__all__ = ["Runner", "SerialRunner", "PoolRunner", "DaskRunner", "make_runner", "default_workers"]


def ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which stops the pool and reports once (the
    terminal sends SIGINT to every process of the group; workers would each print a traceback)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_workers() -> int:
    """All local cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
    return SerialRunner() if n == 1 else PoolRunner(n)
