"""Importers: torch.export programs and ONNX models -> IR, opaque nodes, folding, bad input.

Zoo-wide round trips live in test_codegen.py; here small modules keep each test fast.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from superopt.cli import main
from superopt.frontend import ModelImportError, flops, from_exported_program, import_model
from superopt.ir import GraphBuilder
from superopt.semantics import evaluate
from superopt.semantics.torch_lowering import run

HAS_ONNX = importlib.util.find_spec("onnx") is not None
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="the onnx extra is not installed")


def _import(module, *inputs):
    return from_exported_program(torch.export.export(module.eval(), inputs))


def _close(graph, module, *inputs, tol=1e-5):
    """The IR (torch lowering, float32) computes what the module computes."""
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = run(graph, dict(zip(graph.input_names, inputs)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() <= tol * max(1.0, w.abs().max().item())


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, image):
        y = F.max_pool2d(torch.relu(self.bn(self.conv(image))), 2)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class KitchenSink(nn.Module):
    """One of each layout and elementwise mapping: split, slice, select, pad, cat, permute,
    scalar arithmetic, layer norm with affine part, gelu, softmax, dropout, expand."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.token = nn.Parameter(torch.randn(1, 1, 6))
        self.drop = nn.Dropout(0.3)

    def forward(self, x, y):
        a, b = torch.split(x, [2, 4], dim=-1)
        z = torch.cat([b, a], -1) * 0.5 - 1.0 + y / 4.0
        z = torch.cat([self.token.expand(x.shape[0], -1, -1), z], 1)
        z = F.gelu(self.ln(self.drop(z))).transpose(1, 2)
        s = torch.softmax(z[:, 1:5, :], dim=-1)
        return F.pad(s, (1, 2)), z.select(2, 0).sigmoid() - torch.tanh(z[..., 1])


def test_convnet_maps_every_operator():
    x = torch.randn(2, 3, 16, 16)
    g, report = _import(ConvNet(), x)
    assert report.opaque == {}
    assert set(report.operators) == {"conv2d", "add", "batchnorm", "relu", "maxpool2d", "avgpool2d", "reshape",
                                     "matmul"}
    assert g.input_names == ("image",)
    assert {"conv_weight", "bn_running_var", "fc_weight", "fc_bias"} <= {g.nodes[i].name for i in g.weights}


def test_convnet_outputs_equal_float32_and_float64():
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 16, 16)
    g, _ = _import(model, x)
    _close(g, model, x)
    ref = evaluate(g, {"image": x.double().numpy()})[0]
    assert np.allclose(ref, model(x).detach().double().numpy(), rtol=1e-4, atol=1e-5)


def test_pre_dispatch_and_core_aten_give_the_same_graph():
    torch.manual_seed(0)
    ep = torch.export.export(ConvNet().eval(), (torch.randn(1, 3, 16, 16),))
    g1, _ = from_exported_program(ep)
    g2, report = from_exported_program(ep.run_decompositions())
    assert g1 == g2 and report.folded >= 1  # the fc weight's permute folded into a weight


def test_kitchen_sink_has_no_opaque_nodes():
    torch.manual_seed(0)
    model, x, y = KitchenSink().eval(), torch.randn(3, 4, 6), torch.randn(3, 4, 6)
    g, report = _import(model, x, y)
    assert report.opaque == {}, report.declined
    assert report.dropped >= 1 and report.folded >= 1  # eval dropout; the class token's expand
    assert g.input_names == ("x", "y")
    _close(g, model, x, y)


class EmptyPassThrough(nn.Module):
    """Phi-3's partial rotary embedding at a factor of 1: the pass-through part ``q[..., d:]`` is
    empty and joined back with ``cat``."""

    def forward(self, q):
        rot, rest = q[..., :8], q[..., 8:]
        return torch.cat([torch.cat([-rot[..., 4:], rot[..., :4]], dim=-1) * 2.0, rest], dim=-1)


def test_an_empty_piece_of_a_cat_is_left_out():
    q = torch.randn(1, 2, 3, 8)
    g, report = _import(EmptyPassThrough(), q)
    assert report.opaque == {} and not any(n.op == "opaque" for n in g.nodes)
    _close(g, EmptyPassThrough(), q)


class Exotic(nn.Module):
    def forward(self, x):
        y = torch.cumsum(x, dim=1)
        v, i = torch.sort(y, dim=-1)
        return F.hardswish(v) + F.max_pool2d(x, 3, 2, ceil_mode=True).sum(), i


def test_unknown_operators_become_opaque_and_still_run():
    x = torch.randn(1, 2, 6, 6)
    g, report = _import(Exotic(), x)
    assert report.opaque["aten.cumsum.default"] == 1 and report.opaque["aten.sort.default"] == 1
    assert "aten.max_pool2d.default" in report.opaque  # ceil_mode changes its size: declined
    assert any("ceil_mode" in reason for reason in report.declined)
    sort = next(n for n in g.nodes if n.op == "opaque" and n.attr["target"] == "aten.sort.default")
    assert [t.dtype for t in sort.types] == ["float32", "int64"]
    with torch.no_grad():
        want = Exotic()(x)
    got = run(g, {"x": x})
    assert torch.allclose(got[0], want[0], atol=1e-6) and torch.equal(got[1], want[1])


def test_folding_computes_weight_only_subgraphs_at_import():
    class Folded(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 5))

        def forward(self, x):
            return x @ (self.w.t() * 2.0 + 1.0)

    g, report = _import(Folded(), torch.randn(3, 5))
    assert report.folded == 3 and report.operators == {"matmul": 1}
    assert report.parameters == 20



def test_folding_views_a_constant_whatever_its_layout():
    """Swin's shifted-window mask: a constant built in place, permuted, made contiguous and
    viewed. The dropped ``contiguous`` leaves the folded constant permuted, which ``view`` cannot
    take as it is (torchvision's swin_t crashed the import); its values are what count."""

    class Shifted(nn.Module):
        def forward(self, x):
            m = torch.zeros(6, 4)
            m[:3, :2] = 1.0
            m[3:, 1:] = 2.0
            return x + m.view(2, 3, 2, 2).permute(0, 2, 1, 3).contiguous().view(4, 6)

    x = torch.randn(4, 6)
    g, report = _import(Shifted(), x)
    assert report.operators == {"add": 1}
    _close(g, Shifted(), x, tol=0)

@settings(max_examples=8, deadline=None)
@given(stride=st.integers(1, 2), padding=st.integers(0, 2), groups=st.sampled_from([1, 2]),
       bias=st.booleans(), kernel=st.sampled_from([1, 3]), dilation=st.sampled_from([1, 1, 2]))
def test_conv_property(stride, padding, groups, bias, kernel, dilation):
    conv = nn.Conv2d(4, 6, kernel, stride, padding, dilation, groups, bias).eval()
    x = torch.randn(1, 4, 9, 9)
    g, report = _import(conv, x)
    assert ("aten.conv2d.default" in report.opaque) == (dilation != 1)
    assert report.operators.get("add", 0) == (bias and dilation == 1)
    _close(g, conv, x)


def test_flops_counts_conv_and_matmul_multiply_adds():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.op("conv2d", x, b.weight("w", (6, 2, 3, 3)), groups=2, padding=(1, 1))
    z = b.op("matmul", b.op("reshape", y, shape=(6, 64)), b.weight("m", (64, 10)))
    assert flops(b.build([z])) == 2 * (6 * 64 * 2 * 9) + 2 * (6 * 10 * 64)


def test_report_prints_and_serializes():
    _, report = _import(Exotic(), torch.randn(1, 2, 6, 6))
    table = report.to_table()
    for word in ("FLOPs", "opaque nodes", "aten.cumsum.default", "weights"):
        assert word in table
    assert json.loads(json.dumps(report.to_dict()))["opaque"]["aten.cumsum.default"] == 1


def test_training_mode_batch_norm_is_refused():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).train()
    ep = torch.export.export(model, (torch.randn(2, 3, 4, 4),))
    with pytest.raises(ModelImportError, match="eval"):
        from_exported_program(ep)


class _Flat(nn.Module):
    """State at a path the written module uses for its own graph (``flat``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("flat", torch.zeros(3))

    def forward(self, x):
        self.flat.add_(x)
        return self.flat * 2


def test_state_at_a_path_the_written_module_uses_is_refused_by_name():
    from superopt.codegen import to_module
    from superopt.frontend import import_program
    g, _, sig = import_program(torch.export.export(_Flat(), (torch.ones(3),)))
    assert sig.state_paths == ("flat",) and sig.mutated == (sig.state[0].name,)
    with pytest.raises(ModelImportError, match="state buffer flat cannot be kept"):
        to_module(g, sig)


class Branchy(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))


def test_programs_the_ir_cannot_hold_are_refused_with_a_reason():
    dyn = torch.export.export(nn.Linear(4, 3), (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("b")},))
    with pytest.raises(ModelImportError, match="dynamic sizes.*--specialize"):
        from_exported_program(dyn)
    g, _ = from_exported_program(dyn, specialize=True)  # at the example sizes
    assert g.nodes[g.inputs[0]].types[0].shape == (2, 4)
    with pytest.raises(ModelImportError, match="control flow"):
        from_exported_program(torch.export.export(Branchy(), (torch.randn(3),)))
    with pytest.raises(ModelImportError, match="example_inputs"):
        import_model(nn.ReLU())


# ---- files and the CLI ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    torch.manual_seed(0)
    torch.export.save(torch.export.export(ConvNet().eval(), (torch.randn(1, 3, 16, 16),)), str(path))
    return path


def test_pt2_file_imports(small_pt2):
    g, report = import_model(small_pt2)
    assert report.format == "pt2" and report.opaque == {} and g.input_names == ("image",)


def test_cli_summary_and_json(small_pt2, capsys, tmp_path):
    assert main(["import", str(small_pt2), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "conv2d" in out and "FLOPs" in out
    assert main(["import", str(small_pt2), "--json", "-o", str(tmp_path / "g.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["operators"]["conv2d"] == 1 and doc["flops"] > 0
    from superopt.ir import load_graph
    assert load_graph(tmp_path / "g.json") == import_model(small_pt2)[0]


def _bad_files(tmp, small_pt2):
    data = small_pt2.read_bytes()
    (tmp / "truncated.pt2").write_bytes(data[: len(data) // 2])
    (tmp / "text.pt2").write_text("not a model\n")
    torch.save({"w": torch.ones(2)}, tmp / "checkpoint.pt2")
    return {"missing": tmp / "missing.pt2", "truncated": tmp / "truncated.pt2", "text": tmp / "text.pt2",
            "checkpoint": tmp / "checkpoint.pt2", "folder": tmp}


@pytest.mark.parametrize("kind", ["missing", "truncated", "text", "checkpoint", "folder"])
def test_bad_files_give_one_error_line(kind, small_pt2, tmp_path, capsys):
    path = _bad_files(tmp_path, small_pt2)[kind]
    assert main(["import", str(path), "--format", "pt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("superopt: error: ") and "\n" not in err and "Traceback" not in err


def test_truncated_pt2_in_a_fresh_process_prints_no_traceback(small_pt2, tmp_path):
    path = _bad_files(tmp_path, small_pt2)["truncated"]
    proc = subprocess.run([sys.executable, "-m", "superopt", "import", str(path)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "truncated" in proc.stderr, proc.stderr


def test_onnx_without_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07")
    assert main(["import", str(tmp_path / "m.onnx")]) == 2
    assert "pip install superopt[onnx]" in capsys.readouterr().err


# ---- ONNX ----------------------------------------------------------------------------------

def _onnx(module, inputs, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), inputs, str(path), dynamo=False, opset_version=17, **kw)
    return path


@needs_onnx
def test_onnx_convnet_and_transformer(tmp_path):
    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(2, 3, 16, 16)
    g, report = import_model(_onnx(model, (x,), tmp_path / "c.onnx"))
    assert report.opaque == {} and report.format.startswith("onnx")
    _close(g, model, x)
    from superopt.models import build
    bert, (h,) = build("bert_base", num_layers=1, seq_len=8)
    g, report = import_model(_onnx(bert, (h,), tmp_path / "b.onnx"))
    assert report.opaque == {"aten.erf.default": 1}  # the exporter writes exact GELU as an Erf pattern
    assert report.operators["layernorm"] == 2 and report.operators["softmax"] == 1
    _close(g, bert, h)


def _onnx_graph(tmp_path, nodes, inputs, outputs, name="m.onnx"):
    import onnx
    from onnx import TensorProto, helper
    info = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "g", [info(*i) for i in inputs], [info(*o) for o in outputs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / name))
    return tmp_path / name


@needs_onnx
def test_onnx_symbolic_batch_and_the_3d_pools_of_torchs_lrn(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LocalResponseNorm(3), nn.ReLU()).eval()
    path = _onnx(model, (torch.randn(1, 3, 8, 8),), tmp_path / "lrn.onnx", input_names=["img"],
                 dynamic_axes={"img": {0: "batch"}})
    g, report = import_model(path, batch_size=3)
    assert g.nodes[g.inputs[0]].types[0].shape == (3, 3, 8, 8)
    assert "aten.avg_pool3d.default" in report.opaque
    _close(g, model, torch.randn(3, 3, 8, 8))


@needs_onnx
def test_onnx_lrn_runs_through_torch_and_unknown_ops_are_kept(tmp_path):
    from onnx import helper
    lrn = helper.make_node("LRN", ["x"], ["y"], size=3, alpha=1e-3, beta=0.75, bias=2.0)
    g, report = import_model(_onnx_graph(tmp_path, [lrn], [("x", [2, 5, 4, 4])], [("y", [2, 5, 4, 4])]))
    assert report.opaque == {"torch.nn.functional.local_response_norm": 1}
    _close(g, nn.LocalResponseNorm(3, 1e-3, 0.75, 2.0), torch.randn(2, 5, 4, 4))
    celu = helper.make_node("Celu", ["x"], ["y"], alpha=2.0)
    g, report = import_model(_onnx_graph(tmp_path, [celu], [("x", [2, 3])], [("y", [2, 3])]))
    assert report.opaque == {"onnx.Celu": 1}
    assert json.loads(g.nodes[-1].attr["params"])["kwargs"]["attrs"] == {"alpha": 2.0}


@needs_onnx
def test_onnx_bad_files(tmp_path, capsys):
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xfe garbage \x00")
    for path in (tmp_path / "junk.onnx", tmp_path / "missing.onnx"):
        assert main(["import", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("superopt: error: ") and "\n" not in err


@needs_onnx
def test_onnx_files_the_checker_refuses_get_one_printable_line(tmp_path, capsys):
    """Damaged names and op types (a flipped bit makes 'Relu' 'Relu\x0b') are refused by the ONNX
    checker, and what is read from the file is printed escaped, on one line."""
    from onnx import helper
    path = _onnx_graph(tmp_path, [helper.make_node("Relu\x0b", ["x"], ["y\nz"])], [("x", [2, 3])], [("y\nz", [2, 3])])
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("superopt: error: ") and err.count("\n") == 1 and "checker" in err
    assert all(c.isprintable() for c in err.strip())


@needs_onnx
def test_onnx_a_tensor_attribute_of_the_wrong_size_is_refused(tmp_path, capsys):
    from onnx import TensorProto, helper
    value = helper.make_tensor("v", TensorProto.FLOAT, [3], b"\0" * 12, raw=True)
    value.raw_data = b"\0" * 8  # 2 floats where 3 are said, as a truncated file would have it
    nodes = [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])]
    assert main(["import", str(_onnx_graph(tmp_path, nodes, [("x", [3])], [("y", [3])]))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("superopt: error: ") and err.count("\n") == 1 and "damaged" in err


def test_an_integer_tensor_through_a_float_function_is_kept_opaque(tmp_path):
    """torch promotes tanh(int) to float; the IR's tanh keeps the input type, so the call stays a
    torch call (it used to stop the import with an internal assertion)."""
    class M(nn.Module):
        def forward(self, x, y):
            return torch.tanh(x) + torch.sigmoid(x) * y
    x, y = torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.randn(2, 3)
    g, report = import_model(torch.export.export(M(), (x, y)))
    assert set(report.opaque) == {"aten.tanh.default", "aten.sigmoid.default"}
    assert any("where torch gives f32" in reason for reason in report.declined)
    _close(g, M(), x, y)


# ---- superopt zoo ----------------------------------------------------------------------------

def test_zoo_list(capsys):
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"resnet50", "bert_base", "vit_b16"}
    assert main(["zoo", "list"]) == 0
    assert "squeezenet1_1" in capsys.readouterr().out


def test_zoo_export_writes_a_pt2_that_imports(tmp_path, capsys):
    out = tmp_path / "sq.pt2"
    assert main(["zoo", "export", "squeezenet1_1", "-o", str(out), "--batch-size", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shapes"] == [[2, 3, 224, 224]]
    g, report = import_model(out)
    assert report.opaque == {} and g.nodes[g.inputs[0]].types[0].shape == (2, 3, 224, 224)


def test_zoo_export_in_bf16_writes_a_bf16_program(tmp_path, capsys):
    """A decode step exported as users export LLMs: weights, caches and floating inputs in bf16
    (the position stays an integer)."""
    out = tmp_path / "l.pt2"
    assert main(["zoo", "export", "llama_tiny_decode", "--dtype", "bf16", "--cache", "buffers", "-o", str(out),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "bf16"
    g, report = import_model(out)
    assert report.opaque == {}
    kinds = {g.nodes[i].types[0].dtype for i in g.inputs}
    assert "bfloat16" in kinds and "float32" not in kinds and "int64" in kinds


def test_zoo_export_with_rotary_tables_from_positions(tmp_path):
    """A Llama-style step as transformers writes its rotary embedding: position ids in, the
    tables computed in the graph (no cos and sin inputs)."""
    out = tmp_path / "r.pt2"
    assert main(["zoo", "export", "llama_tiny_decode", "--rotary", "positions", "--dtype", "bf16", "-o", str(out)]) == 0
    g, report = import_model(out)
    assert report.opaque == {} and any(n.op in ("cos", "sin") for n in g.nodes)
    assert [g.nodes[i].types[0].shape for i in g.inputs][:2] == [(1, 1, 64), (1, 1)]


@pytest.mark.parametrize("argv, message", [
    (["zoo", "export", "resnet5"], "unknown model 'resnet5'"),
    (["zoo", "export", "squeezenet1_1", "-o", "model.bin"], "must end in .pt2"),
    (["zoo", "export", "squeezenet1_1", "-o", "/no/such/folder/m.pt2"], "does not exist"),
    (["zoo", "export", "squeezenet1_1", "--seq-len", "8", "-o", "m.pt2"], "--seq-len is for bert_base"),
    (["zoo", "export", "resnet50", "--rotary", "positions", "-o", "m.pt2"], "--rotary is for llama3_8b_prefill"),
])
def test_zoo_export_bad_input(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_linear_on_a_vector_is_not_opaque():
    """Found by the fuzzer: a (D,) input through nn.Linear was kept opaque."""
    from superopt.codegen import to_fx
    m, x = nn.Linear(4, 3).eval(), torch.randn(4)
    g, report = from_exported_program(torch.export.export(m, (x,)))
    assert report.opaque == {} and report.operators["matmul"] == 1
    torch.testing.assert_close(to_fx(g)(x), m(x))


def test_a_weight_array_is_a_view_where_the_tensor_is_dense_else_a_copy():
    """Parameters and transposed linear weights are not copied (superopt.frontend.context
    ._weight_array): the same values, sharing the program's memory; a broadcast (stride 0) or
    strided slice is copied into C order."""
    from superopt.frontend.context import _weight_array
    w = torch.randn(6, 4)
    for t in (w, w.t(), w.reshape(2, 3, 4).permute(2, 0, 1), w[2:4]):
        a = _weight_array(t)
        assert np.shares_memory(a, w.numpy()) and a.shape == tuple(t.shape)
        assert np.array_equal(a, t.contiguous().numpy())
    for t in (w[:, ::2], torch.randn(1, 4).expand(5, 4)):
        a = _weight_array(t)
        assert a.flags.c_contiguous and np.array_equal(a, t.contiguous().numpy())
        assert not np.shares_memory(a, t.numpy())


def test_an_imported_linear_weight_holds_the_parameters_values_transposed():
    from superopt.frontend.torch_import import from_exported_program
    m = torch.nn.Linear(4, 3).eval()
    g, _ = from_exported_program(torch.export.export(m, (torch.randn(2, 4),)))
    (w,) = [g.data[g.nodes[i].name] for i in g.weights if g.data[g.nodes[i].name].ndim == 2]
    assert np.array_equal(w, m.weight.detach().numpy().T)


class HardActivations(nn.Module):
    """MobileNet's activations, and a clamp with two bounds."""

    def forward(self, x):
        y = F.relu6(x) + F.hardtanh(x, -0.5, 2.0) + F.hardsigmoid(x) * F.hardswish(x)
        return torch.clamp(y, -1.0, 3.0)


@settings(max_examples=10, deadline=None)
@given(st.floats(-8, 8), st.floats(0, 8), st.integers(0, 2**31))
def test_hard_activations_import_as_clamp_and_compute_what_torch_does(shift, scale, seed):
    """hardtanh, ReLU6, clamp with two bounds become ``clamp``; hardsigmoid and hardswish the
    ``add``/``clamp``/``smul``/``mul`` of torch's definition: no opaque node, the torch lowering
    within float32 rounding of eager, the float64 reference too (its 1/6 a float32 constant)."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed)) * scale + shift
    g, report = _import(HardActivations(), x)
    assert not report.opaque and report.operators["clamp"] == 5
    _close(g, HardActivations(), x, tol=1e-6)
    want = HardActivations()(x.double())
    (got,) = evaluate(g, {g.input_names[0]: x.double().numpy()})
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-7, atol=1e-9)  # 1/6 is a float32 constant


def test_a_clamp_with_one_bound_stays_opaque():
    class OneSided(nn.Module):
        def forward(self, x):
            return torch.clamp(x, min=0.1) * 2.0

    g, report = _import(OneSided(), torch.randn(2, 3))
    assert dict(report.opaque) == {"aten.clamp.default": 1}
