"""The built-in model zoo: standard vision and language networks in plain torch.nn with
random, seeded weights, for benchmarking the superoptimizer without downloads.

``build(name)`` returns an eval-mode module and example inputs; ``ZOO`` describes each model
and its published size; ``count_flops`` measures FLOPs as 2 x conv/matmul multiply-adds.
"""


import importlib

#: public name -> submodule; imported on first use, so that `superopt --help` and the
#: stages that never touch torch do not pay for importing it
_LAZY = {
    'count_flops': '.flops',
    'count_macs': '.flops',
    'ZOO': '.zoo',
    'ModelSpec': '.zoo',
    'build': '.zoo',
    'get_spec': '.zoo',
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ZOO", "ModelSpec", "build", "get_spec", "count_flops", "count_macs"]
