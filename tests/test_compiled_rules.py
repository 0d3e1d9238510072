"""The compiled rules kept between runs (search/compiled.py): a cached compilation is the very
compilation, a damaged or foreign entry is compiled again, and the search finds the same."""

from __future__ import annotations

import pytest

from superopt.cost import CostModel
from superopt.pattern import RuleSet, match_key, reachable_rules, rule_form
from superopt.rules import examples as ex
from superopt.rules.load import RuleList
from superopt.search import compiled
from superopt.search.instance_proofs import InstanceProofs
from superopt.search.saturate import saturate
from test_saturate import _two_conv_bn  # x -> (conv 1x1 -> batch norm -> relu) twice

RULES = [ex.fold_conv_batchnorm((1, 1), (0, 0), 1), ex.merge_convs((1, 1), (0, 0), 1),
         ex.merge_split_bias(True), ex.merge_split_unary("relu", True), ex.fuse_conv_relu()]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_COMPILE_CACHE", str(tmp_path))
    compiled._MEMO.clear()
    yield tmp_path
    compiled._MEMO.clear()


def _summary(c: compiled.Compiled) -> tuple:
    rs = c.ruleset
    return ([(p.index, p.rule_id, rule_form(p), match_key(p), p.var_names, p.max_lift, p.may_close_cycle)
             for p in rs.patterns], [(r.id, why) for r, why in rs.skipped], rs.by_op, rs.by_anchor,
            c.multi, c.skipped_merges, c.tops, c.top, c.grows, c.maybe, c.height)


def test_cached_compilation_is_the_compilation(cache):
    g = _two_conv_bn()
    fresh = compiled._classify(RuleSet(reachable_rules(RULES, g)))
    first = compiled.compile_rules(RULES, g)
    assert len(list(cache.glob("*.pickle"))) == 1
    compiled._MEMO.clear()  # as a new process: read from disk
    again = compiled.compile_rules(RULES, g)
    assert _summary(fresh) == _summary(first) == _summary(again)
    assert all(p.rule is r for p, r in zip(again.ruleset.patterns, [p.rule for p in first.ruleset.patterns]))
    assert again.ruleset.patterns[0] is not first.ruleset.patterns[0]  # each run its own objects


def test_other_rules_other_entry(cache):
    g = _two_conv_bn()
    compiled.compile_rules(RULES, g)
    fewer = compiled.compile_rules(RULES[:2], g)
    assert len(list(cache.glob("*.pickle"))) == 2
    assert len(fewer.ruleset.patterns) <= 2


def test_damaged_entry_compiled_again(cache):
    g = _two_conv_bn()
    want = _summary(compiled.compile_rules(RULES, g))
    (path,) = cache.glob("*.pickle")
    path.write_bytes(b"not a pickle")
    compiled._MEMO.clear()
    assert _summary(compiled.compile_rules(RULES, g)) == want
    compiled._MEMO.clear()
    assert _summary(compiled.compile_rules(RULES, g)) == want  # and rewritten


def test_digest_key_guards_a_changed_list(cache):
    """A loaded list's key is its database digest and the graph's operators; a list changed
    after loading (its length no longer the one digested) is keyed by its rules' text instead."""
    g = _two_conv_bn()
    rules = RuleList(RULES, digest="db-1")
    k1 = compiled._ops_key(rules, g)
    assert k1 is not None and k1 != compiled._ops_key(RuleList(RULES, digest="db-2"), g)
    rules.append(ex.merge_convs((1, 1), (0, 0), 1))
    assert compiled._ops_key(rules, g) is None and compiled._ops_key(list(RULES), g) is None


def test_warm_database_entry_skips_reachability(cache, monkeypatch):
    """A loaded database's entry names the rules the graph reaches: read back, it is the
    compilation without walking the rules again; an entry whose rules are not the list's (a
    rule replaced after loading, the length kept) is compiled again."""
    g = _two_conv_bn()
    rules = RuleList(RULES, digest="db-1")
    want = _summary(compiled.compile_rules(rules, g))
    compiled._MEMO.clear()

    def walked(*a):
        raise AssertionError("walked the rules")

    with monkeypatch.context() as m:
        m.setattr(compiled, "reachable_rules", walked)
        assert _summary(compiled.compile_rules(rules, g)) == want
    other = RuleList(RULES[:-1] + [ex.merge_split_unary("relu", False)], digest="db-1")
    assert len(other) == len(rules)
    fresh = compiled._classify(RuleSet(reachable_rules(list(other), g)))
    assert _summary(compiled.compile_rules(other, g)) == _summary(fresh)


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_COMPILE_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiled._MEMO.clear()
    compiled.compile_rules(RULES, _two_conv_bn())
    assert not list(tmp_path.rglob("*.pickle"))


def test_search_same_with_and_without_cache(cache):
    g, cost = _two_conv_bn(), CostModel("h100")
    runs = []
    for k in range(3):  # compiled, from memory, from disk
        if k == 2:
            compiled._MEMO.clear()
        res = saturate(g, RULES, cost, InstanceProofs(store=None))
        runs.append((res.report.cost_after, res.report.enodes, dict(res.report.by_rule), res.graph.key()))
    assert runs[0] == runs[1] == runs[2]
    assert sum(runs[0][2].values()) > 0 and runs[0][0] < res.report.cost_before  # rules applied


def test_old_entries_pruned(cache, monkeypatch):
    monkeypatch.setattr(compiled, "KEEP", 2)
    g = _two_conv_bn()
    sets = [RULES[:k] for k in range(1, 6)]
    assert len({compiled._key(r, reachable_rules(r, g)) for r in sets}) > 2
    for rules in sets:
        compiled.compile_rules(rules, g)
    assert len(list(cache.glob("*.pickle"))) == 2


def test_memory_bounded(cache, monkeypatch):
    monkeypatch.setattr(compiled, "KEEP_IN_MEMORY", 2)
    g = _two_conv_bn()
    for k in range(1, 6):
        compiled.compile_rules(RULES[:k], g)
    assert len(compiled._MEMO) <= 2
