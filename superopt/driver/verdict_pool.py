"""The whole-model verdict's programs compiled at once, each in a worker process, then timed
one at a time.

``superopt tune`` times the whole model as several programs (the original, the searched graph
without kernels, with every candidate kernel, with each alone: :mod:`superopt.driver.tune`).
Compiling each with Inductor (freezing, CUDA graphs) takes 15-35 s on an H100 host and was done
one after another: ViT-B/16's verdict took 95 s for five compilations. Here each program the
picker may ask for is built and compiled in a process of its own, all at once on the host's
cores; then the picker's requests are served one at a time, while every other worker waits, so
each timing has the GPU alone, as before. A program no worker holds (the union of the kernels
that won alone, known only after they are timed) or whose worker failed is compiled and timed
in this process, as before (``fallback``).

Workers start with ``spawn`` (CUDA is initialised in this process by then); ``make(*args)``
runs in the worker and returns an object with ``prepare(kernels)`` (compile) and
``__call__(kernels) -> us`` (time): :class:`superopt.driver.tune._ModelTimer`.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Callable

__all__ = ["TimerPool", "QUIT_GRACE_S"]

#: seconds the workers get to exit on their own when the pool closes, before they are stopped
QUIT_GRACE_S = 2.0


def _serve(conn, make: Callable, args: tuple, kernels) -> None:
    """Worker: build and compile one program, say so, then time it whenever asked."""
    try:
        t0 = time.perf_counter()
        timer = make(*args)
        timer.prepare(kernels)
        conn.send(("ready", time.perf_counter() - t0))
    except BaseException as e:  # reported to the picker, which compiles this program itself
        conn.send(("error", f"{type(e).__name__}: {str(e).strip()[:300]}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg != "time":
            return
        try:
            conn.send(("us", timer(kernels)))
        except BaseException as e:
            conn.send(("error", f"{type(e).__name__}: {str(e).strip()[:300]}"))
            return


class TimerPool:
    """``pool(kernels)`` -> microseconds: from the worker that compiled ``kernels``, else from
    ``fallback(kernels)``. Use as a context manager (the workers stop on exit)."""

    def __init__(self, make: Callable, args: tuple, variants: list, fallback: Callable,
                 context: str = "spawn", timeout: float = 900.0, log=print):
        self.fallback, self.log = fallback, log
        self.ready: dict = {}            # kernels -> connection of a worker that compiled them
        self.seconds: dict = {}          # kernels -> the worker's build + compile seconds
        self._procs: list = []
        ctx = mp.get_context(context)
        pending = {}
        for v in dict.fromkeys(variants):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(there, make, args, v), daemon=True)
            p.start()
            there.close()
            self._procs.append(p)
            pending[v] = here
        self._wait(pending, time.monotonic() + timeout)

    def _wait(self, pending: dict, deadline: float) -> None:
        by_conn = {c: v for v, c in pending.items()}
        while by_conn and time.monotonic() < deadline:
            for c in wait(list(by_conn), timeout=max(0.0, deadline - time.monotonic())):
                v = by_conn.pop(c)
                try:
                    kind, value = c.recv()
                except (EOFError, OSError):
                    kind, value = "error", "the worker exited"
                if kind == "ready":
                    self.ready[v], self.seconds[v] = c, value
                else:
                    self.log(f"  a compile worker failed ({value}); that program is compiled here")
        for c, v in by_conn.items():
            self.log("  a compile worker did not finish in time; that program is compiled here")
            c.close()

    def __call__(self, kernels) -> float:
        conn = self.ready.get(kernels)
        if conn is not None:
            try:
                conn.send("time")
                kind, value = conn.recv()
                if kind == "us":
                    return value
                self.log(f"  a timing worker failed ({value}); that program is timed here")
            except (EOFError, OSError, BrokenPipeError):
                self.log("  a timing worker exited; that program is timed here")
            del self.ready[kernels]
        return self.fallback(kernels)

    def close(self) -> None:
        for c in self.ready.values():
            try:
                c.send("quit")
                c.close()
            except (OSError, BrokenPipeError):
                pass
        self.ready = {}
        # a worker's own exit (its compiled model, CUDA context and Inductor's compile pool torn
        # down) took 11 s on an H100 host after the Llama-3-8B decode verdict, all of it after
        # the last timing: a worker told to quit gets a moment, then is stopped (it has nothing
        # left to write; the compile caches it filled are written atomically)
        deadline = time.monotonic() + QUIT_GRACE_S
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
