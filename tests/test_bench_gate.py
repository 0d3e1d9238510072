"""The benchmark's GPU gate (scripts/bench_gpu.py): timing never overlaps other GPU work."""

import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_gpu  # noqa: E402


def _worker(i):
    """Alternate shared (compile-like) and alone (timing-like) sections; log when each runs."""
    gate, log = bench_gpu._GATE, []
    for _ in range(3):
        with gate.shared():
            log.append(("shared", +1, time.monotonic()))
            time.sleep(0.05 * (1 + i % 2))
            log.append(("shared", -1, time.monotonic()))
        with gate.alone():
            log.append(("alone", +1, time.monotonic()))
            time.sleep(0.03)
            log.append(("alone", -1, time.monotonic()))
    return log


def test_timing_runs_alone_and_every_section_runs():
    ctx = mp.get_context("spawn")
    gate = bench_gpu._GpuGate(ctx.Manager())
    with ctx.Pool(4, initializer=bench_gpu._init, initargs=(gate,)) as pool:
        events = sorted((e for log in pool.map(_worker, range(4)) for e in log), key=lambda e: e[2])
    assert len(events) == 4 * 3 * 4  # nothing starved
    open_ = {"shared": 0, "alone": 0}
    shared_during_alone = False
    for kind, step, _ in events:
        open_[kind] += step
        assert open_["alone"] <= 1
        shared_during_alone |= open_["alone"] == 1 and open_["shared"] > 0
    assert not shared_during_alone
    assert gate.state["shared"] == gate.state["alone"] == gate.state["waiting"] == 0


def test_the_optimize_benchmark_refuses_to_run_without_a_gpu(tmp_path, capsys):
    import bench_optimize
    assert bench_optimize.main(["--out", str(tmp_path / "o"), "--models", "squeezenet1_1"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-written
