"""Tensor types: a shape and a dtype. Every value of a graph has one, inferred at construction."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TensorType", "DTYPES", "fmt_shape"]

#: dtypes a graph value may have; names follow torch's.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "bool")

_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "bool": "b1"}
_LONG = {v: k for k, v in _SHORT.items()}


def fmt_shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorType:
    """The static type of a value.

    >>> TensorType((2, 4))
    f32[2,4]
    """

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:  # kept: e-graphs hash types in every e-node lookup
        return self._hash

    def __reduce__(self):  # the kept hash is this process's (string hashes are salted per process)
        return TensorType, (self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"{_SHORT.get(self.dtype, self.dtype)}{fmt_shape(self.shape)}"

    @staticmethod
    def parse(text: str) -> "TensorType":
        """Read the printed form back: ``f32[2,4]`` or ``float32[2,4]``."""
        head, _, rest = text.strip().partition("[")
        dims = rest.rstrip("]").strip()
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        return TensorType(shape, _LONG.get(head, head))
