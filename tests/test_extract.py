"""Extraction from an e-graph (search/extract.py, choice.py, ilp.py): the cycle filter keeps the merges, the local
search and the integer program pay a shared value once, and every pick is acyclic."""

from __future__ import annotations

import numpy as np

from superopt.cost import CostModel
from superopt.ir import GraphBuilder
from superopt.rules import examples as ex
from superopt.search import search
from superopt.search import extract as X
from superopt.search.choice import Problem, cyclic_edges, on_cycles
from superopt.search.fold import fold_constants
from superopt.search.ilp import ilp_choice
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.saturate import saturate
from superopt.semantics.reference import evaluate

H100 = CostModel("h100")
GATE = InstanceProofs(store=None)
D, N = 768, 128  # BERT's width: a merged matmul costs about as much as its parts

_SRC = [("x", (2, 6), "input"), ("w1", (6, 4), "weight"), ("w2", (6, 4), "weight")]
#: concat(matmul(x, a), matmul(x, b)) = matmul(x, concat(a, b)): with both directions the e-graph
#: holds concat(q, k) in the merged class while q's class holds a split of it (a cycle)
CONCAT_MATMUL = ex._rule(_SRC, lambda b, v: b.op("concat", b.op("matmul", v["x"], v["w1"]),
                                                  b.op("matmul", v["x"], v["w2"]), axis=1),
                         lambda b, v: b.op("matmul", v["x"], b.op("concat", v["w1"], v["w2"], axis=1)))
QKV_RULES = [ex.merge_matmuls(), CONCAT_MATMUL, CONCAT_MATMUL.reversed()]


def _qkv():
    """Three sibling matmuls of one input, as BERT's query, key and value, each used apart."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (N, D))
    ws = [b.weight(f"w{k}", (D, D), rng.standard_normal((D, D)).astype(np.float32) / D) for k in "qkv"]
    return b.build([b.op("relu", b.op("matmul", x, w)) for w in ws])


def test_saturation_merges_sibling_matmuls_as_bert_query_key_value():
    g = _qkv()
    res = saturate(g, QKV_RULES, H100, GATE)
    ops = [n.op for n in fold_constants(res.graph).nodes if n.name is None]
    assert ops.count("matmul") == 1 and "split" in ops  # all three merged into one
    assert res.report.dropped_for_cycles > 0  # the e-graph had cycles
    back = search(g, QKV_RULES, H100, alpha=1.05, progress=False).report
    assert res.report.reduction >= back.reduction - 1e-9 and res.report.reduction > 0.1
    env = {"x": np.random.default_rng(1).standard_normal((N, D)).astype(np.float32)}
    for a, b in zip(evaluate(g, env), evaluate(fold_constants(res.graph), env)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def _problem():
    g = _qkv()
    res = saturate(g, QKV_RULES, H100, GATE, use_ilp=False)
    eg = res.egraph
    roots = [eg.find(c) for c in eg.add_graph(g)]  # the model's e-nodes are there: its classes
    return Problem(eg, roots, H100), g


def test_the_cycle_filter_keeps_the_splits_of_merges_and_drops_the_concats_of_parts():
    p, _ = _problem()
    before = {c: list(p.cands[c]) for c in p.classes}
    assert cyclic_edges(p)
    dropped = X.drop_cycles(p)
    gone = [e for c in p.classes for e in before[c] if e not in p.cands[c]]
    assert dropped == len(gone) > 0
    assert {e.op for e in gone} == {"concat"}  # the costly concat of parts, never a split of a merge
    assert not cyclic_edges(p)  # what is left is acyclic here (no free cycles)


def test_local_search_and_the_integer_program_pay_a_shared_merge_once():
    p, g = _problem()
    X.drop_cycles(p)
    greedy = X.greedy_choice(p)
    local = X.local_search(p, greedy)
    ilp, status, dual = ilp_choice(p, 10.0)
    cost = {k: H100.graph_cost(X.build_graph(p.eg, ch, p.roots, g)[0]) for k, ch in
            (("greedy", greedy), ("local", local), ("ilp", ilp))}
    assert cost["local"] < 0.9 * cost["greedy"]  # tree costs count the merged matmul per user
    assert status.startswith("optimal") and abs(cost["ilp"] - cost["local"]) < 1e-6 * cost["local"]
    assert dual <= cost["ilp"] * (1 + 1e-6)
    for ch in (greedy, local, ilp):
        assert not on_cycles(p, ch)


def test_lazy_acyclicity_orders_only_the_classes_on_a_cycle():
    p, g = _problem()  # unfiltered: the program's first answer may close the concat/split cycles
    ilp, status, lazy_dual = ilp_choice(p, 10.0, eager=0)
    assert ilp is not None and not on_cycles(p, ilp)
    assert status.startswith("optimal") and "rounds" in status  # solved again after a cyclic answer
    eager, status, dual = ilp_choice(p, 10.0)  # the classes on cycles ordered at once: one round
    assert eager is not None and not on_cycles(p, eager) and status == "optimal"
    assert dual >= lazy_dual - 1e-9


def test_each_distinct_pick_is_built_and_priced_once(monkeypatch):
    """The local searches and the program often agree: an equal pick makes an equal graph, so
    it is built and priced once, and the result is the same as pricing every pick."""
    g = _qkv()
    res = saturate(g, QKV_RULES, H100, GATE, use_ilp=False)
    eg = res.egraph
    roots = [eg.find(c) for c in eg.add_graph(g)]
    built: list = []
    real = X.build_graph

    def counting(eg_, choice, roots_, graph, memo=None):
        built.append(dict(choice))
        return real(eg_, choice, roots_, graph, memo)

    monkeypatch.setattr(X, "build_graph", counting)
    best, how = X.extract(eg, roots, g, H100, 10.0)
    distinct = []
    for ch in built:
        assert ch not in distinct  # never the same pick twice
        distinct.append(ch)
    assert how.method in ("local search", "ilp") and how.gap is not None and how.gap <= 0.01
    monkeypatch.setattr(X, "build_graph", real)
    p = Problem(eg, roots, H100)
    X.drop_cycles(p)
    local = X.local_search(p, X.greedy_choice(p))
    assert abs(H100.graph_cost(best) - H100.graph_cost(real(eg, local, roots, g)[0])) < 1e-6 * H100.graph_cost(best)


def test_a_memo_shared_across_picks_builds_the_same_graphs():
    """build_graph's memo keeps each e-node's checked node: graphs built with one memo for
    several picks equal those built each alone (names, data, structure)."""
    p, g = _problem()
    X.drop_cycles(p)
    picks = [X.greedy_choice(p)]
    picks.append(X.local_search(p, picks[0]))
    alone = [X.build_graph(p.eg, ch, p.roots, g) for ch in picks]
    memo: dict = {}
    shared = [X.build_graph(p.eg, ch, p.roots, g, memo) for ch in picks + picks[::-1]]
    for (a, ao), (b, bo) in zip(alone + alone[::-1], shared):
        assert a == b and repr(a) == repr(b) and ao == bo
        assert set(a.data) == set(b.data) and all(a.data[k] is b.data[k] for k in a.data)
    assert memo  # it was used
