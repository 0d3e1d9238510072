"""Importers: torch.export programs (.pt2 or in memory), modules and FX graphs, ONNX -> IR.

Every source is reduced to ATen calls, each folded (inputs all constant), mapped to IR
operators (:mod:`.aten`), or kept as an ``opaque`` node that records the call so it runs and
exports as it came. ``import_model`` returns the graph and an :class:`ImportReport`
(operator and opaque counts, weights, FLOPs, what was folded or dropped).

>>> import torch
>>> from superopt.frontend import import_model
>>> g, report = import_model(torch.nn.Conv2d(3, 8, 3).eval(), example_inputs=[torch.randn(1, 3, 8, 8)])
>>> report.operators, report.flops
({'conv2d': 1, 'add': 1}, 15552)
"""


from .._lazy import lazy_exports

#: public name -> submodule, imported on first use (see superopt._lazy)
__getattr__ = lazy_exports(__name__, {
    'FORMATS': '.api',
    'detect_format': '.api',
    'import_model': '.api',
    'ModelImportError': '.errors',
    'ImportReport': '.stats',
    'flops': '.stats',
    'num_parameters': '.stats',
    'op_counts': '.stats',
    'opaque_counts': '.stats',
    'from_exported_program': '.torch_import',
    'from_module': '.torch_import',
    'load_pt2': '.torch_import',
    'import_program': '.torch_import',
    'prepare_program': '.torch_import',
    'Signature': '.signature',
})

__all__ = ["import_model", "detect_format", "FORMATS", "ModelImportError", "ImportReport", "flops",
           "num_parameters", "op_counts", "opaque_counts", "from_exported_program", "from_module", "load_pt2",
           "import_program", "prepare_program", "Signature"]
