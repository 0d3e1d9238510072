"""The zoo models at batch 1 and their exported programs, built once per test session:
exporting NASNet takes seconds, and test_codegen.py and test_models.py read the same programs
without changing them."""

from __future__ import annotations

import functools

import torch

from superopt.models import build

__all__ = ["KW", "built", "exported"]

#: the build options the tests use: BERT at a short sequence keeps its export and forwards fast
KW = {"bert_base": {"seq_len": 16}}


@functools.cache
def built(name: str) -> tuple:
    """``(model, inputs)`` of zoo model ``name`` at batch 1, seed 0."""
    return build(name, batch_size=1, seed=0, **KW.get(name, {}))


@functools.cache
def exported(name: str) -> torch.export.ExportedProgram:
    """``torch.export.export`` of :func:`built` (the pre-dispatch program the importer reads)."""
    model, inputs = built(name)
    return torch.export.export(model, inputs)
