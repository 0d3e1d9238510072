"""Split schedules (split-K, flash-decoding): which programs admit one, the emulator's split run
equal to the unsplit one (float64 and the field), the one-kernel Triton lowering equal to the
emulator under the interpreter (more in ``test_kernel_split_kernel.py``), forged combines
refused, and the tuning space's splits."""

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel_regions import attention, gate_up, program_inputs, rmsnorm_matmul
from superopt.kernel import (EXAMPLE, KernelError, TileConfig, generate_kernels, parse_program, run_field,
                             run_reference, split_kind, to_triton, verify_kernel)
from superopt.kernel import emulate as emulate_mod
from superopt.kernel.configs import SPLITS, split_configs
from superopt.kernel.emulate import default_emulation_config
from superopt.kernel.split import chunks
from superopt.kernel.tune import config_text, parse_config, tuning_space
from superopt.semantics.field import P, Field

REGIONS = {  # loop tiles at blocks of 16: 4, 3, 4, 3 (split 3 of 4 tiles leaves the last chunk empty)
    "rmsnorm_matmul": lambda: rmsnorm_matmul(m=5, k=64, n=24, epilogue="bias"),
    "gate_up_silu": lambda: gate_up(m=3, k=40, n=24),
    "attention_gqa_decode": lambda: attention(h=4, kvh=2, l=1, s=50),
    "attention_causal": lambda: attention(h=2, kvh=2, l=5, s=37, causal=1),
}


def _online(region):
    """The first generated candidate with a loop (the online-softmax one for attention)."""
    return next(c for c in generate_kernels(region).candidates if c.program.loop)


@pytest.fixture(scope="module")
def cands():
    return {name: (make(), _online(make())) for name, make in REGIONS.items()}


LINEAR = """kernel linear_relu
dim M {m}
dim K {k}
dim N {n}
input x f32[{m},{k}]
input w f32[{k},{n}]
output y f32[{m},{n}]
grid M N
loop K
acc acc[M,N] = 0
body:
  a = load x[M,K]
  b = load w[K,N]
  c = dot a b
  d = add acc c
  update acc d
post:
  r = relu acc
  store y[M,N] r
"""

NO_LOOP = """kernel scale
dim M 5
input x f32[5]
output y f32[5]
grid M
pre:
  a = load x[M]
  b = mul a 2.0
  store y[M] b
"""


def _linear(m, k, n):
    return parse_program(LINEAR.format(m=m, k=k, n=n))


# ---- which programs admit a split -------------------------------------------------------------

def test_split_kinds_of_generated_programs(cands):
    assert set(split_kind(cands["rmsnorm_matmul"][1].program).values()) == {("sum",)}
    assert set(split_kind(cands["gate_up_silu"][1].program).values()) == {("sum",)}
    kinds = split_kind(cands["attention_gqa_decode"][1].program)
    assert kinds["m"] == ("max",) and kinds["l"] == kinds["o"] == ("rescale", "m", 0.25)


FORGED = {  # an edit of the online-softmax program, and what the refusal names
    "no rescale of o": (("t17 = add t16 t15", "t17 = add o t15"), "'o' adds a value that reads an accumulator"),
    "other scale": (("t11 = exp t10 scale=0.25", "t11 = exp t10 scale=0.5"), "'[lo]' is rescaled by exp"),
    "reversed shift": (("t10 = sub m t7", "t10 = sub t7 m"), "not exp\\(scale·\\(m_old - m_new\\)\\)"),
    "-inf max": (("acc m[L] = -1e+30", "acc m[L] = -inf"), "finite value"),
    "sum not from 0": (("acc l[L] = 0.0", "acc l[L] = 1.0"), "'l' starts at 1.0"),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_combines_are_refused(cands, name):
    (old, new), match = FORGED[name]
    text = cands["attention_gqa_decode"][1].program.text()
    assert old in text
    p = parse_program(text.replace(old, new))
    with pytest.raises(KernelError, match=match):
        split_kind(p)
    cfg = replace(default_emulation_config(p), split=2)
    with pytest.raises(KernelError, match="cannot split"):
        to_triton(p, cfg)
    with pytest.raises(KernelError, match="cannot split"):
        run_reference(p, program_inputs(cands["attention_gqa_decode"][0], cands["attention_gqa_decode"][1]), cfg)


def test_a_sum_reading_another_accumulator_and_no_loop_are_refused():
    with pytest.raises(KernelError, match="no loop to split"):
        split_kind(parse_program(NO_LOOP))
    text = EXAMPLE.replace("acc acc[M,N] = 0", "acc acc[M,N] = 0\nacc b2[M,N] = 0").replace(
        "  update acc d\n", "  update acc d\n  e = add b2 acc\n  update b2 e\n")
    with pytest.raises(KernelError, match="'b2' adds a value that reads an accumulator"):
        split_kind(parse_program(text))
    with pytest.raises(KernelError, match="'acc' is a sum that starts at 1.0"):
        split_kind(parse_program(EXAMPLE.replace("acc acc[M,N] = 0", "acc acc[M,N] = 1")))
    with pytest.raises(KernelError, match="whole number >= 1"):
        TileConfig((("K", 16),), split=0)


# ---- the emulator: split == unsplit ---------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 20), st.integers(1, 90), st.integers(1, 40), st.sampled_from([16, 32]), st.integers(2, 7),
       st.integers(0, 2**31))
def test_split_linear_equals_unsplit_in_float64_and_the_field(m, k, n, bk, split, seed):
    p = _linear(m, k, n)
    cfg = TileConfig((("M", 16), ("N", 16), ("K", bk)))
    rng = np.random.default_rng(seed)
    ins = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    want, got = run_reference(p, ins, cfg), run_reference(p, ins, replace(cfg, split=split))
    assert np.allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    fins = {t.name: rng.integers(0, P, t.shape) for t in p.inputs}
    fw = run_field(p, fins, Field(seed % 1000), np.random.default_rng(0), cfg)
    fg = run_field(p, fins, Field(seed % 1000), np.random.default_rng(0), replace(cfg, split=split))
    assert np.array_equal(fw[0], fg[0])


@pytest.mark.parametrize("name", ["attention_gqa_decode", "attention_causal"])
@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_attention_equals_unsplit(cands, name, split):
    region, cand = cands[name]
    p, ins = cand.program, program_inputs(region, cand)
    cfg = default_emulation_config(p)
    want = run_reference(p, ins, cfg)
    for shift in (None, np.random.default_rng(split)):   # with every running max shifted too
        got = run_reference(p, ins, replace(cfg, split=split), shift)
        assert np.allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    fins = {t.name: np.random.default_rng(7).integers(0, P, t.shape) for t in p.inputs}
    fw = run_field(p, fins, Field(1), np.random.default_rng(0), cfg)
    fg = run_field(p, fins, Field(1), np.random.default_rng(0), replace(cfg, split=split))
    assert np.array_equal(fw[0], fg[0])


def test_a_chunk_masked_whole_at_a_padded_edge_is_not_nan():
    """A static cache's mask (-inf past the position) that masks a whole chunk, its last tile
    padded (50 keys, tiles of 16): the chunk's running max stays at its init, so the exp of a
    padded key's score (0) is exp(s·1e30) = inf; the dot over the keys must not count that lane
    (inf·0 = NaN), as no reduction counts padded elements."""
    from kernel_regions import masked_sdpa
    from superopt.semantics.reference import evaluate, random_inputs
    region = masked_sdpa(h=4, kvh=2, l=1, s=50, mask_shape=(1, 1, 1, 50))
    cand = _online(region)
    env = random_inputs(region, np.random.default_rng(5))
    env["mask"] = np.where(np.arange(50) < 29, 0.0, -np.inf).reshape(1, 1, 1, 50)
    ins = {t.name: np.asarray(env[t.name]).reshape(t.shape) for t in cand.program.inputs}
    want = np.asarray(evaluate(region, env)[0]).reshape(-1)
    cfg = default_emulation_config(cand.program)
    for split in (1, 2, 3):
        got = run_reference(cand.program, ins, replace(cfg, split=split))[0].reshape(-1)
        assert np.allclose(got, want, rtol=1e-10, atol=1e-12), split
    fins = {t.name: np.random.default_rng(7).integers(0, P, t.shape) for t in cand.program.inputs}
    fw = run_field(cand.program, fins, Field(1), np.random.default_rng(0), cfg)
    assert np.array_equal(fw[0], run_field(cand.program, fins, Field(1), np.random.default_rng(0),
                                           replace(cfg, split=2))[0])


def test_verification_checks_a_split_tiling_and_refuses_a_forged_combine(cands, monkeypatch):
    region, cand = cands["attention_gqa_decode"]
    v = verify_kernel(cand.program, region, cand.identities, cand.prep)
    assert v.ok and any("split=3" in c for c in v.checks), v.checks
    # forged: the partials of the softmax summed without their rescale
    monkeypatch.setattr(emulate_mod, "check_split",
                        lambda p, c: {a.name: ("max",) if a.name == "m" else ("sum",) for a in p.accs}
                        if c.split > 1 else None)
    v = verify_kernel(cand.program, region, cand.identities, cand.prep)
    assert v.status == "refuted" and "float64 error" in v.reason and "input set 2" in v.reason, v.reason


# ---- the tuning space and the config's text/JSON ----------------------------------------------

def test_config_text_and_json_carry_the_split():
    c = TileConfig((("M", 16), ("K", 64)), 4, 3, 8)
    assert c.text() == "M=16 K=64 warps=4 stages=3 split=8" and parse_config(config_text(c)) == c
    plain = replace(c, split=1)
    assert "split" not in config_text(plain) and parse_config(config_text(plain)) == plain
    old = json.dumps({"blocks": [["M", 16], ["K", 64]], "num_warps": 4, "num_stages": 3})
    assert parse_config(old).split == 1


def test_split_configs_only_for_small_grids_and_whole_chunks(cands):
    p = _linear(16, 4096, 1024)
    base = TileConfig((("M", 16), ("N", 32), ("K", 256)), 4, 4)
    got = split_configs(p, [base])
    assert [c.split for c in got] == [8, 16, 4, 2]   # 32 programs, 16 K tiles: nearest 2 per SM first
    for c in got:
        tiles, per = chunks(p, c)
        assert (c.split - 1) * per < tiles            # every chunk has a tile
    big = _linear(16, 4096, 14336)
    assert split_configs(big, [TileConfig((("M", 16), ("N", 16), ("K", 256)))]) == []   # 896 programs: enough
    assert split_configs(parse_program(NO_LOOP), [TileConfig((("M", 16),))]) == []
    space = tuning_space(cands["attention_gqa_decode"][1].program, 6)
    assert any(c.split > 1 for c in space) and all(c.split in (1,) + SPLITS for c in space)


# ---- the one-kernel lowering under Triton's interpreter ---------------------------------------

def check_interpreter() -> dict:
    """(In the child.) Each region's loop candidate at split 1, 2 and 3 against the emulator."""
    import torch
    from superopt.kernel import compile_program
    out = {}
    for name in sorted(REGIONS):
        region = REGIONS[name]()
        cand = _online(region)
        ins = program_inputs(region, cand)
        cfg = default_emulation_config(cand.program)
        errs = []
        for split in (1, 2, 3):
            c = replace(cfg, split=split)
            want = run_reference(cand.program, ins, c)
            got = compile_program(cand.program, c)(*[torch.tensor(ins[t.name], dtype=torch.float32)
                                                     for t in cand.program.inputs])
            errs.append(max(float(np.max(np.abs(g.numpy() - w)) / (np.max(np.abs(w)) + 1e-12))
                            for g, w in zip(got, want)))
        out[name] = {"errors": errs, "tiles": chunks(cand.program, cfg)[0]}
    return out


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    from kernel_regions import run_child
    code = "import json, test_kernel_split as t; print(json.dumps(t.check_interpreter()))"
    return json.loads(run_child(code, tmp_path_factory.mktemp("split")).strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_one_kernel_lowering_matches_the_emulator(interp, name):
    res = interp[name]
    assert res["tiles"] in (3, 4) and len(res["errors"]) == 3
    assert max(res["errors"]) < 2e-5, res


def test_choose_takes_a_measured_split_config(tmp_path, monkeypatch):
    """A profile entry whose config has a split is a variant of a proved candidate like any
    other: the program text is checked, the config travels to the kernel node as measured."""
    from test_kernel_integration import _measured, _rms_linear
    from superopt.kernel import choose_kernels
    from superopt.kernel.profile import KernelEntry, KernelProfile
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path))
    g = _rms_linear()
    prof, prog = _measured(g)
    (entry,) = prof.entries.values()
    cfg = replace(parse_config(entry.config), split=2)
    split_prof = KernelProfile()
    split_prof.add(replace(entry, config=config_text(cfg)))
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", split_prof)
    assert rep.chosen == 1, rep.table()
    (node,) = [n for n in h.nodes if n.op == "kernel"]
    assert parse_config(node.attr["config"]).split == 2
    bad = KernelProfile()
    bad.add(KernelEntry(entry.signature, "fp32", "test-gpu", prog.text().replace("1/32", "1/31"),
                        config_text(cfg), 1.0, 5.0))
    assert choose_kernels(g, None, "test-gpu", "fp32", bad)[1].regions[0].decision == "not verified"


def test_long_key_loops_of_an_attention_get_256_key_tiles(cands):
    """A decode attention over 2,048 keys ran fastest with one 256-key tile per split program
    (H100): its key loop may take 256-wide tiles; a linear's loop and a short key loop may not."""
    from superopt.ir.graph import GraphBuilder
    from superopt.kernel import generate_kernels
    from superopt.kernel.configs import _largest
    b = GraphBuilder()
    q, k, v = b.input("q", (1, 4, 1, 16), "bfloat16"), b.input("k", (1, 2, 2048, 16), "bfloat16"), \
        b.input("v", (1, 2, 2048, 16), "bfloat16")
    g = b.build([b.op("sdpa", q, k, v, scale=0.25, causal=0, gqa=1)])
    long = next(c.program for c in generate_kernels(g, verify=False).candidates if c.program.loop)
    att = cands["attention_gqa_decode"][1].program
    assert _largest(long, "S") == 256 and _largest(att, "S") == 128   # the test region's 64 keys
    assert any(c.block("S") == 256 and c.split > 1 for c in tuning_space(long, 12))   # kept within the limit
    assert _largest(_linear(1, 4096, 4096), "K") == 128
    assert all(c.block("K") <= 512 for c in tuning_space(_linear(1, 4096, 4096), 12))
