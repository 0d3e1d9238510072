"""The zoo-wide benchmark's pure parts (scripts/bench_doors.py): the plan, the optimize launcher,
the queue with its deadlines, and the table, with a fake measurement instead of the GPU."""

import json
import sys
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_doors as bd  # noqa: E402

#: fake RO / CLI / backend times (ms) of a few configurations
FAKE = {"squeezenet1_1@1/fp32": (1.0, 0.8, 0.78), "resnet50@1/fp32": (2.0, 2.0, 1.9),
        "vit_b16@16/bf16": (5.0, 5.1, 5.0), "bert_base@1/bf16": (1.0, 0.9, 0.99),
        "llama3_8b_decode@16/bf16": (3.0, 3.0, 3.0)}


def fake_measure(cfg, settings):
    time.sleep(settings.get("sleep", 0.0))
    ro, cli, backend = FAKE[cfg.key]
    return {"times_ms": {"ro": ro, "cli": cli, "backend": backend}, "errors": {"ro": 0.0, "cli": 1e-6, "backend": 1e-6},
            "backend_report": [{"kept": "optimized"}],
            "cli": {"rewritten": cli != ro, "layout": {"kept": True, "channels_last": True},
                    "custom_ops": ["superopt::conv2d_relu"]}}


def test_plan_puts_each_configuration_once_heaviest_first():
    configs = bd.plan(["squeezenet1_1", "nasnet_a_mobile"], [1, 16], ["fp32", "bf16"],
                      [bd.Config.parse("nasnet_a_mobile@16/bf16"), bd.Config.parse("vit_b16@16/bf16")])
    assert len(configs) == 9 and len(set(configs)) == 9
    assert configs[0].model == "nasnet_a_mobile" and configs[0].batch == 16
    assert configs[-1].model == "squeezenet1_1" and configs[-1].batch == 1
    assert bd.Config.parse("vit_b16@16/bf16").key == "vit_b16@16/bf16"
    with pytest.raises(Exception, match="MODEL@BATCH/DTYPE"):
        bd.Config.parse("vit_b16-16")


def test_the_queue_measures_in_order_and_skips_past_the_deadline(tmp_path):
    configs = [bd.Config.parse(k) for k in FAKE]
    now = time.time()
    settings = {"deadline": now + 0.25, "sleep": 0.1}
    seen = []
    with ThreadPool(1) as pool:
        rows = bd.run_queue([bd.Task(c, fake_measure, settings) for c in configs], pool, now + 30, seen.append)
    assert rows == seen  # every row handed on as it came
    status = [r["status"] for r in rows]
    assert status[:2] == ["ok", "ok"] and status[-1] == "skipped"  # none starts past the deadline
    assert {r["model"] for r in rows} == {c.model for c in configs}


def test_the_hard_deadline_returns_with_the_rest_unfinished():
    configs = [bd.Config.parse(k) for k in FAKE]
    now = time.time()
    with ThreadPool(2) as pool:
        rows = bd.run_queue([bd.Task(c, fake_measure, {"deadline": now + 60, "sleep": 0.3}) for c in configs],
                            pool, now + 0.5, lambda r: None)
        pool.terminate()
    assert time.time() - now < 1.5
    assert len(rows) == len(configs)
    assert {r["status"] for r in rows} == {"ok", "unfinished"}


def test_a_failing_configuration_is_a_row():
    def boom(cfg, settings):
        raise RuntimeError("CUDA out of memory")
    row = bd.run_task(bd.Task(bd.Config.parse("resnet50@16/fp32"), boom, {"deadline": time.time() + 9}))
    assert row["status"] == "failed" and "out of memory" in row["why"]


def test_the_table_has_geomeans_worst_cases_and_flags():
    rows = [bd.run_task(bd.Task(bd.Config.parse(k), fake_measure, {"deadline": time.time() + 9})) for k in FAKE]
    rows.append({"model": "inception_v3", "batch": 16, "dtype": "fp32", "status": "skipped", "why": "deadline"})
    s = bd.summarize(rows)
    assert s["b1 fp32"]["cli"]["geomean"] == pytest.approx((1.25 * 1.0) ** 0.5, abs=1e-3)
    assert s["b1 fp32"]["backend"]["worst"] == pytest.approx(2.0 / 1.9, abs=1e-3)
    assert s["all"]["cli"]["n"] == 4  # the zoo only: the Llama block is an extra
    flagged = s["flagged"]
    assert set(flagged) == {"vit_b16@16/bf16", "resnet50@1/fp32"}  # bert: the CLI above the backend is fine
    assert any("0.980 < 0.99" in f for f in flagged["vit_b16@16/bf16"])  # the case: 0.99
    assert flagged["resnet50@1/fp32"] == ["cli 5.0% below the backend"]
    text = bd.format_table(rows)
    assert "SKIPPED: deadline" in text and "rewritten, channels-last, conv2d_relu | backend: optimized" in text
    assert "flagged" in text and "vit_b16@16/bf16" in text.splitlines()[-1]


def test_the_table_counts_the_kernels_the_backend_chose():
    row = {"model": "llama3_8b_decode", "batch": 1, "dtype": "bf16", "status": "ok",
           "times_ms": {"ro": 0.25, "cli": 0.2, "backend": 0.2}, "errors": {},
           "backend_report": [{"kept": "optimized", "kernels": {"chosen": 4, "regions": 5, "verdict": True},
                               "updates": ["k_cache", "v_cache"]}],
           "cli": {"rewritten": True, "layout": {}, "custom_ops": ["superopt::kernel"]}}
    assert "backend: optimized (4 kernels)" in bd.format_table([row])
    assert bd.flags(row) == []
    row["cudagraph_skips"] = {"ro": 0, "backend": 1}
    assert bd.flags(row) == ["backend: no CUDA graph"]
    row["backend_report"][0]["kept"] = "original (no cheaper graph, no layout or library-call choice)"
    assert "backend: original" in bd.format_table([row]) and "kernels)" not in bd.format_table([row])


def test_optimizes_run_capped_and_every_configuration_gets_an_outcome(tmp_path):
    configs = [bd.Config.parse(k) for k in FAKE]
    script = ("import json, sys, time; time.sleep(0.2); open(sys.argv[1], 'w').write(json.dumps("
              "{'rewritten': True, 'cost_before': 2.0, 'cost_after': 1.0, 'output': sys.argv[1]}))")

    def command(cfg):
        if cfg.model == "bert_base":
            return [sys.executable, "-c", "import sys; print('superopt: error: no memory'); sys.exit(1)"]
        return [sys.executable, "-c", script, str(tmp_path / f"{cfg.slug}.json")]
    bd.run_optimizes(configs[:4], tmp_path, jobs=2, deadline=time.time() + 30, command=command, timeout_s=20)
    bd.run_optimizes(configs[4:], tmp_path, jobs=2, deadline=time.time() - 1, command=command, timeout_s=20)
    done = {c.key: bd.wait_done(tmp_path, c, time.time() + 1) for c in configs}
    assert done["squeezenet1_1@1/fp32"]["report"]["rewritten"] is True
    assert done["bert_base@1/bf16"]["error"] == "superopt: error: no memory"
    assert "deadline" in done["llama3_8b_decode@16/bf16"]["error"]
    summary = bd._cli_summary(done["squeezenet1_1@1/fp32"])
    assert summary["predicted"] == 2.0 and summary["rewritten"] is True
    assert "not finished" in bd.wait_done(tmp_path, bd.Config.parse("resnet50@16/bf16"), time.time() + 0.1,
                                          poll_s=0.05)["error"]


def test_refuses_without_a_gpu_and_merges_runs_without_one(tmp_path, capsys):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert bd.main(["--out", str(tmp_path / "o")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    for name, keys in (("a", list(FAKE)[:2]), ("b", list(FAKE)[2:])):
        rows = [bd.run_task(bd.Task(bd.Config.parse(k), fake_measure, {"deadline": time.time() + 9})) for k in keys]
        (tmp_path / name).mkdir()
        (tmp_path / name / "doors.json").write_text(json.dumps({"device": "H100", "rows": rows}))
    assert bd.main(["--out", str(tmp_path / "m"), "--report", str(tmp_path / "a/doors.json"),
                    str(tmp_path / "b/doors.json")]) == 0
    merged = json.loads((tmp_path / "m/doors.json").read_text())
    assert len(merged["rows"]) == len(FAKE) and "vit_b16@16/bf16" in merged["summary"]["flagged"]
    assert "H100" in capsys.readouterr().out


def test_a_decode_step_holding_its_caches_is_exported_then_optimized(tmp_path):
    """``M+buffers`` (gpt-fast's way: the caches in the model) runs as a user would: `superopt zoo
    export --cache buffers`, then `superopt optimize` on that program, which is written with the
    caches as its own buffers."""
    import os
    import subprocess
    import torch
    cfg = bd.Config.parse("llama_tiny_decode+buffers@1/bf16")
    assert bd.zoo_name(cfg) == ("llama_tiny_decode", {"cache": "buffers"}) and bd.zoo_name(bd.Config.parse("x@1/bf16"))[1] == {}
    assert bd.zoo_name(bd.Config.parse("m+buffers+posmask@1/bf16"))[1] == {"cache": "buffers", "mask": "positions"}
    rot = bd.Config.parse("m+rotpos+halfexport@1/bf16")
    assert bd.zoo_name(rot)[1] == {"rotary": "positions", "export": "half"}
    assert "--rotary positions --dtype bf16" in bd.optimize_command(rot, tmp_path, threads=1)[2]
    cmd = bd.optimize_command(cfg, tmp_path, threads=1, device="h200")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == 0
    report = json.loads((tmp_path / f"{cfg.slug}.json").read_text())
    program = torch.export.load(report["output"])
    assert {s.target for s in program.graph_signature.input_specs if s.kind.name == "BUFFER"} >= {"caches.k0", "caches.v0"}
    assert len(program.example_inputs[0]) == 5  # the step's own inputs, no cache
