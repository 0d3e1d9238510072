"""The zoo models at batch 1 and their exported programs, built once per test session:
exporting NASNet takes seconds, and test_codegen.py and test_models.py read the same programs
without changing them."""

from __future__ import annotations

import functools

import torch

from superopt.models import build

__all__ = ["KW", "built", "exported", "loaded_by_hand"]

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


def loaded_by_hand(name: str, module: torch.nn.Module, inputs):
    """``module`` exported and imported as it is (no float32 form, its eager module the reference),
    a :class:`~superopt.driver.LoadedModel` called with ``inputs``: what the tests of the kernel
    pass and the rules hand to ``optimize`` and ``choose_kernels`` directly."""
    from superopt.driver import LoadedModel
    from superopt.frontend import import_program
    from superopt.frontend.torch_import import export_module
    ep = export_module(module, tuple(inputs))
    g, _, sig = import_program(ep)
    return LoadedModel(name, g, module, tuple(inputs), signature=sig, program=ep)
