"""``superopt generate``: discover rewrite rules, verify them, store them in a rule database."""

from __future__ import annotations

import argparse

from ..cliargs import add_json, add_quiet, nonnegative_int, positive_float, positive_int, show_progress, workers_type
from .opsets import INPUT_SETS, OP_PRESETS
from .parallel import guard_workers

__all__ = ["register"]

_EPILOG = """examples:
  superopt generate --max-ops 3 --ops taso -o rules/taso.db
  superopt generate --max-ops 2 --ops matmul,add,concat,split --inputs x=2x4,w=4x4:w   (dry run: no --out)
  superopt generate --max-ops 3 -o rules/taso.db --dask-workers 4
A run killed at any point resumes from <out>.ckpt when started again with the same command."""


def register(sub) -> None:
    p = sub.add_parser("generate", help="enumerate small graphs and find, verify and store rewrite rules",
                       description="Enumerate every graph of up to N operators over small input tensors, group\n"
                                   "them by exact fingerprint, prune redundant candidates, prove each with the\n"
                                   "verifier and store it (with its status) in a rule database.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-ops", type=int, default=3, help="operators per graph, N (default 3; 4 takes minutes)")
    p.add_argument("--ops", default="taso", help=f"a preset ({', '.join([*OP_PRESETS, 'all'])}) or a comma "
                                                 f"list of operators (default: taso)")
    p.add_argument("--inputs", default=None, help=f"input tensors: a set ({', '.join(INPUT_SETS)}) or a list "
                                                  f"like x=2x4,w=4x4:w,s=scalar:w (':w' marks a weight); "
                                                  f"default: the set of the operator preset")
    p.add_argument("-o", "--output", "--db", "--out", dest="out", default=None,
                   help="the rule database to write, e.g. rules/taso.db (without it: enumerate and prune only, "
                        "write nothing; --db and --out are other names)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="fingerprint seed (default 0)")
    p.add_argument("--max-outputs", type=int, default=2, help="outputs per graph (default 2)")
    p.add_argument("--no-representatives", dest="representatives", action="store_false",
                   help="extend every graph, not only representatives (slower; for comparison)")
    p.add_argument("--timeout", type=positive_float, default=5.0, help="time limit per proof in seconds (default 5)")
    p.add_argument("--specs", default=None, help="axioms for the verifier (default: the shipped specs/)")
    p.add_argument("--workers", type=workers_type, default=None,
                   help="local processes, at most the cores (default: all cores)")
    p.add_argument("--scheduler", default=None, help="a Dask scheduler address, e.g. tcp://host:8786")
    p.add_argument("--dask-workers", type=positive_int, default=None, help="start a local Dask cluster of N processes")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out database")
    p.add_argument("--keep-checkpoint", action="store_true", help="keep <out>.ckpt after a finished run")
    p.add_argument("--restart", action="store_true",
                   help="discard <out>.ckpt (an interrupted or damaged checkpoint) and start over")
    p.add_argument("--print-rules", action="store_true", help="also print the rules, one per line")
    add_quiet(p)
    add_json(p)
    p.set_defaults(func=_generate)


def _generate(args) -> int:
    from ..cliargs import print_json
    from .pipeline import generate
    from .settings import Settings
    settings = Settings.make(max_ops=args.max_ops, ops=args.ops, inputs=args.inputs, seed=args.seed,
                             max_outputs=args.max_outputs, representatives=args.representatives,
                             verify_timeout_s=args.timeout, specs=args.specs)
    if not args.timeout > 0:
        from .errors import GenerateError
        raise GenerateError(f"--timeout must be positive, got {args.timeout}")
    if args.restart and args.out:
        from .checkpoint import Store, checkpoint_dir
        Store(checkpoint_dir(args.out)).remove()
    with guard_workers():  # Ctrl-C ends the workers at once; none outlives the command
        report = generate(settings, args.out, workers=args.workers, scheduler=args.scheduler,
                          dask_workers=args.dask_workers, progress=show_progress(args), overwrite=args.overwrite,
                          keep_checkpoint=args.keep_checkpoint)
    if args.json:
        doc = report.to_json()
        if args.print_rules:
            doc["rule_texts"] = [r.text() for r in report.rules]
        print_json(doc)
    else:
        if args.print_rules:
            for r in report.rules:
                print(r.text())
        print(report.table())
    return 1 if report.verify.get("refuted") else 0
