"""Where a generation run keeps its state: a checkpoint folder, or memory.

Each step's result is one file, written whole to a temporary name and renamed into place
(``os.replace`` is atomic), so a run killed at any moment (SIGINT, SIGKILL, power) leaves only
complete files; started again with the same command it redoes only the missing ones. The folder
holds ``settings.json`` with the digest of the settings that made it; a run with different
settings refuses it (:class:`CheckpointMismatchError`) instead of mixing the two.

Layout: ``level-K/part-NNNNN`` (one chunk of children), ``level-K/merged`` (representatives,
classes, candidate pairs, next frontier), ``candidates`` (pruned rules), ``verify/batch-NNNNN``
(a batch stored in the rule database).

>>> s = Store(None); s.put("a/b", [1, 2]); s.get("a/b"), s.has("a/c")
([1, 2], False)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import CheckpointMismatchError, GenerateError

__all__ = ["Store", "open_store", "checkpoint_dir"]


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
        with open(self._file(name), "rb") as f:
            return pickle.load(f)

    def put(self, name: str, obj) -> None:
        if self.path is None:
            self._mem[name] = obj
            return
        target = self._file(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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
            raise GenerateError(f"checkpoint {path} is unreadable; delete the folder to start over") from None
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
        stamp_file.write_text(json.dumps(_stamp(settings), indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise GenerateError(f"cannot write the checkpoint folder {path}: {e.strerror}") from None
    return Store(path), False
