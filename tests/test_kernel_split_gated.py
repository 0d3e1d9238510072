"""A fused gated projection (Phi-3's gate_up_proj) split into gate and up only where the whole
model ran faster so (superopt.kernel.merge.split_gated_projections, the kernel pass, the tune
verdict; the timer faked: no GPU here)."""

import numpy as np
import pytest
import torch

from superopt.kernel.choose import cached_candidates, choose_kernels, region_signatures
from superopt.kernel.configs import default_configs
from superopt.kernel.merge import PART_SUFFIX, split_gated_projections
from superopt.kernel.model_tuning import ORIGINAL, ProgramPick, distinct_regions, pick_split
from superopt.kernel.profile import KernelEntry, KernelProfile, region_signature
from superopt.kernel.tune import config_text, variants


@pytest.fixture(scope="module")
def phi3():
    import superopt.driver.tune as tune
    from superopt.driver import load_model
    model = load_model(zoo="phi3_tiny_decode")
    graph = tune.searched_graph(model, "fp32")
    split, parts = split_gated_projections(graph)
    assert parts == 1
    prof = KernelProfile()
    for canon, _ in distinct_regions(graph):   # both forms' regions, as `superopt tune` measures them
        cands, _ = cached_candidates(canon)
        c = cands[0]
        names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
        prog = variants(c.program, names, "fp32")[-1]
        prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog.text(),
                             config_text(default_configs(prog)[0]), 1.0, 3.0))
    return model, graph, split, prof


def _has_parts(g):
    return any(n.op == "weight" and PART_SUFFIX in n.name for n in g.nodes)


def _outputs_kept(model, h):
    from superopt.codegen.export import to_module
    want = model.reference(*model.inputs, **model.kwargs)
    got = to_module(h, model.signature)(*model.inputs, **model.kwargs)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_tuning_measures_the_regions_of_both_forms(phi3):
    _, graph, split, _ = phi3
    sigs = {region_signature(g) for pair in distinct_regions(graph) for g in pair if g is not None}
    own = region_signatures(split) - region_signatures(graph)
    assert own and own <= sigs and region_signatures(graph) & sigs


def test_the_split_is_made_only_where_asked_and_keeps_the_outputs(phi3):
    model, graph, split, prof = phi3
    h, rep = choose_kernels(graph, None, "test-gpu", "fp32", prof)   # the margin alone: never split
    assert rep.split == 0 and not _has_parts(h) and rep.chosen >= 1
    only = region_signatures(split) - region_signatures(graph)
    h, rep = choose_kernels(graph, None, "test-gpu", "fp32", prof, only=only)
    assert rep.split == 1 and rep.chosen >= 1 and "1 fused gated projections split" in rep.table()
    _outputs_kept(model, h)
    h, rep = choose_kernels(graph, None, "test-gpu", "fp32", prof, split=True)
    assert rep.split == 1 and rep.chosen >= 3
    _outputs_kept(model, h)


@pytest.mark.parametrize("split_faster", [True, False])
def test_the_tune_verdict_splits_only_where_the_model_ran_faster_so(phi3, monkeypatch, split_faster):
    import superopt.driver.tune as tune
    model, graph, split, prof = phi3
    own = region_signatures(split) - region_signatures(graph)

    class FakeTimer:
        def __init__(self, *a):
            pass

        def __call__(self, s):
            if s is None:
                return 120.0
            if s & own:   # the split form's kernel set
                return 80.0 if split_faster else 99.0
            return 100.0 - len(s)
    monkeypatch.setattr(tune, "_ModelTimer", FakeTimer)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test-gpu")
    verdict = tune.model_verdict(model, prof, "fp32", log=lambda m: None)
    assert bool(set(verdict.kernels) & own) == split_faster
    prof2 = KernelProfile(dict(prof.entries))
    prof2.add_model(verdict)
    h, rep = choose_kernels(graph, None, "test-gpu", "fp32", prof2)
    assert rep.split == int(split_faster) and _has_parts(h) == split_faster
    _outputs_kept(model, h)


def test_pick_split_keeps_the_written_program_unless_the_split_wins_twice():
    pick = ProgramPick(frozenset({"a"}), 90.0, 95.0, 100.0, False, [])
    seq = iter([80.0, 90.0, 95.0])   # split, written again, split: its slower timing loses
    p = pick_split(pick, frozenset({"b"}), lambda s: next(seq), log=lambda m: None)
    assert p.kernels == {"a"} and p.us == 90.0 and len(p.tried) == 2
    original = ProgramPick(frozenset(), 101.0, 101.0, 100.0, True, [])
    times = {ORIGINAL: 100.0, frozenset({"b"}): 97.0}
    p = pick_split(original, frozenset({"b"}), times.__getitem__, log=lambda m: None)
    assert p.kernels == {"b"} and not p.original and p.us == 97.0
