"""scripts/bench_search.py's --calls: the search's Python calls counted (the load-free measure
of its work), and the same search as without it."""

from __future__ import annotations

import runpy
from pathlib import Path


def test_calls_counted_same_search():
    bench = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "bench_search.py"))
    plain = bench["bench_one"]("squeezenet1_1", bench["_args"](["--search", "saturate"]))
    counted = bench["bench_one"]("squeezenet1_1", bench["_args"](["--search", "saturate", "--calls"]))
    assert plain["calls"] is None and counted["calls"] > 100_000
    assert (plain["cost_after_us"], plain["explored"]) == (counted["cost_after_us"], counted["explored"])
