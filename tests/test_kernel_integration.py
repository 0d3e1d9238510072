"""Kernel integration: kernel nodes, the superopt::kernel custom op, choose_kernels, profiles."""

import json
from pathlib import Path
import os
from dataclasses import replace
import subprocess
import sys

import numpy as np
import pytest
import torch

from superopt.codegen.export import export_pt2
from superopt.codegen.fx import to_fx
from superopt.ir import GraphBuilder
from superopt.kernel.choose import choose_kernels
from superopt.kernel.profile import KernelEntry, KernelProfile, region_signature
from superopt.kernel.regions import find_regions
from superopt.kernel.torch_op import kernel, op_program
from superopt.kernel.tune import config_text, extra_inputs, specialize, transposed, streamed_weights, variants
from superopt.kernel import default_configs
from superopt.kernel.choose import cached_candidates
from superopt.kernel.triton_lower import blocked_loads
from superopt.kernel.regions import as_reference, canonical_region

from kernel_regions import profile_of_first_candidates


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kcache"))


def _rms_linear(t=4, k=32, n=48, seed=0):
    """x -> RMSNorm (mean of squares, rsqrt, norm weight) -> linear."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (t, k))
    ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
    r = b.op("rsqrt", b.op("add", ms, b.weight("eps", (1,), np.full((1,), 1e-5, np.float32))))
    h = b.op("mul", b.op("mul", x, r), b.weight("g", (k,), (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)))
    y = b.op("matmul", h, b.weight("w", (k, n), (rng.standard_normal((k, n)) / k ** 0.5).astype(np.float32)))
    return b.build([y])


def _measured(g, dtype="fp32", us=1.0, inductor_us=2.0, transpose=True, blocked=False):
    """A profile entry for g's one region, as a tuning run would write it (times made up); with
    ``blocked``, its config reads the transposed weight tile-blocked (16x16 tiles)."""
    (region,) = find_regions(g)
    canon = canonical_region(region.graph)[0]
    cands, _ = cached_candidates(canon)
    assert cands, "the generator found no proved kernel for the RMSNorm->linear region"
    c = cands[0]
    names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
    prog = variants(c.program, names, dtype)[-1 if transpose else 0]
    cfg = default_configs(prog)[0]
    if blocked:
        cfg = replace(cfg, blocked=True, blocks=tuple((d, 16 if d in ("K", "N") else b) for d, b in cfg.blocks))
        assert blocked_loads(prog, cfg), cfg
    prof = KernelProfile()
    prof.add(KernelEntry(region_signature(canon), dtype, "test-gpu", prog.text(), config_text(cfg), us,
                         inductor_us))
    return prof, prog


def test_choose_kernels_replaces_a_measured_region_and_the_code_matches():
    g = _rms_linear()
    prof, prog = _measured(g)
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.chosen == 1 and [n.op for n in h.nodes].count("kernel") == 1, rep.table()
    assert rep.regions[0].generated["verified"] >= 1
    h.check()
    x = torch.randn(4, 32)
    np.testing.assert_allclose(to_fx(h)(x).numpy(), to_fx(g)(x).numpy(), rtol=1e-4, atol=1e-5)


def test_choose_kernels_keeps_inductor_where_the_kernel_does_not_win():
    g = _rms_linear()
    prof, _ = _measured(g, us=1.0, inductor_us=1.05)
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.chosen == 0 and rep.regions[0].decision == "inductor" and h is g
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", KernelProfile())
    assert rep.regions[0].decision == "not measured" and h is g


class _Priced:
    """A cost model that prices every graph at ``us``."""

    def __init__(self, us):
        self.us = us

    def graph_cost(self, g):
        return self.us


def test_a_kernel_must_beat_both_the_measured_inductor_time_and_the_price():
    """A region's Inductor code timed alone is slower than in the model (its epilogue fuses into
    the next kernel there): a kernel that beats the measurement but not the cost model's price
    of the region is refused; beating both, it is used."""
    g = _rms_linear()
    prof, _ = _measured(g, us=1.0, inductor_us=2.0)
    h, rep = choose_kernels(g, _Priced(0.5), "test-gpu", "fp32", prof)
    assert rep.chosen == 0 and rep.regions[0].model_us == 0.5 and h is g, rep.table()
    assert choose_kernels(g, _Priced(2.0), "test-gpu", "fp32", prof)[1].chosen == 1


def test_a_program_that_is_not_a_verified_candidate_is_never_used():
    g = _rms_linear()
    prof, prog = _measured(g)
    (entry,) = prof.entries.values()
    forged = prog.text().replace("1/32", "1/31")  # a wrong mean
    bad = KernelProfile()
    bad.add(KernelEntry(entry.signature, "fp32", "test-gpu", forged, entry.config, 1.0, 5.0))
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", bad)
    assert rep.regions[0].decision == "not verified" and h is g


def test_a_blocked_config_whose_weight_is_not_made_at_compile_time_is_not_used(monkeypatch):
    """A ``blocked`` entry is used only where the weight it reads blocked is one the kernel pass
    makes (and so can store blocked); else the kernel would read a weight passed as it is."""
    import superopt.kernel.choose as choose
    g = _rms_linear()
    prof, _ = _measured(g, blocked=True)
    monkeypatch.setattr(choose, "extra_inputs", lambda program, ref: [])
    h, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.regions[0].decision == "inductor" and "blocked" in rep.regions[0].reason and h is g


def test_storage_variants_bind_transposed_and_folded_weights():
    g = _rms_linear()
    (region,) = find_regions(g)
    canon = canonical_region(region.graph)[0]
    cands, _ = cached_candidates(canon)
    c = cands[0]
    names = {canon.nodes[i].name for i in canon.weights} | set(c.prep.names if c.prep else ())
    p = c.program
    t = transposed(p, streamed_weights(p, names))
    assert any(n.endswith("__t") for n in extra_inputs(t, as_reference(canon)))
    assert {x.dtype for x in specialize(p, "bf16").inputs} == {"bfloat16"}


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
@pytest.mark.parametrize("blocked", [False, True])
def test_kernel_node_runs_its_triton_program_under_the_interpreter(blocked):
    """The chosen kernel node runs its Triton program (under the interpreter) equal to the graph;
    with a ``blocked`` config, the node carries the weight's blocked copy, which the program reads."""
    g = _rms_linear()
    prof, prog = _measured(g, blocked=blocked)
    h, _ = choose_kernels(g, None, "test-gpu", "fp32", prof)
    def streamed(graph):   # the kernel node's compile-time weight (the folded weight, transposed)
        node = next(n for n in graph.nodes if n.op == "kernel")
        return graph.data[next(graph.nodes[r.node].name for r in node.inputs if graph.nodes[r.node].name.endswith("__t"))]
    plain = streamed(choose_kernels(g, None, "test-gpu", "fp32", _measured(g)[0])[0])
    assert np.array_equal(np.sort(streamed(h).reshape(-1)), np.sort(plain.reshape(-1)))
    assert np.array_equal(streamed(h), plain) != blocked     # the blocked copy: the same values in another order
    x = torch.randn(4, 32)
    want = to_fx(g)(x).numpy()
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.getcwd())
    code = ("import sys, torch, numpy as np; from superopt.ir.serialize import graph_from_json; "
            "from superopt.codegen.fx import to_fx; import json; "
            "h = graph_from_json(json.load(open(sys.argv[1]))); x = torch.load(sys.argv[2]); "
            "import superopt.kernel.torch_op as t; "
            "y = to_fx(h)(x); assert t._launcher.cache_info().currsize == 1, 'the Triton path did not run'; "
            "np.save(sys.argv[3], y.numpy())")
    from superopt.ir.serialize import graph_to_json
    d = os.environ.get("SUPEROPT_KERNEL_CACHE")
    gp, xp, yp = f"{d}/h.json", f"{d}/x.pt", f"{d}/y.npy"
    json.dump(graph_to_json(h), open(gp, "w"))
    torch.save(x, xp)
    subprocess.run([sys.executable, "-c", code, gp, xp, yp], check=True, env=env, timeout=300)
    np.testing.assert_allclose(np.load(yp), want, rtol=1e-4, atol=1e-5)


def test_pt2_with_a_kernel_loads_in_a_fresh_process(tmp_path):
    g = _rms_linear()
    prof, _ = _measured(g)
    h, _ = choose_kernels(g, None, "test-gpu", "fp32", prof)
    x = torch.randn(4, 32)
    path = export_pt2(h, tmp_path / "k.pt2", [x])
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys, torch, superopt, numpy as np; ep = torch.export.load(sys.argv[1]); "
            "np.save(sys.argv[3], ep.module()(torch.load(sys.argv[2])).numpy())")
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "x.pt"), str(tmp_path / "y.npy")],
                   check=True, env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), to_fx(g)(x).numpy(), rtol=1e-4, atol=1e-5)


def test_kernel_op_checks_its_inputs_and_has_a_fake():
    from superopt.kernel.regions import reference_text
    from superopt.kernel.torch_op import KernelCallError
    g = _rms_linear()
    (region,) = find_regions(g)
    ref = reference_text(region.graph)
    with pytest.raises(KernelCallError, match="takes at least 4 tensors"):
        kernel([torch.ones(4, 32)], "", "", ref)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        xs = [torch.empty(4, 32), torch.empty(1), torch.empty(32), torch.empty(32, 48)]
        (y,) = torch.ops.superopt.kernel(xs, "", "", ref)
        assert y.shape == (4, 48)
    with pytest.raises(KernelCallError, match="may not contain"):
        op_program("kernel a|b")


def test_profile_round_trips_and_rejects_damage(tmp_path):
    from superopt.errors import SerializationError
    p = KernelProfile()
    p.add(KernelEntry("s", "bf16", "H100", "kernel k", "{}", 3.0, 6.0, measured=4))
    p.add(KernelEntry("s", "bf16", "H100", "kernel k2", "{}", 2.0, 6.0))
    p.save(tmp_path / "p.json")
    q = KernelProfile.load(tmp_path / "p.json")
    assert q.lookup("s", "bf16").program == "kernel k2" and q.lookup("s", "fp32") is None
    (tmp_path / "bad.json").write_text('{"format": "superopt.kernel-profile", "version": 1, "entries": [{"x": 1}]}')
    with pytest.raises(SerializationError, match="malformed entry"):
        KernelProfile.load(tmp_path / "bad.json")


@pytest.mark.parametrize("zoo", ["llama_tiny_decode", "qwen2_tiny_decode", "phi3_tiny_decode", "gemma_tiny_decode", "qwen3_tiny_decode",
                                 "gpt2_tiny_block"])
def test_kernels_in_a_zoo_model_keep_its_outputs(zoo):
    from superopt.codegen.export import to_module
    from superopt.driver import load_model
    model = load_model(zoo=zoo)
    prof = profile_of_first_candidates(model.graph)
    h, rep = choose_kernels(model.graph, None, "test-gpu", "fp32", prof)
    assert rep.chosen >= 2, rep.table()
    assert sum(n.op == "kernel" for n in h.nodes) == rep.chosen
    h.check()
    want = model.reference(*model.inputs, **model.kwargs)
    got = to_module(h, model.signature)(*model.inputs, **model.kwargs)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_the_backends_precision_check_passes_a_module_of_kernels():
    """The backend runs what it hands over on fake inputs first (its precision check): a module
    calling superopt's kernel ops passes it; one whose outputs come out in another dtype does not."""
    from superopt.codegen.export import to_module
    from superopt.driver import load_model
    from superopt.driver.precision import output_types, runs_at_precision
    model = load_model(zoo="llama_tiny_decode")
    h, rep = choose_kernels(model.graph, None, "test-gpu", "fp32", profile_of_first_candidates(model.graph))
    assert rep.chosen >= 2
    module = to_module(h, model.signature)
    want = output_types(model.reference, model.inputs)
    assert runs_at_precision(module, model.inputs, {}, want) == ""

    class Promotes(torch.nn.Module):   # its outputs in float64 where the original gives float32
        def forward(self, *xs):
            return tuple(o.double() for o in torch.utils._pytree.tree_leaves(module(*xs)))
    assert runs_at_precision(Promotes(), model.inputs, {}, want).startswith("outputs")


def test_the_shipped_h100_profile_decides_without_a_gpu():
    """RMSNorm -> 4096x6144 linear at one token: measured on the H100, the kernel does not beat
    Inductor's code by the margin, so the region stays with Inductor (no generation needed)."""
    from superopt.kernel.profile import shipped_profile
    prof = shipped_profile()
    assert prof.entries and all(e.device.startswith(("NVIDIA H100", "NVIDIA H200")) for e in prof.entries.values())
    for e in prof.entries.values():
        assert e.us > 0 and e.inductor_us > 0 and e.torch and e.triton
        from superopt.kernel import parse_program
        parse_program(e.program)
    b = GraphBuilder()
    x = b.input("x", (1, 4096))
    ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
    r = b.op("rsqrt", b.op("add", ms, b.weight("eps", (1,), np.full((1,), 1e-5, np.float32))))
    h = b.op("mul", b.op("mul", x, r), b.weight("g", (4096,)))
    g = b.build([b.op("matmul", h, b.weight("w", (4096, 6144)))])
    out, rep = choose_kernels(g, None, "cpu", "bf16")
    assert out is g and rep.regions[0].decision == "inductor", rep.table()
    assert rep.regions[0].kernel_us and rep.regions[0].inductor_us


def test_inductor_compiles_around_a_kernel_call():
    g = _rms_linear()
    prof, _ = _measured(g)
    h, _ = choose_kernels(g, None, "test-gpu", "fp32", prof)
    gm = to_fx(h)
    x = torch.randn(4, 32)
    torch._dynamo.reset()
    compiled = torch.compile(gm)
    np.testing.assert_allclose(compiled(x).numpy(), gm(x).numpy(), rtol=1e-5, atol=1e-6)


def test_tune_without_a_gpu_says_so(capsys, monkeypatch):
    from superopt.cli import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", "--zoo", "llama_tiny_decode"]) == 2
    assert "superopt tune needs a CUDA device" in capsys.readouterr().err


def test_tune_measures_the_regions_of_the_searched_graph(tmp_path, monkeypatch, capsys):
    """`superopt tune` hands the kernel tuner the graph the driver's kernel pass sees (the
    passes before it), not the imported graph."""
    import superopt.driver.tune as cmd
    import superopt.kernel.model_tuning as mt
    from superopt.cli import main
    from superopt.driver import load_model
    from superopt.driver.tune import searched_graph
    from superopt.ir.hashing import named_hash
    from superopt.kernel.profile import KernelProfile
    seen = []
    monkeypatch.setattr(cmd, "_has_cuda", lambda: True)
    monkeypatch.setattr(mt, "tune_graph", lambda g, *a, **k: (seen.append(g), (KernelProfile(), []))[1])
    out = tmp_path / "prof.json"
    assert main(["tune", "--zoo", "llama_tiny_decode", "-o", str(out)]) == 0
    want = searched_graph(load_model(zoo="llama_tiny_decode"))
    assert len(seen) == 1 and named_hash(seen[0]) == named_hash(want)
    assert out.exists() and "wrote" in capsys.readouterr().out


def test_a_kernel_node_is_priced_at_its_measured_time():
    from superopt.cost.model import CostModel
    from superopt.driver import load_model
    model = load_model(zoo="gpt2_tiny_block")
    h, rep = choose_kernels(model.graph, None, "test-gpu", "fp32", profile_of_first_candidates(model.graph))
    ks = [n for n in h.nodes if n.op == "kernel"]
    assert ks and all(n.attr["us"] == 1.0 for n in ks)
    cost = CostModel("h100")
    assert all(cost.kernel_us(n.op, n.attr, [h.type_of(r) for r in n.inputs], n.types) == 1.0 for n in ks)


def test_tuning_plan_times_the_transposed_weight_layout_over_the_whole_space():
    """plan_region: each candidate once, its streamed weight read transposed (F.linear's [N, K]
    layout), over its tuning space, the tasks distinct; a non-streaming program as it is."""
    from superopt.kernel.tune import plan_region, timed_variant, tuning_space
    (region,) = find_regions(_rms_linear(t=2, k=1024, n=64))
    canon = canonical_region(region.graph)[0]
    cands, _ = cached_candidates(canon)
    plan = plan_region(canon, cands, "bf16", max_candidates=2, max_configs=4)
    assert len(plan.progs) == min(2, len(cands))
    for c, p in plan.progs:
        assert any(t.name.endswith("__t") for t in p.inputs), p.text()
        assert all(t.dtype in ("bfloat16", "int32", "int64") for t in p.inputs if t.dtype != "float32")
    assert len(plan.tasks) == len(set(plan.tasks)) == sum(len(tuning_space(p, 4)) for _, p in plan.progs)
    assert {t[0] for t in plan.tasks} == {p.text() for _, p in plan.progs}
    from superopt.kernel.program import EXAMPLE, parse_program
    small = parse_program(EXAMPLE)
    assert timed_variant(small, set(), "bf16").inputs == specialize(small, "bf16").inputs


def test_tuning_workers_and_this_process_share_one_triton_cache(monkeypatch, tmp_path):
    """Inductor sets TRITON_CACHE_DIR to its own directory when it first compiles, if unset:
    the tuner sets it first (for the workers it spawns and for itself), keeps a user's, and
    restores the environment afterwards."""
    import os
    from superopt.kernel.tune import shared_triton_cache
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with shared_triton_cache():
        assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert "TRITON_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    with shared_triton_cache():
        assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"


def test_q_k_v_of_one_norm_become_one_kernel_where_the_merged_region_was_measured():
    """Three linears of one RMSNorm output: with the merged region measured, one kernel and two
    splits replace them (report.merged == 1) and the outputs match; measured only separately,
    the merge is undone and the graph is left as it is."""
    from superopt.kernel.merge import merge_linear_siblings
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (4, 32))
    ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
    r = b.op("rsqrt", b.op("add", ms, b.weight("eps", (1,), np.full((1,), 1e-5, np.float32))))
    h = b.op("mul", b.op("mul", x, r), b.weight("g", (32,), (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)))
    outs = [b.op("matmul", h, b.weight(f"w{i}", (32, n), (rng.standard_normal((32, n)) / 6).astype(np.float32)))
            for i, n in enumerate((32, 16, 16))]
    g = b.build(outs)
    merged, count = merge_linear_siblings(g)
    assert count == 1
    out, rep = choose_kernels(g, None, "test-gpu", "fp32", profile_of_first_candidates(merged))
    ops = [n.op for n in out.nodes]
    assert rep.merged == 1 and ops.count("kernel") == 1 and ops.count("split") == 2 and "matmul" not in ops, rep.table()
    xs = torch.randn(4, 32)
    for got, want in zip(to_fx(out)(xs), to_fx(g)(xs)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    # measured only separately: the merge is undone, and the projections keep Inductor's code
    # (it merges them itself: one kernel each would compete with its one merged GEMM)
    alone, rep2 = choose_kernels(g, None, "test-gpu", "fp32", profile_of_first_candidates(g))
    assert rep2.merged == 0 and rep2.chosen == 0 and alone is g, rep2.table()
    assert all(r.decision == "inductor" and "sibling" in r.reason for r in rep2.regions)


def test_a_one_element_weight_is_baked_into_the_kernel_call():
    """The norm's epsilon (a one-element weight) is read by the emitted program as a number, not
    passed to the call: as a tensor Inductor would fill it with a kernel of its own every call.
    The call's reference keeps it as data; outputs unchanged, on the Triton path as well."""
    g = _rms_linear()
    prof, prog = _measured(g)
    assert "eps" in {t.name for t in prog.inputs} or any(t.shape == (1,) for t in prog.inputs)
    h, _ = choose_kernels(g, None, "test-gpu", "fp32", prof)
    (k,) = [n for n in h.nodes if n.op == "kernel"]
    src_names = {h.nodes[r[0]].name for r in k.inputs}
    assert "eps" not in src_names and {"x", "g", "w"} <= src_names            # and the folded weight
    program = k.attr["program"].replace("|", "\n")
    assert "[1]" not in "".join(ln for ln in program.splitlines() if ln.startswith("input"))
    assert repr(float(np.float32(1e-5))) in program                            # the literal, as f32 holds it
    ref = json.loads(k.attr["reference"])
    assert list(ref["data"]) == ["s_w0"] and len(ref["nodes"]) > 3
    x = torch.randn(4, 32)
    np.testing.assert_allclose(to_fx(h)(x).numpy(), to_fx(g)(x).numpy(), rtol=1e-4, atol=1e-5)


def _two_norm_linears_measured(t: int = 4):
    """Two RMSNorm -> linear regions in a chain, and a profile measuring a proved kernel for each."""
    b = GraphBuilder()
    x = b.input("x", (t, 32))
    for k, n, name in ((32, 48, "a"), (48, 24, "b")):
        ms = b.op("mean", b.op("pow", x, exponent=2.0), axis=-1, keepdim=1)
        r = b.op("rsqrt", b.op("add", ms, b.weight(f"eps_{name}", (1,), np.full((1,), 1e-5, np.float32))))
        h = b.op("mul", b.op("mul", x, r), b.weight(f"g_{name}", (k,), np.linspace(0.9, 1.1, k, dtype=np.float32)))
        x = b.op("matmul", h, b.weight(f"w_{name}", (k, n), np.linspace(-0.2, 0.2, k * n, dtype=np.float32).reshape(k, n)))
    g = b.build([x])
    prof = KernelProfile()
    for region in find_regions(g):
        canon = canonical_region(region.graph)[0]
        prog = cached_candidates(canon)[0][0].program
        prof.add(KernelEntry(region_signature(canon), "fp32", "test-gpu", prog.text(),
                             config_text(default_configs(prog)[0]), 1.0, 2.0))
    return g, prof


def _pass_with_proofs_ahead(t: int) -> tuple:
    """The kernel pass with proofs ahead wanted (any size, the cores there), from a clean cache:
    (kernels chosen, regions proved ahead)."""
    import shutil
    import superopt.kernel.choose as choose
    g, prof = _two_norm_linears_measured(t)
    shutil.rmtree(Path(os.environ["SUPEROPT_KERNEL_CACHE"]) / "candidates")
    choose.PROVE_AHEAD_ELEMENTS = 0
    choose.os.cpu_count = lambda: choose.PROVE_AHEAD_CORES
    _, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    return rep.chosen, rep.proved_ahead


def test_a_daemonic_process_proves_the_regions_itself(monkeypatch, tmp_path):
    """In a multiprocessing.Pool's worker (daemonic, so it may start no process; a backend run
    there once fell back to the original graph with an AssertionError) the pass proves its
    regions one after the other instead of ahead in workers."""
    import multiprocessing as mp
    monkeypatch.setenv("SUPEROPT_KERNEL_CACHE", str(tmp_path / "kernels"))
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_pass_with_proofs_ahead, (5,)) == (2, 0)


def test_large_regions_are_proved_side_by_side_before_the_pass_decides(monkeypatch, tmp_path):
    """Where the regions to prove are large (here: any, the threshold lowered) and the machine has
    the cores, their proofs run in worker processes first; the pass then reads them from the
    cache and chooses what it chooses proving them one after the other."""
    import shutil
    import superopt.kernel.choose as choose
    g, prof = _two_norm_linears_measured()
    alone, rep_alone = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep_alone.chosen == 2 and rep_alone.proved_ahead == 0   # cached by the entries above
    cache = Path(os.environ["SUPEROPT_KERNEL_CACHE"]) / "candidates"
    shutil.rmtree(cache)
    monkeypatch.setattr(choose, "PROVE_AHEAD_ELEMENTS", 0)
    monkeypatch.setattr(choose.os, "cpu_count", lambda: choose.PROVE_AHEAD_CORES)
    ahead, rep = choose_kernels(g, None, "test-gpu", "fp32", prof)
    assert rep.proved_ahead == 2 and rep.chosen == 2 and len(list(cache.glob("*.json"))) == 2, rep.table()
    assert all(r.generated.get("cached") for r in rep.regions), rep.table()
    xv = torch.randn(4, 32)
    np.testing.assert_allclose(to_fx(ahead)(xv).numpy(), to_fx(alone)(xv).numpy(), rtol=1e-6, atol=1e-6)


def test_the_ops_launchers_are_never_evicted(monkeypatch):
    """A split schedule's launcher owns the ticket counters a captured CUDA graph writes on every
    replay: the op's launcher cache must keep every launcher for the life of the process (a
    bounded cache dropped the oldest, freeing memory a graph still wrote)."""
    import superopt.kernel.torch_op as op
    from superopt.kernel.program import EXAMPLE, TileConfig
    monkeypatch.setattr(op, "compile_program", lambda prog, cfg: object())
    cfgs = [config_text(TileConfig((("M", 16), ("N", 16), ("K", 16)), 4, stages)) for stages in range(1, 301)]
    try:
        first = op._launcher(EXAMPLE, cfgs[0])
        for c in cfgs[1:]:
            op._launcher(EXAMPLE, c)
        assert op._launcher(EXAMPLE, cfgs[0]) is first
    finally:
        op._launcher.cache_clear()   # the stubs must not outlive the test
