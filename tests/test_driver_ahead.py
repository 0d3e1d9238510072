"""The zoo model built in a thread while ``superopt optimize`` imports (superopt.driver.ahead): the
same weights and inputs as the build in the caller's thread; its error raised where the model is
loaded; the load from it gives the graph the plain load gives. Exported in a forked process
(ExportedAhead): the same graph, its weights views of this process's module, the same program
saved, the same file written; a failure there leaves the export here, a refusal is raised."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from superopt.driver.ahead import BuiltAhead
from superopt.driver.model import load_model
from superopt.errors import SuperoptError
from superopt.ir.hashing import named_hash
from superopt.models import build


@pytest.mark.parametrize("name", ["gpt2_tiny_block", "llama_tiny_decode", "squeezenet1_1"])
def test_the_model_built_ahead_is_the_one_built_here(name):
    module, inputs = build(name)
    ahead = BuiltAhead(name)
    got_module, got_inputs = ahead.get()
    want = module.state_dict()
    assert list(got_module.state_dict()) == list(want)
    assert all(torch.equal(t, want[k]) for k, t in got_module.state_dict().items())
    assert len(got_inputs) == len(inputs) and all(torch.equal(a, b) for a, b in zip(got_inputs, inputs))
    assert ahead.get()[0] is got_module  # waited for once, kept


def test_an_unknown_name_is_raised_by_get_as_the_load_raises_it():
    ahead = BuiltAhead("no_such_model")
    with pytest.raises(SuperoptError, match="unknown model") as err:
        ahead.get()
    with pytest.raises(type(err.value), match="unknown model"):
        load_model(zoo="no_such_model")


def test_load_model_uses_the_build_ahead_only_for_the_same_call():
    """The graph loaded from the model built ahead is the plain load's; a build ahead for another
    model (or batch) is not used."""
    plain = load_model(zoo="gpt2_tiny_block")
    ahead = BuiltAhead("gpt2_tiny_block")
    assert named_hash(load_model(zoo="gpt2_tiny_block", ahead=ahead).graph) == named_hash(plain.graph)
    other = BuiltAhead("llama_tiny_decode")
    got = load_model(zoo="gpt2_tiny_block", ahead=other)
    assert named_hash(got.graph) == named_hash(plain.graph)
    other.get()


# ---- ExportedAhead: the model exported and imported in a forked process --------------------

fork_only = pytest.mark.skipif(not __import__("superopt.driver.aside", fromlist=["can_fork"]).can_fork(),
                               reason="the export beside needs fork (Linux)")


def _same_graph(got, want) -> None:
    """The same graph: nodes, outputs, weight names and every weight's values and shape."""
    assert named_hash(got) == named_hash(want) and got.nodes == want.nodes and got.outputs == want.outputs
    assert list(got.data) == list(want.data)
    assert all(got.data[k].shape == v.shape and got.data[k].dtype == v.dtype and np.array_equal(got.data[k], v)
               for k, v in want.data.items())


def test_a_packed_graph_comes_back_the_same_with_its_weights_viewing_the_module():
    """pack_graph sends a weight that views a module tensor as its place in that tensor (so the
    graph made again views the receiving process's module, no copy); the rest by value."""
    from superopt.driver.ahead import pack_graph, unpack_graph
    plain = load_model(zoo="squeezenet1_1")
    packed = pack_graph(plain.graph, plain.reference)
    kinds = [ref[0] for ref in packed[2].values()]
    assert kinds.count("view") >= len(kinds) - 2 and "view" in kinds
    got = unpack_graph(pickle.loads(pickle.dumps(packed)), plain.reference)
    _same_graph(got, plain.graph)
    params = [t.detach().numpy() for t in plain.reference.parameters()]
    views = [k for k, ref in packed[2].items() if ref[0] == "view"]
    assert all(any(np.shares_memory(got.data[k], p) for p in params) for k in views)


def test_a_transposed_view_and_an_offset_view_come_back_at_their_place():
    from superopt.driver.ahead import pack_graph, unpack_graph
    from superopt.ir.graph import GraphBuilder
    module = torch.nn.Linear(4, 6)
    w = module.weight.detach()
    b = GraphBuilder()
    x = b.input("x", (2, 4))
    t = b.weight("wt", data=w.t().numpy())  # a transposed view (strides reversed)
    row = b.weight("row", data=w[2:].numpy())  # an offset into the storage
    own = b.weight("own", data=np.arange(3, dtype=np.float32))  # not the module's: by value
    g = b.build([b.op("matmul", x, t), row, own])
    packed = pack_graph(g, module)
    assert [packed[2][k][0] for k in ("wt", "row", "own")] == ["view", "view", "value"]
    got = unpack_graph(packed, module)
    _same_graph(got, g)
    assert got.data["wt"].strides == g.data["wt"].strides and np.shares_memory(got.data["row"], w.numpy())


@fork_only
def test_the_model_exported_beside_is_the_one_loaded_here_and_its_program_is_saved(tmp_path):
    """GPT-2 tiny block (not recorded): its graph comes from the process beside, with the weights
    viewing this process's module; the program it saved is the one saved here, its runs of the
    original the ones made here."""
    from superopt.codegen import write_program
    from superopt.driver.ahead import ExportedAhead
    from superopt.driver.outcheck import examples_reference
    out = tmp_path / "gpt2_tiny_block.opt.pt2"
    ahead = ExportedAhead("gpt2_tiny_block", out)
    got = load_model(zoo="gpt2_tiny_block", ahead=ahead)
    plain = load_model(zoo="gpt2_tiny_block")
    _same_graph(got.graph, plain.graph)
    assert ahead.seconds["cpu_s"] > 0  # it came from the process beside
    assert got.reference is ahead.get()[0] and got.program is None and got.has_program()
    params = [t.detach().numpy() for t in got.reference.parameters()]  # the weights view this process's module
    assert sum(any(np.shares_memory(a, p) for p in params) for a in got.graph.data.values()) >= len(params) - 2
    assert got.signature == plain.signature
    assert ahead.place(out)  # waits for the save
    write_program(plain.own_program(), tmp_path / "here.pt2", tmp_path / "here.pt2")
    assert out.read_bytes() == (tmp_path / "here.pt2").read_bytes()
    memo = ahead.reference()
    want = examples_reference(plain.reference, plain.inputs, {})
    assert list(memo) == list(want) == ["examples"]
    got32, want32 = memo["examples"][0], want["examples"][0]
    assert len(got32) == len(want32) and all(np.array_equal(a, b) for a, b in zip(got32, want32))
    ahead.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2_tiny_block.opt.pt2", "here.pt2"]


@fork_only
def test_a_recorded_model_is_only_run_beside(tmp_path):
    """SqueezeNet (recorded here): the process beside neither sends a graph nor saves the program
    (so the core is idle again for the region check); it runs the original on the examples."""
    from superopt.driver.ahead import ExportedAhead
    out = tmp_path / "s.opt.pt2"
    ahead = ExportedAhead("squeezenet1_1", out)
    got = load_model(zoo="squeezenet1_1", ahead=ahead)
    _same_graph(got.graph, load_model(zoo="squeezenet1_1").graph)
    assert not ahead.seconds and not ahead.place(out) and not out.exists()
    ahead = ExportedAhead("squeezenet1_1", out)
    load_model(zoo="squeezenet1_1", ahead=ahead)
    ahead._job.result()  # the process is done
    assert list(ahead.reference()) == ["examples"]
    ahead.discard()
    assert list(tmp_path.iterdir()) == []


@fork_only
def test_a_process_that_fails_leaves_the_export_here_and_a_refusal_is_raised(tmp_path, monkeypatch):
    """No answer from the process beside (a bug there): the model is exported here, the same
    graph; the program is made here when asked for; the discarded save leaves no file. An export
    the exporter refuses is refused as the load here refuses it."""
    from superopt.driver import ahead as mod
    from superopt.frontend.errors import ModelImportError

    def broken(*args, **kwargs):
        raise RuntimeError("a bug beside")
    monkeypatch.setattr(mod, "export_module", broken)
    ahead = mod.ExportedAhead("gpt2_tiny_block", tmp_path / "g.opt.pt2")
    assert ahead.imported() is None
    got = load_model(zoo="gpt2_tiny_block", ahead=ahead)
    _same_graph(got.graph, load_model(zoo="gpt2_tiny_block").graph)
    assert got.program is not None and not ahead.place(tmp_path / "g.opt.pt2")
    assert list(tmp_path.iterdir()) == []

    def refused(*args, **kwargs):
        raise ModelImportError("torch.export.export failed: refused beside")
    monkeypatch.setattr(mod, "export_module", refused)
    ahead = mod.ExportedAhead("gpt2_tiny_block", tmp_path / "g.opt.pt2")
    with pytest.raises(ModelImportError, match="refused beside"):
        load_model(zoo="gpt2_tiny_block", ahead=ahead)
    ahead.discard()
    assert list(tmp_path.iterdir()) == []


@fork_only
def test_an_unknown_name_exported_ahead_is_raised_as_the_load_raises_it():
    from superopt.driver.ahead import ExportedAhead
    ahead = ExportedAhead("no_such_model")
    with pytest.raises(SuperoptError, match="unknown model"):
        load_model(zoo="no_such_model", ahead=ahead)
    ahead.discard()


@fork_only
def test_optimize_writes_the_same_file_with_the_export_beside_or_here(tmp_path):
    """`superopt optimize --zoo`: the model exported beside (a spare core, said) or here, the same
    bytes written (GPT-2 tiny block: not recorded, so exported; and SqueezeNet, recorded, its
    program saved beside or not)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    files = {}
    for model in ("gpt2_tiny_block", "squeezenet1_1"):
        for spare in ("1", "0"):
            env = {**os.environ, "PYTHONPATH": str(root), "SUPEROPT_SPARE_CORE": spare}
            out = tmp_path / f"{model}{spare}.pt2"
            r = subprocess.run([sys.executable, "-m", "superopt", "optimize", "--zoo", model, "--device", "h100",
                                "-o", str(out), "--json"], env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            rep = json.loads(r.stdout)
            files[model, spare] = out.read_bytes()
            beside = rep["cpu_s"].get("import beside")
            assert (beside is not None) == (spare == "1" and model == "gpt2_tiny_block")  # recorded: no wait
        assert files[model, "1"] == files[model, "0"]
    assert len(list(tmp_path.iterdir())) == 4


@fork_only
def test_a_run_that_fails_before_the_import_ends_the_export_beside_and_leaves_no_file(tmp_path):
    """An error after the fork (here: a rule database that is not there) is the usual one-line
    error; the process beside is ended and its file removed."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "SUPEROPT_SPARE_CORE": "1"}
    r = subprocess.run([sys.executable, "-m", "superopt", "optimize", "--zoo", "squeezenet1_1", "--device", "h100",
                        "-o", str(tmp_path / "s.pt2"), "--db", str(tmp_path / "none.db")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("superopt: error:") and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_run_interrupted_while_the_build_ahead_runs_exits_as_interrupted(tmp_path):
    """Ctrl-C or SIGTERM while the zoo model is still being built beside the imports: the run
    waits for the build, then exits 130 with its one line. (With the build's daemon thread still
    in torch's C++ code as the interpreter exits, the process aborted: exit 134.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    script = ("import sys, time, torch\n"
              "import superopt.driver.ahead as ahead, superopt.driver.command as command\n"
              "def slow_build(*a, **k):\n"  # torch kernels that release the interpreter, for ~1.5 s
              "    x, t = torch.randn(600, 600), time.perf_counter()\n"
              "    while time.perf_counter() - t < 1.5:\n"
              "        x = torch.tanh(x @ x)\n"
              "    return torch.nn.Identity(), (x,)\n"
              "def interrupted(*a, **k):\n"
              "    time.sleep(0.3)\n"
              "    raise KeyboardInterrupt\n"
              "ahead.build, command.run_optimize = slow_build, interrupted\n"
              "from superopt.cli import main\n"
              f"sys.exit(main(['optimize', '--zoo', 'llama3_8b_decode', '--device', 'h100', '-o', {str(tmp_path / 'm.pt2')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(root)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 130 and r.stderr.strip() == "superopt: interrupted", (r.returncode, r.stderr[-2000:])
    assert list(tmp_path.iterdir()) == []
