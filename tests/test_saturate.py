"""Equality saturation (search/saturate.py, egraph.py, ematch.py, extract.py) and the
backtracking baseline's exact dedup (search/state.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.rules import examples as ex
from superopt.search import search
from superopt.search.errors import SearchError
from superopt.search.fold import fold_constants
from superopt.search.report import StopReason
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.saturate import Limits, saturate
from superopt.search.state import ExactForms, State
from superopt.semantics.reference import evaluate

H100 = CostModel("h100")
GATE = InstanceProofs(store=None)  # the proof at each instance (superopt.verify.prove), in memory


class Refuse:
    """A gate that admits nothing."""

    def __init__(self):
        self.asked = 0

    def admit(self, rule_id, instance):
        self.asked += 1
        return False


def _w(b, rng, name, shape, positive=False):
    data = rng.standard_normal(shape).astype(np.float32)
    return b.weight(name, shape, np.abs(data) + 1 if positive else data)


def _two_conv_bn(seed=0):
    """x -> (conv 1x1 -> batch norm -> relu) twice, on one input."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8))
    outs = []
    for k in range(2):
        c = b.op("conv2d", x, _w(b, rng, f"w{k}", (16, 16, 1, 1)))
        bn = b.op("batchnorm", c, *(_w(b, rng, f"{n}{k}", (16,), n == "v") for n in "sbmv"))
        outs.append(b.op("relu", bn))
    return b.build(outs)


def _same_outputs(g, h):
    env = {"x": np.random.default_rng(1).standard_normal((1, 16, 8, 8))}
    for a, b in zip(evaluate(g, env), evaluate(fold_constants(h), env)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


ORDER_RULES = [ex.fold_conv_batchnorm((1, 1), (0, 0), 1), ex.merge_convs((1, 1), (0, 0), 1),
               ex.merge_split_bias(True), ex.merge_split_unary("relu", True)]


def test_saturation_finds_what_backtracking_misses_behind_an_order_dependent_choice():
    g = _two_conv_bn()
    back = search(g, ORDER_RULES, H100, alpha=1.05, progress=False).report
    res = saturate(g, ORDER_RULES, H100, GATE)
    # merging the convolutions first is cheaper at once but leaves the batch norms unfoldable
    assert res.report.reduction > back.reduction + 0.1
    assert res.report.stop_reason == StopReason.SATURATED
    assert [n.op for n in fold_constants(res.graph).nodes if n.name is None] == ["conv2d", "add", "relu", "split"]
    _same_outputs(g, res.graph)


def test_nothing_unproven_enters_the_egraph():
    gate = Refuse()
    res = saturate(_two_conv_bn(), ORDER_RULES, H100, gate)
    assert gate.asked > 0 and res.report.rejected["instance not proven"] > 0
    assert res.report.reduction == 0 and res.report.rules_applied == {} and not res.report.by_rule


def _chain(ops, shape=(4, 8)):
    b = GraphBuilder()
    v = b.input("x", shape)
    for op in ops:
        v = b.op(op, v) if op != "transpose" else b.op("transpose", v, perm=(1, 0))
    return b.build([v])


def _rule(lhs_ops, rhs_ops, shape=(2, 3)):
    return Rule(_chain(lhs_ops, shape), _chain(rhs_ops, shape))


@pytest.mark.parametrize("start, rules, expected", [
    (["transpose"] * 4 + ["relu"], [_rule(["transpose", "transpose"], [])], ["relu"]),
    (["tanh", "tanh", "tanh"], [_rule(["tanh", "tanh"], ["tanh"])], ["tanh"] * 3),  # false: no axiom proves it
    (["transpose", "relu", "transpose"], [_rule(["transpose", "relu"], ["relu", "transpose"]),
                                          _rule(["transpose", "transpose"], [])], ["relu"]),
    (["relu", "transpose"], [_rule(["transpose", "transpose"], [])], ["relu", "transpose"]),
])
def test_declarative(start, rules, expected):
    res = saturate(_chain(start), rules, H100, GATE)
    assert [n.op for n in res.graph.nodes if n.name is None] == expected


def test_opaque_nodes_are_leaves_survive_and_are_never_merged():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    r = b.op("relu", b.op("relu", x))
    calls = [b.op("opaque", r, target="torch.ops.aten.bernoulli.default", out_types=[((4, 8), "float32")])
             for _ in range(2)]  # two equal calls of an impure function
    g = b.build([b.op("transpose", b.op("transpose", c, perm=(1, 0)), perm=(1, 0)) for c in calls])
    res = saturate(g, [_rule(["transpose", "transpose"], [])], H100, GATE)
    assert [n.op for n in res.graph.nodes if n.name is None] == ["relu", "relu", "opaque", "opaque"]
    assert res.graph.outputs[0] != res.graph.outputs[1]
    opaque = lambda h: [n.attrs for n in h.nodes if n.op == "opaque"]  # noqa: E731
    assert opaque(res.graph) == opaque(g)


@pytest.mark.parametrize("field, value, message", [
    ("iterations", 0, "iterations limit must be at least 1"), ("nodes", -5, "nodes limit must be at least 1"),
    ("seconds", 0.0, "seconds limit must be positive"), ("ilp_seconds", -1.0, "ilp seconds limit must be positive"),
    ("multi_rounds", -1, "multi-pattern rounds must be 0 or more"),
    ("ban_matches", 0, "ban matches limit must be at least 1"), ("ban_iterations", -2, "ban iterations limit"),
])
def test_bad_limits_are_clear_errors(field, value, message):
    with pytest.raises(SearchError, match=message):
        saturate(_chain(["relu"]), [], H100, GATE, Limits(**{field: value}))


def test_a_rule_matching_too_often_is_banned_for_a_while_but_still_saturates():
    g, rules = _chain(["transpose"] * 8 + ["relu"]), [_rule(["transpose", "transpose"], [])]
    free = saturate(g, rules, H100, GATE).report
    res = saturate(g, rules, H100, GATE, Limits(ban_matches=2, ban_iterations=1))
    assert res.report.bans > 0 and free.bans == 0  # 7 matches > 2, then > 4: banned twice
    assert res.report.stop_reason == StopReason.SATURATED  # the bans are lifted before it stops
    assert [n.op for n in res.graph.nodes if n.name is None] == ["relu"]
    assert res.report.iterations > free.iterations


@pytest.mark.parametrize("growth, transposes", [(1, 2), (2, 0)])
def test_growing_rules_apply_up_to_the_growth_bound_and_the_search_saturates(growth, transposes):
    # transpose(relu(relu(transpose(x)))): the inner transpose must move past both relus (two growing
    # rewrites, each making a class one generation newer) before the two transposes cancel
    g = _chain(["transpose", "relu", "relu", "transpose"])
    rules = [_rule(["transpose", "relu"], ["relu", "transpose"]), _rule(["transpose", "transpose"], [])]
    rep = (res := saturate(g, rules, H100, GATE, Limits(growth=growth))).report
    assert rep.stop_reason == StopReason.SATURATED
    ops = [n.op for n in res.graph.nodes if n.name is None]
    assert ops.count("transpose") == transposes and ops.count("relu") == 2
    assert (rep.held > 0) == (growth == 1)


def test_rules_that_grow_are_told_from_rules_that_fold():
    from superopt.search.saturate import grows
    assert grows(_rule(["transpose", "relu"], ["relu", "transpose"]))  # same operators, moved
    assert grows(_rule(["relu"], ["relu", "relu"]))  # more of the same
    assert not grows(_rule(["transpose", "transpose"], []))
    assert not grows(_rule(["sigmoid"], ["relu", "relu"]))  # does away with an operator: folds


def test_a_gate_is_required():
    with pytest.raises(SearchError, match="proof gate"):
        saturate(_chain(["relu"]), [], H100, None)


def test_limits_stop_with_their_reason():
    g, rules = _two_conv_bn(), ORDER_RULES
    assert saturate(g, rules, H100, GATE, Limits(iterations=1)).report.stop_reason == StopReason.ITERATION_LIMIT
    small = saturate(g, rules, H100, GATE, Limits(nodes=40))
    assert small.report.stop_reason == StopReason.NODE_LIMIT and small.report.enodes <= 60
    assert saturate(g, rules, H100, GATE, Limits(seconds=1e-9)).report.stop_reason == StopReason.TIME_LIMIT


def test_without_the_solver_greedy_extraction_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # import fails as if not installed
    res = saturate(_two_conv_bn(), ORDER_RULES, H100, GATE)
    assert res.report.extraction in ("greedy", "local search") and "scipy" in res.report.ilp_status
    assert res.report.reduction > 0.3
    _same_outputs(_two_conv_bn(), res.graph)


def test_the_integer_program_reports_its_status():
    res = saturate(_two_conv_bn(), ORDER_RULES, H100, GATE)
    rep = res.report
    assert rep.ilp_status.startswith(("optimal", "known pick within 1%")) and rep.gap is not None and rep.gap <= 0.01
    assert rep.greedy_cost >= rep.cost_after > 0  # the start the program improves on or certifies
    doc = res.report.to_json()
    assert doc["stop_reason"] == "saturated" and doc["enodes"] >= doc["eclasses"] > 0 and "extract" in doc["seconds"]
    assert "e-graph" in res.report.table()


# ---- the backtracking baseline ------------------------------------------------------------------
def _relu3_matmul(swap):
    b = GraphBuilder()
    x, y = b.input("x", (4, 4)), b.input("y", (4, 4))
    r = lambda v: b.op("relu", b.op("relu", b.op("relu", v)))  # noqa: E731
    a, c = r(x), r(y)
    return b.build([b.op("matmul", *((c, a) if swap else (a, c)))])


def test_equal_keys_are_confirmed_exactly():
    one, two = (State.from_graph(_relu3_matmul(s), H100) for s in (False, True))
    assert one.key == two.key  # the cheap key collides
    forms = ExactForms(one)
    assert forms.of_state(one) != forms.of_state(two)
    again = State.from_graph(_relu3_matmul(False), H100)
    assert forms.of_state(again) == forms.of_state(one)
    assert forms.key_of(one) != forms.key_of(two) and forms.key_of(again) == forms.key_of(one)


def test_backtracking_finds_each_graph_once_by_its_exact_hash():
    # four transposes then relu: three ways to remove a pair (three graphs, told apart by which
    # of the model's nodes remain), then each way to remove the last pair gives one graph: relu
    g = _chain(["transpose"] * 4 + ["relu"], (4, 4))
    rep = search(g, [_rule(["transpose", "transpose"], [])], H100, alpha=2.0, progress=False).report
    assert rep.stop_reason == StopReason.EXHAUSTED
    assert (rep.explored, rep.duplicates) == (5, 2)


def test_both_searches_stop_with_an_enum_reason():
    g = _chain(["transpose", "transpose", "relu"])
    rules = [_rule(["transpose", "transpose"], [])]
    for rep in (search(g, rules, H100, progress=False).report, saturate(g, rules, H100, GATE).report):
        assert isinstance(rep.stop_reason, StopReason)


def test_a_plan_whose_cost_is_not_exact_skips_the_alpha_bound(monkeypatch):
    import dataclasses
    from superopt.search.rewrite import Rewriter
    plan = Rewriter.plan

    def inexact(self, st_, match):  # an estimate far over alpha x best: only the built graph's cost counts
        p = plan(self, st_, match)
        return None if p is None else dataclasses.replace(p, dcost=1e9, exact=False)
    g = _two_conv_bn()
    want = search(g, ORDER_RULES, H100, alpha=1.0, progress=False).report.reduction
    monkeypatch.setattr(Rewriter, "plan", inexact)
    rep = search(g, ORDER_RULES, H100, alpha=1.0, progress=False).report
    assert rep.reduction >= want > 0.1  # pruned by the estimate, it would find nothing


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from(["relu", "transpose", "sigmoid"]), min_size=2, max_size=6), st.randoms())
def test_forms_of_unbuilt_plans_equal_the_built_graphs_forms(ops, rnd):
    from superopt.search.backtrack import search as bt
    rules = [_rule(["relu", "relu"], ["relu"], (4, 4)), _rule(["transpose", "transpose"], [], (4, 4)),
             _rule(["transpose", "relu"], ["relu", "transpose"], (4, 4))]
    res = bt(_chain(ops, (4, 4)), rules, H100, progress=False)
    st_, rw = res.first, res.rewriter
    forms = ExactForms(st_)
    for _ in range(4):
        plans = [p for p in (rw.plan(st_, m) for m in st_.matches) if p is not None]
        if not plans:
            break
        plan = rnd.choice(plans)
        want, key = forms.after(st_, plan), forms.key_after(st_, plan)
        child = rw.apply(st_, plan)
        assert forms.of_state(child) == want
        assert forms.key_of(child) == key  # the exact hash, updated from the parent's, is the child's own
        st_ = child


# ---- the command line ---------------------------------------------------------------------------
class _ConvBn(__import__("torch").nn.Module):
    def __init__(self):
        import torch
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(6, 4, 3, padding=1, bias=False), torch.nn.Conv2d(6, 4, 3, padding=1, bias=False)
        self.b1, self.b2 = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        import torch
        return torch.relu(self.b1(self.c1(x))), torch.relu(self.b2(self.c2(x)))


@pytest.fixture(scope="module")
def conv_bn_pt2(tmp_path_factory):
    import torch
    torch.manual_seed(0)
    m = _ConvBn().eval()
    for bn in (m.b1, m.b2):
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("models") / "convbn.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(1, 6, 8, 8),)), str(path))
    return path


def test_optimize_saturates_when_asked(conv_bn_pt2, tmp_path, capsys):
    import json
    from superopt.cli import main
    out, rep = tmp_path / "o.pt2", tmp_path / "r.json"
    assert main(["optimize", str(conv_bn_pt2), "-o", str(out), "--example-rules", "--report", str(rep),
                 "--search", "saturate"]) == 0
    text = capsys.readouterr().out
    assert "e-graph" in text and "stopped by saturated" in text
    doc = json.loads(rep.read_text())
    assert doc["search"]["stop_reason"] == "saturated" and doc["search"]["extraction"] in ("ilp", "local search", "greedy")
    assert doc["cost_after"] < doc["cost_before"] and doc["max_relative_error"] < 1e-4 and out.exists()


def test_optimize_saturates_by_default(conv_bn_pt2, tmp_path):
    import json
    from superopt.cli import main
    rep = tmp_path / "r.json"
    assert main(["optimize", str(conv_bn_pt2), "-o", str(tmp_path / "o.pt2"), "--example-rules",
                 "--report", str(rep)]) == 0
    doc = json.loads(rep.read_text())["search"]
    assert "enodes" in doc and "explored" not in doc


@pytest.mark.parametrize("flag", [["--iter-limit", "0"], ["--node-limit", "-3"]])
def test_optimize_rejects_bad_limits_in_one_line(conv_bn_pt2, tmp_path, capsys, flag):
    from superopt.cli import main
    assert main(["optimize", str(conv_bn_pt2), "-o", str(tmp_path / "o.pt2"), "--example-rules"] + flag) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("superopt: error:") and "limit must be at least 1" in err[0]
    assert not (tmp_path / "o.pt2").exists()


def test_a_merge_through_a_concat_runs_in_the_merge_rounds_and_a_fold_does_not():
    from superopt.search.schedule import merges as _merges
    rng = np.random.default_rng(0)

    def side(merged):
        b = GraphBuilder()
        x = b.input("x", (2, 3, 5))
        w0, w1 = _w(b, rng, "w0", (5, 7)), _w(b, rng, "w1", (5, 7))
        if merged:
            return b.build([b.op("matmul", x, b.op("concat", w0, w1, axis=1))])
        return b.build([b.op("concat", b.op("matmul", x, w0), b.op("matmul", x, w1), axis=2)])
    assert _merges(Rule(side(False), side(True)))  # two matmuls become one: bounded by the rounds
    assert not _merges(Rule(side(True), side(False)))  # the reversal grows instead
    assert not any(_merges(r) for r in ORDER_RULES[:1])  # conv + batch norm -> conv: a fold


@pytest.mark.parametrize("stop, stored", [("round limit", True), ("e-node limit", True), ("time limit", False)])
def test_an_unknown_at_a_limit_of_the_instantiation_is_stored_and_refused_again_without_proving(
        tmp_path, monkeypatch, stop, stored):
    """An instance whose proof stopped at its round or e-node limit gets the same answer every
    time: it is stored (with those limits) and refused from the store; a time-out is not."""
    import importlib
    ip = importlib.import_module("superopt.search.instance_proofs")
    prove = importlib.import_module("superopt.verify.prove")
    ran = []

    def fake(instance, theory, timeout_s):
        ran.append(instance.id)
        return prove.ProofOutcome("unknown" if stop != "time limit" else "timeout", (), stop)
    monkeypatch.setattr(prove, "prove", fake)
    rule = ex.fuse_conv_relu()
    gate = InstanceProofs(store=tmp_path / "p.db")
    assert not gate.admit("r", rule) and gate.flush() == int(stored)
    again = InstanceProofs(store=tmp_path / "p.db")
    assert not again.admit("r", rule) and (again.ran, again.reused) == (int(not stored), int(stored))
    monkeypatch.setattr(ip, "_limits_tag", lambda: '{"limits": [99, 99]}')  # larger limits: proven again
    other = InstanceProofs(store=tmp_path / "p.db")
    assert not other.admit("r", rule) and other.ran == 1 and len(ran) == 2 + int(not stored)


def _pool(b, v):
    return b.op("maxpool2d", v, kernel=(2, 2), stride=(2, 2))


def _bias_relu_pool(shape=(4, 64, 64, 64), bias=None):
    """maxpool(relu(x + u)), u a per-channel bias (a weight)."""
    b = GraphBuilder()
    x = b.input("x", shape)
    u = b.weight("u", (shape[1], 1, 1), bias)
    return b.build([_pool(b, b.op("relu", b.op("add", x, u)))])


def _pool_rules():
    """maxpool past a ReLU and past a per-channel add: each rewrite moves an operator, none goes
    away (both grow), and each runs the moved operator on a quarter of the values."""
    def side(ops):
        b = GraphBuilder()
        y = b.input("y", (1, 2, 4, 4))
        u = b.weight("u", (2, 1, 1)) if "add" in ops else None
        v = y
        for op in ops:
            v = _pool(b, v) if op == "pool" else b.op(op, v) if op == "relu" else b.op("add", v, u)
        return b.build([v])
    return [Rule(side(["relu", "pool"]), side(["pool", "relu"])), Rule(side(["add", "pool"]), side(["pool", "add"]))]


def test_a_growing_rewrite_cheaper_at_its_match_folds_so_the_next_one_is_within_the_growth_bound():
    # moving the pool past the ReLU makes maxpool(x + u), a new class: as growth it would be one
    # generation past the bound, and the pool would never move past the add
    from superopt.search.saturate import grows
    rules = _pool_rules()
    assert all(grows(r) for r in rules)
    g = _bias_relu_pool(bias=np.arange(64, dtype=np.float32).reshape(64, 1, 1))
    res = saturate(g, rules, H100, GATE, Limits(growth=1))
    assert [n.op for n in res.graph.nodes if n.name is None] == ["maxpool2d", "add", "relu"]
    assert res.report.paying >= 2 and res.report.stop_reason == StopReason.SATURATED
    env = {"x": np.random.default_rng(2).standard_normal((4, 64, 64, 64))}
    np.testing.assert_allclose(evaluate(g, env)[0], evaluate(fold_constants(res.graph), env)[0], rtol=1e-6)


def test_a_growing_rewrite_dearer_at_its_match_stays_growth():
    # the reversed rules run the ReLU and the add on four times the values: never applied as folds
    rules = [Rule(r.rhs, r.lhs) for r in _pool_rules()]
    b = GraphBuilder()
    x = b.input("x", (4, 64, 64, 64))
    u = b.weight("u", (64, 1, 1), np.ones((64, 1, 1), np.float32))
    g = b.build([b.op("relu", b.op("add", _pool(b, x), u))])
    res = saturate(g, rules, H100, GATE, Limits(growth=1))
    assert res.report.paying == 0 and res.report.held > 0
    assert [n.op for n in res.graph.nodes if n.name is None] == ["maxpool2d", "add", "relu"]


def test_a_stored_answer_is_found_by_what_the_instance_is_built_from_without_building_it(tmp_path, monkeypatch):
    """The saturation names each instance by a digest of what it is built from (the code, the
    rule, the match's types and attributes): a second search over the same store finds every
    answer under that name and builds no instance; the same e-graph and graph either way, and
    an instance refused stays refused."""
    import importlib
    sat = importlib.import_module("superopt.search.saturate")
    first = InstanceProofs(store=tmp_path / "p.db")
    a = saturate(_two_conv_bn(), ORDER_RULES, H100, first)
    first.flush()
    assert first.ran > 0
    built = []
    real = sat.instance_of
    monkeypatch.setattr(sat, "instance_of", lambda *args: built.append(1) or real(*args))
    again = InstanceProofs(store=tmp_path / "p.db")
    b = saturate(_two_conv_bn(), ORDER_RULES, H100, again)
    assert not built and again.ran == 0 and again.reused == b.report.instances_checked > 0
    assert again.refused == first.refused
    found = lambda r: (r.report.enodes, r.report.by_rule, r.report.cost_after)  # noqa: E731
    assert found(b) == found(a)
    plain = InstanceProofs(store=tmp_path / "p.db")
    plain.admit_keyed = None  # a gate without admit_keyed (any object with admit): instances are built
    c = saturate(_two_conv_bn(), ORDER_RULES, H100, plain)
    assert built and c.report.by_rule == a.report.by_rule


def test_an_answer_named_by_what_builds_it_is_stored_only_where_the_built_one_is(tmp_path, monkeypatch):
    """A time-out is not stored under the instance as built, nor under the name of what builds it."""
    prove = __import__("importlib").import_module("superopt.verify.prove")
    monkeypatch.setattr(prove, "prove",
                        lambda instance, theory, timeout_s: prove.ProofOutcome("timeout", (), "time limit"))
    gate = InstanceProofs(store=tmp_path / "p.db")
    assert not gate.admit_keyed("r", "abc", ex.fuse_conv_relu) and gate.flush() == 0
    again = InstanceProofs(store=tmp_path / "p.db")
    assert not again.admit_keyed("r", "abc", ex.fuse_conv_relu) and again.ran == 1 and again.reused == 0


def test_a_named_instance_reads_only_the_names_of_its_code_version(tmp_path):
    """The rows named by other versions of the code are not read (they were most of a store);
    an instance of a new version is found under its built id, and its own names then stored."""
    first = InstanceProofs(store=tmp_path / "p.db")
    assert first.admit_keyed("r", "v1:abc", ex.fuse_conv_relu) and first.ran == 1
    first.flush()
    gate = InstanceProofs(store=tmp_path / "p.db")
    assert gate.admit_keyed("r", "v1:abc", ex.fuse_conv_relu) and (gate.ran, gate.reused) == (0, 1)
    assert [i for _, i in gate._stored] == ["made:v1:abc"]  # not the built and canonical rows
    other = InstanceProofs(store=tmp_path / "p.db")
    assert other.admit_keyed("r", "v2:abc", ex.fuse_conv_relu) and (other.ran, other.reused) == (0, 1)
    assert not any(i.startswith("made:v1:") for _, i in other._stored)
    other.flush()
    last = InstanceProofs(store=tmp_path / "p.db")
    assert last.admit_keyed("r", "v2:abc", ex.fuse_conv_relu) and [i for _, i in last._stored] == ["made:v2:abc"]


def _split_adds(merged: bool, relu: bool = False):
    """add(piece 0 of y, u), add(piece 1 of y, v), or the pieces of add(y, concat(u, v))."""
    b = GraphBuilder()
    y, u, v = (b.input(n, s) for n, s in (("y", (1, 2, 8)), ("u", (1, 2, 4)), ("v", (1, 2, 4))))
    if relu:
        y = b.op("relu", y)
    if merged:
        return b.build(list(b.op("split", b.op("add", y, b.op("concat", u, v, axis=2)), axis=2, sizes=(4, 4))))
    p0, p1 = b.op("split", y, axis=2, sizes=(4, 4))
    return b.build([b.op("add", p0, u), b.op("add", p1, v)])


@pytest.mark.parametrize("rounds", [0, 1, 2])
def test_a_growing_rule_with_several_tops_runs_in_the_merge_rounds_only(rounds):
    # two adds on the pieces of a split as one add on the whole and a concat: the same operators and
    # one more, on two tops; matched in full at every iteration it grew BERT's e-graph by half
    from superopt.search.compiled import compile_rules
    rule, g = Rule(_split_adds(False), _split_adds(True)), _split_adds(False, relu=True)
    c = compile_rules([rule], g)
    assert c.tops and not c.multi and (c.grows | c.maybe)  # several tops, no merge, grows as stated
    rep = saturate(g, [rule], H100, GATE, Limits(multi_rounds=rounds)).report
    assert rep.stop_reason == StopReason.SATURATED
    assert sum(rep.by_rule.values()) == (rounds > 0)
    assert all(t["rewrites"] == 0 for t in rep.trace if t["phase"] == "single")
