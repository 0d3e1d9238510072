"""The weight fold of the search's found graph (``keep if cheaper``): this checkout against another.

    python scripts/bench_fold.py --before DIR [--models inception_v3 ...] [--repeat 3]

For each zoo model, runs the import and the search once (this checkout), then folds the found
graph with this checkout's ``superopt/search/fold.py`` and with ``DIR``'s (loaded from its file,
in this process), alternating, ``--repeat`` times each, and prints the least time of each, their
ratio, and whether the folded weights are the same bytes (they must be: the fold decides what is
written). One process, so both folds see the same graph and the same machine load.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ["squeezenet1_1", "resnet50", "inception_v3", "nasnet_a_mobile", "llama3_8b_decode", "llama3_8b_prefill"]


def load_fold(tree: Path):
    """``fold_constants`` of the checkout ``tree`` (its fold module, with this checkout's others)."""
    spec = importlib.util.spec_from_file_location("superopt.search._fold_before", tree / "superopt/search/fold.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fold_constants


def same_bytes(a, b) -> bool:
    return list(a.data) == list(b.data) and all(
        a.data[k].dtype == b.data[k].dtype and a.data[k].tobytes() == b.data[k].tobytes() for k in a.data)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="another superopt checkout (e.g. main, git archive)")
    p.add_argument("--models", nargs="+", default=DEFAULT)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    from superopt.cost import choose_cost_model
    from superopt.driver.model import load_model
    from superopt.driver.passes import PASSES
    from superopt.driver.pipeline import optimize
    from superopt.rules.load import DEFAULT_RULES, load_rules
    from superopt.search.fold import fold_constants
    before = load_fold(args.before)
    cost, _ = choose_cost_model("h100", "fp32", "inductor")
    rules = load_rules(DEFAULT_RULES, False, True, [])
    print(f"{'model':<18} {'before s':>8} {'after s':>8} {'ratio':>6} {'weights':>7}  same bytes", flush=True)
    for zoo in args.models:
        found = optimize(load_model(zoo=zoo), rules, cost, passes=PASSES[:2]).result.graph  # fold + search
        times: dict = {"before": [], "after": []}
        out = {}
        for _ in range(args.repeat):
            for name, fold in (("before", before), ("after", fold_constants)):
                t = time.perf_counter()
                out[name] = fold(found)
                times[name].append(time.perf_counter() - t)
        b, a = min(times["before"]), min(times["after"])
        print(f"{zoo:<18} {b:>8.3f} {a:>8.3f} {b / a:>6.2f} {len(out['after'].data):>7}  "
              f"{same_bytes(out['before'], out['after'])}", flush=True)
        del out, found
    return 0


if __name__ == "__main__":
    sys.exit(main())
