"""Work done beside ``superopt optimize``'s own, in a forked process, on a core that is idle.

After the search, ``superopt optimize`` exports the chosen graph (mostly Python: ``torch.export``
traces it) and, independently, checks the rewritten regions and runs the original on the
examples (torch kernels, and Python between them). A thread cannot run the two side by side
(they share the interpreter, and ``torch.export`` patches ``torch.nn.Module.__call__`` for every
thread while it traces); a forked process can: it starts with a copy of everything the run has
built (the graphs, the e-classes, the model), computes, and sends its picklable answer back
through a pipe.

The child runs torch with one intra-op thread: with OpenMP (torch's CPU backend) a forked child
that uses the parent's thread count waits forever for threads it does not have. Anything it
cannot answer (a crash, an error that is not the input's, no answer in time) is
:class:`AsideFailed`, and the caller does the work itself, as it would without a spare core;
an input error (:class:`~superopt.errors.SuperoptError`, such as a refused region) is raised
again in the parent.

>>> job = Aside(lambda: 6 * 7)
>>> job.result()
42
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Callable

import torch

from ..errors import SuperoptError

__all__ = ["Aside", "AsideFailed", "can_fork", "terminate_as_interrupt", "raise_if_terminated", "put_in_place",
           "WAIT_S"]

#: how long the parent waits for the child's answer before doing the work itself
WAIT_S = 300.0


class AsideFailed(Exception):
    """The child gave no answer (it crashed, failed on a bug, or took too long): do the work here."""


def can_fork() -> bool:
    """Whether work can go to a forked process here: Linux only (macOS's system libraries are
    not safe to use in a forked child)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


class Aside:
    """``fn()`` computed in a child process forked now (see the module docstring); :meth:`result`
    waits for its value. With ``early``, ``fn(send)`` is called instead, and may hand one value
    back before it ends (``send(value)``, once), which :meth:`first` waits for: the child goes on with
    work whose answer the caller wants later (the zoo model's graph first, then its save)."""

    def __init__(self, fn: Callable[..., object], early: bool = False):
        self._answer: tuple | None = None
        self._first: tuple | None = None
        self._read, write = os.pipe()
        self._early, early_write = os.pipe() if early else (None, None)
        gc.freeze()  # the child's collections leave the parent's objects (and their pages) alone
        try:
            with warnings.catch_warnings():  # Python 3.12 warns of forking with threads (torch's own)
                warnings.simplefilter("ignore", DeprecationWarning)
                self._pid = os.fork()
        except OSError as e:  # no memory or no process left for a child: the caller does the work
            for fd in (self._read, self._early, early_write):
                if fd is not None:
                    os.close(fd)
            self._read = self._early = None
            self._answer = ("failed", f"cannot fork: {e.strerror or e}")
            return
        finally:
            if getattr(self, "_pid", None) != 0:
                gc.unfreeze()
                os.close(write)
                if early_write is not None and getattr(self, "_pid", None) is not None:
                    os.close(early_write)
        if self._pid == 0:
            os.close(self._read)
            if self._early is not None:
                os.close(self._early)
                send = lambda value: _send(early_write, ("ok", value))  # noqa: E731
                _child(lambda: fn(send), write)  # never returns
            _child(fn, write)  # never returns

    def first(self, timeout: float = WAIT_S):
        """The value the child sent early (``early``); where it sent none (it failed, or
        refused the input, before), its answer: the refusal raised, else :class:`AsideFailed`."""
        if self._first is None:
            data = None
            if self._early is not None:
                try:
                    data = _read_all(self._early, timeout)
                except BaseException:  # an interrupt while waiting: the child goes too
                    self._end(kill=True)
                    raise
                os.close(self._early)
                self._early = None
                if data is None:  # no word within the time: the child is ended
                    self._end(kill=True)
                    self._answer = self._answer or ("failed", f"no answer within {timeout:g} s")
            got = _loads(data) if data else None
            self._first = got if got is not None and got[0] == "ok" else ("none", None)
        if self._first[0] == "ok":
            return self._first[1]
        self.result(timeout)  # raises the child's refusal or failure
        raise AsideFailed("the process beside this one sent nothing first")

    def drain_first(self) -> None:
        """The early value is not wanted: a thread here reads and drops it, so that the child,
        which writes it before going on, never waits on a full pipe."""
        fd, self._early = self._early, None
        if fd is None:
            return

        def drain() -> None:
            try:
                while os.read(fd, 1 << 20):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
        threading.Thread(target=drain, name="superopt-drain", daemon=True).start()

    def result(self, timeout: float = WAIT_S):
        """The child's value; its input error raised again; :class:`AsideFailed` otherwise."""
        if self._answer is None:
            self._answer = self._receive(timeout)
        kind, value = self._answer
        if kind == "ok":
            return value
        if kind == "refused":
            raise value
        raise AsideFailed(value)

    def ready(self) -> bool:
        """Whether the child's answer is there (or it ended): :meth:`result` would not wait."""
        if self._answer is not None or self._read is None:
            return True
        return bool(select.select([self._read], [], [], 0)[0])

    def cancel(self) -> None:
        """End the child now if it has not answered (its answer is not wanted)."""
        if self._answer is None:
            self._answer = ("failed", "cancelled")
            self._end(kill=True)

    def _receive(self, timeout: float) -> tuple:
        try:
            data = _read_all(self._read, timeout)
        except BaseException:  # an interrupt while waiting: the child goes too
            self._end(kill=True)
            raise
        if data is None:
            self._end(kill=True)
            return "failed", f"no answer within {timeout:g} s"
        self._end(kill=False)
        return _loads(data)

    def _end(self, kill: bool) -> None:
        """Close the pipes and reap the child (killed first with ``kill``), once."""
        if self._early is not None:
            os.close(self._early)
            self._early = None
        if self._read is None:
            return
        if kill:
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:  # ended already
                pass
        os.close(self._read)
        self._read = None
        os.waitpid(self._pid, 0)


def _read_all(fd: int, timeout: float) -> bytes | None:
    """What the child writes to ``fd`` until it closes it; None where that takes over ``timeout``."""
    data, deadline = bytearray(), time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return bytes(data)
        data += chunk


def _loads(data: bytes) -> tuple:
    try:
        with warnings.catch_warnings():  # torch's tree specs warn of a deprecated name as they load
            warnings.simplefilter("ignore", FutureWarning)
            return pickle.loads(data)
    except Exception:  # noqa: BLE001 (the child died before it finished writing)
        return "failed", "the process beside this one ended without an answer"


def _send(fd: int, answer: tuple) -> None:
    """``answer`` pickled into ``fd``, which is then closed (the reader's end of it)."""
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
        data = pickle.dumps(("failed", f"cannot send the answer: {e}"))
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _child(fn: Callable[[], object], write: int) -> None:
    """The forked process: compute, send ``(kind, value)``, exit without the parent's exit hooks."""
    try:
        torch.set_num_threads(1)
        try:
            answer = ("ok", fn())
        except SuperoptError as e:
            answer = ("refused", e)
        except BaseException as e:  # noqa: BLE001 (a bug or an interrupt: the parent does the work)
            answer = ("failed", f"{type(e).__name__}: {e}")
        _send(write, answer)
    finally:
        os._exit(0)


#: a SIGTERM or SIGINT came while :func:`terminate_as_interrupt` was on (:func:`raise_if_terminated`)
_terminated = False


@contextmanager
def terminate_as_interrupt():
    """SIGTERM (``timeout``, a job scheduler) ends the run as Ctrl-C does: its temporary files
    (the program saved beside the search, a save under way) are removed on the way out, and the
    process forked beside it is ended. Ctrl-C itself (SIGINT, where Python's own handler has it)
    goes through the same handler, so that an interrupt an import swallows is raised again too
    (:func:`raise_if_terminated`). Only in the main thread, where handlers can be set."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return
    global _terminated
    before = signal.signal(signal.SIGTERM, _interrupted)
    if before is not _interrupted:  # the outermost: a signal of an earlier run here is forgotten
        _terminated = False
    ctrl_c = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where it is ignored
    if ctrl_c:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        if ctrl_c:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted(signum, frame):
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def raise_if_terminated() -> None:
    """KeyboardInterrupt again where a SIGTERM (or Ctrl-C) came and its interrupt was swallowed:
    raised in the middle of a C extension's module init (numpy.random's Cython init, imported by
    ``torch._dynamo``, clears it: seen one run in four with a SIGTERM 2.3 s into BERT-base's
    start-up), the run went on and wrote its file. ``superopt optimize`` calls this after its
    imports and between its passes."""
    if _terminated:
        raise KeyboardInterrupt


def put_in_place(tmp, path) -> None:
    """Rename a file a process beside saved (``tempfile.mkstemp``: mode 0600) to ``path``, with
    the permissions a file written here would get."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
