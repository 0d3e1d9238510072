"""superopt: a tensor-algebra superoptimizer (see README.md and docs/).

``import superopt`` registers superopt's torch custom operators (``superopt::conv2d_relu``, and
``superopt::kernel`` where the kernel level is installed), which programs written by
``superopt optimize`` may call: at once when torch is already imported, else right after torch
is (so that ``superopt --help`` does not wait for torch).
"""

import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"
__all__ = ["__version__", "register_ops"]

#: modules whose import registers a custom operator (the optional ones may be absent)
_OPS = ("superopt.codegen.cudnn", "superopt.kernel.torch_op")


def register_ops() -> None:
    """Register superopt's torch custom operators (idempotent)."""
    for name in _OPS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if not (e.name and name.startswith(e.name)):
                raise
        except Exception as e:  # never break `import torch` for the user: say why and go on
            warnings.warn(f"superopt: cannot register the operators of {name}: {e}")


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Registers the operators right after torch finishes importing."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register_ops()
        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    register_ops()
elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTorch())
