"""Code generation: IR graph -> torch.fx GraphModule, torch.export program / .pt2, ONNX."""


import importlib

#: public name -> submodule; imported on first use, so that `superopt --help` and the
#: stages that never touch torch do not pay for importing it
_LAZY = {
    'ONNX_OPSET': '.export',
    'example_inputs': '.export',
    'export_pt2': '.export',
    'to_exported_program': '.export',
    'to_onnx': '.export',
    'CodegenError': '.fx',
    'to_fx': '.fx',
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CodegenError", "to_fx", "example_inputs", "to_exported_program", "export_pt2", "to_onnx", "ONNX_OPSET"]
