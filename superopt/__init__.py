"""superopt: a tensor-algebra superoptimizer (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
__all__ = ["__version__"]

import sys as _sys

if "torch" in _sys.modules:  # register superopt::kernel, which saved .pt2 files call (torch_op's docstring)
    from .kernel import torch_op as _kernel_op  # noqa: F401,E402
