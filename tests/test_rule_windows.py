"""Windows (a convolution's stride, padding and groups; a pool's kernel, stride and padding) as
rule parameters: a rule whose form was found at two or more values of each window, and that
carries its windows through, matches a model's convolutions at any windows (each instance
proven where it is applied); any other rule keeps its windows literal, as on the database it
was found in. The real-only pool axioms are read as rules at two windows, so they are families."""

from __future__ import annotations

import numpy as np
import pytest

from superopt.cost import CostModel
from superopt.driver import relative_error
from superopt.generate.axiom_rules import axiom_rules
from superopt.ir import GraphBuilder, Rule
from superopt.pattern.compile import RuleSet, compile_pattern, rule_form
from superopt.search import State, fold_constants, match_all, search
from superopt.semantics import evaluate

H100 = CostModel("h100")


def _w(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.1


def _fuse(c: int, ci: int, stride, padding, groups: int, kernel=(3, 3)) -> Rule:
    """relu(conv(x, w)) => conv(x, w, activation=relu) at these windows."""
    sides = []
    for fused in (False, True):
        b = GraphBuilder()
        x, w = b.input("x", (1, c, 8, 8)), b.weight("w", (c, ci) + kernel)
        kw = dict(stride=stride, padding=padding, groups=groups)
        y = b.op("conv2d", x, w, activation="relu", **kw) if fused else b.op("relu", b.op("conv2d", x, w, **kw))
        sides.append(b.build([y]))
    return Rule(*sides)


def _enlarge(ci: int, kernel, stride, padding, groups: int) -> Rule:
    """conv(x, k) => conv(x, enlarge(k) to 3x3) with padding 1: it sets the right side's padding."""
    sides = []
    for big in (False, True):
        b = GraphBuilder()
        x, k = b.input("x", (1, 4, 8, 8)), b.weight("k", (4, ci) + kernel)
        if big:
            y = b.op("conv2d", x, b.op("enlarge", k, kernel=(3, 3)), stride=stride, padding=(1, 1), groups=groups)
        else:
            y = b.op("conv2d", x, k, stride=stride, padding=padding, groups=groups)
        sides.append(b.build([y]))
    return Rule(*sides)


def _model(c: int, groups: int, stride, padding, kernel=(3, 3)):
    b = GraphBuilder()
    x = b.input("x", (1, c, 16, 16))
    y = b.op("conv2d", x, b.weight("w", data=_w(c, c // groups, *kernel)), stride=stride, padding=padding, groups=groups)
    return b.build([b.op("relu", y)])


FAMILY = [_fuse(4, 4, (1, 1), (1, 1), 1), _fuse(4, 2, (2, 2), (0, 0), 2)]


def test_rules_that_differ_only_in_windows_are_one_form_and_one_pattern():
    assert rule_form(compile_pattern(FAMILY[0], 0)) == rule_form(compile_pattern(FAMILY[1], 0))
    rs = RuleSet(FAMILY)
    assert len(rs.patterns) == 1 and not any(pn.windows for pn in rs.patterns[0].pnodes)
    assert [why.endswith("up to sizes, names and windows") for _, why in rs.skipped] == [True]


@pytest.mark.parametrize("groups, stride, padding", [(32, (1, 1), (1, 1)), (1, (2, 2), (1, 1)), (4, (1, 1), (0, 0))])
def test_a_family_over_windows_matches_and_rewrites_at_a_models_windows(groups, stride, padding):
    g = _model(32, groups, stride, padding)
    assert len(match_all(State.from_graph(g, H100), RuleSet(FAMILY))) == 1
    res = search(g, FAMILY, H100, progress=False)
    (conv,) = [n for n in res.graph.nodes if n.op == "conv2d"]
    assert (conv.attr["activation"], conv.attr["groups"], conv.attr["stride"], conv.attr["padding"]) == \
        ("relu", groups, stride, padding)
    env = {"x": np.random.default_rng(1).standard_normal((1, 32, 16, 16))}
    assert relative_error(evaluate(fold_constants(res.graph), env), evaluate(g, env)) < 1e-5


def test_a_rule_found_at_one_window_keeps_it_literal():
    rs = RuleSet(FAMILY[:1])
    assert all(pn.windows for pn in rs.patterns[0].pnodes if pn.op == "conv2d")
    assert len(match_all(State.from_graph(_model(4, 1, (1, 1), (1, 1)), H100), rs)) == 1
    for groups, stride, padding in [(4, (1, 1), (1, 1)), (1, (2, 2), (1, 1)), (1, (1, 1), (0, 0))]:
        assert match_all(State.from_graph(_model(4, groups, stride, padding), H100), rs) == []


def _double_neg(c: int, ci: int, stride, padding, groups: int) -> Rule:
    """conv(x, w) => conv(x, relu(relu(w))) at these windows (a convolution at the top; the pattern only)."""
    sides = []
    for negated in (False, True):
        b = GraphBuilder()
        x, w = b.input("x", (1, c, 8, 8)), b.weight("w", (c, ci, 5, 5))
        k = b.op("relu", b.op("relu", w)) if negated else w
        sides.append(b.build([b.op("conv2d", x, k, stride=stride, padding=padding, groups=groups)]))
    return Rule(*sides)


def test_one_rule_compiled_literal_and_as_a_family_in_one_process_keeps_two_index_keys():
    """The matcher's process-wide memos key a pattern by its rule and its windows' form: one
    rule compiled with literal windows (alone), then as a family (another rule set), gets the
    family's index keys, not the literal form's (which would find only that window's e-nodes)."""
    from superopt.pattern import eindex, ematch
    rules = [_double_neg(4, 4, (1, 1), (1, 1), 1), _double_neg(4, 2, (2, 2), (0, 0), 2)]
    lit, fam = RuleSet(rules[:1]).patterns[0], RuleSet(rules).patterns[0]
    assert lit.rule_id == fam.rule_id and any(pn.windows for pn in lit.pnodes) and not any(pn.windows for pn in fam.pnodes)
    (top,) = ematch._plan(lit)[0]
    literal_keys = eindex.anchor_keys(lit, top)
    assert eindex.anchor_keys(fam, top) != literal_keys
    assert ematch._plan(fam) is not ematch._plan(lit)


def test_a_rule_that_sets_a_window_on_its_right_side_is_not_a_family():
    # found at two values of every window, but padding 1 on the right is what padding 0 of a 1x1
    # kernel (or (0, 1) of a 1x3) becomes, not a value carried through
    rules = [_enlarge(4, (1, 1), (1, 1), (0, 0), 1), _enlarge(2, (1, 3), (2, 2), (0, 1), 2)]
    rs = RuleSet(rules)
    assert len(rs.patterns) == 2 and all(pn.windows for p in rs.patterns for pn in p.pnodes)
    b = GraphBuilder()
    g = b.build([b.op("conv2d", b.input("x", (1, 4, 8, 8)), b.weight("k", data=_w(4, 4, 1, 1)), padding=(1, 1))])
    assert match_all(State.from_graph(g, H100), rs) == []


def _stem(kernel, stride, padding):
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    y = b.op("relu", b.op("add", x, b.weight("u", data=_w(8, 1, 1))))
    return b.build([b.op("maxpool2d", y, kernel=kernel, stride=stride, padding=padding)])


@pytest.mark.parametrize("kernel, stride, padding", [((3, 3), (2, 2), (1, 1)), ((3, 3), (2, 2), (0, 0)), ((2, 2), (2, 2), (0, 0))])
def test_relu_and_a_bias_move_after_max_pooling_at_any_window(kernel, stride, padding):
    rules = axiom_rules(["relu_maxpool", "maxpool_add_channel"])
    assert len(rules) == 4 and len(RuleSet(rules).patterns) == 2
    rules += [Rule(r.rhs, r.lhs) for r in rules]  # both directions, as the database is searched
    g = _stem(kernel, stride, padding)
    res = search(g, rules, H100, progress=False)
    assert [n.op for n in res.graph.nodes if n.name is None] == ["maxpool2d", "add", "relu"]
    assert res.report.cost_after < res.report.cost_before
    env = {"x": np.random.default_rng(2).standard_normal((1, 8, 16, 16))}
    assert relative_error(evaluate(fold_constants(res.graph), env), evaluate(g, env)) < 1e-6
