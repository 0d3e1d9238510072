"""The shared grammar of the command line, used by every stage's ``cli`` module.

One spelling per meaning: ``--db`` for a rule database, ``-o/--output`` for a written file,
``--json`` for one JSON document on standard output, ``--quiet`` for no progress (progress
bars are shown only on a terminal). Stage CLIs import this module, never the root CLI, so
there is no import cycle; the root CLI (:mod:`superopt.cli`) knows the stages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

__all__ = ["print_json", "positive_int", "nonnegative_int", "nonnegative_float", "positive_float", "share",
           "add_json", "add_quiet", "add_db", "show_progress", "cores", "workers_type"]


def print_json(obj) -> None:
    """One JSON document on standard output."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = low - 1
        if v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    parse.__name__ = what
    return parse


#: an argparse type: a whole number of at least 1 (batch sizes, lengths)
positive_int = _int_at_least(1, "a positive integer")
#: an argparse type: a whole number of at least 0 (seeds)
nonnegative_int = _int_at_least(0, "an integer of at least 0")


def _float_in(ok, what: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    parse.__name__ = what
    return parse


#: an argparse type: a finite number of at least 0 (tolerances)
nonnegative_float = _float_in(lambda v: v >= 0, "a number of at least 0")
#: an argparse type: a finite number above 0 (time limits)
positive_float = _float_in(lambda v: v > 0, "a number above 0")
#: an argparse type: a share from 0 to below 1 (min-gain)
share = _float_in(lambda v: 0 <= v < 1, "a share from 0 to below 1")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def workers_type(text: str) -> int:
    """An argparse type: worker processes, from 1 to this machine's cores (more only slow the
    work down and, each holding its own memory, can exhaust it)."""
    n = positive_int(text)
    if n > cores():
        raise argparse.ArgumentTypeError(f"{n} workers on a machine with {cores()} cores; give at most {cores()}")
    return n


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                   help="no progress bars (--no-progress is the old name)")


def add_db(p: argparse.ArgumentParser, required: bool = False, default=None, help: str = "the rule database") -> None:
    p.add_argument("--db", required=required, default=default, help=help)


def show_progress(args) -> bool:
    """Progress bars only on a terminal, and not with --quiet or --json."""
    return not getattr(args, "quiet", False) and not getattr(args, "json", False) and sys.stderr.isatty()
