"""Small region graphs for the kernel tests, built with the IR directly (CPU-sized shapes that
are not multiples of 16, so every program has edge tiles)."""

import numpy as np

from superopt.ir.graph import GraphBuilder


def rmsnorm_matmul(m=5, k=40, n=24, epilogue="none"):
    """x * (mean(x²) + eps)^-1/2 * g @ W (+ bias / relu), the mean written as a matmul by a
    column of 1/k (the IR has no mean yet) and eps as a weight."""
    b = GraphBuilder()
    x = b.input("x", (m, k))
    c = b.weight("c", (k, 1), np.full((k, 1), 1.0 / k))
    eps = b.weight("eps", (1,), np.array([1e-6]))
    g, w = b.weight("g", (k,)), b.weight("w", (k, n))
    r = b.op("pow", b.op("add", b.op("matmul", b.op("mul", x, x), c), eps), exponent=-0.5)
    y = b.op("matmul", b.op("mul", b.op("mul", x, r), g), w)
    if epilogue == "bias":
        y = b.op("add", y, b.weight("bias", (n,)))
    elif epilogue == "relu":
        y = b.op("relu", y)
    return b.build([y])


def gate_up(m=3, k=40, n=24, residual=True):
    """sigmoid(x@Wg)·(x@Wu) (+ residual): the SwiGLU shape with the IR's sigmoid."""
    b = GraphBuilder()
    x = b.input("x", (m, k))
    wg, wu = b.weight("wg", (k, n)), b.weight("wu", (k, n))
    gate = b.op("matmul", x, wg)
    y = b.op("mul", b.op("mul", gate, b.op("sigmoid", gate)), b.op("matmul", x, wu))
    if residual:
        y = b.op("add", y, b.input("res", (m, n)))
    return b.build([y])


def matmul_epilogue(m=5, k=40, n=24):
    """gelu(x@W + bias) + residual."""
    b = GraphBuilder()
    x, w, bias, res = b.input("x", (m, k)), b.weight("w", (k, n)), b.weight("bias", (n,)), b.input("res", (m, n))
    return b.build([b.op("add", b.op("gelu", b.op("add", b.op("matmul", x, w), bias)), res)])


def attention(h=4, kvh=2, l=5, s=37, d=16, causal=0, scale=0.25, interleave=True):
    """sdpa over k/v repeated from kvh to h heads by split + concat (GQA as layout ops)."""
    b = GraphBuilder()
    q, k, v = b.input("q", (1, h, l, d)), b.input("k", (1, kvh, s, d)), b.input("v", (1, kvh, s, d))

    def rep(x):
        if kvh == h:
            return x
        parts = b.op("split", x, axis=1, sizes=(1,) * kvh)
        parts = parts if isinstance(parts, tuple) else (parts,)
        g = h // kvh
        seq = [p for p in parts for _ in range(g)] if interleave else [p for _ in range(g) for p in parts]
        return b.op("concat", *seq, axis=1)

    return b.build([b.op("sdpa", q, rep(k), rep(v), scale=scale, causal=causal)])
