"""Code generation: IR graph -> torch.fx GraphModule, torch.export program / .pt2, ONNX."""

from .export import ONNX_OPSET, example_inputs, export_pt2, to_exported_program, to_onnx
from .fx import CodegenError, to_fx

__all__ = ["CodegenError", "to_fx", "example_inputs", "to_exported_program", "export_pt2", "to_onnx", "ONNX_OPSET"]
