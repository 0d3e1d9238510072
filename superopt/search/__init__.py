"""The optimizer: rule matching, rewriting, weight folding and TASO's backtracking search.

A rewrite goes through the one pattern language (:mod:`superopt.pattern`: rules compiled for
matching, the graph matcher, the e-matcher and e-graph, the right side at the match's shapes),
then these modules: ``instance_proofs`` (the gate: each instance proven on first use),
``saturate`` (equality saturation), ``rewrite`` (plans and child
states), ``state`` (the search's graph form and its cheap hash), ``backtrack`` (the search),
``fold`` and ``cse`` (compile-time passes); ``optimize`` is the driver's (:mod:`superopt.driver`).

>>> from superopt.search import search, RuleSet
>>> callable(search)
True
"""

from .errors import ModelError, NumericMismatchError, RulesError, SearchError
from .fold import fold_constants
from ..pattern import Match, Pattern, RuleSet, match_all
from .report import SearchReport
from .rewrite import Rewriter, Step
from .backtrack import DEFAULT_ALPHA, DEFAULT_BUDGET, DEFAULT_TIME_LIMIT, SearchResult, search
from .state import State

__all__ = [
    "ModelError", "NumericMismatchError", "RulesError", "SearchError", "fold_constants", "Match", "match_all",
    "Pattern", "RuleSet", "SearchReport", "Rewriter", "Step", "DEFAULT_ALPHA", "DEFAULT_BUDGET",
    "DEFAULT_TIME_LIMIT", "SearchResult", "search", "State",
]
