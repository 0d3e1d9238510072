"""The substitution generator: enumerate small graphs, group them by exact fingerprint, prune,
verify and store the rules (see DESIGN.md, "Generator", and ``superopt generate --help``).

Public API: :class:`Settings` (what to enumerate), :func:`generate` (run it; returns a
:class:`GenerateReport` with the rules), the operator and input presets (``OP_PRESETS``,
``INPUT_SETS``), the families the shipped database is made of (``FAMILIES``: small operator
sets over inputs that speak CNNs and transformers, each enumerated on its own) and the errors.
The stages (``levels``, ``candidates``, ``prune``) are modules of their own for tests and scripts.
"""

from .errors import CheckpointMismatchError, GenerateError, MissingDependencyError
from .families import FAMILIES, Family
from .opsets import INPUT_SETS, OP_PRESETS, InputSpec, supported_ops
from .pipeline import generate
from .report import GenerateReport
from .settings import Settings

__all__ = ["Settings", "generate", "GenerateReport", "InputSpec", "OP_PRESETS", "INPUT_SETS", "FAMILIES", "Family",
           "supported_ops", "GenerateError", "CheckpointMismatchError", "MissingDependencyError"]
