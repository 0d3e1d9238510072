"""``superopt rules list|show|stats|diff|export|draw|migrate``: inspect (or upgrade) a rule database.

Every command takes ``--json`` for scripts; ``--db`` defaults to ``rules/default.db`` of the
source tree.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..ir.printing import value_name
from ..ir.printing import to_text
from ..ir.serialize import graph_from_json
from .db import ORDERS, SCHEMA_VERSION, RuleDB, RuleDBError, StoredRule, migrate
from .inspect import diff, stats
from .kernel_rules import get_kernel_rule, kernel_rule_line, kernel_rule_text, kernel_rules
from .load import REVERSED_SUFFIX, split_label
from .paths import default_db_path

#: what ``rules stats`` says about a database an interrupted ``generate`` left
INCOMPLETE_HINT = ("a `superopt generate` writing this database was interrupted, so some rules are missing; "
                   "run the same command again to finish it")

__all__ = ["register", "default_db_path"]


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", default=None, help="the rule database (default: rules/default.db)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def _filters() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--status", choices=("proven", "unproven", "refuted"), help="only rules with this status")
    p.add_argument("--op", help="only rules that use this operator")
    p.add_argument("--max-ops", type=int, help="only rules whose larger side has at most this many operators")
    p.add_argument("--min-ops", type=int, help="only rules whose larger side has at least this many operators")
    p.add_argument("--sort", choices=tuple(ORDERS), default="seq", help="order (default: insertion order)")
    p.add_argument("--desc", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=int, help="at most this many rules")
    return p


def register(sub) -> None:
    p = sub.add_parser("rules", help="inspect a rule database: list, show, stats, diff, export, draw")
    ss = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    c = ss.add_parser("list", parents=[_common(), _filters()], help="one line per rule")
    c.add_argument("--kernels", action="store_true",
                   help="the kernel rules instead: region => proved fused kernel, with its measured time")
    c.set_defaults(func=_list)
    c = ss.add_parser("show", parents=[_common()], help="one rule in full: both sides, outputs, proof")
    c.add_argument("id", help="a rule id, or a unique prefix of one (ID~: the rule applied right to left; "
                              "K...: a kernel rule, with its program, Triton source, proof and measured time)")
    c.set_defaults(func=_show)
    c = ss.add_parser("stats", parents=[_common()], help="counts by status, size, operator; proof times")
    c.set_defaults(func=_stats)
    c = ss.add_parser("diff", parents=[_common()], help="rules only in one of two databases: `diff OTHER.db` "
                      "compares --db (default rules/default.db) with OTHER.db; `diff A.db B.db` compares the two")
    c.add_argument("dbs", nargs="+", metavar="DB", help="OTHER.db (against --db), or A.db B.db")
    c.set_defaults(func=_diff)
    c = ss.add_parser("export", parents=[_common(), _filters()],
                      help="rules as JSON lines (with --json, or to a .json file: one JSON document)")
    c.add_argument("-o", "--output", help="write to this file (default: standard output)")
    c.set_defaults(func=_export)
    c = ss.add_parser("draw", parents=[_common()], help="both sides of a rule side by side, as SVG")
    c.add_argument("id", help="a rule id, or a unique prefix of one (ID~: the rule applied right to left)")
    c.add_argument("-o", "--output", required=True, help="the SVG file to write, e.g. rule.svg")
    c.set_defaults(func=_draw)
    c = ss.add_parser("migrate", parents=[_common()], help="upgrade a database of an older schema in place")
    c.set_defaults(func=_migrate)


def _open(args) -> RuleDB:
    return RuleDB.open(args.db or default_db_path())


def _query(db: RuleDB, args) -> list[StoredRule]:
    if args.limit is not None and args.limit < 0:
        raise RuleDBError(f"--limit must be 0 or more, got {args.limit}")
    return db.query(status=args.status, op=args.op, max_ops=args.max_ops, min_ops=args.min_ops,
                    order_by=args.sort, descending=args.desc, limit=args.limit)


def _print_json(obj) -> None:
    from ..cliargs import print_json
    print_json(obj)


def _list_kernels(args) -> int:
    with _open(args) as db:
        rows = kernel_rules(db)
    rows = rows[:args.limit] if args.limit is not None and args.limit >= 0 else rows
    if args.json:
        _print_json([k.to_json(full=False) for k in rows])
        return 0
    print(f"{'id':<16}  {'status':<8}  {'us':>8}  {'inductor':>9}  {'gain':>7}  {'dtype':<5}  {'device':<22}  region")
    for k in rows:
        print(kernel_rule_line(k))
    sys.stdout.flush()
    print(f"{len(rows)} kernel rule(s)", file=sys.stderr)
    return 0


def _show_kernel(args) -> int:
    with _open(args) as db:
        k = get_kernel_rule(db, args.id)
    if args.json:
        _print_json(k.to_json())
        return 0
    print(kernel_rule_text(k, to_text(graph_from_json(json.loads(k.region_json)))))
    return 0


def _list(args) -> int:
    if args.kernels:
        return _list_kernels(args)
    with _open(args) as db:
        rows = _query(db, args)
    if args.json:
        _print_json([s.to_json(graphs=False) for s in rows])
        return 0
    print(f"{'id':<16}  {'status':<9}  {'size':>6}  {'ms':>7}  {'check':<7}  {'ranks':<8}  rule")
    for s in rows:
        print(f"{s.id:<16}  {s.status:<9}  {s.sizes[0]:>2}->{s.sizes[1]:<2}  {1000 * s.seconds:>7.1f}  "
              f"{s.crosscheck:<7}  {_ranks(s):<8}  {s.text}")
    sys.stdout.flush()
    print(f"{len(rows)} rule(s)", file=sys.stderr)
    return 0


def _ranks(s: StoredRule) -> str:
    """``all`` (proven for every rank), ``instance`` (proven where applied) or ``-``."""
    return "-" if s.status != "proven" else "all" if s.all_ranks else "instance"


def _mapping(s: StoredRule) -> list[str]:
    r = s.rule
    return [f"out {k}: left {value_name(r.lhs, p)} = right {value_name(r.rhs, q)} : {r.lhs.type_of(p)!r}"
            for k, (p, q) in enumerate(zip(r.lhs.outputs, r.rhs.outputs))]


def _show(args) -> int:
    if args.id.startswith("K"):
        return _show_kernel(args)
    rule_id, back = split_label(args.id)  # ID~: the rule applied right to left, as reports name it
    with _open(args) as db:
        s = db.get(rule_id)
        settings = db.settings().get(s.settings_id) if s.settings_id is not None else None
    if args.json:
        _print_json({**s.to_json(), "output_mapping": _mapping(s), "settings": settings, "reversed": back})
        return 0
    if back:
        print(f"rule {s.id}{REVERSED_SUFFIX}: rule {s.id} applied right to left: {s.rule.reversed().text()}")
    print(f"rule {s.id}: {s.text}")
    print(f"status      {s.status}" + (" (never applied)" if s.status != "proven" or s.crosscheck != "passed" else ""))
    print(f"reason      {s.reason}")
    print(f"proof time  {1000 * s.seconds:.1f} ms")
    print(f"axioms used {', '.join(s.axioms_used) or '-'}")
    print(f"cross-check {s.crosscheck} (max relative error {s.crosscheck_error:.2g})")
    if s.status == "proven":
        print(f"ranks       {s.ranks or 'per instance'}")
    print(f"size        {s.sizes[0]} -> {s.sizes[1]} operators; uses {', '.join(s.ops)}")
    print(f"created     {s.created}; verified {s.verified}" + (f"; settings {json.dumps(settings)}" if settings else ""))
    print("\nleft side:\n" + to_text(s.rule.lhs))
    print("\nright side:\n" + to_text(s.rule.rhs))
    print("\noutput mapping:\n  " + "\n  ".join(_mapping(s)))
    return 0


def _stats(args) -> int:
    with _open(args) as db:
        st = stats(db)
        st["complete"] = db.meta.get("complete", "1") != "0"
        st["kernel_rules"] = len(kernel_rules(db))
    if args.json:
        _print_json(st)
        return 0
    t, tp = st["proof_seconds"], st["proof_seconds_proven"]
    print(f"{st['path']}: {st['rules']} rules, {st['applicable']} applicable (proven and cross-checked)")
    if not st["complete"]:
        print(f"INCOMPLETE: {INCOMPLETE_HINT}")
    print("by status:     " + ", ".join(f"{k} {v}" for k, v in sorted(st["by_status"].items())))
    proven = st["by_status"].get("proven", 0)
    print(f"ranks:         {st['all_ranks']} of {proven} proven for all ranks; per instance: "
          + (", ".join(f"{k} {v}" for k, v in st["per_instance"].items()) or "-"))
    print("cross-check:   " + ", ".join(f"{k} {v}" for k, v in sorted(st["by_crosscheck"].items())))
    print("by size (l->r): " + ", ".join(f"{k}: {v}" for k, v in st["by_size"].items()))
    print("by operator:   " + ", ".join(f"{k} {v}" for k, v in st["by_op"].items()))
    print("axioms used:   " + (", ".join(f"{k} {v}" for k, v in st["axioms_used"].items()) or "-"))
    print(f"kernel rules:  {st['kernel_rules']}" + (" (`superopt rules list --kernels`)" if st["kernel_rules"] else ""))
    for name, d in (("proof time (all)", t), ("proof time (proven)", tp)):
        print(f"{name:<20} n={d['count']} total {d['total']:.2f} s, mean {1000 * d['mean']:.1f} ms, "
              f"p50 {1000 * d['p50']:.1f}, p90 {1000 * d['p90']:.1f}, p99 {1000 * d['p99']:.1f}, "
              f"max {1000 * d['max']:.1f} ms")
    for u in st["unproven"]:
        print(f"not proven:    {u['id']}  {u['text']}\n               why: {u['reason']}")
    return 0


def _diff_pair(args) -> tuple:
    """(A, B): the two positional databases, or --db (default: the shipped one) and the one given."""
    if len(args.dbs) > 2 or (len(args.dbs) == 2 and args.db):
        raise RuleDBError(f"rules diff: got {len(args.dbs)} database(s)" + (" and --db" if args.db else "")
                          + "; give two (`rules diff A.db B.db`) or --db A.db and one (`rules diff --db A.db B.db`)")
    return tuple(args.dbs) if len(args.dbs) == 2 else (args.db or default_db_path(), args.dbs[0])


def _diff(args) -> int:
    path_a, path_b = _diff_pair(args)
    with RuleDB.open(path_a) as a, RuleDB.open(path_b) as b:
        d = diff(a, b)
    if args.json:
        _print_json({**d, "only_a": [s.to_json(graphs=False) for s in d["only_a"]],
                     "only_b": [s.to_json(graphs=False) for s in d["only_b"]],
                     "status_changed": [{"id": x.id, "a": x.status, "b": y.status, "text": x.text}
                                        for x, y in d["status_changed"]]})
        return 0
    print(f"{d['common']} rules in both; {len(d['only_a'])} only in {d['a']}; {len(d['only_b'])} only in {d['b']}; "
          f"{len(d['status_changed'])} changed status")
    for tag, rows in (("<", d["only_a"]), (">", d["only_b"])):
        for s in rows:
            print(f"{tag} {s.id}  {s.status:<9} {s.text}")
    for x, y in d["status_changed"]:
        print(f"~ {x.id}  {x.status} -> {y.status}  {x.text}")
    return 0


def _export(args) -> int:
    """Standard output: JSON lines, or with --json one JSON document (a list). A file (-o): JSON
    lines, or one document when its name ends in .json; --json then prints what was written."""
    with _open(args) as db:
        docs = [s.to_json() for s in _query(db, args)]
    as_doc = str(args.output).endswith(".json") if args.output else args.json
    text = (json.dumps(docs, indent=2, sort_keys=True) + "\n" if as_doc
            else "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs))
    if not args.output:
        sys.stdout.write(text)
        return 0
    from ..fileio import write_text
    write_text(args.output, text)
    if args.json:
        _print_json({"exported": len(docs), "path": args.output})
    else:
        print(f"wrote {len(docs)} rule(s) to {args.output} ({'JSON' if as_doc else 'JSON lines'})")
    return 0


def _draw(args) -> int:
    from .draw import rule_svg
    rule_id, back = split_label(args.id)  # ID~: the rule applied right to left, as reports name it
    with _open(args) as db:
        s = db.get(rule_id)
    label = f"{s.id}{REVERSED_SUFFIX if back else ''}"
    svg = rule_svg(s.rule.reversed() if back else s.rule,
                   f"rule {label} ({s.status}; axioms: {', '.join(s.axioms_used) or '-'})")
    try:
        from ..fileio import write_text
        write_text(args.output, svg)
    except OSError as e:
        raise RuleDBError(f"cannot write {args.output}: {e.strerror}") from None
    if args.json:
        _print_json({"id": label, "path": args.output})
    else:
        print(f"wrote {args.output}: rule {label}, both sides side by side (open it in a web browser)")
    return 0


def _migrate(args) -> int:
    path = args.db or default_db_path()
    was = migrate(path)
    doc = {"db": str(path), "schema_was": was, "schema_now": SCHEMA_VERSION}
    print(json.dumps(doc) if args.json else
          f"{path}: schema {was} -> {SCHEMA_VERSION}" if was < SCHEMA_VERSION else f"{path}: already schema {was}")
    return 0
