"""`superopt tune` times the original program beside the rewrite; where the original wins, the
verdict says so and `optimize` writes the original (issue 23). No GPU here: the timers are faked."""

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from superopt.kernel.choose import model_signature
from superopt.kernel.model_tuning import IN_MODEL_MARGIN, ORIGINAL, pick_kernel_set, pick_program
from superopt.kernel.profile import PROFILE_ENV, KernelProfile, ModelVerdict, shipped_profile


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kcache"))
    monkeypatch.delenv(PROFILE_ENV, raising=False)


def _timer(times: dict):
    """A whole-model timer answering from ``times`` (ORIGINAL or a kernel set -> us), recording calls."""
    calls = []

    def time_set(s):
        calls.append(s)
        return times[s]
    return time_set, calls


A, NONE = frozenset({"a"}), frozenset()


def test_the_original_is_written_where_it_is_fastest_and_it_alternates_with_the_rewrite():
    t, calls = _timer({ORIGINAL: 90.0, NONE: 100.0, A: 95.0})
    p = pick_program(["a"], t, log=lambda m: None)
    assert p.original and p.kernels == frozenset()
    assert (p.us, p.inductor_us, p.original_us) == (95.0, 100.0, 90.0)   # the rewrite's best: with "a"
    assert calls == [ORIGINAL, NONE, A, NONE, A, ORIGINAL]
    assert ORIGINAL not in {s for s, _ in p.tried}


def test_the_rewrite_that_beats_the_original_is_kept():
    t, _ = _timer({ORIGINAL: 110.0, NONE: 100.0, A: 95.0})
    p = pick_program(["a"], t, log=lambda m: None)
    assert not p.original and p.kernels == A and (p.us, p.inductor_us, p.original_us) == (95.0, 100.0, 110.0)


def test_kernels_must_beat_the_original_by_the_margin_not_only_the_searched_graph():
    # "a" beats the searched graph without kernels by 5%, the original by 0.5%: under the 1% margin
    t, _ = _timer({ORIGINAL: 95.5, NONE: 100.0, A: 95.0})
    p = pick_program(["a"], t, 0.01, log=lambda m: None)
    assert p.original and p.kernels == frozenset()
    # an unchanged graph (the searched graph is the original, regenerated): the same rule
    t, _ = _timer({ORIGINAL: 100.0, NONE: 100.0, A: 97.0})
    assert pick_program(["a"], t, 0.01, log=lambda m: None).kernels == A


def test_a_rewrite_without_kernels_is_timed_twice_against_the_original_twice():
    t, calls = _timer({ORIGINAL: 104.0, NONE: 100.0})
    p = pick_program([], t, log=lambda m: None)
    assert calls == [ORIGINAL, NONE, ORIGINAL, NONE]
    assert not p.original and p.us == p.inductor_us == 100.0
    t, _ = _timer({ORIGINAL: 100.5, NONE: 100.0})     # 0.5% faster: within the margin, the original
    assert pick_program([], t, log=lambda m: None).original


def test_one_lucky_timing_of_the_rewrite_or_an_unlucky_one_of_the_original_does_not_decide():
    seq = iter([100.0, 98.0, 101.0, 100.0])     # original, searched (lucky), original again (unlucky), searched
    p = pick_program([], lambda s: next(seq), log=lambda m: None)
    assert p.original and (p.us, p.inductor_us, p.original_us) == (100.0, 98.0, 100.0)   # slower vs faster


@settings(max_examples=60, deadline=None)
@given(original=st.floats(50, 150), base=st.floats(50, 150),
       effects=st.lists(st.floats(-20, 20), min_size=0, max_size=4))
def test_the_written_program_beats_the_original_by_the_margin_or_is_the_original(original, base, effects):
    names = [f"k{i}" for i in range(len(effects))]

    def times(s):
        return original if s is ORIGINAL else base + sum(effects[names.index(k)] for k in s)
    calls = []
    p = pick_program(names, lambda s: calls.append(s) or times(s), IN_MODEL_MARGIN, log=lambda m: None)
    assert calls[0] is ORIGINAL and calls.count(ORIGINAL) == 2
    assert sum(1 for s in calls if s == NONE) >= 2
    written = times(p.kernels)
    if p.original:
        assert p.kernels == frozenset() and p.us >= original * (1 - IN_MODEL_MARGIN)
    else:
        assert written < original * (1 - IN_MODEL_MARGIN) and p.us == written
        # the kernel set is the one the searched graph alone would keep
        assert p.kernels == pick_kernel_set(names, times, IN_MODEL_MARGIN, log=lambda m: None)[0]


def test_the_reason_says_what_the_device_timed():
    v = ModelVerdict("m", "bf16", "NVIDIA H100", (), 104.2, 104.2, original_us=100.0, original=True)
    assert v.why_original == "the device timed the rewrite slower than the original: 104.2 us vs 100.0 us (NVIDIA H100)"
    v = ModelVerdict("m", "bf16", "gpu", (), 99.5, 100.0, original_us=100.0, original=True)
    assert v.why_original.startswith("the device timed the rewrite only 0.5% faster than the original: 99.5 us vs")
    assert ModelVerdict("m", "bf16", "gpu", ("r",), 90.0, 100.0, original_us=100.0).why_original is None


def test_verdicts_without_the_original_load_as_before_and_new_ones_round_trip(tmp_path):
    old = {"format": "superopt.kernel-profile", "version": 1, "entries": [],
           "models": [{"signature": "m", "dtype": "bf16", "device": "gpu", "kernels": ["r"], "us": 9.0,
                       "inductor_us": 10.0, "tried": [[["r"], 9.0]], "torch": "", "triton": "", "model": "x",
                       "programs": []}]}
    v = KernelProfile.from_json(old).lookup_model("m", "bf16")
    assert not v.original and v.original_us == 0.0 and v.why_original is None and v.kernels == ("r",)
    for w in shipped_profile().models.values():   # old and new verdicts side by side in the shipped file
        assert (w.why_original is not None) == w.original and (not w.original or not w.kernels)
    prof = KernelProfile()
    prof.add_model(ModelVerdict("m", "bf16", "gpu", (), 9.5, 10.0, original_us=9.0, original=True))
    prof.save(tmp_path / "p.json")
    back = KernelProfile.load(tmp_path / "p.json").lookup_model("m", "bf16")
    assert back.original and back.original_us == 9.0
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["models"][0]["original"] = "yes"
    from superopt.errors import SerializationError
    with pytest.raises(SerializationError, match="malformed.*original"):
        KernelProfile.from_json(doc)


class _TwoProjections(torch.nn.Module):
    """Two projections of one input, concatenated: the search merges them into one matmul."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(256, 256, generator=g) / 16)
        self.b = torch.nn.Parameter(torch.randn(256, 256, generator=g) / 16)

    def forward(self, x):
        return torch.cat([x @ self.a, x @ self.b], dim=1)


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """A .pt2 whose searched graph is a graph-level rewrite of the original."""
    path = tmp_path_factory.mktemp("orig") / "two.pt2"
    torch.export.save(torch.export.export(_TwoProjections(), (torch.randn(64, 256),)), str(path))
    return str(path)


def _fake_device(monkeypatch, original_us: float, searched_us: float = 100.0):
    import superopt.driver.tune as tune

    class FakeTimer:
        def __init__(self, *a):
            pass

        def __call__(self, s):
            return original_us if s is ORIGINAL else searched_us
    monkeypatch.setattr(tune, "_ModelTimer", FakeTimer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test-gpu")
    return tune


def _matmuls(path) -> int:
    ep = torch.export.load(str(path))
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and "matmul" in str(n.target))


@pytest.mark.parametrize("original_us", [96.0, 104.0])
def test_optimize_follows_the_verdict_on_a_graph_level_rewrite(rewritten, monkeypatch, tmp_path, capsys, original_us):
    """Original faster (96 us against the rewrite's 100): the original program is written, and
    the report says why; original slower (104): the rewrite is written as before."""
    from superopt.cli import main
    from superopt.driver import load_model
    tune = _fake_device(monkeypatch, original_us)
    model = load_model(rewritten)
    verdict = tune.model_verdict(model, KernelProfile(), "fp32", log=lambda m: None)   # no kernel: still timed
    assert verdict.kernels == () and verdict.original_us == original_us and verdict.original == (original_us < 100)
    prof = KernelProfile()
    prof.add_model(verdict)
    prof.save(tmp_path / "mine.json")
    out = tmp_path / "out.pt2"
    assert main(["optimize", rewritten, "--device", "h100", "--dtype", "fp32", "--kernel-profile",
                 str(tmp_path / "mine.json"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    if verdict.original:
        assert ("(the device timed the rewrite slower than the original: 100.0 us vs 96.0 us (test-gpu): "
                "the original program, unchanged)") in text
        assert _matmuls(out) == 2     # the original's two projections
    else:
        assert "the original program, unchanged" not in text and _matmuls(out) == 1


def test_the_python_api_writes_the_original_graph_with_no_layout_choice(rewritten, monkeypatch, tmp_path):
    from superopt.cost import choose_cost_model
    from superopt.driver import Options, load_model, optimize
    from superopt.rules.load import load_rules
    tune = _fake_device(monkeypatch, 90.0)
    model = load_model(rewritten)
    prof = KernelProfile()
    prof.add_model(tune.model_verdict(model, KernelProfile(), "fp32", log=lambda m: None))
    prof.save(tmp_path / "mine.json")
    cost, _ = choose_cost_model("h100", "fp32")
    res = optimize(model, load_rules(), cost, Options(input_sets=1, kernel_profile=str(tmp_path / "mine.json")),
                   dtype="fp32")
    assert res.unchanged and res.graph is model.graph and res.report.cost_after == res.report.cost_before
    assert "slower than the original" in res.report.kept_original and "kept_original" in res.report.to_json()
    assert res.report.kernels["verdict"]["original"] == res.report.kept_original
    plain = optimize(model, load_rules(), cost, Options(input_sets=1), dtype="fp32")
    assert plain.report.rewritten and not plain.report.kept_original


def test_an_unchanged_graph_without_kernels_is_not_timed(monkeypatch):
    from superopt.driver import load_model
    tune = _fake_device(monkeypatch, 90.0)
    model = load_model(zoo="gpt2_tiny_block")
    found = tune.searched(model, "fp32")
    assert found.unchanged
    assert tune.model_verdict(model, KernelProfile(), "fp32", log=lambda m: None, found=found) is None


def test_tune_says_the_original_wins_and_optimize_then_writes_it(rewritten, monkeypatch, tmp_path, capsys):
    """The command end to end (the region tuning and the timer faked): a rewritten graph with no
    kernel measured is still timed against the original, and the profile it writes makes
    `optimize` write the original."""
    from superopt.cli import main
    import superopt.kernel.model_tuning as mt
    tune = _fake_device(monkeypatch, 97.0)
    monkeypatch.setattr(tune, "_has_cuda", lambda: True)

    def tuned(g, *a, during_proofs=None, **k):   # no kernel measured; the whole model timed as tune_graph does
        if during_proofs is not None:
            during_proofs(KernelProfile())
        return KernelProfile(), []
    monkeypatch.setattr(mt, "tune_graph", tuned)
    prof = tmp_path / "prof.json"
    assert main(["tune", rewritten, "--dtype", "fp32", "-o", str(prof)]) == 0
    text = capsys.readouterr().out
    assert ("in the whole model: the device timed the rewrite slower than the original: 100.0 us vs 97.0 us "
            "(test-gpu); `superopt optimize` writes the original program") in text
    assert main(["tune", rewritten, "--dtype", "fp32", "--json", "-o", str(prof)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["original"] is True and doc["model"]["original_us"] == 97.0
    verdict = next(iter(KernelProfile.load(prof).models.values()))
    from superopt.driver import load_model
    assert verdict.original and verdict.signature == model_signature(tune.searched_graph(load_model(rewritten), "fp32"))
    out = tmp_path / "out.pt2"
    assert main(["optimize", rewritten, "--device", "h100", "--dtype", "fp32", "--kernel-profile", str(prof),
                 "-o", str(out)]) == 0
    assert "the original program, unchanged" in capsys.readouterr().out and _matmuls(out) == 2


def test_the_model_timer_keeps_the_original_compiled_beside_no_kernel(monkeypatch):
    import superopt.driver.tune as tune
    timer = tune._ModelTimer.__new__(tune._ModelTimer)
    timer.kept, timer.compiled, timer.kw, timer.xs, timer.repeat = {}, 0, {}, (), 1
    compiled = []
    monkeypatch.setattr(timer, "_compile", lambda s: compiled.append(s) or (lambda *a, **k: None))
    monkeypatch.setattr(tune, "measure_us", lambda fn, xs, repeat, calls: 1.0)
    pick_program(["a", "b"], timer, log=lambda m: None)
    assert compiled.count(ORIGINAL) == 1 and compiled.count(NONE) == 1     # each timed twice, compiled once
    assert ORIGINAL in timer.kept and NONE in timer.kept


@pytest.mark.parametrize("how", ["--portable", "kernels off"])
def test_the_verdict_decides_without_the_kernel_pass(rewritten, monkeypatch, tmp_path, capsys, how):
    """With --portable (or kernels off through the API) the kernel pass does not run, but a
    verdict that timed the original faster still makes optimize write the original."""
    from superopt.cli import main
    from superopt.cost import choose_cost_model
    from superopt.driver import Options, load_model, optimize
    from superopt.rules.load import load_rules
    tune = _fake_device(monkeypatch, 96.0)
    model = load_model(rewritten)
    prof = KernelProfile()
    prof.add_model(tune.model_verdict(model, KernelProfile(), "fp32", log=lambda m: None))
    prof.save(tmp_path / "mine.json")
    if how == "--portable":
        out = tmp_path / "out.pt2"
        assert main(["optimize", rewritten, "--device", "h100", "--dtype", "fp32", "--portable", "--kernel-profile",
                     str(tmp_path / "mine.json"), "-o", str(out)]) == 0
        assert "the device timed the rewrite slower than the original" in capsys.readouterr().out
        assert _matmuls(out) == 2
        return
    cost, _ = choose_cost_model("h100", "fp32")
    opts = Options(input_sets=1, kernels=False, kernel_profile=str(tmp_path / "mine.json"))
    res = optimize(model, load_rules(), cost, opts, dtype="fp32")
    assert res.unchanged and res.graph is model.graph and "slower than the original" in res.report.kept_original
    assert "device verdict" in res.report.seconds
    plain = optimize(model, load_rules(), cost, Options(input_sets=1, kernels=False), dtype="fp32")
    assert plain.report.rewritten and not plain.report.kept_original


def test_the_whole_model_timing_chooses_kernels_for_timing_only(rewritten, monkeypatch):
    """The verdict runs beside the kernels' proofs (tune_graph's during_proofs): it picks its
    candidate kernels without proving them (``proved=False``), which would prove each one again."""
    from superopt.driver import load_model
    from superopt.kernel import choose
    tune = _fake_device(monkeypatch, 104.0)
    seen, real = [], choose.choose_kernels   # (the timing's candidates: choose.candidate_regions)
    monkeypatch.setattr(choose, "choose_kernels", lambda *a, **k: (seen.append(k.get("proved", True)), real(*a, **k))[1])
    assert tune.model_verdict(load_model(rewritten), KernelProfile(), "fp32", log=lambda m: None) is not None
    assert seen == [False]


def test_the_original_program_is_moved_with_the_devices_its_graph_names():
    """A program traced on the CPU names the CPU where it makes tensors (a mask from positions:
    ``torch.arange(n, device=...)``); the whole-model timing's copy of it runs where it is moved
    (checked on ``meta``), and the model's own program is left as it was."""
    from superopt.driver import load_model
    from superopt.driver.tune import original_on
    from superopt.models import build
    import tempfile
    step, x = build("llama_tiny_decode", batch_size=1, cache="buffers", mask="positions")
    step, x = step.to(torch.bfloat16), tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in x)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/step.pt2"
        torch.export.save(torch.export.export(step, x), path)
        model = load_model(path)
    moved = original_on(model, "meta").to(torch.bfloat16)  # as the timing casts it (no .eval(): torch.export's refuses)
    out = torch.compile(moved, backend="eager")(*[t.to("meta") for t in x])  # dynamo checks its dtype asserts
    assert out.device.type == "meta" and out.dtype == torch.bfloat16
    asserts = [n for n in moved.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]
    assert asserts and all(n.kwargs.get("device") is None for n in asserts)  # "cuda" is not "cuda:0": dropped
    assert all(t.device.type == "cpu" for t in model.program.state_dict.values())
    baked = [n for n in model.program.graph.nodes if n.kwargs.get("device") is not None]
    assert baked and all(str(n.kwargs["device"]) == "cpu" for n in baked)
