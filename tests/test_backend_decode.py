"""backend="superopt" on graphs that write into their inputs: a decode step with a static KV cache
is optimized, and the caller's caches hold exactly what eager writes, step after step."""

from __future__ import annotations

import operator
import shutil
import warnings

import pytest
import torch

import superopt.driver.backend as backend
from superopt.driver.backend import CACHE, as_float32, last_report, register, updated_inputs
from superopt.models import build


def _compile(m, **options):
    torch._dynamo.reset()
    CACHE.clear()
    register()
    return torch.compile(m, backend="superopt", options={"time_limit": 10, **options})


def _step_inputs(inputs, p: int, gen: torch.Generator):
    """The tiny decode step's inputs at position ``p``: a new token, its rotary tables and the
    mask that lets it see positions up to ``p`` (the caches are the caller's, kept)."""
    hidden, cos, sin, mask, _, *caches = inputs
    mask = torch.zeros_like(mask)
    mask[..., p + 1:] = torch.finfo(torch.float32).min
    angle = torch.rand(cos.shape, generator=gen) * 6.0
    return (torch.randn(hidden.shape, generator=gen), angle.cos(), angle.sin(), mask, torch.tensor([p]), *caches)


@pytest.mark.parametrize("freezing_trace", [False, True])
def test_a_decode_step_is_optimized_and_writes_the_caches_as_eager_does_at_every_step(freezing_trace):
    """The zoo's Llama decode step (tiny), caches marked static as HF's StaticCache marks them:
    one compile, then every step's output and both caches equal eager's (a cache frozen into the
    module, or an update lost, shows from the second step on). With Inductor's freezing flag set
    while dynamo traces, the static caches are attributes of dynamo's graph, not inputs."""
    m, inputs = build("llama_tiny_decode", batch_size=2)
    m = m.eval()
    mine = [t.clone() for t in inputs[-2:]]
    theirs = [t.clone() for t in inputs[-2:]]
    for c in mine:
        torch._dynamo.mark_static_address(c)
    f = _compile(m, inductor=False, device="h100", dtype="bf16")
    gen = torch.Generator().manual_seed(0)
    start = inputs[4].item()
    with torch.no_grad(), warnings.catch_warnings(), torch._inductor.config.patch(freezing=freezing_trace):
        warnings.simplefilter("error", UserWarning)  # no "compiling the original graph"
        for p in range(start, start + 4):
            x = _step_inputs(inputs, p, gen)
            got, want = f(*x[:5], *mine), m(*x[:5], *theirs)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            for a, b in zip(mine, theirs):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
                assert a[:, :, p].abs().sum() > 0  # the step wrote its column
    assert len(CACHE) == 1
    rep = last_report()
    assert rep["kept"] == "optimized" and rep["cost_after_us"] < rep["cost_before_us"]
    # dynamo's names: its inputs l_caches_0_, l_caches_1_, or the graph's attributes k_cache, v_cache
    assert rep["updates"] == (["k_cache", "v_cache"] if freezing_trace else ["l_caches_0_", "l_caches_1_"])
    assert "kernels" in rep["passes"] and rep["kernels"]["regions"] > 0  # the kernel pass ran, as in optimize


def test_the_backend_gives_the_kernel_pass_the_graph_the_cli_gives_it(monkeypatch):
    """A bf16 decode step through the backend (its RMSNorm casts back to bf16 in dynamo's graph)
    and ``superopt optimize --zoo llama_tiny_decode --device h100 --dtype bf16``: the kernel pass
    sees graphs of the same signature, so a model verdict of the shipped profile decides alike,
    and the search prices them alike."""
    import copy
    import superopt.driver.passes as passes
    from superopt.cost import choose_cost_model
    from superopt.driver import load_model, optimize
    from superopt.kernel.choose import model_signature
    from superopt.rules.load import load_rules

    seen = []
    real = passes.choose_kernels
    monkeypatch.setattr(passes, "choose_kernels", lambda g, *a, **k: seen.append(model_signature(g)) or real(g, *a, **k))
    monkeypatch.setattr(backend, "compile_inductor", lambda gm, *a: gm.forward)
    cost, said = choose_cost_model("h100", "bf16", "inductor", freezing=True, layout="choose", conv_relu=True)
    cli = optimize(load_model(zoo="llama_tiny_decode"), load_rules(), cost, dtype="bf16", profile_name=said)
    m, inputs = build("llama_tiny_decode")
    m = copy.deepcopy(m).eval().to(torch.bfloat16)
    x = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs]
    with torch.no_grad():
        _compile(m, device="h100")(*x)
    rep = last_report()
    assert len(seen) == 2 and seen[0] == seen[1]
    assert rep["cost_before_us"] == round(cli.report.cost_before, 2)


class _Siblings(torch.nn.Module):
    """Three linears on one input (the example rules merge them), written into a cache."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(16, 32) for _ in range(3))

    def new(self, x):
        return torch.relu(self.a(x)) + torch.relu(self.b(x)) * self.c(x)


class _SetItem(_Siblings):
    def forward(self, x, cache, pos):
        cache[:, pos] = self.new(x).unsqueeze(1)
        return cache.sum(1)


def _set_item_case():
    """A cache-writing module, a step's inputs, the caller's cache and eager's copy of it."""
    torch.manual_seed(0)
    m = _SetItem().eval()
    x, pos = torch.randn(4, 16), torch.tensor([2])
    mine = torch.randn(4, 8, 32)
    return m, x, pos, mine, mine.clone()


class _ThroughView(_Siblings):
    def forward(self, x, cache, pos):
        cache.transpose(0, 1)[3].copy_(self.new(x))
        return cache.sum(1) * 2


class _ReturnsIt(_Siblings):
    def forward(self, x, cache, pos):
        return cache.index_copy_(1, pos, self.new(x).unsqueeze(1)), self.new(x).sum()


@pytest.mark.parametrize("cls", [_SetItem, _ThroughView, _ReturnsIt])
def test_writes_direct_or_through_a_view_are_written_back(cls):
    torch.manual_seed(0)
    m = cls().eval()
    x, pos = torch.randn(4, 16), torch.tensor([5])
    mine, theirs = torch.randn(4, 8, 32), None
    theirs = mine.clone()
    f = _compile(m, inductor=False, rules="examples", device="h100")
    with torch.no_grad():
        got, want = f(x, mine, pos), m(x, theirs, pos)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    rep = last_report()
    assert rep["kept"] == "optimized" and len(rep["updates"]) == 1
    if cls is _ReturnsIt:
        assert got[0] is mine  # as in eager: the updated cache itself


def _dynamo_graph(fn, *args) -> torch.fx.GraphModule:
    seen = []

    def keep(gm, example_inputs):
        seen.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=keep)(*args)
    return seen[0]


def test_updated_inputs_follows_views():
    def via_views(a, b, c, d, e):
        a.transpose(0, 1)[0].add_(1.0)
        v = b.view(-1)
        v.mul_(2.0)
        c[0] = d.sum()
        t = e + 1.0
        t.relu_()  # a temporary, not an input
        return d.relu() + t

    args = [torch.randn(3, 3) for _ in range(5)]
    gm = _dynamo_graph(via_views, *args)
    names = updated_inputs(gm)
    assert len(names) == 3 and [n[2] for n in names] == ["a", "b", "c"]  # dynamo's l_a_, l_b_, l_c_


def test_a_decode_graph_with_nothing_cheaper_goes_to_inductor_as_dynamo_gave_it(monkeypatch):
    class Step(torch.nn.Module):
        def forward(self, q, k, cache, pos):
            cache.index_copy_(1, pos, k)
            return torch.softmax(q @ cache, -1)

    given = []

    def fake_inductor(gm, inputs, mode=None, *args):
        given.append(gm)
        return gm.forward
    monkeypatch.setattr(backend, "compile_inductor", fake_inductor)
    q, k, pos = torch.randn(2, 4), torch.randn(4, 1), torch.tensor([3])
    mine, theirs = torch.zeros(4, 8), torch.zeros(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = _compile(Step(), rules="examples")(q, k, mine, pos)
    assert torch.allclose(got, Step()(q, k, theirs, pos)) and torch.equal(mine, theirs) and mine[:, 3].abs().sum() > 0
    assert last_report()["kept"].startswith("original (no cheaper graph")
    assert any(n.target == "index_copy_" for n in given[0].graph.nodes)  # dynamo's own graph


def test_a_verdict_for_the_original_hands_inductor_the_original_and_says_why(monkeypatch):
    """Where `superopt tune` timed the original program faster on the device, optimize writes
    the original (report.kept_original); the backend then gives Inductor dynamo's graph."""
    real = backend.optimize

    def device_said_original(*args, **kwargs):
        res = real(*args, **kwargs)
        res.report.rewritten, res.report.kept_original = False, "the device timed the rewrite slower"
        return res
    monkeypatch.setattr(backend, "optimize", device_said_original)
    given = []
    monkeypatch.setattr(backend, "compile_inductor", lambda gm, *a: given.append(gm) or gm.forward)
    m, x, pos, mine, theirs = _set_item_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = _compile(m, rules="examples", device="h100", freezing=False)(x, mine, pos)
    torch.testing.assert_close(got, m(x, theirs, pos))
    torch.testing.assert_close(mine, theirs)
    assert last_report()["kept"] == "original (the device timed the rewrite slower)"
    assert len(given) == 1 and not any(n.target is torch.ops.aten.copy_.default for n in given[0].graph.nodes)


def test_a_failure_keeps_the_original_graph_with_a_warning(monkeypatch):
    def forged(*args, **kwargs):
        raise RuntimeError("forged failure")
    monkeypatch.setattr(backend, "optimize", forged)
    m, x, pos, mine, theirs = _set_item_case()
    f = _compile(m, inductor=False, rules="examples")
    with torch.no_grad(), pytest.warns(UserWarning, match="forged failure; compiling the original graph"):
        got = f(x, mine, pos)
    torch.testing.assert_close(got, m(x, theirs, pos))
    torch.testing.assert_close(mine, theirs)
    assert last_report()["kept"] == "original (RuntimeError: forged failure)"


def test_inductor_failing_on_the_optimized_module_compiles_the_original_with_a_warning(monkeypatch):
    given = []

    def picky_inductor(gm, inputs, mode=None, *args):
        given.append(gm)
        if len(given) == 1:
            raise RuntimeError("forged Inductor failure")
        return gm.forward
    monkeypatch.setattr(backend, "compile_inductor", picky_inductor)
    m, x, pos, mine, theirs = _set_item_case()
    f = _compile(m, rules="examples", device="h100", freezing=False)
    with torch.no_grad(), pytest.warns(UserWarning, match="forged Inductor failure"):
        got = f(x, mine, pos)
    torch.testing.assert_close(got, m(x, theirs, pos))
    torch.testing.assert_close(mine, theirs)
    assert len(given) == 2 and any(n.target is torch.ops.aten.copy_.default for n in given[0].graph.nodes)
    assert last_report()["kept"] == "original (Inductor: RuntimeError)"


@pytest.mark.parametrize("original_skips_too", [False, True])
def test_an_optimized_graph_without_cuda_graphs_keeps_the_original(monkeypatch, original_skips_too):
    """Where Inductor would run the optimized graph that writes the cache without CUDA graphs
    (reduce-overhead then pays every launch) and the original with them, the original is
    compiled, with a warning; where the original would lose them too, the optimized stays."""
    from torch._dynamo.utils import counters
    given = []

    def skipping_inductor(gm, inputs, mode=None, *args):
        given.append(gm)
        if len(given) == 1 or original_skips_too:
            counters["inductor"]["cudagraph_skips"] += 1
        return gm.forward
    monkeypatch.setattr(backend, "compile_inductor", skipping_inductor)
    m, x, pos, mine, theirs = _set_item_case()
    f = _compile(m, rules="examples", device="h100", freezing=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(x, mine, pos)
    torch.testing.assert_close(got, m(x, theirs, pos))
    torch.testing.assert_close(mine, theirs)
    assert len(given) == 2
    said = [str(w.message) for w in caught if "without CUDA graphs" in str(w.message)]
    if original_skips_too:
        assert not said and last_report()["kept"] == "optimized"
    else:
        assert said and last_report()["kept"] == "original (the optimized graph would run without CUDA graphs)"


def test_half_precision_dtypes_are_imported_as_float32():
    """A bf16 model's casts (HF's RMSNorm casts back to its input dtype) are nothing in the
    float32 import, as in the CLI's import of the float32 model."""
    def norm(x, w):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return w * h.to(torch.bfloat16) + x.half().float().to(dtype=torch.float16)

    gm = as_float32(torch.fx.symbolic_trace(norm))
    named = [a for n in gm.graph.nodes for a in [*n.args, *n.kwargs.values()] if isinstance(a, torch.dtype)]
    assert named and set(named) == {torch.float32}
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target in ("half", "bfloat16")]
    x, w = torch.randn(3, 8), torch.randn(8)
    out = gm(x, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) + x)


@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on the CPU needs a C++ compiler")
@pytest.mark.parametrize("freezing_trace", [False, True])
def test_inductor_compiles_the_write_back_with_the_cache_a_static_input(monkeypatch, freezing_trace):
    """The copy into the cache is inside what Inductor compiles, and the cache marked static
    stays a static input (what keeps one CUDA graph under reduce-overhead), whether dynamo gave
    it as an input or, tracing under Inductor's freezing flag, as an attribute of its graph."""
    aot = pytest.importorskip("torch._functorch.aot_autograd")
    from torch._inductor.utils import run_and_get_code
    real = getattr(aot, "_try_get_metadata_from_dynamo", None)
    seen = []

    def spy(mod, *args, **kwargs):
        out = real(mod, *args, **kwargs)
        seen.append((mod, out[1]))
        return out
    if real is not None:
        monkeypatch.setattr(aot, "_try_get_metadata_from_dynamo", spy)
    torch.manual_seed(0)
    m = _SetItem().eval()
    mine = torch.randn(4, 8, 32)
    theirs = mine.clone()
    torch._dynamo.mark_static_address(mine)
    f = _compile(m, rules="examples", device="h100", freezing=False)  # with freezing, Inductor merges them itself
    codes = []
    with torch.no_grad(), torch._inductor.config.patch(freezing=freezing_trace):
        for p in (1, 6):
            x, pos = torch.randn(4, 16), torch.tensor([p])
            got, code = run_and_get_code(f, x, mine, pos)
            codes += code
            torch.testing.assert_close(got, m(x, theirs, pos), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    # the update is written into the cache in place: no buffer of the cache's size
    assert codes and not any("empty_strided_cpu((4, 8, 32)" in c for c in codes)
    assert last_report()["kept"] == "optimized"
    module = next(v[0] for v in CACHE.values())
    copies = [n for n in module.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(copies) == 1 and copies[0].args[0].op == "placeholder"
    if freezing_trace:
        # dynamo held the cache as an attribute: Inductor gets it back as a buffer of the module
        # (the caller's tensor, not a copy), written in place like the original's
        handed = [mod for mod, _ in seen if any(n.op == "get_attr" and n.target.startswith("superopt_state_")
                                                 for n in mod.graph.nodes)]
        assert handed, "the cache was not handed to Inductor as a buffer"
        bufs = dict(handed[-1].named_buffers())
        assert any(b.data_ptr() == mine.data_ptr() for n, b in bufs.items() if n.startswith("superopt_state_"))
    elif real is not None:
        mod, static = next((mod, s) for mod, s in seen if mod is module)
        weights = len(dict(mod.named_parameters(remove_duplicate=False))) + len(
            dict(mod.named_buffers(remove_duplicate=False)))
        cache_pos = [k for k, n in enumerate(n for n in mod.graph.nodes if n.op == "placeholder")
                     if n.target == copies[0].args[0].target][0]
        assert weights + cache_pos in static


class TablesFromPositions(torch.nn.Module):
    """A bf16 decode step as Hugging Face's models write it: the rotary tables computed in
    float32 from the integer positions and cast back with ``.to(x.dtype)``, the new key written
    into a bf16 cache the caller holds."""

    def __init__(self):
        super().__init__()
        self.k = torch.nn.Linear(16, 16, bias=False)
        self.register_buffer("inv_freq", 1.0 / (100.0 ** (torch.arange(0, 16, 2).float() / 16)), persistent=False)

    def forward(self, x, pos, cache):
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([freqs, freqs], dim=-1).cos().to(x.dtype)
        k = (self.k(x) * cos).view(1, 1, 1, 16)
        cache.index_copy_(2, pos, k)
        return torch.nn.functional.scaled_dot_product_attention(k, cache, cache)


class UpcastOutput(TablesFromPositions):
    def forward(self, x, pos, cache):   # its output upcast to float32: the float32 form drops that cast
        return super().forward(x, pos, cache).float()


def _bits_abs(y: torch.Tensor) -> torch.Tensor:
    """|y| through a bf16 tensor's bits: read in float32 the views change the shape, so the
    float32 form of a program doing this does not run at bf16."""
    return (y.view(torch.int16) & 0x7FFF).view(torch.bfloat16)


class BitsOfTheOutput(TablesFromPositions):
    def forward(self, x, pos, cache):
        return _bits_abs(super().forward(x, pos, cache))


@pytest.mark.parametrize("form", ["float32-form", "upcast", "as-it-is"])
def test_a_bf16_step_with_float32_tables_runs_with_its_casts_back(form):
    """Imported in float32, the cast back to bf16 is nothing, so the float32 form's module cast to
    bf16 alone would meet the cache with float32 keys: its code at bf16 casts the table back where
    the program did (``codegen.half.at_precision``), and an output the program upcast is returned
    upcast, checked on fake inputs at the inputs' precision (until session 52 the backend handed
    Inductor the original here); where the form's code does not run at bf16 (a view of the bits),
    the bf16 graph is imported as it is. Either way the module handed on runs in bf16 with eager's
    values."""
    torch.manual_seed(0)
    m = {"float32-form": TablesFromPositions, "upcast": UpcastOutput, "as-it-is": BitsOfTheOutput}[form]().eval().bfloat16()
    mine, theirs = torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16), torch.zeros(1, 1, 8, 16, dtype=torch.bfloat16)
    f = _compile(m, inductor=False, device="h100", dtype="bf16", search=False)   # the imported graph handed on
    with torch.no_grad():
        for p in range(3):
            x, pos = torch.randn(1, 16, dtype=torch.bfloat16), torch.tensor([p])
            got, want = f(x, pos, mine), m(x, pos, theirs)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(mine, theirs)
    rep = last_report()
    said = "the bf16 graph as it is: its float32 form does not run at bf16" if form == "as-it-is" \
        else "the float32 form of the bf16 graph"
    assert rep["imported_as"].startswith(said), rep
    assert rep["kept"] == "imported (search off)"


class MatmulTable(torch.nn.Module):
    """transformers' rotary table as a matmul: its bf16 buffer read in float32 (``.float()``), which
    the bf16 graph imported as it is holds as a float32 weight; a view of the bits, so the float32
    form does not run at bf16 and the graph is imported as it is."""

    def __init__(self):
        super().__init__()
        self.k = torch.nn.Linear(16, 16, bias=False)
        self.v = torch.nn.Linear(16, 16, bias=False)
        self.register_buffer("inv", torch.rand(1, 16), persistent=False)

    def forward(self, x, pos):
        angles = pos.float()[:, None] @ self.inv.float()
        return _bits_abs((self.k(x) + self.v(x)) * torch.sin(angles).to(x.dtype)).float()


def test_a_graph_imported_as_it_is_keeps_its_float32_weights():
    """The module made from a bf16 graph imported as it is is moved to the inputs' device only: a
    cast of it to bf16 made the float32 weight bf16 again and the matmul met float32 positions."""
    torch.manual_seed(0)
    m = MatmulTable().eval().bfloat16()
    f = _compile(m, inductor=False, device="h100", dtype="bf16", min_gain=0.0)   # searched: the weight's cast folded
    x, pos = torch.randn(4, 16, dtype=torch.bfloat16), torch.arange(300, 304)
    with torch.no_grad():
        got, want = f(x, pos), m(x, pos)
    rep = last_report()
    assert rep["imported_as"].startswith("the bf16 graph as it is") and rep["kept"] == "optimized", rep
    handed = list(CACHE.values())[-1][0]
    assert torch.float32 in {t.dtype for t in handed.buffers()}   # the buffer's cast, folded: a float32 weight
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)   # the projections merged: bf16 rounding


def test_devices_a_gpu_graph_names_are_the_cpu_in_the_import():
    """Dynamo's graph of a model on the GPU makes tensors there (a mask built from positions:
    ``torch.arange(n, device=pos.device)``); the import runs it on the CPU, device for device."""
    from superopt.driver.backend import as_cpu

    g = torch.fx.Graph()  # as dynamo writes it (constant devices; tracing here would make CUDA tensors)
    x, pos = g.placeholder("x"), g.placeholder("pos")
    keys = g.call_function(torch.arange, (6,), {"device": torch.device("cuda", 0)})
    ones = g.call_function(torch.ones, (6,), {"device": "cuda:0"})
    at = g.call_function(operator.getitem, (g.call_method("to", (pos, "cuda")), (slice(None), None)))
    mask = g.call_function(operator.le, (g.call_function(operator.getitem, (keys, (None, slice(None)))), at))
    y = g.call_function(operator.mul, (g.call_method("cuda", (x,)), mask))
    g.output(g.call_function(operator.add, (y, g.call_method("to", (ones, torch.device("cuda"))))))
    gm = as_cpu(torch.fx.GraphModule(torch.nn.Module(), g))
    named = [a for n in gm.graph.nodes for a in [*n.args, *n.kwargs.values()]
             if isinstance(a, torch.device) or isinstance(a, str) and a.startswith("cuda")]
    assert named and all(str(a) == "cpu" for a in named)
    x, pos = torch.randn(2, 6), torch.tensor([1, 4])
    assert torch.equal(gm(x, pos), x * (torch.arange(6)[None, :] <= pos[:, None]) + 1)
