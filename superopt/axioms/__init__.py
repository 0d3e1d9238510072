"""Operator axioms (``specs/``): the terms, the parser, instances, and the numeric check."""

from .terms import ALit, ATuple, AVar, Axiom, Call, Var
from .parse import attr_var_uses, default_specs_dir, load_axioms, parse_axioms
from .instantiate import build_instance, sample_instances
from .check import AxiomCheck, check_axiom, check_axioms

__all__ = ["ALit", "ATuple", "AVar", "Axiom", "Call", "Var", "attr_var_uses", "default_specs_dir", "load_axioms",
           "parse_axioms", "build_instance", "sample_instances", "AxiomCheck", "check_axiom", "check_axioms"]
