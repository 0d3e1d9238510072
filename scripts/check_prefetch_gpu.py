"""L2 prefetch of the next kernel's weight during a kernel that leaves HBM idle (experiment).

Llama-3-8B's decode step at batch 1 is five superopt kernels in a chain (q/k/v, attention, o,
gate/up, down). Attention reads 8.4 MB in ~8 us (a sixth of the bandwidth) with 64 programs on
132 SMs; the o projection then streams its 33.5 MB weight with 64 programs. This script times
the chain of the shipped kernels (programs and configs from the H200 profile's verdict) under a
CUDA graph, as is and with ``cp.async.bulk.prefetch.L2.global`` instructions put at the start of
a kernel for (part of) a later kernel's weight: the prefetch reads nothing into registers and
changes no value, so a kernel's result is bit-identical (checked). Prints one row per variant:
the chain's microseconds and the ratio to the plain chain measured in the same run.

    python scripts/check_prefetch_gpu.py [--reps 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superopt.kernel import compile as kcompile  # noqa: E402
from superopt.kernel.program import parse_program  # noqa: E402
from superopt.kernel.triton_lower import to_triton  # noqa: E402
from superopt.kernel.tune import parse_config  # noqa: E402

ORDER = ["pow-mean-add-rsqrt-mul-matmul @", "sdpa @", "matmul-add @ 1x1x4096,", "silu-mul @", "matmul-add @ 1x1x14336"]
NAMES = ["qkv", "attn", "o", "gateup", "down"]


def chain_programs(model: str, device: str):
    """The five (program, config) pairs of the model's verdict, in the step's order."""
    raw = json.loads((Path(kcompile.__file__).parent / "profiles" / f"{device}-bf16.json").read_text())
    verdict = min((m for m in raw["models"] if m["model"] == model), key=lambda m: m["us"])
    entries = {e["program"]: e for e in raw["entries"]}
    found = {}
    for _h, text in verdict["programs"]:
        e = entries[text]
        for i, key in enumerate(ORDER):
            if key in e["region"] and not (i == 0 and "silu" in e["region"]):
                found[NAMES[i]] = (parse_program(text), parse_config(e["config"]), e["us"])
    return [found[n] for n in NAMES]


def inputs_for(program, torch, gen):
    xs = []
    for t in program.inputs:
        dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}[t.dtype]
        if t.shape == (1,):
            xs.append(torch.full(t.shape, 1e-5 if "w0" in t.name else 1.0, dtype=dt, device="cuda"))
        elif t.shape[-1] == 2048 and len(t.shape) == 4 and t.shape[2] == 1:   # the additive mask
            xs.append(torch.zeros(t.shape, dtype=dt, device="cuda"))
        else:
            xs.append((torch.randn(t.shape, generator=gen, device="cuda") * 0.05).to(dt))
    return xs


def with_prefetch(src: str, targets: list, num_warps: int, n_programs: int) -> str:
    """``src`` with bulk L2 prefetches of ``targets`` ([(address, bytes)]) spread over the
    programs, one per thread, put right after the first program-id read."""
    lanes = 32 * num_warps
    lines = []
    for k, (addr, nbytes) in enumerate(targets):
        chunk = max(16, (nbytes // (n_programs * lanes)) // 16 * 16)
        total = chunk * n_programs * lanes
        assert total <= nbytes + 16 * n_programs * lanes, (total, nbytes)
        lines += [
            f"    _pf{k} = (tl.program_id(0) * {lanes} + tl.arange(0, {lanes})).to(tl.int64) * {chunk}",
            f"    _pf{k} = tl.minimum(_pf{k}, {max(0, nbytes - chunk)}) + {addr}",
            f"    tl.inline_asm_elementwise('cp.async.bulk.prefetch.L2.global [$1], {chunk}; mov.u32 $0, 0;', "
            f"'=r,l', [_pf{k}], dtype=tl.int32, is_pure=False, pack=1)",
        ]
    out, done = [], False
    for line in src.splitlines():
        out.append(line)
        if not done and re.match(r"\s+pid = tl\.program_id\(0\)", line):
            out += lines
            done = True
    assert done
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_8b_decode")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--reps", type=int, default=20, help="chains per CUDA graph")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    from superopt.kernel.triton_lower import launch_grid

    gen = torch.Generator(device="cuda").manual_seed(0)
    chain = chain_programs(args.model, args.device)
    data = [inputs_for(p, torch, gen) for p, _c, _u in chain]
    plain = [kcompile.compile_program(p, c) for p, c, _u in chain]
    tmp = Path(tempfile.mkdtemp(prefix="prefetch_"))

    def weight(i, which=-1):
        """(address, bytes) of kernel i's weight input (the largest)."""
        x = max(data[i], key=lambda t: t.numel())
        if which == -1:
            return x.data_ptr(), x.numel() * x.element_size()
        ws = sorted(data[i], key=lambda t: -t.numel())[:2]
        return ws[which].data_ptr(), ws[which].numel() * ws[which].element_size()

    def patched(i, targets, tag):
        p, c, _u = chain[i]
        src = with_prefetch(to_triton(p, c, False, False, None), targets, c.num_warps, launch_grid(p, c))
        mod = kcompile._import(tmp / f"k_{tag}.py", src)
        return kcompile._launcher(p, c, mod)

    o_addr, o_bytes = weight(2)
    g_addr, g_bytes = weight(3, 0)
    u_addr, u_bytes = weight(3, 1)
    mb = 1 << 20
    variants = {"plain": {}}
    for f in (0.25, 0.5, 0.75, 1.0):
        variants[f"attn prefetches {f:.0%} of W_o"] = {1: [(o_addr, int(o_bytes * f) // 16 * 16)]}
    for x in (4, 8, 16):
        variants[f"attn W_o, o prefetches {x}+{x} MB of gate/up"] = {
            1: [(o_addr, o_bytes)], 2: [(g_addr, x * mb), (u_addr, x * mb)]}
    variants["attn W_o + 4+4 MB gate/up"] = {1: [(o_addr, o_bytes), (g_addr, 4 * mb), (u_addr, 4 * mb)]}

    launchers = {}
    for name, spec in variants.items():
        ls = list(plain)
        for i, targets in spec.items():
            ls[i] = patched(i, targets, f"{len(launchers)}_{i}")
        launchers[name] = ls

    # same results: a prefetch changes no value
    want = [run(*xs) for run, xs in zip(plain, data)]
    for name, ls in launchers.items():
        for i, (run, xs) in enumerate(zip(ls, data)):
            got = run(*xs)
            for g, w in zip(got, want[i]):
                if not torch.equal(g, w):
                    raise SystemExit(f"{name}: kernel {NAMES[i]} changed its result")

    def graph_of(ls):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for run, xs in zip(ls, data):
                run(*xs)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.reps):
                for run, xs in zip(ls, data):
                    run(*xs)
        return g

    graphs = {n: graph_of(ls) for n, ls in launchers.items()}
    times = {n: [] for n in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for n, g in graphs.items():
            g.replay()
            torch.cuda.synchronize()
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times[n].append(start.elapsed_time(end) * 1000 / args.reps)
    base = statistics.median(times["plain"])
    rows = []
    print(f"{'variant':48s} {'chain us':>9s} {'vs plain':>9s}")
    for n, ts in times.items():
        m = statistics.median(ts)
        rows.append({"variant": n, "us": round(m, 2), "ratio": round(base / m, 4), "all": [round(t, 2) for t in ts]})
        print(f"{n:48s} {m:9.2f} {base / m:9.4f}")
    print("shipped alone-times (us):", {NAMES[i]: u for i, (_p, _c, u) in enumerate(chain)})
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "device": torch.cuda.get_device_name()}, indent=1))


if __name__ == "__main__":
    main()
