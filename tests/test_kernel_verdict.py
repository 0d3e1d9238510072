"""Model verdicts: the whole model timed with kernel sets decides which regions get kernels."""

import json

import numpy as np
import pytest

from superopt.ir import GraphBuilder
from superopt.kernel.choose import cached_candidates, choose_kernels, model_signature
from superopt.kernel.model_tuning import pick_kernel_set
from superopt.kernel.profile import PROFILE_ENV, KernelEntry, KernelProfile, ModelVerdict, default_profile, \
    region_signature
from superopt.kernel.regions import canonical_region, find_regions
from superopt.kernel.tune import config_text, variants
from superopt.kernel import default_configs


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kcache"))
    monkeypatch.delenv(PROFILE_ENV, raising=False)


def _two_norm_linears(k=32, n=48, seed=0):
    """Two RMSNorm -> linear regions in a chain (of different shapes, so two signatures)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (4, k))

    def norm_linear(x, k, n, tag):
        ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
        r = b.op("rsqrt", b.op("add", ms, b.weight(f"eps{tag}", (1,), np.full((1,), 1e-5, np.float32))))
        h = b.op("mul", b.op("mul", x, r), b.weight(f"g{tag}", (k,), (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)))
        w = (rng.standard_normal((k, n)) / k ** 0.5).astype(np.float32)
        return b.op("matmul", h, b.weight(f"w{tag}", (k, n), w))
    y = norm_linear(norm_linear(x, k, n, "a"), n, k, "b")
    return b.build([y])


def _profile(graph, us=1.0, inductor_us=1.02):
    """Entries for every region (the kernel 2% faster than Inductor alone: under the margin)."""
    prof, sigs = KernelProfile(), []
    for region in find_regions(graph):
        canon = canonical_region(region.graph)[0]
        cands, _ = cached_candidates(canon)
        c = cands[0]
        names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
        prog = variants(c.program, names, "fp32")[-1]
        sig = region_signature(canon)
        prof.add(KernelEntry(sig, "fp32", "test-gpu", prog.text(), config_text(default_configs(prog)[0]), us, inductor_us))
        sigs.append(sig)
    return prof, sigs


def test_a_verdict_puts_kernels_exactly_where_the_model_ran_faster():
    g = _two_norm_linears()
    prof, sigs = _profile(g)
    assert len(set(sigs)) == 2
    assert choose_kernels(g, None, "test-gpu", "fp32", prof)[1].chosen == 0   # 2% alone: under the margin
    prof.add_model(ModelVerdict(model_signature(g), "fp32", "test-gpu", (sigs[1],), 9.0, 10.0))
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.chosen == 1 and rep.verdict["us"] == 9.0
    kernel_sig = [r.signature for r in rep.regions if r.decision == "kernel"]
    assert kernel_sig == [sigs[1]]
    assert "whole-model timing" in next(r.reason for r in rep.regions if r.decision == "inductor")
    # an empty verdict: no kernel, however much faster alone
    fast, _ = _profile(g, us=1.0, inductor_us=5.0)
    assert choose_kernels(g, None, "test-gpu", "fp32", fast)[1].chosen == 2
    fast.add_model(ModelVerdict(model_signature(g), "fp32", "test-gpu", (), 10.0, 10.0))
    out, rep = choose_kernels(g, None, "test-gpu", "fp32", fast)
    assert out is g and rep.chosen == 0


def test_a_verdict_of_another_graph_is_not_followed():
    g, other = _two_norm_linears(), _two_norm_linears(k=16)
    prof, sigs = _profile(g, inductor_us=5.0)
    prof.add_model(ModelVerdict(model_signature(other), "fp32", "test-gpu", (), 10.0, 10.0))
    assert choose_kernels(g, None, "test-gpu", "fp32", prof)[1].chosen == 2


def test_only_names_the_regions_and_never_admits_an_unproven_program():
    g = _two_norm_linears()
    prof, sigs = _profile(g)
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof, only={sigs[0]})
    assert rep.chosen == 1
    bad = KernelProfile()
    for e in prof.entries.values():   # a program no candidate proves: never used, whatever `only` says
        forged = e.program.replace("1/32", "1/31").replace("1/48", "1/47")   # a wrong mean
        assert forged != e.program
        bad.add(KernelEntry(e.signature, e.dtype, e.device, forged, e.config, 1.0, 9.0))
    rep = choose_kernels(g, None, "test-gpu", "fp32", bad, only=set(sigs))[1]
    assert rep.chosen == 0 and {r.decision for r in rep.regions} == {"not verified"}


def test_a_profile_answers_for_the_gpu_asked_by_name_or_key():
    """Entries store the name torch reports, the kernel pass asks with the cost model's key: an
    H200 gets the H200's entry and verdict, an H100 the H100's, another GPU the H100's both."""
    from superopt.kernel.profile import same_gpu
    assert same_gpu("NVIDIA H200", "h200") and same_gpu("NVIDIA H100 80GB HBM3", "h100")
    assert not same_gpu("NVIDIA H100 80GB HBM3", "h200") and not same_gpu("NVIDIA H200", "NVIDIA H100 PCIe")
    prof = KernelProfile()
    prof.add(KernelEntry("r", "bf16", "NVIDIA H100 80GB HBM3", "p100", "{}", 10.0, 12.0))
    prof.add(KernelEntry("r", "bf16", "NVIDIA H200", "p200", "{}", 8.0, 9.0))
    for dev in ("NVIDIA H200", "h200"):
        assert prof.lookup("r", "bf16", dev).program == "p200"
    for dev in ("NVIDIA H100 80GB HBM3", "h100"):
        assert prof.lookup("r", "bf16", dev).program == "p100"
    assert prof.lookup("r", "bf16", "a100").program == "p100" and prof.lookup("r", "bf16").program == "p100"
    prof.add(KernelEntry("q", "bf16", "NVIDIA H200", "q200", "{}", 8.0, 9.0))
    assert prof.lookup("q", "bf16", "h100").program == "q200"   # measured elsewhere only
    prof.add_model(ModelVerdict("m", "bf16", "NVIDIA H200", ("r",), 8.0, 9.0))
    prof.add_model(ModelVerdict("m", "bf16", "NVIDIA H100 80GB HBM3", (), 12.0, 12.0))
    assert prof.lookup_model("m", "bf16", "h200").kernels == ("r",)
    assert prof.lookup_model("m", "bf16", "h100").kernels == ()
    assert prof.lookup_model("m", "bf16", "a100").kernels == () and prof.lookup_model("m", "bf16").kernels == ()


def test_the_shipped_profiles_hold_h200_measurements_apart():
    """The H200's timings ship beside the H100's (``h200-bf16.json``), each entry of one GPU,
    every H200 verdict approving only kernels measured on the H200."""
    from superopt.kernel.profile import same_gpu, shipped_profile
    prof = shipped_profile()
    h200 = [v for v in prof.models.values() if same_gpu(v.device, "h200")]
    assert h200 and any(same_gpu(v.device, "h100") for v in prof.models.values())
    for v in h200:
        assert v.kernels and all(same_gpu(prof.lookup(k, v.dtype, "h200").device, "h200") for k in v.kernels)


def test_verdicts_round_trip_and_merge(tmp_path):
    prof = KernelProfile()
    prof.add(KernelEntry("r", "bf16", "gpu", "p", "{}", 1.0, 2.0))
    v = ModelVerdict("m", "bf16", "gpu", ("r",), 9.5, 10.0, ((("r",), 9.5), ((), 10.0)), model="tiny")
    prof.add_model(v)
    prof.save(tmp_path / "p.json")
    back = KernelProfile.load(tmp_path / "p.json")
    assert back.lookup_model("m", "bf16", "gpu") == v and back.lookup_model("m", "bf16").speedup == round(10 / 9.5, 4)
    assert back.lookup_model("m", "fp32") is None
    newer = KernelProfile()
    newer.add_model(ModelVerdict("m", "bf16", "gpu", (), 10.0, 10.0))
    assert back.merge(newer).lookup_model("m", "bf16").kernels == ()
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["models"][0]["tried"] = "nonsense"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    from superopt.errors import SerializationError
    with pytest.raises(SerializationError, match="malformed"):
        KernelProfile.load(tmp_path / "bad.json")


def test_the_users_profile_is_read_on_top_of_the_shipped_one(tmp_path, monkeypatch):
    from superopt.errors import SerializationError
    mine = KernelProfile()
    mine.add(KernelEntry("mine", "bf16", "my-gpu", "p", "{}", 1.0, 2.0))
    mine.save(tmp_path / "mine.json")
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "mine.json"))
    prof = default_profile()
    assert prof.lookup("mine", "bf16") is not None and len(prof.entries) > 1
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(SerializationError, match="not a file"):
        default_profile()


def _timer(times):
    calls = []

    def time_set(s):
        calls.append(s)
        return times(s)
    return time_set, calls


def test_pick_keeps_every_kernel_when_all_together_win():
    t, calls = _timer(lambda s: 100.0 - 3 * len(s))
    chosen, base, us, tried = pick_kernel_set(["a", "b", "c"], t, 0.01, log=lambda m: None)
    assert chosen == {"a", "b", "c"} and base == 100.0 and us == 91.0
    assert len(calls) == 4   # none, all, then both again


def test_pick_finds_the_kernels_that_help_when_all_together_lose():
    # "a" helps (-3), "b" hurts (+8), "c" helps (-2): all together 97 + ... = 103 loses
    effect = {"a": -3.0, "b": 8.0, "c": -2.0}
    t, _ = _timer(lambda s: 100.0 + sum(effect[k] for k in s))
    chosen, base, us, tried = pick_kernel_set(["a", "b", "c"], t, 0.01, log=lambda m: None)
    assert chosen == {"a", "c"} and us == 95.0
    assert frozenset() in {s for s, _ in tried} and frozenset({"a", "b", "c"}) in {s for s, _ in tried}


def test_pick_keeps_none_when_nothing_wins_by_the_margin_or_the_win_does_not_repeat():
    t, _ = _timer(lambda s: 100.0 - 0.5 * len(s))
    assert pick_kernel_set(["a", "b"], t, 0.01, log=lambda m: None)[0] == frozenset()
    seq = iter([100.0, 90.0, 100.0, 99.5])   # none, all (lucky), none again, all again: no
    assert pick_kernel_set(["a"], lambda s: next(seq), 0.01, log=lambda m: None)[0] == frozenset()


def test_pick_stops_trying_single_kernels_at_the_deadline():
    import time
    t, calls = _timer(lambda s: 100.0 + (5.0 if len(s) > 1 else 0.0))
    pick_kernel_set(["a", "b", "c"], t, 0.01, deadline=time.monotonic() - 1, log=lambda m: None)
    assert calls == [frozenset(), frozenset({"a", "b", "c"})]


def test_tune_verdict_is_keyed_by_the_graph_the_kernel_pass_sees(monkeypatch, tmp_path):
    """What `superopt tune` decides in the whole model (the timer faked: no GPU here) is what
    `optimize` then follows, through the user's profile: same graph signature on both sides."""
    import torch
    import superopt.driver.tune as tune
    from superopt.cost import choose_cost_model
    from superopt.driver import Options, load_model, optimize
    from superopt.rules.load import load_rules
    model = load_model(zoo="llama_tiny_decode")
    graph = tune.searched_graph(model, "fp32")
    prof, sigs = _profile(graph, us=1.0, inductor_us=1.02)     # every kernel under the margin alone
    keep = sorted(set(sigs))[:1]

    class FakeTimer:
        def __init__(self, *a):
            pass

        def __call__(self, s):
            if s is None:    # the original program: slower than the searched graph here
                return 102.0
            return 100.0 - 5.0 * len(s & set(keep)) + 5.0 * len(s - set(keep))
    monkeypatch.setattr(tune, "_ModelTimer", FakeTimer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test-gpu")
    verdict = tune.model_verdict(model, prof, "fp32", log=lambda m: None)
    assert verdict.kernels == tuple(keep) and verdict.us == 95.0 and verdict.inductor_us == 100.0
    assert verdict.original_us == 102.0 and not verdict.original
    prof.add_model(verdict)
    prof.save(tmp_path / "mine.json")
    cost, _ = choose_cost_model("h100", "fp32")
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "mine.json"))
    by_env = optimize(model, load_rules(), cost, Options(input_sets=1), dtype="fp32").report.kernels
    monkeypatch.delenv(PROFILE_ENV)
    rep = optimize(model, load_rules(), cost, Options(input_sets=1, kernel_profile=str(tmp_path / "mine.json")),
                   dtype="fp32").report
    by_option = rep.kernels
    # the report's cost after kernels: the searched graph's price scaled by the model's measured ratio
    assert rep.cost_after == pytest.approx(cost.graph_cost(graph) * 95.0 / 100.0)
    for kern in (by_env, by_option):
        assert kern["verdict"] is not None and kern["chosen"] == sum(r["signature"] in keep for r in kern["regions"])
        assert kern["chosen"] >= 1
    shipped_only = optimize(model, load_rules(), cost, Options(input_sets=1), dtype="fp32").report.kernels
    assert shipped_only["verdict"] is None


def _fake_tune(monkeypatch, prof):
    import superopt.driver.tune as cmd
    import superopt.kernel.model_tuning as mt
    monkeypatch.setattr(cmd, "_has_cuda", lambda: True)

    def tuned(g, *a, during_proofs=None, **k):   # the whole model timed as the real one does, then done
        if during_proofs is not None:
            during_proofs(prof)
        return prof, [{"region": "r"}]
    monkeypatch.setattr(mt, "tune_graph", tuned)
    return cmd


def test_tune_keeps_the_regions_when_the_whole_model_timing_fails(monkeypatch, tmp_path, capsys):
    from superopt.cli import main
    prof = KernelProfile()
    prof.add(KernelEntry("abc", "fp32", "gpu", "p", "{}", 1.0, 2.0))
    cmd = _fake_tune(monkeypatch, prof)

    def broken(*a, **k):
        raise RuntimeError("Inductor could not compile the model\nmore lines")
    monkeypatch.setattr(cmd, "model_verdict", broken)
    out = tmp_path / "prof.json"
    assert main(["tune", "--zoo", "llama_tiny_decode", "--dtype", "fp32", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the whole-model timing failed (RuntimeError: Inductor could not compile the model)" in err
    assert KernelProfile.load(out).lookup("abc", "fp32") is not None


def test_tune_stores_kernel_rules_in_a_rule_database(monkeypatch, tmp_path, capsys):
    from superopt.cli import main
    from superopt.driver import load_model
    from superopt.driver.tune import searched_graph
    from superopt.rules.db import RuleDB
    from superopt.rules.kernel_rules import kernel_rules
    prof, sigs = _profile(searched_graph(load_model(zoo="llama_tiny_decode"), "fp32"))
    _fake_tune(monkeypatch, prof)
    db = tmp_path / "rules.db"
    args = ["tune", "--zoo", "llama_tiny_decode", "--dtype", "fp32", "--no-in-model", "-o", str(tmp_path / "p.json")]
    assert main(args + ["--db", str(db)]) == 0
    with RuleDB.open(db) as d:
        got = {k.signature for k in kernel_rules(d)}
    assert got and got <= set(sigs)   # the regions as the kernel pass cuts them (q/k/v merged: not measured)
    assert "kernel rule(s) stored in" in capsys.readouterr().out
    (tmp_path / "junk.db").write_text("not a database")
    assert main(args + ["--db", str(tmp_path / "junk.db")]) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_the_model_timer_compiles_each_set_once_and_keeps_two(monkeypatch):
    """The picker's second look (no kernel, then the winner) reuses the compiled models."""
    import superopt.driver.tune as tune
    timer = tune._ModelTimer.__new__(tune._ModelTimer)
    timer.kept, timer.compiled, timer.kw, timer.xs, timer.repeat = {}, 0, {}, (), 1
    compiled, ran = [], []

    def fake_compile(s):
        compiled.append(s)
        return lambda *a, **k: ran.append(s)

    def fake_measure(fn, xs, repeat, calls):
        fn()
        return 100.0 - 3 * len(ran[-1])
    monkeypatch.setattr(timer, "_compile", fake_compile)
    monkeypatch.setattr(tune, "measure_us", fake_measure)
    chosen, *_ = pick_kernel_set(["a", "b"], timer, 0.01, log=lambda m: None)
    assert chosen == {"a", "b"}
    assert compiled == [frozenset(), frozenset({"a", "b"})]      # none, all; both timed again uncompiled
    assert set(timer.kept) == {frozenset(), frozenset({"a", "b"})}
    timer(frozenset({"a"}))
    assert set(timer.kept) == {frozenset(), frozenset({"a"})}    # at most the empty set and the last


def test_optimize_names_a_kernel_profile_that_is_not_there(tmp_path, capsys):
    from superopt.cli import main
    code = main(["optimize", "--zoo", "llama_tiny_decode", "--kernel-profile", str(tmp_path / "none.json"),
                 "-o", str(tmp_path / "out.pt2")])
    err = capsys.readouterr().err
    assert code == 2 and "--kernel-profile names" in err and "Traceback" not in err
    assert not (tmp_path / "out.pt2").exists()


def test_a_region_measured_again_since_the_verdict_is_not_taken_as_approved():
    g = _two_norm_linears()
    prof, sigs = _profile(g)
    timed = {e.signature: e.program for e in prof.entries.values()}
    prof.add_model(ModelVerdict(model_signature(g), "fp32", "test-gpu", tuple(sorted(set(sigs))), 9.0, 10.0,
                                programs=tuple(sorted(timed.items()))))
    assert choose_kernels(g, None, "test-gpu", "fp32", prof)[1].chosen == 2
    key = next(k for k in prof.entries if k[0] == sigs[0])
    old = prof.entries[key]
    other = KernelProfile({key: KernelEntry(old.signature, old.dtype, old.device, old.program + "\n",
                                            old.config, old.us, old.inductor_us)})
    prof.entries[key] = other.entries[key]          # another program measured for the region since
    rep = choose_kernels(g, None, "test-gpu", "fp32", prof)[1]
    assert rep.chosen == 1 and rep.verdict["remeasured"] == 1
    assert [r.signature for r in rep.regions if r.decision == "kernel"] == [sigs[1]]
    back = KernelProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert back.lookup_model(model_signature(g), "fp32").programs == tuple(sorted(timed.items()))


def test_a_verdict_where_the_original_won_puts_no_kernel_and_optimize_writes_the_original(tmp_path):
    """The kernels won against the searched graph but not against the original program: the
    kernel pass places none and `optimize` writes the original, saying why."""
    from superopt.cost import choose_cost_model
    from superopt.driver import Options, load_model, optimize
    from superopt.driver.tune import searched_graph
    from superopt.rules.load import load_rules
    model = load_model(zoo="llama_tiny_decode")
    graph = searched_graph(model, "fp32")
    prof, sigs = _profile(graph, us=1.0, inductor_us=1.02)
    cost, _ = choose_cost_model("h100", "fp32")
    results = {}
    for original in (False, True):
        kernels = () if original else tuple(sorted(set(sigs)))
        prof.add_model(ModelVerdict(model_signature(graph), "fp32", "test-gpu", kernels, 95.0, 100.0,
                                    original_us=95.4 if original else 120.0, original=original))
        prof.save(tmp_path / "mine.json")
        results[original] = optimize(model, load_rules(), cost, Options(input_sets=1,
                                                                        kernel_profile=str(tmp_path / "mine.json")),
                                     dtype="fp32")
    kept, orig = results[False], results[True]
    assert kept.report.rewritten and any(n.op == "kernel" for n in kept.graph.nodes) and not kept.report.kept_original
    assert orig.unchanged and orig.graph is model.graph and orig.report.kernels["chosen"] == 0
    assert orig.report.kept_original == ("the device timed the rewrite only 0.4% faster than the original: "
                                         "95.0 us vs 95.4 us (test-gpu)")
    rep = choose_kernels(graph, None, "test-gpu", "fp32", prof)[1]
    assert "the original program is written instead: the device timed" in rep.table()


def _fake_timing(monkeypatch, us_by_region):
    """``tune_regions`` without a GPU: each plan's first (program, config) task timed at the
    region's given microseconds (by position), Inductor at 10 us; also a CUDA device."""
    import superopt.kernel.tune as kt
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)

    def fake(plans, workers=8, repeat=50, device_name="", tol=0.0):
        out = []
        for plan, us in zip(plans, us_by_region):
            prog, cfg, dtype = plan.tasks[0]
            entry = KernelEntry(region_signature(plan.region), dtype, "test-gpu", prog, cfg, us, 10.0)
            out.append(kt.TuneResult(entry, 10.0, [("p", cfg, us, "ok")], 0.0, [(us, prog, cfg)]))
        return out
    monkeypatch.setattr(kt, "tune_regions", fake)


def test_tuning_proves_only_the_kernels_that_beat_inductor(monkeypatch):
    """The translations are timed before they are proved; only the winner is verified (and
    cached), and its profile entry is of a proved program."""
    import superopt.kernel.choose as kc
    import superopt.kernel.generate as kg
    from superopt.kernel.model_tuning import tune_graph
    g = _two_norm_linears(k=24, n=40)
    proved = []
    real = kg.generate_kernels

    def counting(region, *a, verify=True, **k):
        if verify:
            proved.append(region_signature(region))
        return real(region, *a, verify=verify, **k)
    monkeypatch.setattr(kg, "generate_kernels", counting)
    monkeypatch.setattr(kc, "generate_kernels", counting)
    _fake_timing(monkeypatch, [5.0, 20.0])   # the first region's kernel wins, the second's loses
    prof, rows = tune_graph(g, "fp32", workers=1, log=lambda r: None)
    assert len(rows) == 2 and proved == [rows[0]["signature"]]
    assert rows[0]["generated"]["verified"] >= 1 and rows[1]["generated"]["verified"] == "after the timing"
    assert kc.read_cached_candidates(canonical_region(find_regions(g)[0].graph)[0]) is not None
    assert kc.read_cached_candidates(canonical_region(find_regions(g)[1].graph)[0]) is None
    assert {e.signature for e in prof.entries.values()} == {r["signature"] for r in rows}
    assert choose_kernels(g, None, "test-gpu", "fp32", prof)[1].chosen == 1   # the winner, proved
    again, rows = tune_graph(g, "fp32", workers=1, log=lambda r: None)   # the winner's proof read from the cache
    assert proved == [rows[0]["signature"]] and rows[0]["generated"]["cached"] and again.entries == prof.entries


def _refuse_every_proof(monkeypatch):
    """The verifier refuses every candidate (the translations to time are still made)."""
    import superopt.kernel.choose as kc
    from superopt.kernel.generate import KernelSearchReport, generate_kernels
    monkeypatch.setattr(kc, "generate_kernels", lambda region, verify=True, **k:
                        KernelSearchReport("matmul", refused=1) if verify else generate_kernels(region, verify=False, **k))


def test_a_timed_winner_the_verifier_refuses_gets_no_entry(monkeypatch):
    from superopt.kernel.model_tuning import tune_graph
    g = _two_norm_linears(k=20, n=36)   # shapes no other test proves (the cache is shared)
    _refuse_every_proof(monkeypatch)
    _fake_timing(monkeypatch, [5.0, 6.0])
    prof, rows = tune_graph(g, "fp32", workers=1, log=lambda r: None)
    assert not prof.entries
    assert all("verifier proved no program" in r["error"] for r in rows)


def test_the_whole_model_is_timed_while_the_winners_are_proved(monkeypatch):
    """``during_proofs`` runs beside the proofs (here the proof waits for it to start), with the
    timed winner's entry; nothing changed by the proof, so it is not called again."""
    import threading
    import superopt.kernel.model_tuning as mt
    g = _two_norm_linears(k=28, n=44)   # shapes no other test proves (the cache is shared)
    _fake_timing(monkeypatch, [5.0, 20.0])
    started, overlapped, seen = threading.Event(), [], []
    real = mt.generate_all

    def proving(regions, workers, **k):
        overlapped.append(started.wait(30))
        return real(regions, workers, **k)
    monkeypatch.setattr(mt, "generate_all", proving)

    def whole_model(prof):
        started.set()
        seen.append({e.signature for e in prof.entries.values()})
    prof, rows = mt.tune_graph(g, "fp32", workers=1, log=lambda r: None, during_proofs=whole_model)
    assert overlapped == [True] and len(seen) == 1
    assert seen[0] == {e.signature for e in prof.entries.values()} == {r["signature"] for r in rows}
    assert rows[0]["generated"]["verified"] >= 1 and "kernel_us" in rows[0]


def test_a_winner_refused_by_its_proof_makes_the_whole_model_timed_again_without_it(monkeypatch):
    from superopt.kernel.model_tuning import tune_graph
    g = _two_norm_linears(k=20, n=52)
    _refuse_every_proof(monkeypatch)
    _fake_timing(monkeypatch, [5.0, 6.0])
    seen = []
    prof, rows = tune_graph(g, "fp32", workers=1, log=lambda r: None,
                            during_proofs=lambda p: seen.append(len(p.entries)))
    assert seen == [2, 0] and not prof.entries


def test_with_nothing_to_prove_the_whole_model_is_timed_once_after_the_regions(monkeypatch):
    from superopt.kernel.model_tuning import tune_graph
    g = _two_norm_linears(k=20, n=60)
    _fake_timing(monkeypatch, [15.0, 16.0])   # both lose to Inductor's 10 us: no proof
    seen = []
    prof, rows = tune_graph(g, "fp32", workers=1, log=lambda r: None,
                            during_proofs=lambda p: seen.append(sorted(e.us for e in p.entries.values())))
    assert seen == [[15.0, 16.0]] and all(r["generated"]["verified"] == "after the timing" for r in rows)


def test_kernels_chosen_for_timing_only_are_not_proved_there(monkeypatch):
    """``choose_kernels(proved=False)``, as the whole-model timing calls it while the proofs run:
    a region's kernel whose proof is not cached goes in as the translation that was timed, with
    no verifier call and nothing cached; the kernel pass (``proved=True``) still puts in nothing
    the verifier refuses."""
    import superopt.kernel.choose as kc
    from superopt.kernel.choose import read_cached_candidates
    from superopt.kernel.generate import generate_kernels
    g = _two_norm_linears(k=12, n=56)   # shapes no other test proves (the cache is shared)
    prof, canons = KernelProfile(), []
    for region in find_regions(g):
        canon = canonical_region(region.graph)[0]
        c = generate_kernels(canon, verify=False).candidates[0]
        names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
        prog = variants(c.program, names, "fp32")[0]
        prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog.text(),
                             config_text(default_configs(prog)[0]), 1.0, 2.0))
        canons.append(canon)
    proofs = []
    real = kc.generate_kernels
    monkeypatch.setattr(kc, "generate_kernels", lambda region, verify=True, **k:
                        (proofs.append(verify), real(region, verify=verify, **k))[1])
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof, margin=0.0, proved=False)
    assert rep.chosen == 2 and sum(n.op == "kernel" for n in h.nodes) == 2
    assert True not in proofs and all(read_cached_candidates(c) is None for c in canons)
    _refuse_every_proof(monkeypatch)
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof, margin=0.0)
    assert rep.chosen == 0 and {r.decision for r in rep.regions} == {"not verified"}


def test_a_verdict_with_session_45s_launch_flag_loads_and_its_kernels_are_launched_plainly(tmp_path):
    """Session 45's tune could write ``"pdl": true`` into a verdict (programmatic dependent
    launch); timed as users run the models it never paid, so the flag was removed: such a file
    still loads, and the kernel pass emits the same calls as for a verdict without it."""
    g = _two_norm_linears()
    prof, sigs = _profile(g)
    prof.add_model(ModelVerdict(model_signature(g), "fp32", "test-gpu", tuple(sigs), 1.0, 2.0))
    prof.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert "pdl" not in doc["models"][0]
    doc["models"][0]["pdl"] = True
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = KernelProfile.load(tmp_path / "old.json")
    assert old.lookup_model(model_signature(g), "fp32") == prof.lookup_model(model_signature(g), "fp32")
    got, rep = choose_kernels(g, None, "test-gpu", "fp32", old)
    want, _ = choose_kernels(g, None, "test-gpu", "fp32", prof)
    configs = [n.attr["config"] for n in got.nodes if n.op == "kernel"]
    assert rep.chosen == len(configs) >= 1 and "pdl" not in rep.verdict
    assert configs == [n.attr["config"] for n in want.nodes if n.op == "kernel"]
    assert not any("pdl" in c for c in configs)
