"""Where a generation run keeps its state: a checkpoint folder, or memory.

Each step's result is one file, written whole to a temporary name and renamed into place
(``os.replace`` is atomic), so a run killed at any moment (SIGINT, SIGKILL, power) leaves only
complete files; started again with the same command it redoes only the missing ones. The folder
holds ``settings.json`` with the digest of the settings that made it; a run with different
settings refuses it (:class:`CheckpointMismatchError`) instead of mixing the two. Each file
starts with a SHA-256 of its contents, so a chunk damaged on disk (a bad sector, a copy cut
short, a stray edit) is detected when it is read and reported with what to do
(``superopt generate ... --restart`` discards the checkpoint) instead of failing obscurely.

Layout: ``level-K/part-NNNNN`` (one chunk of children), ``level-K/merged`` (representatives,
classes, candidate pairs, next frontier), ``candidates`` (pruned rules), ``verify/batch-NNNNN``
(a batch stored in the rule database).

>>> s = Store(None); s.put("a/b", [1, 2]); s.get("a/b"), s.has("a/c")
([1, 2], False)
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import CheckpointMismatchError, GenerateError

__all__ = ["Store", "open_store", "checkpoint_dir", "CheckpointCorruptError", "RESTART_HINT"]

_MAGIC = b"SOCK1"  # superopt checkpoint, format 1: magic, sha256 of the payload, pickled payload
RESTART_HINT = "run the same command with --restart to discard the checkpoint and start over"


class CheckpointCorruptError(GenerateError):
    """A checkpoint file cannot be read back as it was written."""


def checkpoint_dir(out: str | Path) -> Path:
    """The checkpoint folder of an output path: ``<out>.ckpt``."""
    return Path(str(out) + ".ckpt")


class Store:
    """Named pickled objects in a folder (``path``) or in memory (``path=None``)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._mem: dict[str, object] = {}

    def _file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return name in self._mem if self.path is None else self._file(name).exists()

    def get(self, name: str):
        if self.path is None:
            return self._mem[name]
        path = self._file(name)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CheckpointCorruptError(f"checkpoint file {path} cannot be read ({e.strerror}); {RESTART_HINT}") from None
        if data.startswith(_MAGIC):
            digest, payload = data[len(_MAGIC):len(_MAGIC) + 32], data[len(_MAGIC) + 32:]
            if hashlib.sha256(payload).digest() != digest:
                raise CheckpointCorruptError(f"checkpoint file {path} is damaged (checksum mismatch); {RESTART_HINT}")
        else:
            payload = data  # written before checksums (trusted as before)
        try:
            return pickle.loads(payload)
        except Exception:  # pickle raises many kinds on damaged data
            raise CheckpointCorruptError(f"checkpoint file {path} is damaged (cannot be unpickled); "
                                         f"{RESTART_HINT}") from None

    def put(self, name: str, obj) -> None:
        if self.path is None:
            self._mem[name] = obj
            return
        target = self._file(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomic(target, _MAGIC + hashlib.sha256(payload).digest() + payload)

    def put_text(self, name: str, text: str) -> None:
        """Write a text file into the folder atomically (the settings stamp)."""
        _write_atomic(self._file(name), text.encode("utf-8"))

    def remove(self) -> None:
        """Delete the whole checkpoint (after a finished run). The folder is first renamed away
        in one step, so a run killed while deleting never leaves a half checkpoint behind."""
        if self.path is None:
            self._mem.clear()
            return
        trash = self.path.with_name(self.path.name + ".removing")
        if trash.exists():
            shutil.rmtree(trash)
        if self.path.exists():
            os.replace(self.path, trash)
            shutil.rmtree(trash)


def _stamp(settings) -> dict:
    return {"digest": settings.digest(), "python": list(sys.version_info[:2]), "settings": settings.to_json()}


def open_store(path: Path | None, settings) -> tuple[Store, bool]:
    """The store for a run; ``True`` when it resumes an earlier run's checkpoint."""
    if path is None:
        return Store(None), False
    stamp_file = path / "settings.json"
    if stamp_file.exists():
        try:
            old = json.loads(stamp_file.read_text())
        except (OSError, ValueError):
            raise CheckpointCorruptError(f"checkpoint {path} is unreadable (settings.json is damaged); "
                                         f"{RESTART_HINT}") from None
        new = _stamp(settings)
        if old.get("digest") != new["digest"] or old.get("python") != new["python"]:
            diff = sorted(k for k, v in new["settings"].items() if old.get("settings", {}).get(k) != v)
            what = ", ".join(diff) if diff else "Python version " + ".".join(map(str, old.get("python", [])))
            raise CheckpointMismatchError(
                f"checkpoint {path} was made with different settings ({what}); use the same settings "
                f"to resume it, or delete the folder to start over")
        return Store(path), True
    try:
        path.mkdir(parents=True, exist_ok=True)
        Store(path).put_text("settings.json", json.dumps(_stamp(settings), indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise GenerateError(f"cannot write the checkpoint folder {path}: {e.strerror}") from None
    return Store(path), False


def _write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to a hidden temporary file beside ``target`` (never a chunk name), flush it
    to disk, then rename it into place: a killed run leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
