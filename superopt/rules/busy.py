"""What a command says when it meets a rule database another process has locked: that it is
locked (not corrupt, not "not a rule database"), by which process where it can tell, and what
to do. SQLite does not say who holds a lock; on Linux the processes that have the file (or its
journal) open are found in ``/proc``.

>>> "locked by another process" in locked_message("r.db", "cannot open the rule database")
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["holders", "locked_message", "is_locked"]


def is_locked(e: Exception) -> bool:
    """Whether a SQLite error means another connection holds a lock (busy, not damaged)."""
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


def _command(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        words = f.read().decode(errors="replace").split("\0")
    words = [w for w in words if w]
    if "superopt" in words and words.index("superopt") > 0 and words[words.index("superopt") - 1] == "-m":
        words = words[words.index("superopt"):]  # `python -m superopt generate ...` as the user typed it
    return " ".join(words)[:100]


def holders(path, limit: int = 3) -> list[str]:
    """``pid N: command`` of up to ``limit`` other processes that have ``path`` (or its journal
    or write-ahead log) open; empty where ``/proc`` cannot tell (not Linux, other users' processes)."""
    target = os.path.realpath(path)
    names = {target, target + "-journal", target + "-wal"}
    found: list[str] = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return found
    for pid in pids:
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            if links & names:
                found.append(f"pid {pid}: {_command(pid)}")
        except OSError:  # gone, or not ours to look at
            continue
        if len(found) >= limit:
            break
    return found


def locked_message(path, doing: str) -> str:
    """The one line a command prints for a locked database."""
    who = holders(Path(path))
    by = f"by {'; '.join(who)}" if who else "by another process (a running `superopt generate` or `verify`?)"
    return (f"{path}: {doing}: the database is locked {by}; nothing was changed: try again when it finishes"
            + (" (or stop it)" if who else ""))
