"""The built-in model zoo: standard vision and language networks in plain torch.nn with
random, seeded weights, for benchmarking the superoptimizer without downloads.

``build(name)`` returns an eval-mode module and example inputs; ``ZOO`` describes each model
and its published size; ``count_flops`` measures FLOPs as 2 x conv/matmul multiply-adds.
"""

from .flops import count_flops, count_macs
from .zoo import ZOO, ModelSpec, build, get_spec

__all__ = ["ZOO", "ModelSpec", "build", "get_spec", "count_flops", "count_macs"]
