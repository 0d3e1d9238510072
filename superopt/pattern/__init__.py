"""One pattern language (egg's ``Pattern``): a rule's side compiled once (``compile``), the
one place attributes bind (``attrs``), the graph matcher (``match``), the e-matcher
(``ematch``) over the one e-graph (``egraph``), the instantiator (``instantiate``) and a rule's
parametric form (``family``). It sits just above the IR so that the verifier, the generator
and both searches import it (pyproject.toml's layers)."""

from .attrs import ALit, ATuple, AVar, AttrPat, attrs_match, bind_attr, bind_params, facets, shift
from .compile import MAX_LIFT, PNode, Pattern, RuleSet, compile_pattern, reachable_rules, rule_form
from .egraph import OPAQUE_MARK, EGraph, ENode, real_attrs, scc_ranks
from .ematch import EMatch, height, index_by_op, is_merge, match_key, tops_of
from .ematch import match_pattern as ematch_pattern
from .instantiate import Instantiator, Template, instance_of, instance_rule
from .match import Match, match_all, match_at, match_near

__all__ = ["ALit", "ATuple", "AVar", "AttrPat", "attrs_match", "bind_attr", "bind_params", "facets", "shift",
           "MAX_LIFT", "PNode", "Pattern", "RuleSet", "compile_pattern", "reachable_rules", "rule_form",
           "OPAQUE_MARK", "EGraph", "ENode", "real_attrs", "scc_ranks", "EMatch", "height", "index_by_op",
           "is_merge", "match_key", "tops_of", "ematch_pattern", "Instantiator", "Template", "instance_of",
           "instance_rule", "Match", "match_all", "match_at", "match_near"]
