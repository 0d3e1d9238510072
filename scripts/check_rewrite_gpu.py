"""Which graph rewrite makes a model slower on the GPU: the model as ``superopt optimize`` writes
it for an H100 in bf16 (shipped rules, no kernels), and the same with each applied rule left out,
each timed under ``torch.compile(mode="reduce-overhead")`` with Inductor freezing against the
original module in the same run (bench_kernels' harness: L2 flushed, median of ``--repeat``).

    python scripts/check_rewrite_gpu.py --models bert_base:16 [--profile-kernels] [--json OUT.json]

Prints, per model: the variant (all rules, or all but one), the cost model's price, the measured
microseconds and the ratio to the original (> 1: faster). The cost model prices a rewrite; this
says whether the GPU agrees, rule by rule (BERT-base at batch 16 was written 2.8% cheaper by the
price and ran 4% slower).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import _bf16, compiled, kernel_list, time_call  # noqa: E402


def variants(model, leave_out=None):
    """(label, cost before, cost after, module or None, rules applied) of the model optimized
    with all rules, then without each group of ``leave_out`` (rule ids; None: each rule the full
    search applied, one at a time; []: none). The graph level only: no kernels, and no output
    checks (they decide nothing here: the rules are proven)."""
    from superopt.cost.select import choose_cost_model
    from superopt.driver import Options, optimize
    from superopt.driver.passes import PASSES
    from superopt.rules.load import load_rules, split_label
    cost, _ = choose_cost_model("h100", "bf16")
    passes = [p for p in PASSES if p.name not in ("kernels", "output check", "region check")]

    def run(exclude=()):
        res = optimize(model, load_rules(exclude=exclude), cost, Options(input_sets=1, kernels=False),
                       passes=passes, dtype="bf16")
        applied = sorted((res.report.search or {}).get("rules_applied", []))
        return res, applied
    res, applied = run()
    out = [("all rules", res.report.cost_before, res.report.cost_after, None if res.unchanged else res.module(),
            applied)]
    groups = [[rid] for rid in dict.fromkeys(split_label(a)[0] for a in applied)] if leave_out is None else leave_out
    for group in groups if not res.unchanged else []:
        r, used = run(tuple(group))
        out.append((f"without {'+'.join(g[:6] for g in group)}", r.report.cost_before, r.report.cost_after,
                    None if r.unchanged else r.module(), used))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["bert_base:16"])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--leave-out", nargs="*", default=None, metavar="ID[,ID]",
                    help="rule groups to leave out one group at a time (default: each applied rule; none given: "
                         "only the original and the full rewrite)")
    ap.add_argument("--profile-kernels", action="store_true", help="kernel lists of the original and the full rewrite")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import torch
    from superopt.driver import load_model
    rows = []
    for spec in args.models:
        name, batch = spec.split(":")
        t0 = time.perf_counter()
        model = load_model(zoo=name, batch_size=int(batch))
        found = variants(model, None if args.leave_out is None else [g.split(",") for g in args.leave_out])
        xs = _bf16(model.inputs)
        base = model.reference.to("cuda", torch.bfloat16).eval()
        fn = compiled(base, "reduce-overhead", xs)
        ro = time_call(fn, xs, args.repeat)
        print(f"\n# {spec}: searched and written in {time.perf_counter() - t0:.0f} s; original {ro:.1f} us "
              f"(reduce-overhead + freezing, {torch.cuda.get_device_name()})", flush=True)
        print(f"{'variant':<30} {'cost before':>11} {'cost after':>10} {'priced':>7} {'us':>9} {'measured':>8}  rules")
        row = {"model": spec, "ro_us": round(ro, 2), "variants": []}
        if args.profile_kernels:
            row["kernels_ro"] = kernel_list(fn, xs)
        for k, (label, before, after, module, applied) in enumerate(found):
            us = ro if module is None else time_call(compiled(module.to("cuda", torch.bfloat16).eval(),
                                                              "reduce-overhead", xs), xs, args.repeat)
            if k == 0 and args.profile_kernels and module is not None:
                row["kernels_all"] = kernel_list(compiled(module.to("cuda", torch.bfloat16).eval(),
                                                          "reduce-overhead", xs), xs)
            print(f"{label:<30} {before:11.1f} {after:10.1f} {before / after:7.3f} {us:9.1f} {ro / us:8.3f}  "
                  f"{' '.join(applied)[:90]}", flush=True)
            row["variants"].append({"variant": label, "cost_before": before, "cost_after": after, "us": round(us, 2),
                                    "speedup": round(ro / us, 3), "rules": applied})
        rows.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    for r in rows:
        for key in ("kernels_ro", "kernels_all"):
            if key in r:
                print(f"\n{r['model']} {key}:")
                for k in r[key]:
                    print(f"  {k['us']:8.2f} us x{k['calls']:<3} {k['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
