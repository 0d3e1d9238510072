"""The search's e-graph is the one e-graph of :mod:`superopt.pattern.egraph`; this name stays
for the extraction modules that import it from here."""

from ..pattern.egraph import OPAQUE_MARK, EGraph, ENode, real_attrs, scc_ranks

__all__ = ["ENode", "EGraph", "OPAQUE_MARK", "real_attrs", "scc_ranks"]
