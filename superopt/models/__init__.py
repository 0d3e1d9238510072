"""The built-in model zoo: standard vision and language networks in plain torch.nn with
random, seeded weights, for benchmarking the superoptimizer without downloads.

``build(name)`` returns an eval-mode module and example inputs; ``ZOO`` describes each model
and its published size; ``count_flops`` measures FLOPs as 2 x conv/matmul multiply-adds.
"""


from .._lazy import lazy_exports

#: public name -> submodule, imported on first use (see superopt._lazy)
__getattr__ = lazy_exports(__name__, {
    'count_flops': '.flops',
    'count_macs': '.flops',
    'ZOO': '.zoo',
    'ModelSpec': '.zoo',
    'build': '.zoo',
    'get_spec': '.zoo',
})

__all__ = ["ZOO", "ModelSpec", "build", "get_spec", "count_flops", "count_macs"]
