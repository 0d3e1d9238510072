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

from ..cliargs import cores

__all__ = ["IdleMeter", "idle_seconds", "METER", "MIN_WINDOW_S", "WINDOW_S", "SPARE_IDLE", "spare_core", "others"]

#: the shortest window a measure is made over, and the age of the sample it starts from when
#: there are several (a window of the last seconds, not of the whole run)
MIN_WINDOW_S = 1.0
WINDOW_S = 3.0
#: the idle share of a core, measured over the last seconds, that counts as a spare core
SPARE_IDLE = 0.6


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


def spare_core(meter: IdleMeter = METER, running: Callable[[], int] | None = None) -> bool:
    """Whether a core is idle: measured, the idle cores over the last seconds of this run
    (``meter``, the kernel's counters; at least :data:`SPARE_IDLE` of a core), else, where
    they cannot be read, the cores less this task and the others, counted both now
    (``running``, by default :func:`others`: ``/proc/loadavg``'s running tasks) and over the
    last minute (the load average, rounded).
    On a busy machine a second process would only share this run's core (ResNet-50 at load 2
    on 2 cores: its search 3.5 -> 4.4 s with the original's run beside it); the count of this
    instant alone often read idle there, and the load average, which counts this run and the
    ones before it, read busy on an idle machine running one ``optimize`` after another.
    ``SUPEROPT_SPARE_CORE=1`` (or ``0``) says it instead (to measure on a shared machine what
    an idle one would do)."""
    said = os.environ.get("SUPEROPT_SPARE_CORE", "").strip()
    if said in ("0", "1"):
        return said == "1"
    idle = meter.cores()
    if idle is not None:
        return idle >= SPARE_IDLE
    try:
        recent = int(os.getloadavg()[0] + 0.5)
    except (AttributeError, OSError):  # not Unix
        recent = 0
    return cores() > 1 + max((running or others)(), recent)


def others() -> int:
    """Tasks running or runnable now besides this one (``/proc/loadavg``'s count, which is not
    averaged), else the load average (not Linux)."""
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        pass
    try:
        return int(os.getloadavg()[0])
    except (AttributeError, OSError):  # not Unix
        return 0
