"""Store the shipped kernel profiles' kernels as kernel rules in rules/default.db.

For each zoo model measured on the H100 (the cases of ``scripts/bench_kernels.py``), the graph
``optimize`` searches is cut into regions as the kernel pass cuts them, and every region the
shipped profile measured with a proved program becomes a kernel rule (region graph, program,
proof record, Triton source, measured times, the models whose verdict uses it): what
``superopt tune --db`` does for a user's model, without a GPU, since the times are the profile's.
Proofs come from the candidate cache or are generated now (minutes for the decode attention at
batch 16). Prints one line per model and a table of the rules.

    python scripts/ship_kernel_rules.py [--db rules/default.db] [--models llama3_8b_decode:1 ...] [--device h200]

``--device``: the kernels measured on that GPU (a name or key; where a region has none there, the
H100's, as the kernel pass looks them up); default: the H100's, else any.
"""

from __future__ import annotations

import argparse
import sys
import time

CASES = ["llama3_8b_decode:1", "llama3_8b_decode:16", "gpt2_block:1", "bert_base:1", "vit_b16:1", "bert_base:16"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default=None, help="the rule database (default: rules/default.db)")
    p.add_argument("--models", nargs="*", default=CASES, help="zoo models as NAME:BATCH")
    p.add_argument("--device", default=None, help="the GPU whose measurements to store (default: the H100's)")
    args = p.parse_args()
    from superopt.driver import load_model
    from superopt.driver.kernel_rules import kernel_rules_for, store_kernel_rules
    from superopt.driver.tune import searched_graph
    from superopt.kernel.profile import shipped_profile
    from superopt.rules.kernel_rules import kernel_rule_line
    from superopt.rules.paths import default_db_path
    db = args.db or str(default_db_path())
    prof = shipped_profile()
    rules = {}
    for case in args.models:
        name, batch = case.split(":")
        t0 = time.perf_counter()
        graph = searched_graph(load_model(zoo=name, batch_size=int(batch)), "bf16")
        found = kernel_rules_for(graph, prof, "bf16", args.device)
        rules.update((k.id, k) for k in found)
        print(f"{case}: {len(found)} kernel rule(s), {time.perf_counter() - t0:.1f} s", flush=True)
    n = store_kernel_rules(db, list(rules.values()))
    for k in sorted(rules.values(), key=lambda k: k.region):
        print(kernel_rule_line(k))
    print(f"{n} kernel rule(s) stored in {db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
