"""The written program built without tracing (``superopt.codegen.aten``): byte for byte the program
``torch.export.export`` makes of the same generated module, operator by operator and on a zoo
model's written program; anything it does not handle is traced by ``torch.export`` as before."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

from superopt.codegen import aten, example_inputs, to_exported_program, to_module
from superopt.cost.fusion import conv_relu_chains
from superopt.codegen.export import no_canonical_self_test
from superopt.driver.model import no_stack_traces
from superopt.frontend.signature import Signature
from superopt.ir import REGISTRY, GraphBuilder
from test_codegen import _example, _rng_weight

#: the operators whose example programs are built here (the zoo CNNs' written programs are made of
#: them); the others are traced by torch.export
BUILT = {"add", "avgpool2d", "batchnorm", "concat", "conv2d", "conv2d_bias", "identity_conv", "maxpool2d", "mul",
         "ones", "pool_kernel", "relu", "reshape", "smul", "split", "zeros"}


def _bytes(ep) -> bytes:
    f = io.BytesIO()
    with no_canonical_self_test():
        torch.export.save(ep, f)
    return f.getvalue()


def _traced(g, inputs, sig, **fx):
    """What ``torch.export`` makes of the generated module (the program the emitter must equal)."""
    with no_stack_traces():
        return torch.export.export(to_module(g, sig, **fx), tuple(inputs))


def _both(g, **fx):
    g = g.prune()
    inputs = example_inputs(g)
    sig = Signature.positional(list(g.input_names), len(g.outputs))
    with no_stack_traces():
        built = to_exported_program(g, inputs, sig, **fx)
    return built, _traced(g, inputs, sig, **fx), inputs


def _emitted(monkeypatch) -> list:
    """The programs :func:`aten.exported_program` built (None: left to torch.export)."""
    made = []
    real = aten.exported_program

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]
    monkeypatch.setattr("superopt.codegen.export.exported_program", spy)
    return made


@pytest.mark.parametrize("op", sorted(set(REGISTRY) - {"input", "weight", "opaque"}))
def test_every_operators_program_is_the_one_torch_export_makes(op, monkeypatch):
    """Built here or traced, the program saves to the bytes ``torch.export`` gives and runs equal."""
    made = _emitted(monkeypatch)
    built, traced, inputs = _both(_example(op))
    assert _bytes(built) == _bytes(traced)
    assert (made[0] is not None) == (op in BUILT), "which operators are built here"
    got, want = built.module()(*inputs), traced.module()(*inputs)
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", ["plain", "pinned", "pinned channels-last", "channels-last"])
def test_convolution_layouts_and_fused_calls_are_the_ones_torch_export_makes(layout, monkeypatch):
    """superopt's convolutions (fused ReLU and residual, pinned layout) and channels-last inputs."""
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 7, 7))
    w1, w2, bias = _rng_weight(b, "w1", (4, 4, 3, 3), rng), _rng_weight(b, "w2", (4, 2, 1, 1), rng), \
        _rng_weight(b, "cb", (4, 1, 1), rng)
    y = b.op("relu", b.op("add", b.op("conv2d", x, w1, padding=(1, 1)), bias))
    z = b.op("relu", b.op("add", b.op("conv2d", y, w2, groups=2), x))  # a residual
    p = b.op("maxpool2d", z, kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    g = b.build([p, b.op("avgpool2d", z, kernel=(3, 3), stride=(1, 1), padding=(1, 1))])
    chains = conv_relu_chains(g, {i for i, n in enumerate(g.nodes) if n.op == "weight"})
    assert len(chains) == 2  # a bias, a residual
    fx = {"plain": {}, "pinned": {"pin_layout": True, "conv_relu": chains},
          "pinned channels-last": {"pin_layout": True, "channels_last": True, "conv_relu": chains},
          "channels-last": {"channels_last": True}}[layout]
    made = _emitted(monkeypatch)
    built, traced, inputs = _both(g, **fx)
    assert made[0] is not None
    assert _bytes(built) == _bytes(traced)
    for got, want in zip(built.module()(*inputs), traced.module()(*inputs)):
        assert torch.equal(got, want)


def test_split_with_an_unused_part_and_several_outputs(monkeypatch):
    """A split whose first part nothing reads, outputs in the graph's order, an unused input."""
    b = GraphBuilder()
    x, _ = b.input("x", (2, 6, 4)), b.input("unused", (3,))
    lo, mid, hi = b.op("split", x, axis=1, sizes=(1, 2, 3))
    g = b.build([b.op("relu", hi), b.op("concat", mid, mid, axis=1)])
    made = _emitted(monkeypatch)
    sig = Signature.positional(["x", "unused"], 2)
    inputs = [torch.randn(2, 6, 4), torch.randn(3)]
    with no_stack_traces():
        built = to_exported_program(g, inputs, sig)
    traced = _traced(g, inputs, sig)
    assert made[0] is not None and _bytes(built) == _bytes(traced)
    assert all(torch.equal(a, b) for a, b in zip(built.module()(*inputs), traced.module()(*inputs)))


def test_what_is_not_handled_is_left_to_torch_export(monkeypatch):
    """An input returned as it is, a keyword input, no signature: torch.export traces them (the
    generated module compiled as before where there is no signature: a lazy module's forward
    would show torch.export no parameter names)."""
    made = _emitted(monkeypatch)
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    g = b.build([b.op("relu", x), x])
    sig, inputs = Signature.positional(["x"], 2), [torch.randn(2, 3)]
    with no_stack_traces():
        built = to_exported_program(g, inputs, sig)
    assert made == [None] and _bytes(built) == _bytes(_traced(g, inputs, sig))
    made.clear()
    y = b.input("y", (2, 3))
    g = b.build([b.op("add", x, y)])
    kw = Signature(pytree.tree_flatten(((0,), {"y": 0}))[1], pytree.tree_flatten(0)[1], ("x", "y"))
    with no_stack_traces():
        built = to_exported_program(g, inputs, kw, {"y": torch.ones(2, 3)})  # a keyword input: not tried here
        assert made == [] and torch.equal(built.module()(inputs[0], y=torch.ones(2, 3)), inputs[0] + 1)
        ep = to_exported_program(g, inputs + [torch.ones(2, 3)])  # no signature: not tried either
    assert made == [] and [n.name for n in ep.graph.nodes if n.op == "placeholder"] == ["x", "y"]


def test_a_call_in_a_form_not_handled_here_is_traced(monkeypatch):
    """A call whose arguments its mapping does not take (here: relu's made to want a keyword)
    falls back to torch.export's trace instead of failing."""
    monkeypatch.setitem(aten.CALLS, torch.relu, lambda x, *, inplace: None)  # relu(x) is a TypeError here
    made = _emitted(monkeypatch)
    built, traced, inputs = _both(_example("relu"))
    assert made == [None] and _bytes(built) == _bytes(traced)


def test_a_zoo_models_written_program_is_the_one_torch_export_makes(tmp_path):
    """`superopt optimize` on SqueezeNet builds its written program here, and that program saves
    to the bytes of the one torch.export traces from the same module; the file written loads and
    runs as that program does."""
    out = tmp_path / "s.pt2"
    code = f"""
import io, sys, torch
from superopt.cli import main
from superopt.codegen import aten, export
def save(ep):
    f = io.BytesIO()
    with export.no_canonical_self_test():
        torch.export.save(ep, f)
    return f.getvalue()
def checked(gm, module, args, signature):
    ep = aten.exported_program(gm, module, args, signature)
    assert ep is not None, "not built here"
    assert save(ep) == save(torch.export.export(module, tuple(args))), "not the traced program"
    print("built and checked", file=sys.stderr)
    return ep
export.exported_program = checked
sys.exit(main(["optimize", "--zoo", "squeezenet1_1", "--device", "h100", "-o", {str(out)!r}, "--quiet"]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "built and checked" in r.stderr, r.stderr[-2000:]
    from superopt.driver import load_model
    x = load_model(zoo="squeezenet1_1").inputs
    assert torch.export.load(out).module()(*x).shape == (1, 1000)
