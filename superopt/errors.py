"""Error types of superopt.

Every problem caused by input (a malformed spec, an ill-shaped graph, an unknown operator, a
corrupt file) raises a subclass of :class:`SuperoptError`. The CLI catches it once and prints
one line; anything else is a bug and keeps its traceback.
"""

__all__ = [
    "SuperoptError",
    "GraphError",
    "ShapeError",
    "UnknownOperatorError",
    "AttributeValueError",
    "SerializationError",
    "SpecError",
    "UnknownModelError",
    "RulesError",
    "ModelError",
    "NumericMismatchError",
    "ResourceLimitError",
]


class SuperoptError(Exception):
    """Base class of every error caused by input rather than by a bug."""


class GraphError(SuperoptError):
    """A graph is ill-formed: bad references, arity, or a cycle."""


class ShapeError(GraphError):
    """An operator was given inputs whose shapes or dtypes it cannot take."""


class UnknownOperatorError(SuperoptError):
    """An operator name is not in the registry."""


class AttributeValueError(GraphError):
    """An operator attribute is missing, unknown, or outside its domain."""


class SerializationError(SuperoptError):
    """A serialized graph (JSON or text) cannot be read."""


class SpecError(SuperoptError):
    """The axiom specification file is malformed (the message names file and line)."""


class UnknownModelError(SuperoptError):
    """A model name is not in the built-in zoo."""


class RulesError(SuperoptError):
    """A rule database is missing, unreadable, of another version, or holds no usable rule."""


class ModelError(SuperoptError):
    """A model cannot be loaded or has nothing the optimizer can work on."""


class NumericMismatchError(SuperoptError):
    """The optimized model's outputs differ from the original's; nothing was written."""


class ResourceLimitError(SuperoptError):
    """A job would not fit this machine (more workers than cores, a batch larger than memory,
    out of memory while running); the message says what fits."""
