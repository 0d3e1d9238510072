"""The ``superopt`` command line.

Each stage contributes its sub-commands through a ``register(subparsers)`` function in its own
``cli`` module (``superopt.axioms.cli``, ``superopt.generate.cli``, ...), which sets
``func`` on its parser. Errors caused by input (:class:`SuperoptError`) are caught here, once,
and printed as one line with exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys

from . import __version__
from .cliargs import positive_int, print_json
from .errors import SuperoptError

__all__ = ["main", "end_process", "build_parser", "STAGES", "ALONE", "print_json", "positive_int", "is_out_of_memory", "OUT_OF_MEMORY"]

#: modules whose ``register`` adds sub-commands, in the order of the pipeline
STAGES = (
    "superopt.axioms.cli",
    "superopt.ir.cli",
    "superopt.generate.cli",
    "superopt.verify.cli",
    "superopt.rules.cli",
    "superopt.models.cli",
    "superopt.frontend.cli",
    "superopt.codegen.cli",
    "superopt.cost.cli",
    "superopt.driver.cli",
)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``superopt: error:`` line (exit 2), like every other bad input; the
    sub-command parsers inherit the class."""

    def error(self, message):
        where = self.prog.removeprefix("superopt").strip()
        sys.stderr.write(f"superopt: error: {where + ': ' if where else ''}{message} (see `{self.prog} --help`)\n")
        sys.exit(2)


#: sub-commands whose parser is built alone when the command line names them (the other stages'
#: modules are not imported: about 0.1 s of ``superopt optimize``'s start-up)
ALONE = {"optimize": "superopt.driver.cli"}


def build_parser(stages: tuple = STAGES) -> argparse.ArgumentParser:
    p = _Parser(prog="superopt", description="A tensor-algebra superoptimizer.")
    p.add_argument("--version", action="version", version=f"superopt {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in stages:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that stage is not part of this build
            raise
        mod.register(sub)
    return p


#: what an out-of-memory error says, wherever it happens
OUT_OF_MEMORY = ("out of memory; try a smaller --batch-size, fewer --workers, or a machine with more memory "
                 "(nothing was written)")
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocator running out of memory (CPU or GPU)."""
    return isinstance(e, MemoryError) or any(t in str(e).lower() for t in _OOM_TEXT)


def one_line(text: str) -> str:
    """An error message as one printable line: names read from a damaged file can hold line
    breaks or control characters, which would split the message or reach the terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text.strip())


def _stages(argv) -> tuple:
    """The stages whose sub-commands the parser needs: the one of :data:`ALONE` that the command
    line names first, else all."""
    words = sys.argv[1:] if argv is None else list(argv)
    first = next((w for w in words if not w.startswith("-")), None)
    if first in ALONE and words[0] == first:
        return (ALONE[first],)
    return STAGES


def main(argv=None) -> int:
    parser = build_parser(_stages(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = _run(args)
    if argv is None and getattr(args, "end_at_once", False):
        end_process(code)
    return code


def end_process(code: int) -> None:
    """End the process now: flush the output, run the exit hooks, and skip the interpreter's
    teardown, which took about 1 s after every ``superopt optimize`` (freeing torch's modules
    and objects one by one; 0.75 s after a bare ``import torch.export``). Only commands that
    ask for it (``end_at_once``: their files are written, flushed and closed when they return),
    and only when ``main`` reads the process's own arguments (never in tests or scripts that
    call ``main([...])``)."""
    atexit._run_exitfuncs()  # logging's flush, torch's and filelock's hooks: as a normal exit runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader gone, or a stream closed: nothing more to say
            pass
    os._exit(code)


def _run(args) -> int:
    try:
        return int(args.func(args) or 0)
    except SuperoptError as e:
        print(f"superopt: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"superopt: error: {OUT_OF_MEMORY}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # torch's allocators raise RuntimeError (or a subclass) when memory runs out
        if not is_out_of_memory(e):
            raise
        print(f"superopt: error: {OUT_OF_MEMORY} ({one_line(str(e).splitlines()[0])[:200]})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("superopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
