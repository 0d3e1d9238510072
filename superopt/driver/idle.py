"""How many of this process's cores were idle lately, measured from the kernel's idle counters.

``superopt optimize`` puts work beside itself (a forked region check, a save) only where a core
is idle. The load average cannot tell: it counts this very run and, a minute behind, the runs
before it, so on an idle 2-core machine running one ``optimize`` after another it read 1 and
nothing went beside (session 36's idle table: NASNet-A's region check and save on the critical
path). ``/proc/stat`` counts, per core, the time it spent idle: over a window of the last few
seconds of this run, the idle seconds over the wall seconds are the cores nobody used, this run
and every other process included.

>>> meter = IdleMeter(read=lambda: 0.0, clock=lambda: 0.0)
>>> meter.cores() is None   # one sample: no window yet
True
"""

from __future__ import annotations

import os
import time
from typing import Callable

__all__ = ["IdleMeter", "idle_seconds", "METER", "MIN_WINDOW_S", "WINDOW_S"]

#: the shortest window a measure is made over, and the age of the sample it starts from when
#: there are several (a window of the last seconds, not of the whole run)
MIN_WINDOW_S = 1.0
WINDOW_S = 3.0


def idle_seconds(path: str = "/proc/stat") -> float | None:
    """Idle and I/O-wait seconds since boot, summed over the cores this process may run on;
    None where the file is not there or says nothing of those cores (not Linux)."""
    try:
        mine = {f"cpu{k}" for k in os.sched_getaffinity(0)}
        ticks, found = 0, False
        with open(path) as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *fields = line.split()
                if name in mine and len(fields) >= 5:
                    ticks += int(fields[3]) + int(fields[4])
                    found = True
        return ticks / os.sysconf("SC_CLK_TCK") if found else None
    except (OSError, AttributeError, ValueError):
        return None


class IdleMeter:
    """Samples of (wall clock, idle seconds); :meth:`cores` is the idle cores on average over
    the window from the newest sample at least :data:`WINDOW_S` old (else the oldest) to now.
    :meth:`mark` takes a sample (``superopt optimize`` takes one as it starts)."""

    def __init__(self, read: Callable[[], float | None] = idle_seconds, clock: Callable[[], float] = time.monotonic):
        self._read, self._clock = read, clock
        self._samples: list[tuple[float, float]] = []

    def mark(self) -> None:
        idle = self._read()
        if idle is not None:
            self._keep(self._clock(), idle)

    def _keep(self, now: float, idle: float) -> None:
        self._samples.append((now, idle))
        del self._samples[:-16]  # the window needs only the last few

    def cores(self) -> float | None:
        """Idle cores over the recent window, or None where none can be measured (no counters,
        no sample taken before, or a window under :data:`MIN_WINDOW_S`)."""
        now, idle = self._clock(), self._read()
        if idle is None:
            return None
        older = [s for s in self._samples if now - s[0] >= WINDOW_S]
        start = older[-1] if older else self._samples[0] if self._samples else None
        self._keep(now, idle)  # the first one starts a window for the next call
        if start is None:
            return None
        span = now - start[0]
        if span < MIN_WINDOW_S:
            return None
        return max(0.0, idle - start[1]) / span


#: this process's meter
METER = IdleMeter()
