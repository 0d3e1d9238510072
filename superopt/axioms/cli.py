"""``superopt specs check|list``: validate and show the operator axioms."""

from __future__ import annotations

import sys

from ..cliargs import nonnegative_int
from .check import check_axioms
from .parse import load_axioms

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("specs", help="inspect and validate the operator axioms in specs/")
    ss = p.add_subparsers(dest="specs_command", metavar="ACTION", required=True)
    c = ss.add_parser("check", help="evaluate both sides of every axiom in float64 on random inputs")
    c.add_argument("--specs", help="a .axioms file or a folder of them (default: the shipped specs/)")
    c.add_argument("--seed", type=nonnegative_int, default=0, help="random seed (default 0)")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.set_defaults(func=_check)
    ls = ss.add_parser("list", help="list the axioms")
    ls.add_argument("--specs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_list)


def _load(specs):
    from ..errors import SpecError
    axioms = load_axioms(specs)
    if not axioms:
        raise SpecError(f"{specs or 'specs/'}: no axioms found; see specs/README.md for the syntax")
    return axioms


def _check(args) -> int:
    from ..cliargs import print_json
    axioms = _load(args.specs)
    results = check_axioms(axioms, args.seed)
    bad = [r for r in results if not r.ok]
    if args.json:
        print_json([{"axiom": r.axiom.name, "ok": r.ok, "instances": r.instances, "max_rel_error": r.max_error,
                     "problem": r.problem, "where": f"{r.axiom.file}:{r.axiom.line}"} for r in results])
    else:
        w = max(len(r.axiom.name) for r in results)
        print(f"{'axiom':<{w}}  instances  max rel error  result")
        for r in results:
            print(f"{r.axiom.name:<{w}}  {r.instances:>9}  {r.max_error:>13.1e}  {'ok' if r.ok else 'FAILED'}")
        print(f"\n{len(results) - len(bad)} of {len(results)} axioms hold numerically "
              f"(float64 reference semantics, random inputs, several shapes).")
        for r in bad:
            print(f"FAILED {r.axiom.name} ({r.axiom.file}:{r.axiom.line}): {r.problem}", file=sys.stderr)
    return 1 if bad else 0


def _list(args) -> int:
    from ..cliargs import print_json
    axioms = _load(args.specs)
    if args.json:
        print_json([{"name": a.name, "tags": a.tags, "axiom": str(a), "where": f"{a.file}:{a.line}"} for a in axioms])
    else:
        w = max(len(a.name) for a in axioms)
        for a in axioms:
            print(f"{a.name:<{w}}  {a}")
    return 0
