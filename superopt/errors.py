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
