"""A zoo model built in a thread while ``superopt optimize`` imports the rest of the pipeline.

``superopt optimize --zoo NAME`` spends its first seconds importing (``torch._dynamo`` and the
exporter, the search: Python, one core) and then builds the model, whose weights are drawn by
torch kernels that release the interpreter. Started right after ``import torch``, the build's
draws run on a second core beside the imports (Llama-3-8B: 2.6 s of CPU drawing 218 M weights;
BERT-base and ViT-B/16 about 0.6 s, the CNNs 0.2-0.3 s). The build is the very call
:func:`superopt.driver.model.load_model` makes (same name, batch, seed: the same weights); every
module it needs is imported before the thread starts, so that the two threads never import the
same module at once. Only at batch 1: a larger batch is first checked against the memory free.
"""

from __future__ import annotations

import threading

from ..models import build
from ..models import zoo as _zoo  # noqa: F401 (the builders' modules, imported here, not in the thread)

__all__ = ["BuiltAhead"]


class BuiltAhead:
    """``build(zoo, batch_size, seed)`` in a daemon thread started now; :meth:`get` waits for
    it and returns its value or raises its error (an unknown name: the same ModelError)."""

    def __init__(self, zoo: str, batch_size: int = 1, seed: int = 0):
        self.key = (zoo, batch_size, seed)
        self._value: tuple | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="superopt-zoo-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = build(*self.key[:1], batch_size=self.key[1], seed=self.key[2])
        except BaseException as e:  # noqa: BLE001 (raised again by get, in the caller's thread)
            self._error = e

    def get(self) -> tuple:
        """``(module, inputs)`` as ``build`` returns them."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
