"""A program exported in bf16 is optimized as its float32 form (the graph a float32 export of the
same model gives: the same kernel regions, the same shipped measurements as the backend uses)
and written back in bf16; where that form does not run at bf16, as it is."""

import copy
import json

import pytest
import torch

from superopt.cli import main
from superopt.cost import CostModel
from superopt.driver import load_model, optimize
from superopt.driver.model import program_dtype
from superopt.driver.precision import as_float32, float32_form
from superopt.frontend import import_program
from superopt.frontend.torch_import import export_module
from superopt.ir.hashing import structural_hash
from superopt.models import build
from superopt.rules.load import load_rules


def _export(tmp_path, name: str, dtype=torch.bfloat16, **kw):
    module, inputs = build(name, **kw)
    module = module.to(dtype).eval()
    inputs = tuple(i.to(dtype) if i.is_floating_point() else i for i in inputs)
    path = tmp_path / f"{name}.pt2"
    torch.export.save(export_module(module, inputs), path)
    return path, module, inputs


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """Llama-style decode step, exported in bf16 with its caches in buffers and its mask built
    from the cache position (the form transformers exports for on-device runtimes)."""
    return _export(tmp_path_factory.mktemp("half"), "llama_tiny_decode", cache="buffers", mask="positions")


def test_a_bf16_program_imports_as_the_graph_of_its_float32_export(step):
    path, _, _ = step
    model = load_model(str(path))
    assert model.half == "bf16" and program_dtype(model) == "bf16"
    assert "float32 form" in model.imported_as
    assert {n.types[0].dtype for n in model.graph.nodes if n.types and n.types[0].dtype.startswith("float")} \
        <= {"float32"}
    f32 = load_model(zoo="llama_tiny_decode")   # the same step, float32, as the backend imports a bf16 module
    module, inputs = build("llama_tiny_decode", cache="buffers", mask="positions")
    g, _, _ = import_program(export_module(module, inputs))
    assert structural_hash(model.graph) == structural_hash(g)    # the same regions: the same measured kernels
    assert structural_hash(f32.graph) != structural_hash(model.graph)   # (another form of the step: not vacuous)


def test_the_program_written_from_the_float32_form_runs_in_bf16_and_matches(step, tmp_path):
    path, module, inputs = step
    out, report = tmp_path / "opt.pt2", tmp_path / "rep.json"
    assert main(["optimize", str(path), "-o", str(out), "--device", "h100", "--min-gain", "0",
                 "--report", str(report), "--time-limit", "30"]) == 0
    rep = json.loads(report.read_text())
    assert rep["rewritten"] and "float32 form" in rep["imported_as"]
    ep = torch.export.load(out)
    floats = {n.meta["val"].dtype for n in ep.graph.nodes if n.op == "placeholder"
              and n.meta["val"].is_floating_point()}
    assert floats == {torch.bfloat16}   # weights, caches and inputs: the program's own precision
    original = torch.export.load(path)
    names = [s.arg.name for s in original.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"] == names
    got, want = ep.module()(*inputs), original.module()(*inputs)
    assert got.dtype == want.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max() <= 5e-2 * want.float().abs().max()


class _TableFromPositions(torch.nn.Module):
    """A float32 table computed from integer positions, cast to the activations' dtype before it
    meets them (as Hugging Face computes rotary tables): the float32 form drops that cast, and its
    code at bf16 puts it back (:func:`~superopt.codegen.half.at_precision`)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x, pos):
        table = torch.sin(pos.float())[:, None].expand(-1, 16)
        return (x * table.to(x.dtype)) @ self.w


class _UpcastOutput(_TableFromPositions):
    """Its output upcast to float32 (as older transformers upcast their logits): the float32 form
    drops that cast; its code returns the output in the program's dtype (``Signature.out_dtypes``)."""

    def forward(self, x, pos):
        return super().forward(x, pos).float()


def _bits_abs(y: torch.Tensor) -> torch.Tensor:
    """|y| through its bits (a bf16 tensor's sign bit cleared): read in float32, the views change
    the shape, so the float32 form of a program doing this does not run at bf16."""
    return (y.view(torch.int16) & 0x7FFF).view(torch.bfloat16)


class _BitsOfTheOutput(_TableFromPositions):
    def forward(self, x, pos):
        return _bits_abs(super().forward(x, pos))


def test_a_program_with_a_float32_table_is_optimized_as_its_float32_form(tmp_path):
    torch.manual_seed(0)
    module = _TableFromPositions().to(torch.bfloat16)
    inputs = (torch.randn(8, 16, dtype=torch.bfloat16), torch.arange(300, 308))
    path = tmp_path / "table.pt2"
    torch.export.save(export_module(module, inputs), path)
    model = load_model(str(path))
    assert model.half == "bf16" and "float32 form" in model.imported_as
    res = optimize(model, load_rules(), CostModel("h100"), progress=False, min_gain=0.0, dtype="bf16")
    with torch.no_grad():
        got, want = res.module()(*inputs), module(*inputs)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)   # the table cast back where the program did


def test_an_output_the_program_upcast_is_returned_in_its_dtype(tmp_path):
    """The float32 form cannot say where the program cast an output up (``logits.float()``); the
    code written back casts each output to the dtype the program returned it in (until session
    53 such a program was imported as it is, with no kernel)."""
    torch.manual_seed(0)
    module = _UpcastOutput().to(torch.bfloat16)
    inputs = (torch.randn(8, 16, dtype=torch.bfloat16), torch.arange(8))
    path = tmp_path / "upcast.pt2"
    torch.export.save(export_module(module, inputs), path)
    model = load_model(str(path))
    assert model.half == "bf16" and "float32 form" in model.imported_as
    assert model.signature.out_dtypes == (torch.float32,)
    res = optimize(model, load_rules(), CostModel("h100"), progress=False, min_gain=0.0, dtype="bf16")
    with torch.no_grad():
        got, want = res.module()(*inputs), module(*inputs)
    assert got.dtype == torch.float32 and torch.equal(got, want)   # the matmul in bf16, then upcast


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_regions_cover_the_random_sets_only_for_a_float32_program(tmp_path, dtype):
    """The region check runs in float32: it says nothing of a bf16 program's own rounding, so the
    whole program runs on every input set asked for (before, on its examples alone)."""
    torch.manual_seed(0)
    module = _TwoProjectionsOfAGivenTable().to(dtype)
    inputs = (torch.randn(8, 16, dtype=dtype), torch.randn(8, 16, dtype=dtype))
    path = tmp_path / "two.pt2"
    torch.export.save(export_module(module, inputs), path)
    res = optimize(load_model(str(path)), load_rules(), CostModel("h100"), progress=False, min_gain=0.0,
                   input_sets=3)
    assert not res.unchanged and res.report.region_check["region_outputs"] == 2   # the projections merged
    assert res.report.region_check["covered"] == (dtype == torch.float32)
    want = ["examples"] if dtype == torch.float32 else ["examples", "normal", "normal x0.01"]
    assert list(res.report.output_check) == want


def test_a_program_whose_float32_form_does_not_run_at_bf16_is_imported_as_it_is(tmp_path, capfd):
    module = _BitsOfTheOutput().to(torch.bfloat16)
    inputs = (torch.randn(8, 16, dtype=torch.bfloat16), torch.arange(8))
    path = tmp_path / "bits.pt2"
    torch.export.save(export_module(module, inputs), path)
    model = load_model(str(path))
    assert model.half is None and program_dtype(model) == "bf16"
    assert "as it is" in model.imported_as and "does not run at bf16" in model.imported_as
    assert "Traceback" not in capfd.readouterr().err   # one line in the report, not torch's log of the failure
    res = optimize(model, load_rules(), CostModel("h100"), progress=False, min_gain=0.0, dtype="bf16")
    assert res.report.imported_as == model.imported_as
    with torch.no_grad():
        assert torch.equal(res.module()(*inputs), module(*inputs))


class _RunningAverage(torch.nn.Module):
    """A buffer the program updates in place (a running average, as a cache is written)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))
        self.register_buffer("avg", torch.randn(8, 16))

    def forward(self, x):
        self.avg.mul_(0.5).add_(x @ self.w, alpha=0.5)
        return x - self.avg


@pytest.mark.parametrize("min_gain", ["0", "0.99"], ids=["rewritten", "unchanged"])
def test_importing_a_bf16_program_leaves_its_buffers_as_they_were(tmp_path, min_gain):
    """The float32 form's checks run the program on fake inputs; its buffers were real there, so a
    program that updates one in place had it overwritten, and the program written back (its own,
    where nothing changed) started from another state (``scripts/fuzz.py --dtype bf16``: 3 of 80
    models differed from the original in a fresh process)."""
    torch.manual_seed(0)
    module = _RunningAverage().to(torch.bfloat16)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    src, dst = tmp_path / "avg.pt2", tmp_path / "avg.opt.pt2"
    torch.export.save(export_module(module, (x,)), src)
    model = load_model(str(src))
    assert "float32 form" in model.imported_as
    assert torch.equal(model.program.state_dict["avg"], module.avg)
    assert main(["optimize", str(src), "-o", str(dst), "--quiet", "--min-gain", min_gain, "--device", "h100"]) == 0
    with torch.no_grad():
        want = torch.export.load(src).module()(x)
        got = torch.export.load(dst).module()(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_float32_form_leaves_the_program_untouched(step):
    """Its module is copied: the program's own graph and bf16 weights are what the output check
    compares with (a shared graph rewritten in place made the original compute in float32)."""
    path, module, inputs = step
    ep = torch.export.load(path)
    with torch.no_grad():
        before = ep.module()(*inputs)
    graph, sig, why = float32_form(ep, inputs, {}, "bf16", "step")
    assert why == "" and graph is not None
    assert {p.dtype for p in ep.state_dict.values() if p.is_floating_point()} == {torch.bfloat16}
    with torch.no_grad():
        assert torch.equal(ep.module()(*inputs), before)
    copy.deepcopy(ep)   # its buffers still leaves (the fake run wrote its caches without autograd)


def test_as_float32_renames_half_dtypes_only():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16).half().to(torch.float64).to(torch.int32)
    gm = as_float32(torch.fx.symbolic_trace(M()))
    assert gm(torch.ones(2)).dtype == torch.int32
    dtypes = [a for n in gm.graph.nodes for a in n.args if isinstance(a, torch.dtype)]
    assert dtypes == [torch.float32, torch.float64, torch.int32]
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["to", "float", "to", "to"]


class _TwoProjections(_TableFromPositions):
    def __init__(self):
        super().__init__()
        self.v = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x, pos):
        h = x * torch.sin(pos.float())[:, None].expand(-1, 16).to(x.dtype)
        return h @ self.w, (h @ self.v).float()   # the second output upcast: the float32 form cannot say so


class _TwoProjectionsOfAGivenTable(_TwoProjections):
    def forward(self, x, table):   # the table an input (bf16): nothing float32 by construction
        return (x * table) @ self.w, (x * table) @ self.v


class _TwoProjectionsAndBits(_TwoProjections):
    def forward(self, x, pos):
        a, b = super().forward(x, pos)
        return _bits_abs(a), b


@pytest.mark.parametrize("form", ["given-table", "upcast", "bits"])
def test_the_backend_imports_a_bf16_graph_as_the_cli_does(form):
    """Through ``torch.compile``: the float32 form where it runs in bf16 (an output the program
    upcast returned upcast), else the bf16 graph as it is, searched with the rules at bf16
    (before, Inductor got the original there)."""
    from superopt.driver.backend import CACHE, last_report, register
    torch.manual_seed(0)
    module = {"given-table": _TwoProjectionsOfAGivenTable, "upcast": _TwoProjections,
              "bits": _TwoProjectionsAndBits}[form]().to(torch.bfloat16)
    x, pos = torch.randn(8, 16, dtype=torch.bfloat16), torch.arange(8)
    if form == "given-table":
        pos = torch.sin(torch.arange(8.0))[:, None].expand(-1, 16).to(torch.bfloat16)
    torch._dynamo.reset()
    CACHE.clear()
    register()
    f = torch.compile(module, backend="superopt", options={"inductor": False, "min_gain": 0.0, "device": "h100",
                                                          "time_limit": 10})
    with torch.no_grad():
        got, want = f(x, pos), module(x, pos)
    rep = last_report()
    assert rep["imported_as"].startswith("the bf16 graph as it is" if form == "bits" else "the float32 form")
    assert rep["kept"] == "optimized" and rep["cost_after_us"] < rep["cost_before_us"]   # the projections merged
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


class _Float32Form(torch.nn.Module):
    """What the float32 form of a bf16 program that computes a table from integer positions (in
    float32, its weight read in float32) and casts it back to the activations' dtype looks like:
    the casts are gone."""

    def __init__(self, matmul: bool):
        super().__init__()
        self.matmul = matmul
        self.inv = torch.nn.Parameter(torch.rand(16))
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x, pos):
        p = pos.float()[:, None]
        angles = p @ self.inv[None, :] if self.matmul else p * self.inv
        return (x * torch.sin(angles)) @ self.w


@pytest.mark.parametrize("matmul", [False, True], ids=["promoting", "matmul"])
def test_at_precision_casts_back_where_the_program_did(matmul):
    from superopt.codegen.half import at_precision
    torch.manual_seed(0)
    form = _Float32Form(matmul)
    x, pos = torch.randn(8, 16).to(torch.bfloat16), torch.arange(300, 308)
    inv, w = form.inv.detach().to(torch.bfloat16), form.w.detach().to(torch.bfloat16)
    with torch.no_grad():
        with pytest.raises(RuntimeError):   # cast alone: the matmul meets float32 values
            torch.fx.symbolic_trace(_Float32Form(matmul)).to(torch.bfloat16)(x, pos)
        code = at_precision(torch.fx.symbolic_trace(form), torch.bfloat16, (x, pos))
        got = code(x, pos)
    table = torch.sin(pos.float()[:, None] * inv.float())   # the program: positions and weight in float32
    want = (x * table.to(torch.bfloat16)) @ w                 # ... cast back where it meets x
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    casts = [n.args[1] for n in code.graph.nodes if n.op == "call_method" and n.target == "to" and len(n.args) > 1]
    assert casts == ([torch.float32] if matmul else []) + [torch.bfloat16]   # the weight read up; the table back
