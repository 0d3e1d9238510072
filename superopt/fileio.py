"""Atomic file writes: a temporary file next to the target, flushed, then renamed over it.

A crash, a full disk or Ctrl-C while writing leaves the old file (or none), never half of a
new one: ``os.replace`` is atomic on one file system. Every file superopt writes for the user
(models, reports, rule databases when created, checkpoints) goes through here.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "r.json"
>>> write_text(p, "{}")
>>> p.read_text()
'{}'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import SuperoptError

__all__ = ["WriteError", "atomic_path", "write_bytes", "write_text", "check_writable", "user_cache_dir", "write_cache"]


class WriteError(SuperoptError):
    """A file cannot be written (no folder, no permission, disk full); nothing was changed."""


def check_writable(path: str | Path, what: str = "output") -> Path:
    """Fail early (before long work) when ``path`` cannot be written: a missing folder, a folder
    given where a file is wanted, a read-only folder."""
    p = Path(path)
    if p.is_dir():
        raise WriteError(f"{p}: the {what} is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise WriteError(f"cannot write {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise WriteError(f"cannot write {p}: the folder {parent} is not writable")
    return p


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path`` (same suffix) that replaces ``path`` when the block
    ends without an error, and is removed otherwise."""
    p = check_writable(path)
    try:  # a folder that exists but takes no new file (/proc, a full disk, no permission)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=f".tmp{p.suffix}",
                                   dir=p.parent if str(p.parent) else ".")
    except OSError as e:
        raise WriteError(f"cannot write {p}: {e.strerror or e}; nothing was written") from None
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; the result gets the usual permissions
        yield tmp_path
        os.replace(tmp_path, p)
    except OSError as e:
        raise WriteError(f"cannot write {p}: {e.strerror or e}; nothing was written") from None
    finally:
        tmp_path.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def user_cache_dir() -> Path:
    """superopt's folder in the user's cache (``$XDG_CACHE_HOME/superopt``, else
    ``~/.cache/superopt``): what runs keep for later runs (proofs, compiled rules, rule ids)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "superopt"


def write_cache(path: str | Path, data: bytes) -> bool:
    """Write a cache file atomically (a reader sees all of it or none), best effort: False where
    it cannot be written (a read-only home costs only the work again next time). Not flushed to
    disk: a cache lost in a crash is recomputed."""
    p = Path(path)
    tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, p)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
