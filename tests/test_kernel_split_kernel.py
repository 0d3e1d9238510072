"""A split schedule in one kernel: every program stores its chunk's partials, the last program of
its grid tile to draw a ticket combines them and resets the tile's counter.

Under Triton's interpreter (programs run one after another, so the last one combines) every
split kind -- sum (a linear with masked edge tiles; an RMSNorm's lane accumulators), max (a
running max alone), rescale (online softmax: grouped-query decode, an additive mask that masks a
whole chunk) -- at splits that leave the last chunk short or empty, launched twice in a row by
one launcher (the counters left zero in between), against the unsplit kernel and float64 numpy.
Forged lowerings (the ticket compared with S instead of S - 1, the counter reset by every
program, no reset) are refused by ``launch_errors``, the check the tuner runs on the device. (A
race, such as the first ticket combining, is out of the interpreter's reach: it runs programs in
order, and that forgery, resetting the counter each time, ends with the last program combining.) The source
compiled for an H100 (PTX, no GPU needed) orders the partial stores, a barrier, the acq_rel
ticket and the ``.cg`` loads of the partials as the lowering's docstring argues.
"""

import functools
import json
import re
from dataclasses import replace

import numpy as np
import pytest

from kernel_regions import attention, child_check, masked_sdpa, rmsnorm_matmul, run_child, skip_without_nvidia_backend
from superopt.kernel import generate_kernels, parse_program, to_triton
from superopt.kernel.emulate import default_emulation_config
from superopt.kernel.split import chunks
from superopt.semantics.reference import evaluate, random_inputs
from test_kernel_split import LINEAR as LINEAR_T  # the linear+ReLU program, sized by format

pytest.importorskip("triton")
TOL = 2e-5

LINEAR = LINEAR_T.format(m=5, k=70, n=24)

ROWMAX = """kernel rowmax
dim M 5
dim K 70
input x f32[5,70]
output y f32[5]
grid M
loop K
acc m[M] = -1e+30
body:
  a = load x[M,K]
  t = max a dim=K
  u = maximum m t
  update m u
post:
  store y[M] m
"""


def _text_case(text, want_fn, seed):
    p = parse_program(text)
    rng = np.random.default_rng(seed)
    ins = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    return p, ins, [want_fn(ins)]


REGIONS = {
    "rmsnorm": lambda: rmsnorm_matmul(m=5, k=64, n=24, epilogue="bias"),
    "gqa": lambda: attention(h=4, kvh=2, l=1, s=50),
    "masked": lambda: masked_sdpa(h=4, kvh=2, l=1, s=50, mask_shape=(1, 1, 1, 50)),
}


@functools.lru_cache(maxsize=None)
def _loop_candidate(key):
    region = REGIONS[key]()
    return region, next(c for c in generate_kernels(region).candidates if c.program.loop)


def _region_case(key, seed, fix=None):
    region, cand = _loop_candidate(key)
    env = random_inputs(region, np.random.default_rng(seed))
    env.update({k: np.asarray(v, float) for k, v in region.data.items()})
    if fix:
        fix(env)
    if cand.prep:
        env.update(zip(cand.prep.names, evaluate(cand.prep.graph, env)))
    ins = {t.name: np.asarray(env[t.name]).reshape(t.shape) for t in cand.program.inputs}
    return cand.program, ins, [np.asarray(w, np.float64) for w in evaluate(region, env)]


def _static_cache_mask(env):
    """0 for the first 29 of 50 positions, -inf after: keys 32-49 (a whole tile, a whole chunk at
    split 2) masked."""
    env["mask"] = np.where(np.arange(50) < 29, 0.0, -np.inf).reshape(1, 1, 1, 50)


#: name -> (the case at a seed, the splits run); loop tiles at blocks of 16: 5, 5, 4, 4, 4
CASES = {
    "sum: linear, masked edges": (lambda s: _text_case(LINEAR, lambda i: np.maximum(i["x"] @ i["w"], 0), s),
                                  (2, 3, 4)),
    "max: running max alone": (lambda s: _text_case(ROWMAX, lambda i: i["x"].max(axis=1), s), (2, 4)),
    "sum: rmsnorm lane accumulators": (lambda s: _region_case("rmsnorm", s), (3,)),
    "rescale: gqa decode": (lambda s: _region_case("gqa", s), (2, 3)),
    "rescale: masked decode": (lambda s: _region_case("masked", s, _static_cache_mask), (2, 3)),
}

#: name -> (edit of the split kernel's source at split S, which launch must be wrong)
FORGED = {
    "ticket compared with S": (lambda src, s: src.replace(f"if ticket == {s - 1}:", f"if ticket == {s}:"), 0),
    "every program resets": (lambda src, s: src.replace("        tl.store(p_cnt + pid0, 0)\n", "").replace(
        f"    if ticket == {s - 1}:\n", f"    tl.store(p_cnt + pid0, 0)\n    if ticket == {s - 1}:\n"), 0),
    "no counter reset": (lambda src, s: src.replace("tl.store(p_cnt + pid0, 0)\n", ""), 1),
}


def _tensors(p, ins):
    import torch
    return [torch.tensor(ins[t.name], dtype=torch.float32) for t in p.inputs]


def check_cases() -> dict:
    """(In the child, interpreted.) Each case unsplit, then split, two launches each."""
    import torch
    from superopt.kernel.compile import compile_program, launch_errors
    out, kept = {}, []
    for k, name in enumerate(sorted(CASES)):
        make, splits = CASES[name]
        p, ins, want = make(10 + k)
        args, want = _tensors(p, ins), [torch.tensor(w) for w in want]
        base = default_emulation_config(p)
        unsplit = compile_program(p, base)(*args)
        kept.append(unsplit)
        res = {"unsplit": launch_errors(compile_program(p, base), args, want), "splits": {}}
        for s in splits:
            run = compile_program(p, replace(base, split=s))
            res["splits"][s] = {"numpy": launch_errors(run, args, want), "unsplit": launch_errors(run, args, unsplit),
                                "counters": [int(c.abs().sum()) for c in run.counters.values()],
                                "chunks": list(chunks(p, replace(base, split=s)))}
        out[name] = res
    return out


def _forge(edit, src: str, s: int) -> str:
    forged = edit(src, s)
    assert forged != src, "the forgery did not change the source"
    return forged


def check_forged() -> dict:
    """(In the child, interpreted.) The linear case at split 3 and the masked decode at split 2,
    each forged lowering launched twice on fresh inputs."""
    from superopt.kernel import compile as compile_mod
    from superopt.kernel.compile import compile_program, launch_errors
    real, out = compile_mod.to_triton, {}
    for case, s in (("sum: linear, masked edges", 3), ("rescale: masked decode", 2)):
        for k, (name, (edit, _)) in enumerate(sorted(FORGED.items())):
            p, ins, want = CASES[case][0](100 + k)
            cfg = replace(default_emulation_config(p), split=s)
            compile_mod._LOADED.clear()
            compile_mod.to_triton = lambda *a, edit=edit, s=s: _forge(edit, real(*a), s)
            try:
                import torch
                errs = launch_errors(compile_program(p, cfg), _tensors(p, ins), [torch.tensor(w) for w in want])
            finally:
                compile_mod.to_triton = real
                compile_mod._LOADED.clear()
            out[f"{case} / {name}"] = errs
    return out


def check_random_linears(examples: int = 12) -> int:
    """(In the child, interpreted.) Hypothesis: linears of random sizes, loop blocks and splits
    (edges masked on every dim, chunks short or empty), the one kernel launched twice against
    numpy; raises on a counterexample (the child then fails with it)."""
    import torch
    from hypothesis import given, settings, strategies as st
    from superopt.kernel.compile import compile_program, launch_errors
    from superopt.kernel.program import TileConfig
    seen = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(st.integers(1, 20), st.integers(1, 90), st.integers(1, 40), st.sampled_from([16, 32]), st.integers(2, 7),
           st.integers(0, 2**31))
    def prop(m, k, n, bk, split, seed):
        p = parse_program(LINEAR_T.format(m=m, k=k, n=n))
        rng = np.random.default_rng(seed)
        ins = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
        run = compile_program(p, TileConfig((("M", 16), ("N", 16), ("K", bk)), split=split))
        errs = launch_errors(run, _tensors(p, ins), [torch.tensor(np.maximum(ins["x"] @ ins["w"], 0))])
        assert max(errs) < TOL and [int(c.abs().sum()) for c in run.counters.values()] == [0], (m, k, n, bk, split, errs)
        seen.append(1)
    prop()
    return len(seen)


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    code = ("import json, test_kernel_split_kernel as t; "
            "print(json.dumps({'cases': t.check_cases(), 'forged': t.check_forged(), "
            "'random': t.check_random_linears()}))")
    return json.loads(run_child(code, tmp_path_factory.mktemp("one")).strip().splitlines()[-1])


def test_the_cases_cover_short_and_empty_last_chunks():
    """A chunk is ``per`` loop tiles; the splits run leave the last one short or empty."""
    kinds = set()
    for name, (make, splits) in CASES.items():
        p, _, _ = make(0)
        for s in splits:
            tiles, per = chunks(p, replace(default_emulation_config(p), split=s))
            last = tiles - (s - 1) * per
            kinds.add("empty" if last <= 0 else "short" if last < per else "full")
    assert kinds == {"empty", "short", "full"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_kernel_split_equals_unsplit_and_numpy_twice(interp, name):
    res = interp["cases"][name]
    assert max(res["unsplit"]) < TOL, res
    for s, r in res["splits"].items():
        assert len(r["numpy"]) == 2 and max(r["numpy"]) < TOL and max(r["unsplit"]) < TOL, (s, r)
        assert r["counters"] == [0], (s, r)     # the last program left its tile's counter zero


def test_one_kernel_split_of_random_linears(interp):
    assert interp["random"] >= 12   # every example passed (a counterexample fails the child)


@pytest.mark.parametrize("name", sorted(FORGED))
@pytest.mark.parametrize("case", ["sum: linear, masked edges", "rescale: masked decode"])
def test_forged_lowerings_are_refused(interp, case, name):
    errs = interp["forged"][f"{case} / {name}"]
    wrong = FORGED[name][1]
    assert not errs[wrong] < 1e-2, errs          # NaN (garbage) or far off: refused
    if wrong == 1:
        assert errs[0] < TOL, errs               # a missing reset is right once, then wrong


def test_one_kernel_source_has_the_ticket_and_no_second_kernel():
    p = parse_program(LINEAR)
    src = to_triton(p, replace(default_emulation_config(p), split=3))
    assert src.count("@triton.jit") == 1 and "superopt_partial" not in src
    tail = src[src.index("tl.debug_barrier()"):]
    assert tail.index("tl.atomic_add(p_cnt + pid0, 1, sem='acq_rel', scope='gpu')") < tail.index("if ticket == 2:") \
        < tail.index("cache_modifier='.cg'") < tail.index("tl.store(p_cnt + pid0, 0)") < tail.index("tl.store(p_y")
    assert "p_cnt" not in to_triton(p, default_emulation_config(p))


def check_ptx() -> dict:
    """(In the child, compiled for sm_90.) The order of the memory operations around the ticket."""
    from superopt.kernel.compile import compile_ptx
    from superopt.kernel.tune import specialize
    out = {}
    for name, dtype, s in (("sum: linear, masked edges", "fp32", 3), ("rescale: masked decode", "bf16", 2)):
        p = specialize(CASES[name][0](0)[0], dtype)
        lines = [ln.strip() for ln in compile_ptx(p, replace(default_emulation_config(p), split=s)).splitlines()]
        ops = [("atom" if "atom.global" in ln else "bar" if ln.startswith("bar.sync") else
                "ldcg" if "ld.global.cg" in ln else "st" if "st.global" in ln else None) for ln in lines]
        out[name] = {"ops": [o for o in ops if o], "atoms": [ln for ln in lines if "atom.global" in ln]}
    return out


def test_ptx_orders_partials_barrier_ticket_and_cg_loads(tmp_path):
    skip_without_nvidia_backend()
    res = child_check("test_kernel_split_kernel", "check_ptx", tmp_path, interpret=False)
    for name, r in res.items():
        ops = r["ops"]
        assert len(r["atoms"]) == 1 and re.search(r"atom\.global\.gpu\.acq_rel\.add", r["atoms"][0]), r["atoms"]
        at = ops.index("atom")
        assert "bar" in ops[ops.index("st"):at], ops                    # partial stores, a barrier, the ticket
        assert "ldcg" not in ops[:at] and "ldcg" in ops[at:], ops      # partials read after it, from the L2
        assert ops[at + 1:].count("st") >= 2, ops                       # the reset and the output
