"""scripts/bench_search.py's --calls: the search's Python calls counted (the load-free measure
of its work), and the same search as without it."""

from __future__ import annotations

import json
import runpy
from pathlib import Path


def test_calls_counted_same_search():
    bench = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "bench_search.py"))
    plain = bench["bench_one"]("squeezenet1_1", bench["_args"](["--search", "saturate"]))
    counted = bench["bench_one"]("squeezenet1_1", bench["_args"](["--search", "saturate", "--calls"]))
    assert plain["calls"] is None and counted["calls"] > 100_000
    assert (plain["cost_after_us"], plain["explored"]) == (counted["cost_after_us"], counted["explored"])


def test_same_compares_what_the_searches_found(tmp_path, capsys):
    bench = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "bench_search.py"))
    row = {"model": "m", "cost": "analytic", "cost_after_us": 1.0, "reduction": 0.5, "explored": 10, "cpu_s": 1.0}
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps({"models": [row]}))
    b.write_text(json.dumps({"models": [{**row, "cpu_s": 2.0}]}))  # seconds differ: the same search
    c.write_text(json.dumps({"models": [{**row, "explored": 11}]}))
    assert bench["main"](["--same", str(a), str(b)]) == 0 and "m (analytic): same" in capsys.readouterr().out
    assert bench["main"](["--same", str(a), str(c)]) == 1 and "differs: explored" in capsys.readouterr().out
    assert bench["main"](["--same", str(a), str(tmp_path / "none.json")]) == 2
