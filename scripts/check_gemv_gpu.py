"""Decode-step linears (1 row, bf16, W stored [N, K]) streamed by three hand-written kernel
shapes: ``tl.dot`` with a 16-row tile (what the generator emits), a dot-free GEMV with per-lane
products summed after the loop, and the GEMV with a row sum per iteration; against
``F.linear``; timed alone with the L2 flushed (``superopt.kernel.tune.measure_us``), best of 64
configs. What it showed (H100, 2026-11-26): the dot kernels already stream the weights at
71-87% of the bandwidth (q 14.1 us, 4096->6144 19.6, down 41.9, gate/up + SiLU·mul 80.4; torch
16.5 / 21.4 / 44.5 / 86.6), the GEMV forms gain at most 5% (13.9 / 18.7 / 42.6 / 79.8): not
worth a second program form; two-warp configs won three of the four (now in the tuner).

    python scripts/check_gemv_gpu.py          # on a CUDA machine; prints a table (about 3 min)
"""
import sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp
import triton, triton.language as tl


@triton.jit
def lin_dot(x, w, out, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, 16)
    acc = tl.zeros((16, BN), tl.float32)
    acc2 = tl.zeros((16, BN), tl.float32)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        xk = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=offs_m[:, None] < 1, other=0.0)
        wk = tl.load(w + offs_n[:, None] * K + offs_k[None, :])
        acc += tl.dot(xk, tl.trans(wk), out_dtype=tl.float32)
        if GATE:
            wu = tl.load(w + (offs_n[:, None] + N) * K + offs_k[None, :])
            acc2 += tl.dot(xk, tl.trans(wu), out_dtype=tl.float32)
    if GATE:
        acc = acc * tl.sigmoid(acc) * acc2
    tl.store(out + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16), mask=offs_m[:, None] < 1)


@triton.jit
def lin_gemv(x, w, out, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, BK), tl.float32)
    acc2 = tl.zeros((BN, BK), tl.float32)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        xk = tl.load(x + offs_k).to(tl.float32)
        wk = tl.load(w + offs_n[:, None] * K + offs_k[None, :]).to(tl.float32)
        acc += wk * xk[None, :]
        if GATE:
            wu = tl.load(w + (offs_n[:, None] + N) * K + offs_k[None, :]).to(tl.float32)
            acc2 += wu * xk[None, :]
    r = tl.sum(acc, axis=1)
    if GATE:
        r2 = tl.sum(acc2, axis=1)
        r = r * tl.sigmoid(r) * r2
    tl.store(out + offs_n, r.to(tl.bfloat16))


@triton.jit
def lin_gemv_row(x, w, out, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr):
    # as lin_gemv but the row sum every iteration (no lane accumulator)
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), tl.float32)
    acc2 = tl.zeros((BN,), tl.float32)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        xk = tl.load(x + offs_k).to(tl.float32)
        wk = tl.load(w + offs_n[:, None] * K + offs_k[None, :]).to(tl.float32)
        acc += tl.sum(wk * xk[None, :], axis=1)
        if GATE:
            wu = tl.load(w + (offs_n[:, None] + N) * K + offs_k[None, :]).to(tl.float32)
            acc2 += tl.sum(wu * xk[None, :], axis=1)
    if GATE:
        acc = acc * tl.sigmoid(acc) * acc2
    tl.store(out + offs_n, acc.to(tl.bfloat16))


KERNELS = {"dot (today)": lin_dot, "gemv lanes": lin_gemv, "gemv row-sum": lin_gemv_row}
CONFIGS = [(bn, bk, wp, st) for bn in (8, 16, 32, 64) for bk in (64, 128, 256, 512) for wp, st in ((4, 3), (4, 4), (8, 3), (2, 4))]
SHAPES = [("q 4096->4096", 4096, 4096, 0), ("qkv 4096->6144", 4096, 6144, 0), ("down 14336->4096", 14336, 4096, 0),
          ("gate/up 4096->2x14336", 4096, 14336, 1)]


def launch(kern, x, w, o, K, N, gate, cfg):
    bn, bk, wp, st = cfg
    kern[(N // bn,)](x, w, o, N=N, K=K, BN=bn, BK=bk, GATE=gate, num_warps=wp, num_stages=st)


def warm(task):
    import torch
    name, K, N, gate, cfg = task
    if name == "dot (today)" and cfg[0] < 16:
        return "bn<16"
    try:
        x = torch.zeros(1, K, device="cuda", dtype=torch.bfloat16)
        w = torch.zeros(N * (2 if gate else 1), K, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
        launch(KERNELS[name], x, w, o, K, N, gate, cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return str(e).splitlines()[0][:100]


def main():
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from superopt.kernel.tune import measure_us
    t0 = time.time()
    tasks = [(n, K, N, g, c) for _, K, N, g in SHAPES for n in KERNELS for c in CONFIGS]
    with ProcessPoolExecutor(16, mp_context=mp.get_context("spawn")) as ex:
        errs = dict(zip(tasks, ex.map(warm, tasks)))
    print(f"# compiled {len(tasks)} in {time.time()-t0:.0f} s", flush=True)
    print(f"{'shape':<24} {'variant':<14} {'us':>7} {'floor%':>7} {'err':>8} config; 2nd")
    for label, K, N, gate in SHAPES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, K, generator=g).cuda().bfloat16()
        w = (torch.randn(N * (2 if gate else 1), K, generator=g) / K ** 0.5).cuda().bfloat16()
        o = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
        floor = w.numel() * 2 / 3.35e12 * 1e6
        if gate:
            def ref(x):
                a, b = F.linear(x, w).chunk(2, dim=-1)
                return F.silu(a) * b
        else:
            def ref(x):
                return F.linear(x, w)
        want = ref(x).float()
        us = measure_us(ref, [x], 50)
        print(f"{label:<24} {'torch':<14} {us:7.2f} {100*floor/us:6.0f}%", flush=True)
        for name, kern in KERNELS.items():
            res = []
            for c in CONFIGS:
                if errs[(name, K, N, gate, c)]:
                    continue
                launch(kern, x, w, o, K, N, gate, c)
                err = float((o.float() - want).abs().max())
                res.append((measure_us(lambda: launch(kern, x, w, o, K, N, gate, c), [], 15), c, err))
            res.sort()
            fin = sorted((measure_us(lambda: launch(kern, x, w, o, K, N, gate, c), [], 60), c, e) for _, c, e in res[:4])
            print(f"{label:<24} {name:<14} {fin[0][0]:7.2f} {100*floor/fin[0][0]:6.0f}% {fin[0][2]:8.3f} {fin[0][1]}; "
                  f"{fin[1][0]:.2f} {fin[1][1]}", flush=True)
    print(f"# total {time.time()-t0:.0f} s; {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
