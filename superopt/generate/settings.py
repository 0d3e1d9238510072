"""The settings of one generation run, checked once, hashed for checkpoints and the rule DB.

Everything that changes the rule set is here (and in :meth:`Settings.digest`); how the work is
spread (process count, Dask scheduler) is not, so a run may be resumed with other workers.

>>> s = Settings.make(max_ops=2, ops="matmul,add", inputs="x=2x4,w=4x4")
>>> s.ops, [i.name for i in s.inputs]
(('matmul', 'add'), ['x', 'w'])
>>> Settings.make(max_ops=0)
Traceback (most recent call last):
...
superopt.generate.errors.GenerateError: --max-ops must be at least 1, got 0
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from .errors import GenerateError
from .families import PRESET_INPUTS, PRESET_WEIGHT_OPS
from .opsets import InputSpec, default_inputs, parse_inputs, parse_ops

__all__ = ["Settings", "FORMAT_VERSION"]

#: bump when the enumeration or the checkpoint layout changes (old checkpoints are refused)
FORMAT_VERSION = 2


@dataclass(frozen=True)
class Settings:
    """What to enumerate and how to check it (see the module docstring).

    ``max_ops``: operators per graph (N); ``max_outputs``: outputs per graph (1 or 2 covers the
    merge rules); ``representatives``: extend only graphs whose every value is computed the
    smallest way (RepGen); ``fingerprint_seeds``: independent fingerprints per value (collision
    probability is the single-seed bound to that power); ``verify_timeout_s`` and ``specs``
    go to the verifier; ``weight_ops``: operators that take weights only in this run (a
    family's reshape of scale vectors).
    """

    max_ops: int = 3
    ops: tuple[str, ...] = ()
    inputs: tuple[InputSpec, ...] = ()
    seed: int = 0
    max_outputs: int = 2
    representatives: bool = True
    fingerprint_seeds: int = 1
    verify_timeout_s: float = 5.0
    specs: str | None = None
    weight_ops: tuple[str, ...] = ()

    @staticmethod
    def make(max_ops: int = 3, ops: str | tuple = "taso", inputs: str | tuple | None = None, **kw) -> "Settings":
        """Settings from user-level values (preset names, comma lists), validated."""
        op_names = parse_ops(ops) if isinstance(ops, str) else tuple(ops)
        preset = ops.strip() if isinstance(ops, str) else None
        if preset in PRESET_WEIGHT_OPS:
            kw.setdefault("weight_ops", PRESET_WEIGHT_OPS[preset])
        if inputs is None:
            specs = PRESET_INPUTS[preset] if preset in PRESET_INPUTS else default_inputs(op_names)
        elif isinstance(inputs, str):
            specs = parse_inputs(inputs)
        else:
            specs = tuple(inputs)
        s = Settings(max_ops=max_ops, ops=op_names, inputs=specs, **kw)
        s.validate()
        return s

    def validate(self) -> None:
        if not isinstance(self.max_ops, int) or self.max_ops < 1:
            raise GenerateError(f"--max-ops must be at least 1, got {self.max_ops}")
        if self.max_ops > 6:
            raise GenerateError(f"--max-ops {self.max_ops} is beyond reach (the space grows about 100x per "
                                f"operator); use 6 or fewer")
        if self.max_outputs < 1:
            raise GenerateError(f"--max-outputs must be at least 1, got {self.max_outputs}")
        if self.fingerprint_seeds < 1:
            raise GenerateError(f"fingerprint_seeds must be at least 1, got {self.fingerprint_seeds}")
        if not self.ops:
            raise GenerateError("no operators to enumerate; give --ops")
        if not self.inputs:
            raise GenerateError("no input tensors; give --inputs")

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["inputs"] = [[i.name, list(i.shape), i.weight] for i in self.inputs]
        doc["ops"] = list(self.ops)
        doc["weight_ops"] = list(self.weight_ops)
        doc["format_version"] = FORMAT_VERSION
        return doc

    @staticmethod
    def from_json(doc: dict) -> "Settings":
        doc = dict(doc)
        doc.pop("format_version", None)
        doc["inputs"] = tuple(InputSpec(n, tuple(s), bool(w)) for n, s, w in doc["inputs"])
        doc["ops"] = tuple(doc["ops"])
        doc["weight_ops"] = tuple(doc.get("weight_ops", ()))
        return Settings(**doc)

    def digest(self) -> str:
        """A hash of everything that changes the result (16 hex digits)."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
