"""Tests of the optimizer: matching, rewriting, folding, the search, `superopt optimize`."""

from __future__ import annotations

import functools
import json
import sqlite3

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from superopt.cli import main
from superopt.cost import CostModel
from superopt.ir import GraphBuilder, Rule
from superopt.search import RuleSet, State, fold_constants, match_all, search
from superopt.rules import examples as ex
from superopt.search.cse import eliminate_common_subexpressions
from superopt.search.errors import SearchError
from superopt.driver import relative_error
from superopt.search.rewrite import Rewriter
from superopt.semantics import evaluate

H100 = CostModel("h100")
RNG = np.random.default_rng(0)


def _w(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def _ops(g):
    """Operators that run, in order (weights and what is computed from them alone left out)."""
    folded = fold_constants(g)
    return [n.op for n in folded.nodes if n.name is None]


def _same_outputs(g1, g2, seed=0):
    """Equal outputs in float64 on random inputs, up to the float32 rounding of folded weights."""
    env = {n.name: np.random.default_rng(seed).standard_normal(n.types[0].shape) for n in g1.nodes if n.op == "input"}
    assert relative_error(evaluate(fold_constants(g2), env), evaluate(g1, env)) < 1e-5


def _optimized(g, rules, **kw):
    res = search(g, rules, H100, progress=False, **kw)
    res.graph.check()
    assert res.report.cost_after <= res.report.cost_before
    return res


# ---- the known wins ---------------------------------------------------------------------------

def test_relu_is_fused_into_conv():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    g = b.build([b.op("relu", b.op("conv2d", x, b.weight("w", data=_w(16, 8, 3, 3)), padding=(1, 1)))])
    res = _optimized(g, [ex.fuse_conv_relu()])
    assert _ops(res.graph) == ["conv2d"] and res.graph.nodes[-1].attr["activation"] == "relu"
    assert res.report.cost_after < res.report.cost_before
    _same_outputs(g, res.graph)


def test_two_matmuls_sharing_an_input_are_merged():
    b = GraphBuilder()
    x = b.input("x", (5, 12))
    y1 = b.op("matmul", x, b.weight("w1", data=_w(12, 7)))
    y2 = b.op("matmul", x, b.weight("w2", data=_w(12, 9)))
    g = b.build([b.op("relu", y1), b.op("tanh", y2)])
    res = _optimized(g, [ex.merge_matmuls(2)])
    assert _ops(res.graph).count("matmul") == 1 and "split" in _ops(res.graph)
    assert res.report.cost_after < res.report.cost_before
    _same_outputs(g, res.graph)


def test_conv_and_batchnorm_are_folded():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 12, 12))
    y = b.op("conv2d", x, b.weight("w", data=_w(16, 8, 3, 3)), padding=(1, 1))
    vecs = [b.weight(n, data=_w(16, positive=n == "v")) for n in ("s", "b", "m", "v")]
    g = b.build([b.op("batchnorm", y, *vecs, eps=1e-3)])  # another eps than the rule's
    res = _optimized(g, [ex.fold_conv_batchnorm()])
    assert _ops(res.graph) == ["conv2d", "add"]
    _same_outputs(g, res.graph)


def test_two_convs_sharing_an_input_are_merged():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 10, 10))
    y1 = b.op("conv2d", x, b.weight("w1", data=_w(16, 8, 1, 1)))
    y2 = b.op("conv2d", x, b.weight("w2", data=_w(24, 8, 1, 1)))
    g = b.build([b.op("relu", y1), b.op("sigmoid", y2)])
    res = _optimized(g, [ex.merge_convs()])
    assert _ops(res.graph).count("conv2d") == 1
    _same_outputs(g, res.graph)


def test_fire_module_becomes_one_conv():
    """SqueezeNet's expand 1x1 and 3x3 convolutions, bias and relu each, then concat: one conv."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 13, 13))
    branches = []
    for k, (kernel, pad) in enumerate(((1, 0), (3, 1))):
        y = b.op("conv2d", x, b.weight(f"w{k}", data=_w(32, 16, kernel, kernel)), padding=(pad, pad))
        branches.append(b.op("relu", b.op("add", y, b.weight(f"b{k}", data=_w(32, 1, 1)))))
    g = b.build([b.op("concat", *branches, axis=1)])
    res = _optimized(g, ex.example_rules(), budget=200)
    assert _ops(res.graph) == ["conv2d", "add", "relu"]
    _same_outputs(g, res.graph)


# ---- what must not be rewritten -----------------------------------------------------------------

def _conv_relu(extra_output=False, padding=(1, 1)):
    b = GraphBuilder()
    y = b.op("conv2d", b.input("x", (1, 8, 16, 16)), b.weight("w", data=_w(16, 8, 3, 3)), padding=padding)
    return b.build([b.op("relu", y)] + ([y] if extra_output else []))


def test_intermediate_value_used_outside_blocks_the_rewrite():
    res = _optimized(_conv_relu(extra_output=True), [ex.fuse_conv_relu()])
    assert res.report.rules_applied == {}
    assert res.report.rejected == {"intermediate value used outside the match": 1}


def test_attributes_must_be_equal():
    assert match_all(State.from_graph(_conv_relu(padding=(0, 0)), H100), RuleSet([ex.fuse_conv_relu()])) == []


def _side(shape, f):
    b = GraphBuilder()
    x = b.input("x", shape)
    return b.build([f(b, x)])


def test_variables_bind_values_of_the_same_rank_or_with_leading_batch_axes():
    rule = Rule(_side((2, 4), lambda b, x: b.op("relu", b.op("relu", x))), _side((2, 4), lambda b, x: b.op("relu", x)))
    for shape, n in (((3, 5), 1), ((1, 5), 1), ((2, 3, 4), 1), ((2, 2, 3, 4), 1), ((1, 2, 2, 3, 4), 0), ((4,), 0)):
        g = _side(shape, lambda b, x: b.op("relu", b.op("relu", x)))
        assert len(match_all(State.from_graph(g, H100), RuleSet([rule], max_lift=2))) == n, shape
        assert len(match_all(State.from_graph(g, H100), RuleSet([rule], max_lift=0))) == (n and len(shape) == 2)


def test_rules_at_batch_one_apply_to_larger_batches():
    b = GraphBuilder()
    y = b.op("conv2d", b.input("x", (8, 8, 16, 16)), b.weight("w", data=_w(16, 8, 3, 3)), padding=(1, 1))
    g = b.build([b.op("relu", y)])
    res = _optimized(g, [ex.fuse_conv_relu()])  # the rule's image has a batch of 1
    assert _ops(res.graph) == ["conv2d"]
    _same_outputs(g, res.graph)


def test_a_rule_that_holds_only_for_size_one_axes_is_not_applied_to_larger_ones():
    def side(f):
        b = GraphBuilder()
        return b.build([f(b, b.input("x", (1, 4)), b.input("y", (1, 4)))])
    rule = Rule(side(lambda b, x, y: b.op("matmul", x, b.op("transpose", y, perm=(1, 0)))),
                side(lambda b, x, y: b.op("matmul", y, b.op("transpose", x, perm=(1, 0)))))  # x y^T = y x^T: rows only
    b = GraphBuilder()
    x, y = b.input("x", (3, 4)), b.input("y", (3, 4))
    g = b.build([b.op("matmul", x, b.op("transpose", y, perm=(1, 0)))])
    res = _optimized(g, [rule], budget=5)
    assert res.report.rules_applied == {}


def test_weight_variables_bind_compile_time_values_only():
    b = GraphBuilder()
    x, w2 = b.input("x", (5, 12)), b.input("w2", (12, 9))  # an input, not a weight
    g = b.build([b.op("matmul", x, b.weight("w1", data=_w(12, 7))), b.op("matmul", x, w2)])
    assert match_all(State.from_graph(g, H100), RuleSet([ex.merge_matmuls(2)])) == []


def test_a_rewrite_that_would_close_a_cycle_is_rejected():
    """Batch-merging conv(x, w) and conv(y, w) is wrong when y is computed from conv(x, w)."""
    def merge(b, v):
        y = b.op("conv2d", b.op("concat", v["x"], v["y"], axis=0), v["w"])
        return b.op("split", y, axis=0, sizes=(1, 1))
    src = [("x", (1, 4, 8, 8), "input"), ("y", (1, 4, 8, 8), "input"), ("w", (4, 4, 1, 1), "weight")]
    rule = ex._rule(src, lambda b, v: [b.op("conv2d", v["x"], v["w"]), b.op("conv2d", v["y"], v["w"])], merge)
    b = GraphBuilder()
    x, w = b.input("x", (1, 6, 9, 9)), b.weight("w", data=_w(6, 6, 1, 1))
    a = b.op("conv2d", x, w)
    g = b.build([b.op("conv2d", b.op("relu", a), w)])
    res = _optimized(g, [rule])
    assert res.report.rules_applied == {} and res.report.rejected["would create a cycle"] >= 1
    b = GraphBuilder()
    x, y, w = b.input("x", (1, 6, 9, 9)), b.input("y", (1, 6, 9, 9)), b.weight("w", data=_w(6, 6, 1, 1))
    g2 = b.build([b.op("add", b.op("conv2d", x, w), b.op("conv2d", y, w))])
    _same_outputs(g2, _optimized(g2, [rule]).graph)


def test_a_rewrite_that_changes_an_output_type_is_rejected():
    """A (wrong) rule that type-checks at its square generation shape only."""
    rule = Rule(_side((4, 4), lambda b, x: b.op("relu", x)),
                _side((4, 4), lambda b, x: b.op("transpose", b.op("relu", x), perm=(1, 0))))
    res = _optimized(_side((2, 3), lambda b, x: b.op("relu", x)), [rule])
    assert res.report.rules_applied == {}
    assert res.report.rejected == {"right side does not fit the match's shapes": 1}


def test_the_old_graph_stays_intact():
    g = _conv_relu()
    key, nodes = g.key(), g.nodes
    _optimized(g, [ex.fuse_conv_relu()])
    assert g.key() == key and g.nodes is nodes


def test_opaque_nodes_are_kept_and_optimized_around():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    y = b.op("relu", b.op("conv2d", x, b.weight("w", data=_w(8, 8, 3, 3)), padding=(1, 1)))
    (z,) = b.add("opaque", [y], {"target": "mystery", "out_types": [[(1, 8, 16, 16), "float32"]]})
    g = b.build([b.op("relu", b.op("conv2d", z, b.weight("w2", data=_w(8, 8, 3, 3)), padding=(1, 1)))])
    res = _optimized(g, [ex.fuse_conv_relu()])
    assert _ops(res.graph) == ["conv2d", "opaque", "conv2d"]


# ---- the search's bookkeeping against recomputing from scratch ------------------------------------

def _random_graph(seed: int):
    """A random image network of convs, batch norms, relus, adds, splits and concats."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    vals = [b.input("x", (1, 6, 8, 8))]
    for k in range(int(rng.integers(3, 9))):
        x = vals[int(rng.integers(len(vals)))]
        c = b.type_of(x).shape[1]
        kind = rng.choice(["conv", "conv", "bn", "relu", "add", "split"])
        if kind == "conv":
            kk = int(rng.choice([1, 3]))
            y = b.op("conv2d", x, b.weight(f"w{k}", data=_w(int(rng.choice([4, 6])), c, kk, kk)), padding=(kk // 2,) * 2)
        elif kind == "bn":
            y = b.op("batchnorm", x, *[b.weight(f"{n}{k}", data=_w(c, positive=n == "v")) for n in "sbmv"])
        elif kind == "add":
            y = b.op("add", x, b.weight(f"b{k}", data=_w(c, 1, 1)))
        elif kind == "split" and c % 2 == 0:
            p, q = b.op("split", x, axis=1, sizes=(c // 2, c // 2))
            y = b.op("concat", b.op("relu", p), b.op("relu", q), axis=1)
        else:
            y = b.op("relu", x)
        vals.append(y)
    outs = [v for v in vals[1:] if v not in {r for n in b.nodes for r in n.inputs}] or [vals[-1]]
    return b.build(outs)


def _check_state(st: State, rules: RuleSet, rw: Rewriter):
    """Incremental matches, cost, key and reused plans equal what a fresh start computes."""
    g = st.to_graph()
    g.check()
    fresh = State.from_graph(g, H100)
    assert fresh.key == st.key
    assert fresh.cost == pytest.approx(st.cost, rel=1e-9, abs=1e-9)
    assert len(set(st.matches)) == len(match_all(fresh, rules)) == len(set(match_all(st, rules)))
    assert set(st.matches) == set(match_all(st, rules))
    again = Rewriter(rules, H100)
    again.ids = rw.ids  # node ids are unique within a search
    for m, p in st.plans.items():
        q = again._plan(st, m)
        assert type(p) is type(q) and (getattr(p, "dcost", 0) == pytest.approx(getattr(q, "dcost", 0)))
        if hasattr(p, "key"):
            assert p.key(st) == q.key(st)


@settings(max_examples=int(__import__("os").environ.get("SUPEROPT_EXAMPLES", 25)), deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_incremental_bookkeeping_matches_recomputation(graph_seed, walk_seed):
    g = _random_graph(graph_seed)
    rules = RuleSet(ex.example_rules() + [r.reversed() for r in ex.example_rules()])
    rw = Rewriter(rules, H100)
    st = State.from_graph(g, H100)
    st.matches = match_all(st, rules)
    rng = np.random.default_rng(walk_seed)
    for _ in range(6):
        plans = [p for p in (rw.plan(st, m) for m in st.matches) if p is not None]
        _check_state(st, rules, rw)
        if not plans:
            break
        st = rw.apply(st, plans[int(rng.integers(len(plans)))])
        _same_outputs(g, st.to_graph())


def test_keys_agree_whatever_the_order_of_rewrites():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    outs = [b.op("relu", b.op("conv2d", x, b.weight(f"w{k}", data=_w(8, 8, 3, 3)), padding=(1, 1))) for k in range(2)]
    g = b.build(outs)
    rules = RuleSet([ex.fuse_conv_relu()])
    rw = Rewriter(rules, H100)
    first = State.from_graph(g, H100)
    first.matches = match_all(first, rules)
    ends = []
    for order in ((0, 1), (1, 0)):
        s = first
        for k in order:
            m = next(m for m in s.matches if s.nodes[m.nodes[0]].inputs[1].node == g.by_name[f"w{k}"])
            s = rw.apply(s, rw.plan(s, m))
        ends.append(s)
    assert ends[0].key == ends[1].key and ends[0].to_graph().key() == ends[1].to_graph().key()
    assert ends[0].key != first.key


# ---- passes and limits ------------------------------------------------------------------------------

def test_fold_constants_computes_weight_subgraphs():
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    w = b.op("transpose", b.weight("w", data=_w(5, 4)), perm=(1, 0))
    g = b.build([b.op("matmul", x, w)])
    f = fold_constants(g)
    assert [n.op for n in f.nodes] == ["weight", "input", "matmul"] and "w" not in f.data
    _same_outputs(g, f)


def test_common_subexpressions_are_merged():
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    g = b.build([b.op("add", b.op("relu", x), b.op("relu", x)), b.op("add", x, x)])
    assert [n.op for n in eliminate_common_subexpressions(g).nodes] == ["input", "relu", "add", "add"]


@pytest.mark.parametrize("kw, words", [({"alpha": 0.9}, "alpha must be at least 1"),
                                       ({"budget": 0}, "budget must be at least 1"),
                                       ({"time_limit": 0}, "time limit must be positive")])
def test_bad_limits_are_refused(kw, words):
    with pytest.raises(SearchError, match=words):
        search(_conv_relu(), [ex.fuse_conv_relu()], H100, progress=False, **kw)


def test_budget_and_time_limit_stop_the_search():
    g = _random_graph(3)
    rules = ex.example_rules()
    assert search(g, rules, H100, budget=1, progress=False).report.stop_reason in ("budget", "exhausted")
    rep = search(_conv_relu(), [ex.fuse_conv_relu()], H100, budget=1, progress=False).report
    assert rep.explored == 1 and rep.stop_reason == "budget"
    assert search(g, rules, H100, time_limit=1e-9, progress=False).report.stop_reason == "time limit"


def test_report_prints_as_table_and_json():
    rep = _optimized(_conv_relu(), [ex.fuse_conv_relu()]).report
    doc = json.loads(json.dumps(rep.to_json()))
    assert doc["explored"] == rep.explored and doc["stop_reason"] == "exhausted" and 0 < doc["reduction"] < 1
    assert "graphs explored" in rep.table() and "rules applied" in rep.table()


# ---- the zoo ----------------------------------------------------------------------------------------

@functools.cache
def _zoo(name):
    from superopt.driver import load_model
    return load_model(zoo=name)


@pytest.mark.parametrize("name", ["resnet50", "resnext50_32x4d", "inception_v3", "squeezenet1_1",
                                  "nasnet_a_mobile", "bert_base", "vit_b16"])
def test_zoo_models_get_no_worse_and_keep_their_outputs(name):
    from superopt.driver import optimize
    rules = ex.example_rules() + [r.reversed() for r in ex.example_rules()]
    best, rep, _ = optimize(_zoo(name), rules, H100, budget=40, time_limit=20, progress=False, input_sets=1)
    assert rep.cost_after <= rep.cost_before
    assert rep.max_relative_error < 1e-4


# ---- the command line ------------------------------------------------------------------------------

class _Tiny(torch.nn.Module):
    def __init__(self, opaque=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.a, self.b = torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(8, 5, bias=False)
        self.opaque = opaque

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.opaque:
            y = torch.cumsum(y, dim=1)
        z = y.mean(dim=(2, 3)) if not self.opaque else y.flatten(2).amax(dim=2)
        return self.a(z), self.b(z)


@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    out = {}
    for opaque in (False, True):
        torch.manual_seed(0)
        ep = torch.export.export(_Tiny(opaque).eval(), (torch.randn(1, 4, 8, 8),))
        out[opaque] = d / f"tiny{int(opaque)}.pt2"
        torch.export.save(ep, str(out[opaque]))
    return out


def test_optimize_writes_a_checked_model_and_a_report(tiny_pt2, tmp_path, capsys):
    out, rep = tmp_path / "o.pt2", tmp_path / "r.json"
    code = main(["optimize", str(tiny_pt2[False]), "-o", str(out), "--example-rules", "--report", str(rep),
                 "--search", "backtrack", "--no-freezing"])
    assert code == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "cost (us)" in text and "rules applied" in text and "graphs explored" in text
    doc = json.loads(rep.read_text())
    assert doc["cost_after"] < doc["cost_before"] and doc["max_relative_error"] < 1e-4
    x = torch.randn(1, 4, 8, 8)
    want = torch.export.load(str(tiny_pt2[False])).module()(x)
    got = torch.export.load(str(out)).module()(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_optimize_works_around_opaque_operators(tiny_pt2, tmp_path, capsys):
    out = tmp_path / "o.pt2"
    assert main(["optimize", str(tiny_pt2[True]), "-o", str(out), "--example-rules", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cost_after"] < doc["cost_before"] and out.exists()


@functools.cache
def _tiny_model(path):
    from superopt.driver import load_model
    return load_model(path)


@settings(max_examples=12, deadline=None)
@given(min_gain=st.floats(0.0, 0.99))
def test_the_written_graph_saves_min_gain_or_is_the_original(tiny_pt2, min_gain):
    from superopt.ir.hashing import named_hash
    from superopt.driver import optimize
    model = _tiny_model(str(tiny_pt2[False]))
    rules = [ex.merge_matmuls(2), ex.fuse_conv_relu()]
    best, rep, _ = optimize(model, rules, H100, budget=20, progress=False, input_sets=1, min_gain=min_gain)
    assert rep.cost_found < rep.cost_before  # the merge is cheaper: what is kept is min_gain's doing
    if rep.rewritten:
        assert rep.cost_before - rep.cost_after >= min_gain * rep.cost_before and rep.cost_after == rep.cost_found
    else:
        assert named_hash(best) == named_hash(model.graph) and rep.cost_after == rep.cost_before
        assert rep.cost_before - rep.cost_found < min_gain * rep.cost_before


def test_a_wrong_rule_is_refused_by_the_instance_proofs(tiny_pt2):
    from superopt.driver import load_model, optimize
    right = ex.fuse_conv_relu()
    wrong = Rule(right.lhs, right.lhs.subgraph([right.lhs.nodes[-1].inputs[0]]))  # drops the relu
    _, rep, res = optimize(load_model(str(tiny_pt2[False])), [ex.merge_matmuls(2), wrong], H100, progress=False)
    assert wrong.id not in res.report.rules_applied and res.report.instance_proofs["refused"] >= 1


def test_a_wrong_rule_is_caught_named_and_nothing_written(tiny_pt2, tmp_path, monkeypatch):
    """Past a gate that admits everything, the output check still stops a wrong rule."""
    from superopt.search.errors import NumericMismatchError
    from superopt.search.instance_proofs import InstanceProofs
    from superopt.driver import load_model, optimize
    monkeypatch.setattr(InstanceProofs, "admit", lambda self, rule_id, instance: True)
    right = ex.fuse_conv_relu()
    wrong = Rule(right.lhs, right.lhs.subgraph([right.lhs.nodes[-1].inputs[0]]))  # drops the relu
    with pytest.raises(NumericMismatchError) as err:  # the backtracking search's history is replayed
        optimize(load_model(str(tiny_pt2[False])), [ex.merge_matmuls(2), wrong], H100, progress=False,
                 search="backtrack")
    msg = str(err.value)
    assert f"rule {wrong.id}" in msg and f"--exclude-rule {wrong.id}" in msg and "nothing was written" in msg


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("superopt: error: ")
    return err


def test_bad_input_gets_one_line_messages(tiny_pt2, tmp_path, capsys):
    m = str(tiny_pt2[False])
    assert "no rule database at" in _error(["optimize", m, "--rules", str(tmp_path / "none.db")], capsys)
    assert "alpha must be at least 1" in _error(["optimize", m, "--example-rules", "--alpha", "0.5"], capsys)
    assert "exactly one" in _error(["optimize", "--example-rules"], capsys)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"format": "superopt.profile", "version": 1, "device": "cpu", "entries": []}))
    assert "measured on 'cpu'" in _error(["optimize", m, "--example-rules", "--profile", str(prof), "--device", "h100"], capsys)


def test_optimize_applies_the_proven_rules_of_a_database(tiny_pt2, tmp_path, capsys):
    from superopt.rules import RuleDB
    from superopt.verify.result import VerifyResult
    path = tmp_path / "r.db"
    ok = VerifyResult("proven", "unsat", 0.1, ("a",), "passed", 0.0)
    no = VerifyResult("unproven", "timeout", 5.0, (), "passed", 0.0)
    with RuleDB.create(path) as db:
        db.add([(ex.fuse_conv_relu(), ok), (ex.merge_matmuls(2), no)])
    out = tmp_path / "o.pt2"
    assert main(["optimize", str(tiny_pt2[False]), "--rules", str(path), "-o", str(out), "--json", "--target", "eager"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["search"]["rules_applied"] == {ex.fuse_conv_relu().id: 1}  # the unproven merge is not applied
    assert doc["search"]["rules"] == 2  # the fusion both ways


def test_rule_database_of_another_version_is_refused(tiny_pt2, tmp_path, capsys):
    from superopt.rules import RuleDB
    path = tmp_path / "r.db"
    RuleDB.create(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    assert "version" in _error(["optimize", str(tiny_pt2[False]), "--rules", str(path)], capsys)


def test_a_model_of_opaque_operators_only_is_refused(tmp_path, capsys):
    class Sorts(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=0)
    path = tmp_path / "s.pt2"
    torch.export.save(torch.export.export(Sorts(), (torch.randn(3, 4),)), str(path))
    assert "opaque" in _error(["optimize", str(path), "--example-rules"], capsys)


def test_rules_that_can_never_match_are_dropped_and_results_do_not_change():
    from superopt.pattern import reachable_rules
    rules = ex.example_rules()
    b = GraphBuilder()
    x, w = b.input("x", (1, 6, 8, 8)), b.weight("w", (4, 6, 3, 3))
    g = b.build([b.op("relu", b.op("conv2d", x, w, padding=(1, 1)))])
    kept = reachable_rules(rules, g)
    ops = lambda r: {n.op for n in r.lhs.nodes if n.name is None}
    assert any("batchnorm" in ops(r) for r in rules) and not any("batchnorm" in ops(r) for r in kept)
    assert any(r.id == ex.fuse_conv_relu().id for r in kept)
    # an operator that only a kept rule's right side introduces makes its rules reachable
    assert all(ops(r) <= {n.op for n in g.nodes} | {o for k in kept for o in ops(k.reversed())} | {"zeros", "ones"}
               for r in kept)


def test_bench_search_names_an_unknown_model_in_one_line(capsys):
    import runpy
    from pathlib import Path
    bench = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "bench_search.py"))
    assert bench["main"](["--models", "squeezenet1_1", "resnext50"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model 'resnext50'") and "resnext50_32x4d" in err and "\n" not in err
