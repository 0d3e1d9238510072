"""The shared grammar of the command line, used by every stage's ``cli`` module.

One spelling per meaning: ``--db`` for a rule database, ``-o/--output`` for a written file,
``--json`` for one JSON document on standard output, ``--quiet`` for no progress (progress
bars are shown only on a terminal). Stage CLIs import this module, never the root CLI, so
there is no import cycle; the root CLI (:mod:`superopt.cli`) knows the stages.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["print_json", "positive_int", "nonnegative_int", "add_json", "add_quiet", "add_db", "show_progress"]


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
