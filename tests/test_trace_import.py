"""The zoo model recorded instead of exported (superopt.frontend.trace_import): the very graph
and signature torch.export and the importer give, on every zoo CNN; a model calling anything the
recording does not map is NotRecorded (and load_model exports it as before); the written file
of a recorded model is the exported one's."""

from __future__ import annotations

import pytest
import torch

from superopt.driver.model import load_model
from superopt.frontend.torch_import import export_module, import_program
from superopt.frontend.trace_import import NotRecorded, record_module
from superopt.ir.hashing import named_hash
from superopt.models import build


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet50", "resnext50_32x4d", "inception_v3", "nasnet_a_mobile"])
def test_the_recorded_graph_is_the_exported_one(name):
    module, inputs = build(name)
    graph, sig = record_module(module, tuple(inputs))
    want, _, want_sig = import_program(export_module(module, inputs))
    assert graph == want and named_hash(graph) == named_hash(want)  # nodes, names, outputs and every weight
    assert list(graph.data) == list(want.data)
    assert sig == want_sig


@pytest.mark.parametrize("name, why", [("bert_base", "reshape"), ("vit_b16", "transpose"),
                                       ("gpt2_tiny_block", "layer_norm")])
def test_a_model_with_calls_the_recording_does_not_map_is_not_recorded(name, why):
    module, inputs = build(name)
    with pytest.raises(NotRecorded, match=why):
        record_module(module, tuple(inputs))


class _Made(torch.nn.Module):
    """Adds a tensor made inside its forward pass (the export lifts it as a constant)."""

    def forward(self, x):
        return torch.relu(x) + torch.ones(3)


class _InPlace(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.relu(x + x, inplace=True)


class _Scalar(torch.nn.Module):
    def forward(self, x):
        return x + 1.0


@pytest.mark.parametrize("module, why", [(_Made(), "not recorded"), (_InPlace(), "in-place"),
                                         (_Scalar(), "add of a number"),
                                         (torch.nn.BatchNorm1d(3).train(), "add_ is not recorded"),  # its step count
                                         (torch.nn.Dropout(0.5).train(), "training mode")])
def test_what_the_export_does_differently_is_not_recorded(module, why):
    with pytest.raises(NotRecorded, match=why):
        record_module(module, (torch.randn(2, 3),))


def test_a_forward_pass_that_fails_is_left_to_the_export():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    with pytest.raises(NotRecorded, match="failed"):
        record_module(conv, (torch.randn(1, 5, 8, 8),))  # 5 channels for a 3-channel convolution


def test_load_model_records_a_cnn_and_exports_the_rest():
    cnn = load_model(zoo="squeezenet1_1")
    assert cnn.program is None and cnn.has_program() and cnn.seconds < 5
    assert named_hash(cnn.graph) == named_hash(import_program(cnn.own_program())[0])  # exported when asked
    assert cnn.program is not None
    gpt = load_model(zoo="gpt2_tiny_block")
    assert gpt.program is not None and gpt.export is None


def test_a_recorded_zoo_model_still_refuses_a_forged_wrong_rule(tmp_path, monkeypatch, capsys):
    """`superopt optimize --zoo` of a recorded model: past a proof gate that admits everything, a
    forged rule (relu(x) => x * x) is refused by the output check and nothing is written."""
    import superopt.driver.command as command
    from superopt.cli import main
    from superopt.ir.graph import GraphBuilder
    from superopt.ir.rule import Rule
    from superopt.search.instance_proofs import InstanceProofs
    monkeypatch.setattr(InstanceProofs, "admit", lambda self, rule_id, instance: True)

    def side(relu: bool):
        b = GraphBuilder()
        x = b.input("x", (1, 4, 8, 8))
        return b.build([b.op("relu", x) if relu else b.op("mul", x, x)])
    wrong = Rule(side(True), side(False))  # relu(x) => x * x
    monkeypatch.setattr(command, "load_rules", lambda *a, **k: [wrong])
    out = tmp_path / "s.opt.pt2"
    assert main(["optimize", "--zoo", "squeezenet1_1", "-o", str(out), "--device", "h100", "--min-gain", "0",
                 "--target", "eager", "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "computes something else" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
