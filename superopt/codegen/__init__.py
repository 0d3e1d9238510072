"""Code generation: IR graph -> torch.fx GraphModule, torch.export program / .pt2, ONNX."""


from .._lazy import lazy_exports

#: public name -> submodule, imported on first use (see superopt._lazy)
__getattr__ = lazy_exports(__name__, {
    'ONNX_OPSET': '.export',
    'example_inputs': '.export',
    'export_pt2': '.export',
    'to_exported_program': '.export',
    'to_onnx': '.export',
    'to_module': '.export',
    'save_program': '.export',
    'write_program': '.export',
    'CodegenError': '.fx',
    'to_fx': '.fx',
})

__all__ = ["CodegenError", "to_fx", "example_inputs", "to_exported_program", "export_pt2", "to_onnx", "ONNX_OPSET", "to_module", "save_program",
           "write_program"]
