"""Small region graphs for the kernel tests, built with the IR directly (CPU-sized shapes that
are not multiples of 16, so every program has edge tiles)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from superopt.ir.graph import GraphBuilder
from superopt.semantics.reference import evaluate, random_inputs


ROOT = Path(__file__).resolve().parents[1]


def run_child(code: str, tmp_path, interpret: bool = True) -> str:
    """Run ``code`` in a fresh Python (the repository and tests/ importable, its own kernel
    cache under ``tmp_path``), under Triton's interpreter unless ``interpret`` is false (then
    Triton compiles for the GPU: PTX checks); its standard output, after it exits 0."""
    env = dict(os.environ, SUPEROPT_KERNEL_CACHE=str(tmp_path / "kernels"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def child_check(module: str, fn: str, tmp_path, interpret: bool = True):
    """``module.fn()`` run in a child (:func:`run_child`), its JSON result."""
    code = f"import json, {module} as t; print(json.dumps(t.{fn}()))"
    return json.loads(run_child(code, tmp_path, interpret).strip().splitlines()[-1])


def skip_without_nvidia_backend() -> None:
    """Skip the calling test where this Triton cannot compile for an NVIDIA GPU (PTX checks)."""
    import pytest
    try:
        from triton.backends import backends
    except ImportError:
        pytest.skip("this Triton has no backend registry")
    if "nvidia" not in backends:
        pytest.skip("this Triton has no NVIDIA backend")


def streaming_program(region, i=0):
    """Candidate ``i``'s program of ``region`` in bf16, its 2-d weights of 1024 rows read from
    their compile-time transposes (``X__t``, as a decode step's linears are); and their names."""
    from superopt.kernel import generate_kernels
    from superopt.kernel.tune import specialize, transposed
    p = generate_kernels(region, verify=False).candidates[i].program
    names = [t.name for t in p.inputs if len(t.shape) == 2 and t.shape[0] == 1024]
    return specialize(transposed(p, names), "bf16"), names


def relative_errors(got, want) -> list[float]:
    """``max |g - w| / max |w|`` for each output pair (torch tensors or numpy arrays)."""
    as64 = lambda x: np.asarray(x.float().numpy() if hasattr(x, "numpy") else x, dtype=np.float64)  # noqa: E731
    return [float(np.max(np.abs(as64(g) - as64(w))) / np.max(np.abs(as64(w)))) for g, w in zip(got, want)]


def program_inputs(region, cand, seed=3):
    """A candidate program's inputs by name: the region's random inputs and weights, and what its
    compile-time preparation (a folded weight) computes from them."""
    env = random_inputs(region, np.random.default_rng(seed))
    env.update({k: np.asarray(v, float) for k, v in region.data.items()})
    if cand.prep:
        env.update(zip(cand.prep.names, evaluate(cand.prep.graph, env)))
    return {t.name: np.asarray(env[t.name]).reshape(t.shape) for t in cand.program.inputs}


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


def layernorm_matmul(m=5, k=40, n=24, affine=True, eps=1e-5):
    """gelu((layernorm(x)·g + beta) @ W + bias): BERT's and ViT's shape."""
    b = GraphBuilder()
    x = b.input("x", (m, k))
    h = b.op("layernorm", x, eps=eps)
    if affine:
        h = b.op("add", b.op("mul", h, b.weight("g", (k,))), b.weight("beta", (k,)))
    y = b.op("add", b.op("matmul", h, b.weight("w", (k, n))), b.weight("bias", (n,)))
    return b.build([b.op("gelu", y)])


def hf_rmsnorm_swiglu(m=3, k=40, n=24, eps=1e-6):
    """Llama's RMSNorm as Hugging Face writes it (float32 upcast, pow, mean, + eps, rsqrt, cast
    back, weight) into the gate and up projections with SiLU·mul."""
    b = GraphBuilder()
    x = b.input("x", (1, m, k), "bfloat16")
    h = b.op("cast", x, dtype="float32")
    var = b.op("mean", b.op("pow", h, exponent=2.0), axis=-1, keepdim=1)
    r = b.op("rsqrt", b.op("add", var, b.weight("eps", (), np.array(eps, dtype=np.float32))))
    h = b.op("mul", b.weight("g", (k,), dtype="bfloat16"), b.op("cast", b.op("mul", h, r), dtype="bfloat16"))
    gate = b.op("matmul", h, b.weight("wg", (k, n), dtype="bfloat16"))
    up = b.op("matmul", h, b.weight("wu", (k, n), dtype="bfloat16"))
    return b.build([b.op("mul", b.op("silu", gate), up)])


def gqa_sdpa(h=4, kvh=2, l=1, s=37, d=16):
    """sdpa with gqa=1: k/v with fewer heads than q (enable_gqa)."""
    b = GraphBuilder()
    q, k, v = b.input("q", (1, h, l, d)), b.input("k", (1, kvh, s, d)), b.input("v", (1, kvh, s, d))
    return b.build([b.op("sdpa", q, k, v, scale=d ** -0.5, gqa=1)])


def rotary_sdpa(h=4, kvh=2, l=1, s=37, d=16, mask=True, causal=0, dtype="float32", neg="smul", table=(1, 1, None),
                swap=False, splits=1, shared=False):
    """HF's attention with the queries' rotary embedding in front: q·cos + rotate_half(q)·sin
    (rotate_half = concat(-q_hi, q_lo), the -1 a scalar weight as the import writes it), then sdpa
    with gqa=1 (and an additive mask, or causal). ``table``: the cos/sin shape before the head
    dim (None: L); ``neg``: "smul" or "mul" by the -1; ``swap``: every commutative operand pair
    the other way round; ``splits``: the halves from one split of q or from two; ``shared``: the
    rotated queries are a graph output too."""
    b = GraphBuilder()
    q = b.input("q", (1, h, l, d), dtype)
    k, v = b.input("k", (1, kvh, s, d), dtype), b.input("v", (1, kvh, s, d), dtype)
    tshape = tuple(l if t is None else t for t in table) + (d,)
    c, sn = b.input("cos", tshape, dtype), b.input("sin", tshape, dtype)
    lo, hi = b.op("split", q, axis=3, sizes=(d // 2, d // 2))
    if splits == 2:
        hi = b.op("split", q, axis=3, sizes=(d // 2, d // 2))[1]
    m1 = b.weight("minus_one", (), np.array(-1.0, np.float32), dtype)
    pair = (lambda x, y: (y, x)) if swap else (lambda x, y: (x, y))
    ng = b.op("smul", hi, m1) if neg == "smul" else b.op("mul", *pair(hi, m1))
    e = b.op("add", *pair(b.op("mul", *pair(q, c)), b.op("mul", *pair(b.op("concat", ng, lo, axis=3), sn))))
    args = [e, k, v] + ([b.input("mask", (1, 1, l, s), dtype)] if mask else [])
    return b.build([b.op("sdpa", *args, scale=d ** -0.5, causal=causal, gqa=1)] + ([e] if shared else []))


def normed_sdpa(h=4, kvh=2, l=1, s=37, d=16, rotary=True, transposed=True, swap=False, casts=False,
                dtype="float32", shared=False, projected=False):
    """Qwen3's attention: a per-head RMSNorm of the queries over the head dim (``q_norm``:
    w·(x·rsqrt(mean(x²) + eps)), the eps a scalar weight as the import writes it), on the
    source [1, L, H, D] then transposed to [1, H, L, D] (``transposed``; else the source is
    [1, H, L, D] already), then the rotary embedding (``rotary``) and sdpa with an additive mask.
    ``swap``: every commutative operand pair the other way round; ``casts``: the float32 upcast
    and the cast back as HF writes them; ``shared``: the normalized queries are an output too;
    ``projected``: the source is a linear layer's output (``q_proj``), so that its region may take
    the upcast into its epilogue."""
    b = GraphBuilder()
    shape = (1, l, h, d) if transposed else (1, h, l, d)
    if projected:
        x = b.op("reshape", b.op("matmul", b.input("x", (1, l, 32), dtype), b.weight("wq", (32, h * d), dtype=dtype)),
                 shape=shape)
    else:
        x = b.input("q", shape, dtype)
    k, v = b.input("k", (1, kvh, s, d), dtype), b.input("v", (1, kvh, s, d), dtype)
    pair = (lambda a, c: (c, a)) if swap else (lambda a, c: (a, c))
    xf = b.op("cast", x, dtype="float32") if casts else x
    ms = b.op("mean", b.op("pow", xf, exponent=2.0), axis=3, keepdim=1)
    eps = b.weight("eps", (), np.array(1e-6, np.float32), "float32" if casts else dtype)
    y = b.op("mul", *pair(xf, b.op("rsqrt", b.op("add", *pair(ms, eps)))))
    y = b.op("cast", y, dtype=dtype) if casts else y
    nq = b.op("mul", *pair(b.weight("q_norm", (d,), dtype=dtype), y))
    q = b.op("transpose", nq, perm=(0, 2, 1, 3)) if transposed else nq
    if rotary:
        c, sn = b.input("cos", (1, 1, l, d), dtype), b.input("sin", (1, 1, l, d), dtype)
        lo, hi = b.op("split", q, axis=3, sizes=(d // 2, d // 2))
        ng = b.op("smul", hi, b.weight("minus_one", (), np.array(-1.0, np.float32), dtype))
        q = b.op("add", b.op("mul", q, c), b.op("mul", b.op("concat", ng, lo, axis=3), sn))
    out = b.op("sdpa", q, k, v, b.input("mask", (1, 1, l, s), dtype), scale=d ** -0.5, gqa=1)
    return b.build([out] + ([nq] if shared else []))


def masked_sdpa(h=4, kvh=2, l=1, s=37, d=16, mask_shape=(1, 1, 1, 37)):
    """sdpa with an additive mask (a decode step over a static cache: -inf past the position)."""
    b = GraphBuilder()
    q, k, v = b.input("q", (1, h, l, d)), b.input("k", (1, kvh, s, d)), b.input("v", (1, kvh, s, d))
    m = b.input("mask", mask_shape)
    return b.build([b.op("sdpa", q, k, v, m, scale=d ** -0.5, gqa=1)])


def residual_layernorm(m=9, k=32, n=40, pre_ln=False, eps=1e-5, dtype="float32", prologue=False):
    """A row-owning region: r = res + (x @ W + bias), y = layernorm(r)·g + beta. Post-LN (BERT:
    y is the one output) or pre-LN (GPT-2, ViT: r, the residual stream, is an output too).
    ``prologue``: x is itself a LayerNorm's output (a norm before the matmul as well)."""
    b = GraphBuilder()
    x, res = b.input("x", (m, k), dtype), b.input("res", (m, n), dtype)
    if prologue:
        x = b.op("layernorm", x, eps=eps)
    h = b.op("add", b.op("matmul", x, b.weight("w", (k, n), dtype=dtype)), b.weight("bias", (n,), dtype=dtype))
    r = b.op("add", res, h)
    y = b.op("add", b.op("mul", b.op("layernorm", r, eps=eps), b.weight("g", (n,), dtype=dtype)),
             b.weight("beta", (n,), dtype=dtype))
    return b.build([r, y] if pre_ln else [y])


# ---- attention regions cut from a graph, and checks of their generated programs ----------------

def attention_region(g, prologue=True):
    """The one attention region of ``g`` (with or without prologues)."""
    from superopt.kernel.regions import find_regions
    (r,) = [r for r in find_regions(g, prologue=prologue) if r.kind == "attention"]
    return r


def region_ops(g, r) -> list[str]:
    """The operators of region ``r`` of ``g``, weights aside, sorted."""
    return sorted(g.nodes[i].op for i in r.nodes if g.nodes[i].op != "weight")


def refused_when_forged(region, cand, fn, match="fingerprint differs"):
    """``cand``'s program edited by ``fn`` (text -> text) changes and is refused for ``match``."""
    import re
    from superopt.kernel import parse_program, verify_kernel
    text = fn(cand.program.text())
    assert text != cand.program.text()
    v = verify_kernel(parse_program(text), region, cand.identities, cand.prep)
    assert v.status != "proved" and re.search(match, v.reason), v.reason


def programs_match_in_float64(region, seed):
    """Every unverified translation of ``region``, emulated tile by tile, equals its float64
    semantics on one random input set."""
    from superopt.kernel import generate_kernels, run_reference
    rep = generate_kernels(region, verify=False)
    assert rep.candidates
    env = random_inputs(region, np.random.default_rng(seed))
    env.update({k: np.asarray(v, float) for k, v in region.data.items()})
    want = evaluate(region, env)[0]
    for cand in rep.candidates:
        ins = {t.name: np.asarray(env[t.name]).reshape(t.shape) for t in cand.program.inputs}
        got = run_reference(cand.program, ins)[0].reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def profile_of_first_candidates(graph, dtype="fp32", us=1.0, inductor_us=3.0, skip=()):
    """Entries for every region of ``graph`` with a proved kernel (regions of a kind in ``skip``
    left out), as a tuning run writes them: the first candidate, ``us`` against ``inductor_us``."""
    from superopt.kernel import default_configs
    from superopt.kernel.choose import cached_candidates
    from superopt.kernel.profile import KernelEntry, KernelProfile, region_signature
    from superopt.kernel.regions import canonical_region, find_regions
    from superopt.kernel.tune import config_text, variants
    prof = KernelProfile()
    for region in find_regions(graph):
        if region.kind in skip:
            continue
        canon = canonical_region(region.graph)[0]
        cands, _ = cached_candidates(canon)
        if not cands:
            continue
        c = cands[0]
        names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
        prog = variants(c.program, names, dtype)[-1]
        prof.add(KernelEntry(region_signature(canon), dtype, "test-gpu", prog.text(),
                             config_text(default_configs(prog)[0]), us, inductor_us))
    return prof
