"""The three semantics of every operator: fingerprint (field), reference (float64), torch.

The torch lowering lives in :mod:`superopt.semantics.torch_lowering` and is imported on demand,
so that jobs which never touch torch (generation, verification) do not pay for importing it.

>>> from superopt.semantics import REFERENCE, Field
>>> "matmul" in REFERENCE and "matmul" in Field().table
True
"""

from .interpret import SemanticsError, interpret
from .reference import REFERENCE, evaluate, random_inputs
from .field import P, Field, to_field

__all__ = ["SemanticsError", "interpret", "REFERENCE", "evaluate", "random_inputs", "P", "Field", "to_field"]
