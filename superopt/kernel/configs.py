"""The autotuning space of a kernel program: tile sizes, warps and stages (``default_configs``).

Blocks are powers of two from 16 (``tl.dot``'s minimum on the GPU) up to 128, no larger than the
dim needs; a dim read by a load without mask (``mask=0``) only gets blocks that divide it. The
list is ordered from small to large tiles (the emulator's float64 check uses the last).

>>> from superopt.kernel.program import parse_program, EXAMPLE
>>> cs = default_configs(parse_program(EXAMPLE))
>>> cs[0].text(), cs[-1].text()
('M=16 N=16 K=16 warps=4 stages=2', 'M=16 N=32 K=64 warps=4 stages=3')
"""

from __future__ import annotations

import itertools

from .program import KernelProgram, TileConfig

__all__ = ["default_configs", "block_choices"]


def _unmasked_dims(p: KernelProgram) -> set[str]:
    out = set()
    for _, s in p.statements():
        if s.op == "load" and not s.attr("mask", 1):
            out.update(a.dim for a in s.index if a.dim is not None)
    return out


def block_choices(p: KernelProgram, dim: str, largest: int = 128) -> list[int]:
    """Power-of-two blocks for ``dim``: 16 .. min(largest, the dim's size rounded up)."""
    n = p.dim_sizes[dim]
    top = max(16, min(largest, 1 << max(0, (n - 1).bit_length())))
    out = [b for b in (16, 32, 64, 128) if b <= top]
    if dim in _unmasked_dims(p):
        out = [b for b in out if n % b == 0] or [out[0]]
    return out


def default_configs(program: KernelProgram, limit: int = 24) -> list[TileConfig]:
    """Configs to autotune over (at most ``limit``, spread over the product of the choices)."""
    dims = program.tiled_dims()
    choices = [block_choices(program, d) for d in dims]
    combos = list(itertools.product(*choices)) or [()]
    if len(combos) > limit // 2:
        step = len(combos) / (limit // 2 - 1)
        combos = [combos[int(i * step)] for i in range(limit // 2 - 1)] + [combos[-1]]
        combos = list(dict.fromkeys(combos))
    out = []
    for combo in combos:
        size = 1
        for b in combo:
            size *= b
        variants = ((4, 2), (4, 3)) if size <= 16 * 64 * 64 else ((4, 3), (8, 3))
        out += [TileConfig(tuple(zip(dims, combo)), w, st) for w, st in variants]
    return out
