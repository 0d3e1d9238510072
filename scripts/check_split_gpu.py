"""Split schedules on the GPU: the Llama-3-8B decode-step kernels (bf16) with and without a
split of their loop (split-K for the linears, flash-decoding for attention) against torch.

A split schedule is one kernel: every program stores its chunk's partials and the last program
of each grid tile to draw a ticket combines them (``superopt.kernel.triton_lower._SplitRender``).
Regions (M = 1 and 16 rows): q 4096->4096, k/v 4096->1024, gate/up 4096->2x14336 with SiLU·mul,
down 14336->4096, RMSNorm -> 4096->6144 (Mirage's case); grouped-query decode attention at
batch 1 and 16 (32 query / 8 key-value heads, 2,048 cached positions, head dim 128). For each,
the generated programs (``generate_kernels(verify=False)``: CI verifies the same translations at
small sizes; the linears with their weights stored [N, K] as ``F.linear``'s, ``--layouts both``
adds [K, N]), over the streaming configs and their split variants
(``superopt.kernel.tune.tuning_space``), compiled in a process pool, checked against torch on
two launches in a row (a split kernel must leave its ticket counters zero for the next) and
timed alone under CUDA graphs with the L2 flushed (``tune.measure_us``). torch: ``F.linear``
(the gate/up weights concatenated, as Inductor merges them) and
``F.scaled_dot_product_attention`` with ``enable_gqa=True`` as dispatched, and for attention
each SDPA backend forced (cuDNN, flash, memory-efficient; those that take the case), captured
the same way. Prints one row per region and schedule (torch, the best unsplit program, the best
few split ones): microseconds, % of the bytes floor (every input, weight and output read or
written once at 3.35 TB/s), max abs error vs torch over both launches.

    python scripts/check_split_gpu.py [--workers 16] [--top 3] [--json $OUT/split.json]
    TRITON_INTERPRET=1 python scripts/check_split_gpu.py --tiny     # a CPU dry run (no timing)
    python scripts/check_split_gpu.py --compare BEFORE.json AFTER.json   # two runs' rows side by side
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superopt.ir.graph import Graph, GraphBuilder  # noqa: E402
from superopt.kernel import generate_kernels  # noqa: E402
from superopt.kernel.regions import as_reference  # noqa: E402
from superopt.kernel.tune import (config_text, extra_arrays, extra_inputs, measure_us, stream_configs,  # noqa: E402
                                  tuning_space, variants, warm_all)

BW = 3.35e12   # H100 SXM HBM3 bytes per second
BF16 = "bfloat16"


def linear(m, k, n) -> Graph:
    b = GraphBuilder()
    return b.build([b.op("matmul", b.input("x", (m, k), BF16), b.weight("w", (k, n), None, BF16))])


def gate_up(m, k, n) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (m, k), BF16)
    g = b.op("matmul", x, b.weight("wg", (k, n), None, BF16))
    u = b.op("matmul", x, b.weight("wu", (k, n), None, BF16))
    return b.build([b.op("mul", b.op("mul", g, b.op("sigmoid", g)), u)])


def rmsnorm_linear(m, k, n) -> Graph:
    """x·(mean(x²)+eps)^-1/2·g @ W, the mean a matmul by a column of 1/k (as the tests write it)."""
    b = GraphBuilder()
    x = b.input("x", (m, k), BF16)
    c = b.weight("c", (k, 1), np.full((k, 1), 1.0 / k), BF16)
    eps = b.weight("eps", (1,), np.array([1e-6]), BF16)
    g, w = b.weight("g", (k,), None, BF16), b.weight("w", (k, n), None, BF16)
    r = b.op("pow", b.op("add", b.op("matmul", b.op("mul", x, x), c), eps), exponent=-0.5)
    return b.build([b.op("matmul", b.op("mul", b.op("mul", x, r), g), w)])


def gqa_decode(bs, h, kvh, s, d) -> Graph:
    b = GraphBuilder()
    q = b.input("q", (bs, h, 1, d), BF16)
    k, v = b.input("k", (bs, kvh, s, d), BF16), b.input("v", (bs, kvh, s, d), BF16)

    def rep(x):
        parts = b.op("split", x, axis=1, sizes=(1,) * kvh)
        parts = parts if isinstance(parts, tuple) else (parts,)
        return b.op("concat", *[p for p in parts for _ in range(h // kvh)], axis=1)
    return b.build([b.op("sdpa", q, rep(k), rep(v), scale=d ** -0.5, causal=0)])


def gqa_decode_masked(bs, h, kvh, s, d) -> Graph:
    """The decode attention as a Llama model's searched graph has it: SDPA with grouped-query
    heads (the graph rule's ``gqa=1``) and the static cache's additive mask [bs, 1, 1, s]."""
    b = GraphBuilder()
    q = b.input("q", (bs, h, 1, d), BF16)
    k, v = b.input("k", (bs, kvh, s, d), BF16), b.input("v", (bs, kvh, s, d), BF16)
    mask = b.input("mask", (bs, 1, 1, s), BF16)
    return b.build([b.op("sdpa", q, k, v, mask, scale=d ** -0.5, causal=0, gqa=1)])


def regions(tiny: bool):
    s = 32 if tiny else 1
    for m in (1, 16):
        yield f"q {m}x4096->4096", "linear", linear(m, 4096 // s, 4096 // s)
        yield f"k/v {m}x4096->1024", "linear", linear(m, 4096 // s, 1024 // s)
        yield f"gate/up silu {m}x4096->14336", "gate_up", gate_up(m, 4096 // s, 14336 // s)
        yield f"down {m}x14336->4096", "linear", linear(m, 14336 // s, 4096 // s)
        yield f"rmsnorm->linear {m}x4096->6144", "rmsnorm", rmsnorm_linear(m, 4096 // s, 6144 // s)
    for bs in (1, 16):
        yield f"gqa decode b{bs} 32q/8kv 2048", "sdpa", gqa_decode(bs, 32 // min(s, 4), 8 // min(s, 4), 2048 // s, 128)
        yield f"masked gqa decode b{bs} 2048", "sdpa_mask", gqa_decode_masked(bs, 32 // min(s, 4), 8 // min(s, 4),
                                                                            2048 // s, 128)


def weight_data(region: Graph, rng) -> dict:
    out = {}
    for i in region.weights:
        n = region.nodes[i]
        shape = n.types[0].shape
        out[n.name] = np.asarray(region.data[n.name], np.float32) if n.name in region.data else \
            (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)
    return out


def torch_fn(kind, region, t, data):
    """torch's version of the region and its inputs (the same values as the kernel's)."""
    import torch
    import torch.nn.functional as F
    shapes = [region.nodes[i].types[0].shape for i in region.inputs]
    xs = [t(np.random.default_rng(1 + j).standard_normal(sh)) for j, sh in enumerate(shapes)]
    if kind == "gate_up":
        wgu = t(np.concatenate([data["wg"].T, data["wu"].T]))

        def gu(x):
            g, u = F.linear(x, wgu).chunk(2, dim=-1)
            return F.silu(g) * u
        return gu, xs
    if kind == "rmsnorm":
        wt, g = t(data["w"].T), t(data["g"])

        def rms(x):
            xf = x.float()
            return F.linear((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g, wt)
        return rms, xs
    if kind == "linear":
        wt = t(data["w"].T)
        return (lambda x: F.linear(x, wt)), xs
    scale = shapes[0][-1] ** -0.5
    if kind == "sdpa_mask":
        xs[3] = torch.zeros_like(xs[3])   # a cache filled to the end: every position attended
        return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=scale, enable_gqa=True)), xs
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)), xs


def floor_bytes(region: Graph) -> int:
    ts = [region.nodes[i].types[0] for i in region.inputs + region.weights] + \
         [region.type_of(r) for r in region.outputs]
    return sum(2 * x.numel for x in ts)


def wide_stream_configs(program) -> list:
    """A wider streaming grid than the tuner's (``--wide``): column tiles 16-128, loop tiles
    128-512, 4 or 8 warps, 3-5 stages, and their split variants."""
    from superopt.kernel.configs import split_configs
    shapes = [(bn, bk, w, st) for bn in (16, 32, 64, 128) for bk in (128, 256, 512)
              for w, st in ((4, 3), (4, 4), (4, 5), (8, 3), (8, 4))]
    out = stream_configs(program, shapes)
    return out + split_configs(program, out, limit=40) if out else []


def wide_attention_configs(program) -> list:
    """A wider grid for a decode attention (``--wide``): key tiles 32-256, 2/4/8 warps, 1-3
    stages, unsplit and cut into 8-64 chunks (each at least one key tile)."""
    from superopt.kernel.program import TileConfig
    from superopt.kernel.split import chunks
    rows = [(d, 16) for d, tiled in program.grid if tiled]
    out = []
    for bs in (32, 64, 128, 256):
        for w, st in ((2, 2), (4, 1), (4, 2), (4, 3), (8, 2)):
            base = TileConfig(tuple(rows) + ((program.loop, bs),), w, st)
            tiles = chunks(program, base)[0]
            out += [TileConfig(base.blocks, w, st, s) for s in (1, 8, 16, 32, 64) if s <= tiles]
    return out


def plan(tiny: bool, dev: str, max_configs: int, layouts: str, wide: bool = False):
    """Per region: torch's fn, inputs, output; the programs with their bound inputs and configs."""
    import torch

    def t(a):
        return torch.as_tensor(np.ascontiguousarray(a, np.float32)).to(dev, torch.bfloat16)
    out = []
    for name, kind, region in regions(tiny):
        rng = np.random.default_rng(0)
        data = weight_data(region, rng)
        fn, xs = torch_fn(kind, region, t, data)
        with torch.no_grad():
            want = fn(*xs)
        env = dict(zip(region.input_names, xs))
        env.update({n: t(a) for n, a in data.items()})
        cands = [c for c in generate_kernels(region, verify=False).candidates if c.program.loop]
        cands = cands[:2 if kind.startswith("sdpa") else 1]
        progs = []
        for c in cands:
            names = set(data) | set(c.prep.names if c.prep else ())
            vs = variants(c.program, names, "bf16")
            for p in (vs if layouts == "both" else vs[-1:]):
                extras = extra_arrays(extra_inputs(p, as_reference(region)), data, c.prep)
                env.update({n: t(a) for n, a in extras.items()})
                attention = kind.startswith("sdpa")
                space = tuning_space(p, 2 * max_configs if attention else max_configs)
                if wide:
                    more = wide_attention_configs(p) if attention else wide_stream_configs(p)
                    space = list(dict.fromkeys(space + more))
                progs.append((c.moves, p, space))
        out.append({"name": name, "kind": kind, "fn": fn, "xs": xs, "want": want, "env": env, "progs": progs,
                    "floor_us": floor_bytes(region) / BW * 1e6})
    return out


def calibrate():
    """The timer against older ones: one replay of a one-call graph per sample after a 256 MB
    write (charges the graph's launch and the write-back of the dirty L2), the two-graph
    difference after that write, and ``measure_us`` (the difference after a read)."""
    import torch
    from superopt.cost.measure import cuda_graph, replay_medians
    from superopt.kernel.tune import FLUSH_BYTES
    scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def one_replay(fn, xs):
        return replay_medians([cuda_graph(lambda: fn(*xs))[0]], 50, before=scratch.zero_)[0]

    def write_diff(fn, xs, calls=8):
        both = cuda_graph(lambda: (scratch.zero_(), fn(*xs))[1], calls)[0]
        first, second = replay_medians([both, cuda_graph(scratch.zero_, calls)[0]], 50)
        return (first - second) / calls
    x1 = torch.zeros(1, device="cuda")
    cases = [("add 1 element", lambda x: x + 1, [x1])]
    for k, n in ((4096, 4096), (4096, 1024), (4096, 6144), (4096, 28672)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        cases.append((f"F.linear 1x{k}->{n}", lambda x, w=w: torch.nn.functional.linear(x, w), [x]))
    print(f"{'calibration (us)':<24} {'1 replay, write':>16} {'diff, write':>12} {'diff, read':>11} {'floor':>6}")
    for name, fn, xs in cases:
        floor = sum(t.numel() * t.element_size() for t in xs) / BW * 1e6
        if name.startswith("F.linear"):
            floor = fn.__defaults__[0].numel() * 2 / BW * 1e6
        print(f"{name:<24} {one_replay(fn, xs):16.2f} {write_diff(fn, xs):12.2f} {measure_us(fn, xs, 50):11.2f} "
              f"{floor:6.1f}", flush=True)


def run(args):
    import torch
    from superopt.kernel import compile_program
    dev = "cpu" if args.tiny else "cuda"
    t0 = time.perf_counter()
    if args.calibrate and not args.tiny:
        calibrate()
    jobs = plan(args.tiny, dev, args.max_configs, args.layouts, args.wide)
    if args.only:
        jobs = [j for j in jobs if any(o in j["name"] for o in args.only)]
    tasks = [(p.text(), config_text(c), "bf16") for j in jobs for _, p, cs in j["progs"] for c in cs]
    print(f"# {len(jobs)} regions, {len(tasks)} (program, config) pairs; planned in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    errors = dict(zip(tasks, [""] * len(tasks) if args.tiny else warm_all(tasks, args.workers)))
    failed = sum(bool(e) for e in errors.values())
    print(f"# compiled in {time.perf_counter() - t0:.1f} s ({failed} failed)", flush=True)
    device = "CPU (interpreter, no timing)" if args.tiny else torch.cuda.get_device_name()
    rows = []
    for j in jobs:
        with torch.no_grad():
            base = float("nan") if args.tiny else measure_us(j["fn"], j["xs"], args.repeat)
        rows.append(dict(region=j["name"], schedule="torch", config="", us=base, err=0.0, floor_us=j["floor_us"]))
        if j["kind"].startswith("sdpa") and not args.tiny:
            rows += sdpa_backend_rows(j, args.repeat)
        results = []
        for moves, p, cs in j["progs"]:
            for c in cs:
                if args.tiny and c not in (cs[0], next((x for x in cs if x.split > 1), cs[0])):
                    continue
                err = errors[(p.text(), config_text(c), "bf16")]
                if err:
                    continue
                fn = compile_program(p, c)
                xs = [j["env"][x.name] for x in p.inputs]
                e = _launch_error(fn, xs, j["want"])
                us = float("nan") if args.tiny else measure_us(fn, xs, args.repeat)
                results.append(dict(region=j["name"], schedule=f"{p.name} {moves}", config=c.text(), us=us, err=e,
                                    floor_us=j["floor_us"], split=c.split))
        key = (lambda r: r["us"]) if not args.tiny else (lambda r: r["err"])
        unsplit = sorted((r for r in results if r["split"] == 1), key=key)[:args.top]
        split = sorted((r for r in results if r["split"] > 1), key=key)[:args.top]
        _print_rows([r for r in rows if r["region"] == j["name"]] + unsplit + split,
                    f"{j['name']} ({time.perf_counter() - t0:.0f} s)")
        rows += unsplit + split
        if args.json:   # after every region: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    print(f"\ndevice: {device}; torch {torch.__version__}; floor = bytes / {BW / 1e12:.2f} TB/s; "
          f"total {time.perf_counter() - t0:.0f} s")
    _print_rows(rows, "all regions")
    return rows


def _launch_error(fn, xs, want, launches: int = 2) -> float:
    """Max |got - want| over ``launches`` calls in a row (NaN if any output is not finite); the
    outputs are kept until the end, so no call finds an earlier one's in reused memory."""
    kept = [fn(*xs)[0].reshape(want.shape) for _ in range(launches)]
    errs = [float((got.float() - want.float()).abs().max()) for got in kept]
    return float("nan") if any(e != e for e in errs) else max(errs)


def sdpa_backend_rows(job, repeat: int) -> list:
    """torch's attention with each SDPA backend forced (``torch.nn.attention.sdpa_kernel``):
    cuDNN, flash, memory-efficient; a backend that does not take the case is left out."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        backend = getattr(SDPBackend, name)

        def fn(*xs, backend=backend):
            with sdpa_kernel(backend):
                return job["fn"](*xs)
        try:
            with torch.no_grad():
                err = float((fn(*job["xs"]).float() - job["want"].float()).abs().max())
                us = measure_us(fn, job["xs"], repeat)
        except RuntimeError as e:   # "No available kernel": this backend does not take the case
            print(f"# {job['name']}: torch {name.lower()} left out ({str(e).splitlines()[0][:80]})")
            continue
        rows.append(dict(region=job["name"], schedule=f"torch {name.split('_')[0].lower()}", config="", us=us,
                         err=err, floor_us=job["floor_us"]))
    return rows


def compare(before: str, after: str) -> None:
    """Two runs' JSON side by side (e.g. the two-kernel split of main before, the one-kernel
    form after, on one machine): per region, torch and the best unsplit and split schedules of
    each run, and the rows of the same (schedule, config) in both with their ratio."""
    runs = [json.loads(Path(f).read_text()) for f in (before, after)]
    print(f"before: {before} ({runs[0]['device']}); after: {after} ({runs[1]['device']})")
    print(f"{'region':<30} {'what':<34} {'before us':>9} {'after us':>9} {'before/after':>12}  config")
    regions = list(dict.fromkeys(r["region"] for run in runs for r in run["rows"]))
    for region in regions:
        rows = [[r for r in run["rows"] if r["region"] == region] for run in runs]
        best = []
        for rs in rows:
            pick = {}
            for r in rs:
                what = r["schedule"] if r["schedule"].startswith("torch") else \
                    ("best split" if r.get("split", 1) > 1 else "best unsplit")
                if r["us"] == r["us"] and (what not in pick or r["us"] < pick[what]["us"]):
                    pick[what] = r
            best.append(pick)
        for what in dict.fromkeys(list(best[0]) + list(best[1])):
            b, a = best[0].get(what), best[1].get(what)
            _compare_row(region, what, b, a)
        same = {(r["schedule"], r["config"]): r for r in rows[0] if r["config"]}
        for r in rows[1]:
            if (r["schedule"], r["config"]) in same:
                _compare_row(region, r["schedule"], same[r["schedule"], r["config"]], r)


def _compare_row(region, what, b, a) -> None:
    bu, au = (r["us"] if r else float("nan") for r in (b, a))
    ratio = bu / au if au == au and au > 0 else float("nan")
    cfg = (a or b)["config"] if (a and a["config"]) or (b and b["config"]) else ""
    if b and a and b["config"] != a["config"]:
        cfg = f"{b['config']} -> {a['config']}"
    print(f"{region:<30} {what[:34]:<34} {bu:9.2f} {au:9.2f} {ratio:12.3f}  {cfg}")


def _print_rows(rows: list, title: str) -> None:
    print(f"\n# {title}\n{'region':<32} {'schedule':<44} {'us':>8} {'floor%':>7} {'max|err|':>9}  config")
    for r in rows:
        pct = 100 * r["floor_us"] / r["us"] if r["us"] == r["us"] and r["us"] > 0 else float("nan")
        print(f"{r['region']:<32} {r['schedule'][:44]:<44} {r['us']:8.1f} {pct:6.0f}% {r['err']:9.2g}  {r['config']}",
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--top", type=int, default=3, help="unsplit and split schedules shown per region")
    ap.add_argument("--max-configs", type=int, default=4,
                    help="default configs per linear program, twice that for attention (plus streaming and split ones)")
    ap.add_argument("--layouts", choices=("weight-major", "both"), default="weight-major",
                    help="weight-major: a linear's weights stored [N, K] as F.linear's (contiguous K tiles) only")
    ap.add_argument("--json", default="")
    ap.add_argument("--wide", action="store_true", help="a wider grid: streaming configs for the linears, key tiles and splits for attention")
    ap.add_argument("--only", nargs="*", default=[], help="regions whose name contains one of these")
    ap.add_argument("--calibrate", action="store_true", help="first, the timer against one replay per sample")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1), no timing")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                    help="print two runs' --json files side by side (no device needed) and exit")
    args = ap.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return
    run(args)


if __name__ == "__main__":
    main()
