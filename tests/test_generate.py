"""Tests of the substitution generator (``superopt generate``): the classic rules, canonical
enumeration, pruning, determinism, checkpoints and resuming, Dask, and bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from superopt.cli import main
from superopt.errors import UnknownOperatorError
from superopt.generate import CheckpointMismatchError, GenerateError, Settings, generate
from superopt.generate import levels as levels_mod
from superopt.generate import pipeline as pipeline_mod
from superopt.generate.checkpoint import Store
from superopt.generate.classics import CLASSICS, find_classics, rule_ids
from superopt.generate.expand import Expander, RECORD
from superopt.generate.fastfield import fast_table
from superopt.generate.levels import run_levels
from superopt.generate.parallel import SerialRunner
from superopt.ir import GraphBuilder, Rule
from superopt.rules import RuleDB
from superopt.semantics import P, Field

X = (2, 4)

# ---- helpers -------------------------------------------------------------------------------


def _graph(inputs, body):
    b = GraphBuilder()
    refs = {n: b.input(n, s) for n, s in inputs}
    out = body(b, refs)
    return b.build(out if isinstance(out, list) else [out])


def _rules(max_ops, ops, inputs, **kw):
    return generate(Settings.make(max_ops=max_ops, ops=ops, inputs=inputs, **kw), workers=1, progress=False).rules


# ---- the classics ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CLASSICS))
def test_finds_the_classic_rules(name):
    ops, inputs, n, expected = CLASSICS[name]
    rules = _rules(n, ops, inputs)
    assert find_classics(rules)[name], f"{name} not among {[r.text() for r in rules]}"


def test_multi_output_rules_line_up_and_hold():
    rules = _rules(3, "matmul,concat,split", "x=2x4,w1=4x4:w,w2=4x4:w")
    two = [r for r in rules if len(r.lhs.outputs) == 2]
    assert two
    f = Field(seed="test")
    for r in two:
        env = f.random_inputs(r.lhs, np.random.default_rng(1))
        for a, b in zip(f.evaluate(r.lhs, env), f.evaluate(r.rhs, env)):
            assert np.array_equal(a, b), r.text()


# ---- enumeration -------------------------------------------------------------------------------

_SMALL = dict(max_ops=3, ops="relu,transpose,matmul,add", inputs="x=2x2,y=2x2,w=2x2:w", representatives=False)


def _all_graphs(settings, canonical=True):
    """Keys of every graph per level, built from every (or only canonical) parent."""
    ex = Expander(settings)
    frontier, out = [()], []
    for level in range(1, settings.max_ops + 1):
        rows = []
        for i, nodes in enumerate(frontier):
            ex.children(ex.unpack(nodes), level, i, rows, canonical=canonical)
        rec = np.array(rows, dtype=RECORD)
        keys, first = np.unique(rec["key"], return_index=True)
        out.append((len(rec), set(keys.tolist())))
        if not canonical:
            rec = rec[np.sort(first)]
        frontier = [frontier[int(r["parent"])] + ((ex.table.instances[int(r["inst"])].op,
                                                    ex.table.instances[int(r["inst"])].attrs,
                                                    tuple(int(v) for v in r["ins"] if v >= 0)),) for r in rec]
    return out


def test_enumeration_builds_every_graph_exactly_once():
    canonical = _all_graphs(Settings.make(**_SMALL))
    brute = _all_graphs(Settings.make(**_SMALL), canonical=False)
    for level, ((n, keys), (n_brute, keys_brute)) in enumerate(zip(canonical, brute), 1):
        assert n == len(keys), f"level {level}: a graph was built twice"
        assert keys == keys_brute, f"level {level}: canonical order missed or added graphs"
        assert level == 1 or n_brute > n  # the brute force does see duplicates


def test_representatives_cut_the_enumeration_and_lose_no_rule_of_their_own():
    full = generate(Settings.make(**_SMALL), workers=1, progress=False)
    reps = generate(Settings.make(**{**_SMALL, "representatives": True}), workers=1, progress=False)
    assert reps.graphs < full.graphs and reps.levels[1].extended < full.levels[1].extended
    # compared before the per-family collapse, which keeps one rule per family of either list
    assert 0 < len(reps.rules) + reps.prune.covered < len(full.rules) + full.prune.covered
    known = set().union(*(rule_ids(r) for r in full.rules))
    assert all(rule_ids(r) & known for r in reps.rules)


def test_fingerprint_does_not_depend_on_output_order():
    from superopt.generate.expand import h64
    from superopt.generate.graphs import node_of_record
    s = Settings.make(max_ops=2, ops="matmul", inputs="x=2x4,w1=4x4:w,w2=4x4:w")
    store = Store(None)
    run_levels(s, store, SerialRunner(), progress=False)
    rec, instances = levels_mod.load_records(store, 2)
    ex, frontier = Expander(s), store.get("level-1/frontier")
    two = rec[(rec["nout"] == 2) & (rec["fp"] != 0)]
    assert len(two) >= 1  # (mm(x, w1), mm(x, w2)), built once
    for r in two:
        p = ex.unpack(frontier[int(r["parent"])] + (node_of_record(r, instances),))
        a, b = (p.vh[v] for v in sorted(p.unused))
        assert int(r["fp"]) == h64(2, *sorted((a, b))) == h64(2, *sorted((b, a)))
        assert h64(2, a, b) != h64(2, b, a)  # the sorting is what makes it order-free


def test_deterministic_and_independent_of_the_worker_count():
    s = Settings.make(max_ops=3, ops="matmul,add,concat,split", inputs="x=2x4,y=2x4,w=4x4:w")
    one = generate(s, workers=1, progress=False)
    two = generate(s, workers=2, progress=False)
    again = generate(s, workers=1, progress=False)
    assert [r.text() for r in one.rules] == [r.text() for r in two.rules] == [r.text() for r in again.rules]
    assert one.prune.to_json() | {"seconds": 0} == two.prune.to_json() | {"seconds": 0}


@hsettings(max_examples=25, deadline=None)
@given(c=st.sampled_from([1, 2, 4]), o=st.sampled_from([1, 2, 4]), k=st.sampled_from([(1, 1), (1, 3), (3, 3)]),
       stride=st.sampled_from([(1, 1), (2, 2)]), same=st.booleans(), depthwise=st.booleans(),
       relu=st.booleans(), seed=st.integers(0, 2**16))
def test_fast_window_operators_equal_the_field_semantics(c, o, k, stride, same, depthwise, relu, seed):
    rng = np.random.default_rng(seed)
    field = Field(seed=seed)
    fast = fast_table(field)
    x = rng.integers(0, P, (2, c, 5, 6))
    groups = c if depthwise else 1
    w = rng.integers(0, P, (c if depthwise else o, c // groups, *k))
    pad = (k[0] // 2, k[1] // 2) if same else (0, 0)
    a = {"stride": stride, "padding": pad, "groups": groups, "activation": "relu" if relu else "none"}
    assert np.array_equal(fast["conv2d"](a, x, w), field.table["conv2d"](a, x, w))
    p = {"kernel": k, "stride": stride, "padding": pad}
    for op in ("avgpool2d", "maxpool2d"):
        assert np.array_equal(fast[op](p, x), field.table[op](p, x))


# ---- pruning -------------------------------------------------------------------------------------

def test_pruning_steps_remove_what_they_should():
    xs = [("x", X)]
    trtr = Rule(_graph(xs, lambda b, r: b.op("transpose", b.op("transpose", r["x"], perm=(1, 0)), perm=(1, 0))),
                _graph(xs, lambda b, r: r["x"]))
    trtr_relu = Rule(_graph(xs, lambda b, r: b.op("transpose", b.op("transpose", b.op("relu", r["x"]), perm=(1, 0)),
                                                 perm=(1, 0))),
                     _graph(xs, lambda b, r: b.op("relu", r["x"])))
    report = generate(Settings.make(max_ops=3, ops="relu,transpose", inputs="x=2x4,y=2x4", representatives=False),
                      workers=1, progress=False)
    found = [r for r in report.rules if rule_ids(r) & rule_ids(trtr)]
    assert len(found) == 1  # Tr Tr y => y, its copy over x pruned as a renaming
    assert not any(rule_ids(r) & rule_ids(trtr_relu) for r in report.rules)  # common subgraph relu(x)
    p = report.prune
    assert p.common_subgraph > 0 and p.renaming > 0
    assert p.rules == len(report.rules) == p.pairs - sum(removed for _, removed, _ in p.steps())


def test_instances_of_smaller_rules_are_pruned():
    from superopt.generate.instances import InstanceIndex
    xyz = [("x", X), ("y", X), ("z", X)]
    general = Rule(_graph(xyz, lambda b, r: b.op("mul", b.op("add", r["x"], r["y"]), r["z"])),
                   _graph(xyz, lambda b, r: b.op("add", b.op("mul", r["x"], r["z"]), b.op("mul", r["y"], r["z"]))))
    xz = [("x", X), ("z", X)]
    special = Rule(_graph(xz, lambda b, r: b.op("mul", b.op("add", r["x"], r["z"]), r["z"])),
                   _graph(xz, lambda b, r: b.op("add", b.op("mul", r["x"], r["z"]), b.op("mul", r["z"], r["z"]))))
    index = InstanceIndex()
    index.add(general)
    assert index.find(special) is general
    assert index.find(general.reversed()) is None  # not strictly more general than itself


# ---- the command, checkpoints, resuming --------------------------------------------------------

_CLI = ["generate", "--max-ops", "2", "--ops", "transpose,matmul,concat,split", "--inputs", "x0=2x4,x1=2x4,w=4x4:w",
        "--workers", "1", "--quiet"]


def _db_rows(path):
    with RuleDB.open(path) as db:
        return [(s.id, s.status) for s in db.query()]


def test_cli_writes_a_rule_database(tmp_path, capsys):
    out = tmp_path / "r.db"
    assert main(_CLI + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "graphs" in text and "renaming" in text and "proven" in text
    rows = _db_rows(out)
    assert rows and any(s == "proven" for _, s in rows)
    assert not (tmp_path / "r.db.ckpt").exists()
    assert main(_CLI + ["--out", str(out)]) == 0  # the same command again: already done, nothing written
    assert "already complete" in capsys.readouterr().out and _db_rows(out) == rows
    assert main(_CLI + ["--out", str(out), "--max-ops", "1"]) == 2  # other settings: refused
    assert "--overwrite" in capsys.readouterr().err
    assert main(_CLI + ["--out", str(out), "--json", "--overwrite"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify"]["rules"] == len(rows) and doc["graphs"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--ops", "matmul,nosuchop"], "unknown operator 'nosuchop'; known operators:"),
    (["--ops", "opaque"], "cannot be enumerated"),
    (["--max-ops", "0"], "--max-ops must be at least 1"),
    (["--out", "/nonexistent-folder/r.db"], "does not exist"),
    (["--out", "/"], "is a folder"),
    (["--inputs", "x=2xq"], "is not like 2x4"),
])
def test_bad_input_gives_one_clear_error(argv, message, capsys):
    assert main(["generate", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unknown_operator_is_the_registry_error():
    with pytest.raises(UnknownOperatorError):
        Settings.make(ops="relu,frobnicate")


def _interrupt_after(monkeypatch, module, name, n):
    real, calls = getattr(module, name), []

    def wrapper(*args, **kw):
        if len(calls) >= n:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(module, name, wrapper)
    return calls


#: the resume tests' job: 35 enumeration chunks (30 of them at level 3) and 13 rules, proven in
#: a second (with a square weight, ``w=4x4``, the same rules take 20 s to prove: nothing more
#: for a resume to lose or repeat)
_RESUMED = dict(max_ops=3, ops="transpose,matmul,concat", inputs="x=2x4,w=4x2:w")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The database rows of the job run once without interruption, and its chunk count."""
    clean = tmp_path_factory.mktemp("clean") / "clean.db"
    levels = generate(Settings.make(**_RESUMED), clean, workers=1, progress=False).levels
    return _db_rows(clean), sum(len(levels_mod.chunk_bounds(lv.parents)) for lv in levels)


def test_resume_after_interruption_loses_and_repeats_nothing(tmp_path, monkeypatch, uninterrupted):
    s = Settings.make(**_RESUMED)
    clean, chunks = uninterrupted
    assert len(clean) > 4 and chunks > 12  # more than one verified batch; level 3 is cut below
    out = tmp_path / "r.db"
    # interrupted in the middle of level 3 ...
    _interrupt_after(monkeypatch, levels_mod, "expand_chunk", 12)
    with pytest.raises(KeyboardInterrupt):
        generate(s, out, workers=1, progress=False)
    monkeypatch.undo()
    # ... then in the middle of verification, after the first batch was stored ...
    import superopt.verify as verify_mod
    monkeypatch.setattr(pipeline_mod, "VERIFY_BATCH", 4)
    _interrupt_after(monkeypatch, verify_mod, "verify_rules", 1)
    redone = _interrupt_after(monkeypatch, levels_mod, "expand_chunk", 10**6)
    with pytest.raises(KeyboardInterrupt):
        generate(s, out, workers=1, progress=False)
    assert len(redone) == chunks - 12  # only the chunks that were missing
    assert 0 < len(_db_rows(out)) < len(clean)
    monkeypatch.undo()
    monkeypatch.setattr(pipeline_mod, "VERIFY_BATCH", 4)
    report = generate(s, out, workers=1, progress=False)
    assert report.resumed and _db_rows(out) == clean
    assert report.verify["stored"] == len(clean)  # each rule written once, over both runs


_KILLER = """
import argparse, os, signal, sys
from superopt.generate import checkpoint
from superopt.generate.cli import register
where, count, real = sys.argv[1], int(sys.argv[2]), os.replace
def replace(src, dst):  # dies before a checkpoint file lands: the temporary file stays behind
    global count
    if where in str(dst):
        count -= 1
        if count == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
checkpoint.os.replace = replace
parser = argparse.ArgumentParser()
register(parser.add_subparsers())
args = parser.parse_args(sys.argv[3:])
sys.exit(args.func(args))
"""


@pytest.mark.parametrize("where, count", [("level-3/part-", 5), ("verify/batch-", 1)])
def test_resume_after_sigkill(tmp_path, where, count, uninterrupted):
    """SIGKILL in the middle of the enumeration, or between storing a verified batch in the
    database and checkpointing it; the next run (the command) finishes with exactly the result
    of the uninterrupted run."""
    argv = ["generate", "--max-ops", str(_RESUMED["max_ops"]), "--ops", _RESUMED["ops"], "--inputs",
            _RESUMED["inputs"], "--workers", "1", "--quiet"]
    out = tmp_path / "r.db"
    killed = subprocess.run([sys.executable, "-c", _KILLER, where, str(count), *argv, "--out", str(out)],
                            capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert list(Path(str(out) + ".ckpt").rglob(".tmp-*"))
    assert main(argv + ["--out", str(out)]) == 0
    assert _db_rows(out) == uninterrupted[0]


def test_checkpoint_from_other_settings_is_refused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.db"
    _interrupt_after(monkeypatch, levels_mod, "expand_chunk", 2)
    with pytest.raises(KeyboardInterrupt):
        generate(Settings.make(max_ops=2, ops="transpose,matmul", inputs="x=2x4,w=4x4:w"), out, workers=1,
                 progress=False)
    monkeypatch.undo()
    with pytest.raises(CheckpointMismatchError, match="different settings .*max_ops"):
        generate(Settings.make(max_ops=3, ops="transpose,matmul", inputs="x=2x4,w=4x4:w"), out, workers=1,
                 progress=False)
    argv = ["generate", "--max-ops", "3", "--ops", "transpose,matmul", "--inputs", "x=2x4,w=4x4:w", "--quiet"]
    assert main(argv + ["--out", str(out)]) == 2
    assert "delete the folder" in capsys.readouterr().err


def test_dask_cluster_gives_the_local_rule_set(tmp_path):
    pytest.importorskip("dask.distributed")
    s = Settings.make(**_RESUMED)
    local = generate(s, workers=2, progress=False)
    dask = generate(s, tmp_path / "dask.db", dask_workers=2, progress=False)  # verified on the cluster too
    assert "Dask" in dask.runner and "2 workers" in dask.runner
    assert [r.text() for r in dask.rules] == [r.text() for r in local.rules]
    assert [rid for rid, _ in _db_rows(tmp_path / "dask.db")] == [r.id for r in local.rules]
    assert local.graphs == dask.graphs and local.classes == dask.classes


def test_missing_output_folder_is_refused_before_work(tmp_path):
    with pytest.raises(GenerateError, match="does not exist"):
        generate(Settings.make(max_ops=1, ops="relu", inputs="x=2x2"), tmp_path / "no" / "r.db", progress=False)


# ---- the families of issue 24: rank 1 and 2, matmul chains, grouped convolutions; batch norm --------

def _ids_of(family: str) -> tuple[set, list]:
    rules = generate(Settings.make(max_ops=3, ops=family), workers=1, progress=False).rules
    return set().union(*(rule_ids(r) for r in rules)), rules


def _side(inputs, body):
    b = GraphBuilder()
    refs = {n: b.input(n, s) for n, s in inputs}
    return b.build([body(b, refs)])


def test_matmul_chains_are_regrouped():
    ins = [("x1", (2, 3, 5)), ("w2", (5, 7)), ("w1", (7, 4))]
    assoc = Rule(_side(ins, lambda b, r: b.op("matmul", b.op("matmul", r["x1"], r["w2"]), r["w1"])),
                 _side(ins, lambda b, r: b.op("matmul", r["x1"], b.op("matmul", r["w2"], r["w1"]))))
    ids, _ = _ids_of("matmul_chain")
    assert rule_ids(assoc) & ids


@pytest.mark.parametrize("family,rank", [("eltwise1", 1), ("eltwise2", 2)])
def test_rank_1_and_2_elementwise_algebra_is_found(family, rank):
    shape = (6,) if rank == 1 else (3, 5)
    ins = [("x0", shape), ("x1", shape), ("x2", shape)]
    distrib = Rule(_side(ins, lambda b, r: b.op("mul", b.op("add", r["x0"], r["x1"]), r["x2"])),
                   _side(ins, lambda b, r: b.op("add", b.op("mul", r["x0"], r["x2"]), b.op("mul", r["x1"], r["x2"]))))
    ids, rules = _ids_of(family)
    assert rule_ids(distrib) & ids
    assert all(r.lhs.type_of(r.lhs.outputs[0]).rank == rank for r in rules if r.lhs.inputs)


def test_grouped_convolutions_are_found_at_their_group_counts():
    _, rules = _ids_of("cnn_groups")
    groups = {n.attr["groups"] for r in rules for g in (r.lhs, r.rhs) for n in g.nodes if n.op == "conv2d"}
    assert {2, 4, 8} <= groups


def test_batch_norm_affine_map_comes_from_its_axiom_and_only_attention_is_curated():
    from superopt.generate.axiom_rules import axiom_rules
    from superopt.rules.curated import curated_rules
    from superopt.verify import verify_rules
    rules = axiom_rules(["batchnorm_affine", "batchnorm_affine_2d"])
    assert [r.lhs.nodes[-1].op for r in rules] == ["batchnorm", "batchnorm"]
    assert all(v.applicable for v in verify_rules(rules, progress=False, workers=1))
    assert [r.lhs.nodes[-1].op for r in curated_rules()] == ["sdpa"] * 3  # grouped-query attention (curated.py says why)
    with pytest.raises(GenerateError, match="no axiom named"):
        axiom_rules(["no_such_axiom"])
    with pytest.raises(GenerateError, match="no shape template"):
        axiom_rules(["add_comm"])
