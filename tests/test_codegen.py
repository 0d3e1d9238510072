"""Code generation: IR -> GraphModule / .pt2 / ONNX, every operator, and every zoo model round trip."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import zoo_programs
from superopt.cli import STAGES, main
from superopt.codegen import cli as codegen_cli
from superopt.errors import SuperoptError
from superopt.codegen import CodegenError, example_inputs, export_pt2, to_exported_program, to_fx, to_onnx
from superopt.frontend import from_exported_program, import_model
from superopt.ir import REGISTRY, GraphBuilder, save_graph
from superopt.semantics import evaluate

needs_onnx = pytest.mark.skipif(importlib.util.find_spec("onnx") is None, reason="the onnx extra is not installed")


def _rng_weight(b, name, shape, rng, positive=False):
    data = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return b.weight(name, data=data.astype(np.float32))


def _example(op: str):
    """A small graph using ``op`` (one per registry operator), with weight data."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    img = b.input("img", (2, 4, 6, 6))
    mat = b.input("mat", (2, 3, 4))
    w = lambda name, shape, **kw: _rng_weight(b, name, shape, rng, **kw)  # noqa: E731
    build = {
        "identity_matrix": lambda: b.op("matmul", mat, b.op("identity_matrix", n=4)),
        "identity_conv": lambda: b.op("conv2d", img, b.op("identity_conv", channels=4, kernel=(3, 3)), padding=(1, 1)),
        "ones": lambda: b.op("add", mat, b.op("ones", shape=(3, 4))),
        "zeros": lambda: b.op("add", mat, b.op("zeros", shape=(3, 4))),
        "pool_kernel": lambda: b.op("conv2d", img, b.op("pool_kernel", channels=4, kernel=(3, 3)), groups=4),
        "add": lambda: b.op("add", mat, w("v", (4,))),
        "mul": lambda: b.op("mul", mat, mat),
        "smul": lambda: b.op("smul", mat, w("s", ())),
        "matmul": lambda: b.op("matmul", mat, w("m", (4, 5))),
        "conv2d": lambda: b.op("conv2d", img, w("k", (6, 2, 3, 3)), stride=(2, 2), padding=(1, 1), groups=2,
                               activation="relu"),
        "conv2d_bias": lambda: b.op("conv2d_bias", img, w("k", (6, 2, 3, 3)), w("cb", (6,)), stride=(2, 2),
                                    padding=(1, 1), groups=2, activation="relu"),
        "enlarge": lambda: b.op("conv2d", img, b.op("enlarge", w("k", (4, 4, 1, 1)), kernel=(3, 3)), padding=(1, 1)),
        "transpose": lambda: b.op("transpose", mat, perm=(2, 0, 1)),
        "reshape": lambda: b.op("reshape", mat, shape=(6, 4)),
        "concat": lambda: b.op("concat", mat, mat, axis=2),
        "split": lambda: b.op("split", mat, axis=2, sizes=(1, 3))[1],
        "avgpool2d": lambda: b.op("avgpool2d", img, kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
        "maxpool2d": lambda: b.op("maxpool2d", img, kernel=(2, 2), stride=(2, 2)),
        "batchnorm": lambda: b.op("batchnorm", img, w("g", (4,)), w("bb", (4,)), w("mu", (4,)),
                                  w("var", (4,), positive=True), eps=1e-3),
        "softmax": lambda: b.op("softmax", mat, axis=1),
        "layernorm": lambda: b.op("layernorm", mat, ndim=2),
        "sdpa": lambda: b.op("sdpa", mat, w("kk", (2, 5, 4)), w("vv", (2, 5, 3)), scale=0.5, causal=0),
        "embedding": lambda: b.op("embedding", w("table", (7, 4)), b.input("ids", (2, 3), "int64")),
        "pow": lambda: b.op("pow", mat, exponent=3.0),
        "mean": lambda: b.op("mean", mat, axis=1, keepdim=0),
        "sum": lambda: b.op("sum", mat, axis=-1),
        "rsqrt": lambda: b.op("rsqrt", b.op("add", b.op("mul", mat, mat), w("eps", (), positive=True))),
        "cast": lambda: b.op("cast", b.op("cast", mat, dtype="float64"), dtype="float32"),
        "expand": lambda: b.op("expand", b.op("reshape", mat, shape=(2, 1, 3, 4)), shape=(2, 5, 3, 4)),
        "slice": lambda: b.op("slice", mat, axis=2, start=1, end=4, step=2),
        "index_copy": lambda: b.op("index_copy", mat, b.input("pos", (1,), "int64"), w("row", (2, 3, 1)), axis=2),
        "compare": lambda: b.op("compare", mat, w("limit", (4,)), cmp="lt"),
        "logical": lambda: b.op("logical", b.op("compare", mat, w("lo", (4,)), cmp="ge"),
                                b.op("compare", mat, w("hi", (3, 1)), cmp="lt"), fn="or"),
        "mask_bias": lambda: b.op("mask_bias", b.op("compare", mat, w("edge", (4,)), cmp="le"), dtype="float32"),
        "clamp": lambda: b.op("clamp", mat, lo=-0.5, hi=0.75),
    }
    build.update({u: (lambda u=u: b.op(u, mat)) for u in ("relu", "sigmoid", "tanh", "gelu", "silu", "gelu_tanh", "cos", "sin")})
    if op not in build:
        pytest.skip(f"no example graph for the new operator {op!r} yet: add one to _example")
    return b.build([build[op]()])


LOWERED_OPS = sorted(set(REGISTRY) - {"input", "weight", "opaque"})


@pytest.mark.parametrize("op", LOWERED_OPS)
def test_every_operator_generates_code_that_matches_the_reference(op):
    g = _example(op)
    g = g.prune()
    inputs = example_inputs(g)
    got = to_fx(g)(*inputs)
    want = evaluate(g, {n: x.double().numpy() for n, x in zip(g.input_names, inputs)})[0]
    assert np.allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-5)


def test_multi_output_graph_keeps_output_order():
    b = GraphBuilder()
    x = b.input("x", (4, 6))
    lo, hi = b.op("split", x, axis=1, sizes=(2, 4))
    gm = to_fx(b.build([hi, b.op("relu", lo), x]))
    t = torch.randn(4, 6)
    out = gm(t)
    assert isinstance(out, tuple) and len(out) == 3
    assert torch.equal(out[0], t[:, 2:]) and torch.equal(out[1], t[:, :2].relu()) and torch.equal(out[2], t)


def _opaque_graph(target="aten.cumsum.default"):
    b = GraphBuilder()
    x = b.input("x", (3, 5))
    params = json.dumps({"args": [{"$t": 0}, 1], "kwargs": {"dtype": {"$dtype": "float32"}}})
    y = b.op("opaque", x, target=target, params=params, out_types=[((3, 5), "float32")])
    return b.build([b.op("relu", y)])


def test_opaque_nodes_export_as_they_came(tmp_path):
    g = _opaque_graph()
    x = torch.randn(3, 5)
    assert torch.allclose(to_fx(g)(x), torch.cumsum(x, 1).relu())
    ep = torch.export.load(str(export_pt2(g, tmp_path / "o.pt2", [x])))
    assert torch.allclose(ep.module()(x), torch.cumsum(x, 1).relu())


def test_codegen_errors_name_the_problem(tmp_path):
    with pytest.raises(CodegenError, match="onnx.Celu"):
        to_fx(_opaque_graph("onnx.Celu"))
    b = GraphBuilder()
    g = b.build([b.op("matmul", b.input("x", (2, 3)), b.weight("w", (3, 3)))])
    with pytest.raises(CodegenError, match="weight 'w' has no data"):
        to_fx(g)
    with pytest.raises(CodegenError, match="end in .pt2"):
        export_pt2(_example("relu"), tmp_path / "x.bin")
    with pytest.raises(CodegenError, match="3 example inputs"):
        to_exported_program(_example("relu"), [torch.randn(2, 4, 6, 6)] * 3)


def test_generated_module_creates_no_tensors_on_the_cpu():
    """Constants are buffers, so the module runs wherever it is moved (meta stands in for a GPU)."""
    g = _example("identity_conv")
    gm = to_fx(g).to("meta")
    out = gm(*(x.to("meta") for x in example_inputs(g)))
    assert out.device.type == "meta" and out.shape == (2, 4, 6, 6)


# ---- the zoo ---------------------------------------------------------------------------------

def _rel_err(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("name", ["resnet50", "resnext50_32x4d", "inception_v3", "squeezenet1_1",
                                  "nasnet_a_mobile", "bert_base", "vit_b16"])
def test_zoo_model_round_trips(name):
    from superopt.models import count_flops
    model, inputs = zoo_programs.built(name)
    g, report = from_exported_program(zoo_programs.exported(name))
    assert report.opaque == {}, report.declined
    assert report.flops == count_flops(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
        assert _rel_err(to_fx(g)(*inputs), want) < 1e-5
    ep = to_exported_program(g, inputs)  # the generated module exports as it is
    with torch.no_grad():
        assert _rel_err(ep.module()(*inputs), want) < 1e-5


FRESH = """
import sys, torch
prog = torch.export.load(sys.argv[1])
x, want = torch.load(sys.argv[2])
got = prog.module()(x)
print(((got - want).abs().max() / want.abs().max()).item())
"""


def test_pt2_loads_and_runs_in_a_fresh_process(tmp_path):
    from superopt.models import build
    model, (x,) = build("squeezenet1_1")
    g, _ = import_model(model, example_inputs=[x])
    path = export_pt2(g, tmp_path / "squeezenet.pt2", [x])
    with torch.no_grad():
        torch.save((x, model(x)), tmp_path / "io.pt")
    proc = subprocess.run([sys.executable, "-c", FRESH, str(path), str(tmp_path / "io.pt")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip().splitlines()[-1]) < 1e-5
    g2, _ = import_model(path)  # and importing the export gives the graph back
    assert g2 == g


@needs_onnx
def test_onnx_export_round_trips(tmp_path):
    from superopt.models import build
    model, (h,) = build("bert_base", num_layers=1, seq_len=8)
    g, _ = import_model(model, example_inputs=[h])
    g2, report = import_model(to_onnx(g, tmp_path / "bert.onnx"))
    assert report.opaque == {"aten.erf.default": 1}
    with torch.no_grad():
        assert _rel_err(to_fx(g2)(h), model(h)) < 1e-5


def _codegen_cli(argv) -> int:
    """``superopt codegen ...`` (through the main CLI once superopt.cli lists the stage)."""
    if "superopt.codegen.cli" in STAGES:
        return main(argv)
    parser = argparse.ArgumentParser()
    codegen_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SuperoptError as e:
        print(f"superopt: error: {e}", file=sys.stderr)
        return 2


def test_codegen_cli(tmp_path, capsys):
    g = _example("conv2d")
    save_graph(g, tmp_path / "g.json")
    assert _codegen_cli(["codegen", str(tmp_path / "g.json"), "-o", str(tmp_path / "g.pt2"), "--print"]) == 0
    assert "torch.conv2d" in capsys.readouterr().out
    assert torch.export.load(str(tmp_path / "g.pt2")).module()(*example_inputs(g)).shape == (2, 6, 3, 3)
    for argv in (["codegen", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.pt2")],
                 ["codegen", str(tmp_path / "g.json"), "-o", str(tmp_path / "x.txt")]):
        assert _codegen_cli(argv) == 2
        assert capsys.readouterr().err.startswith("superopt: error: ")


def test_written_programs_carry_no_device_in_their_metadata_asserts():
    """An HF-style ``.to(dtype)`` makes torch.export assert the trace's device; a program written
    for a GPU from a CPU export must not carry it (the dtype check stays)."""
    from superopt.codegen.export import device_free

    class Upcast(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32) * 2

    ep = torch.export.export(Upcast(), (torch.ones(2, dtype=torch.bfloat16),))
    asserts = lambda: [n.kwargs for n in ep.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]  # noqa: E731
    if not asserts():
        pytest.skip("this torch records no metadata assert for .to(dtype)")
    assert any("device" in k for k in asserts())
    device_free(ep)
    assert asserts() and all("device" not in k and k.get("dtype") is not None for k in asserts())
    assert torch.equal(ep.module()(torch.ones(2, dtype=torch.bfloat16)), torch.full((2,), 2.0))


def test_a_channels_last_weight_is_saved_without_torchs_warning_and_loads_equal(tmp_path):
    """torch.export.save warns "No complete tensor found in the group" for every weight that is
    not contiguous (a channels-last kernel alone in its storage), which every written CNN with
    channels-last convolutions has: the save keeps those warnings out, and the weight loads equal."""
    import warnings

    from superopt.codegen.export import save_program

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last))

        def forward(self, x):
            return torch.nn.functional.conv2d(x, self.w, padding=1)

    ep = torch.export.export(Net(), (torch.randn(1, 3, 8, 8),))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        save_program(ep, tmp_path / "m.pt2")
    assert not [w for w in seen if "complete tensor" in str(w.message)]
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(torch.export.load(tmp_path / "m.pt2").module()(x), ep.module()(x))


def test_save_program_writes_the_bytes_torch_export_save_writes(tmp_path):
    """The save skips torch's self-test of the canonical form (its result is discarded): the file
    is byte for byte what ``torch.export.save`` writes, loads and runs, and the function is put back."""
    import io

    from torch._export.serde import serialize as serde

    from superopt.codegen.export import no_canonical_self_test, save_program

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)

        def forward(self, x, y):
            return {"a": torch.relu(self.bn(self.conv(x))).sum((2, 3)) + y, "b": x.mean()}

    ep = torch.export.export(Net().eval(), (torch.randn(2, 3, 8, 8), torch.randn(2, 4)))
    before = serde.canonicalize
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    save_program(ep, tmp_path / "m.pt2")
    assert (tmp_path / "m.pt2").read_bytes() == buf.getvalue()
    assert serde.canonicalize is before
    with pytest.raises(ValueError), no_canonical_self_test():
        assert serde.canonicalize is not before
        raise ValueError("put back on errors too")
    assert serde.canonicalize is before
    x, y = torch.randn(2, 3, 8, 8), torch.randn(2, 4)
    got, want = torch.export.load(tmp_path / "m.pt2").module()(x, y), ep.module()(x, y)
    assert torch.equal(got["a"], want["a"]) and torch.equal(got["b"], want["b"])
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt2"]  # no temporary file left


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pinned_convolution_keeps_its_relu(channels_last):
    """With every convolution a ``superopt::conv2d`` call (``pin_layout``), a ``conv2d`` node with
    ``activation='relu'`` (what the rule fusing a ReLU into the convolution makes) still
    applies the ReLU (it was dropped: a wrong program, which the whole-model check refused)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6))
    w = _rng_weight(b, "w", (8, 4, 3, 3), rng)
    g = b.build([b.op("conv2d", x, w, padding=(1, 1), activation="relu")])
    xs = torch.randn(1, 4, 6, 6)
    want = evaluate(g, {"x": xs.numpy()})[0]
    got = to_fx(g, pin_layout=True, channels_last=channels_last)(xs)
    assert (got >= 0).all() and np.allclose(got.numpy(), want, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pinned_convolution_with_bias_keeps_its_bias_and_relu(channels_last):
    """A ``conv2d_bias`` node under ``pin_layout`` is one ``superopt::conv2d`` call with its bias,
    then its ReLU."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6))
    w, bias = _rng_weight(b, "w", (8, 4, 3, 3), rng), _rng_weight(b, "b", (8,), rng)
    g = b.build([b.op("conv2d_bias", x, w, bias, padding=(1, 1), activation=act) for act in ("none", "relu")])
    xs = torch.randn(1, 4, 6, 6)
    want = evaluate(g, {"x": xs.numpy()})
    got = to_fx(g, pin_layout=True, channels_last=channels_last)(xs)
    assert (got[1] >= 0).all() and (got[0] < 0).any()
    for a, e in zip(got, want):
        assert np.allclose(a.numpy(), e, atol=1e-5)


def test_program_bytes_counts_each_storage_once():
    """What the free-space check before a save asks for: a weight shared by two names counts once."""
    from superopt.codegen.export import program_bytes

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64, bias=False)
            self.b = torch.nn.Linear(64, 64, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    ep = torch.export.export(Tied(), (torch.randn(2, 64),))
    assert program_bytes(ep) == 64 * 64 * 4

