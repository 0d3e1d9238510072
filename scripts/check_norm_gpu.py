"""Where an RMSNorm -> linear kernel loses time on the GPU (decode shapes, bf16, the weight
stored [N, K] with the norm weight folded in): variants of one hand-written Triton kernel that
differ only in how the row statistics are computed, against torch, each timed alone with the
L2 flushed (``superopt.kernel.tune.measure_us``). What it showed (H100, 2026-11-26) decided the
lowering in ``superopt/kernel/triton_lower.py``: reusing the dot's operand tile for the square
(what the generated kernels did) cost 26.1 us at 1x4096->4096 against 14.2 for the bare linear
(a layout conversion every iteration); loading x a second time 16.0; a prepass loop 14.7.

    python scripts/check_norm_gpu.py          # on a CUDA machine; prints a table (about 5 min)
"""
import sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp
import triton, triton.language as tl

K = 4096

@triton.jit
def norm_linear(x, w, out, M, eps, N: tl.constexpr, K: tl.constexpr, STATS: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, BM)
    mask_m = offs_m < M
    acc = tl.zeros((BM, BN), tl.float32)
    ss = tl.zeros((BM, BK), tl.float32)
    ssd = tl.zeros((BM, 16), tl.float32)
    if STATS == 3:  # prepass: a loop of its own before the matmul loop
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            xk = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
            ss += xk * xk
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        xk = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        wk = tl.load(w + offs_n[:, None] * K + offs_k[None, :])
        acc += tl.dot(xk, tl.trans(wk), out_dtype=tl.float32)
        if STATS == 1:  # lane accumulator from the dot's operand (today's generated kernel)
            xf = xk.to(tl.float32)
            ss += xf * xf
        if STATS == 2:  # x loaded a second time for the square
            x2 = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0,
                         eviction_policy="evict_last").to(tl.float32)
            ss += x2 * x2
        if STATS == 4:  # the sum of squares as a second dot (x*x in bf16 times ones)
            xf = xk.to(tl.float32)
            ssd += tl.dot((xf * xf).to(tl.bfloat16), tl.full((BK, 16), 1.0, tl.bfloat16), out_dtype=tl.float32)
    if STATS == 4:
        tot = tl.max(ssd, axis=1)
    else:
        tot = tl.sum(ss, axis=1)
    if STATS == 0:
        r = tl.full((BM,), 1.0, tl.float32)
    else:
        r = tl.rsqrt(tot / K + eps)
    y = acc * r[:, None]
    tl.store(out + offs_m[:, None] * N + offs_n[None, :], y.to(tl.bfloat16), mask=mask_m[:, None])


STATS = {0: "none (bare linear)", 1: "lane (today)", 2: "reload x", 3: "prepass loop", 4: "stats by dot"}
CONFIGS = [(bn, bk, wp, st) for bn in (16, 32, 64) for bk in (128, 256, 512) for wp, st in ((4, 3), (4, 4), (8, 3))]
SHAPES = [(1, 4096), (1, 6144), (1, 1024), (16, 4096), (16, 6144)]


def launch(xx, ww, oo, m, n, stats, cfg):
    bn, bk, wp, st = cfg
    norm_linear[(n // bn,)](xx, ww, oo, m, 1e-6, N=n, K=K, STATS=stats, BM=16, BN=bn, BK=bk, num_warps=wp, num_stages=st)


def warm(task):
    import torch
    m, n, stats, cfg = task
    try:
        x = torch.zeros(m, K, device="cuda", dtype=torch.bfloat16)
        w = torch.zeros(n, K, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        launch(x, w, o, m, n, stats, cfg)
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
    tasks = [(m, n, s, c) for m, n in SHAPES for s in STATS for c in CONFIGS]
    with ProcessPoolExecutor(16, mp_context=mp.get_context("spawn")) as ex:
        errs = dict(zip(tasks, ex.map(warm, tasks)))
    print(f"# compiled {len(tasks)} in {time.time()-t0:.0f} s, {sum(bool(e) for e in errs.values())} failed", flush=True)
    torch._inductor.config.freezing = True
    print(f"{'shape':<14} {'variant':<20} {'us':>7} {'floor%':>7} {'err':>8} config (BN BK warps stages); 2nd best")
    for m, n in SHAPES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, K, generator=g).cuda().bfloat16()
        w = (torch.randn(n, K, generator=g) / 64).cuda().bfloat16()
        o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        floor = (n * K * 2 + m * K * 2 + m * n * 2) / 3.35e12 * 1e6
        xf = x.float()
        want = F.linear((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16(), w)

        def ref(x):
            xf = x.float()
            return F.linear((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype), w)
        torch._dynamo.reset()
        comp = torch.compile(ref, dynamic=False)
        with torch.no_grad():
            comp(x); comp(x)
            rows = [("inductor norm+linear", measure_us(comp, [x]), ""), ("F.linear alone", measure_us(lambda x: F.linear(x, w), [x]), "")]
        for name, us, c in rows:
            print(f"{m}x{K}->{n:<6} {name:<20} {us:7.2f} {100*floor/us:6.0f}%")
        for s, sname in STATS.items():
            res = []
            for c in CONFIGS:
                if errs[(m, n, s, c)]:
                    continue
                launch(x, w, o, m, n, s, c)
                err = float((o.float() - (want.float() if s else F.linear(x, w).float())).abs().max())
                us = measure_us(lambda: launch(x, w, o, m, n, s, c), [], 20)
                res.append((us, c, err))
            res.sort()
            fin = sorted((measure_us(lambda: launch(x, w, o, m, n, s, c), [], 60), c, e) for _, c, e in res[:4])
            us, c, err = fin[0]
            print(f"{m}x{K}->{n:<6} {sname:<20} {us:7.2f} {100*floor/us:6.0f}% {err:8.3f} {c}; {fin[1][0]:.2f} {fin[1][1]}", flush=True)
    print(f"# total {time.time()-t0:.0f} s; {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")


if __name__ == "__main__":
    main()
