"""The autotuning space of a kernel program: tile sizes, warps and stages (``default_configs``).

Blocks are powers of two from 16 (``tl.dot``'s minimum on the GPU) up to 128, no larger than the
dim needs; a dim read by a load without mask (``mask=0``) only gets blocks that divide it. The
list is ordered from small to large tiles (the emulator's float64 check uses the last).
:func:`split_configs` adds split schedules (the loop cut across programs) for small grids.

>>> from superopt.kernel.program import parse_program, EXAMPLE
>>> cs = default_configs(parse_program(EXAMPLE))
>>> cs[0].text(), cs[-1].text()
('M=16 N=16 K=16 warps=4 stages=2', 'M=16 N=32 K=64 warps=4 stages=3')
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .errors import KernelError
from .program import KernelProgram, TileConfig
from .split import chunks, split_kind
from .triton_lower import grid_size, lane_accumulators

__all__ = ["default_configs", "block_choices", "split_configs", "row_dims", "row_configs", "SPLITS", "SMS",
           "ROW_ACC_ELEMS", "SMEM_BYTES"]

#: loop splits the tuner tries (split schedules, :mod:`superopt.kernel.split`)
SPLITS = (2, 4, 8, 16)
#: streaming multiprocessors of the GPU the shipped profiles target (an H100 SXM has 132)
SMS = 132


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
    out = [b for b in (16, 32, 64, 128, 256) if b <= top]
    if dim in _unmasked_dims(p) or dim == p.loop and lane_accumulators(p):
        out = [b for b in out if n % b == 0] or [out[0]]
    return out


def default_configs(program: KernelProgram, limit: int = 24) -> list[TileConfig]:
    """Configs to autotune over (at most ``limit``, spread over the product of the choices);
    a row-owning program's are :func:`row_configs`."""
    if row_dims(program):
        return row_configs(program, limit)
    dims = program.tiled_dims()
    choices = [block_choices(program, d, _largest(program, d)) for d in dims]
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


def _largest(program: KernelProgram, dim: str) -> int:
    """The largest block tried for ``dim``: 256 for the key loop of an attention over a long
    cache (an online softmax: an accumulator updated by ``maximum``), where one 256-key tile
    per program of a split schedule ran the Llama-3-8B decode attention in 11.6 us against 17.9
    for 64-key tiles (H100, ``scripts/check_split_gpu.py --wide``); 128 elsewhere."""
    if dim != program.loop or program.dim_sizes[dim] < 2048:
        return 128
    ups = {s.out: s.args[0] for s in program.body if s.op == "update"}   # update: out = the accumulator
    defs = {s.out: s for s in program.body if s.op != "update"}
    online = any(defs.get(v) is not None and defs[v].op == "maximum" and acc in defs[v].args
                 for acc, v in ups.items())
    return 256 if online else 128


def split_configs(program: KernelProgram, configs: list[TileConfig], sms: int = SMS,
                  limit: int = 24) -> list[TileConfig]:
    """Split variants of ``configs`` (at most ``limit``) for a program that admits a split: for
    each config whose grid is small for the GPU (fewer than 4 programs per SM), the splits of
    :data:`SPLITS` that leave every chunk at least one loop tile and at most 8 programs per SM;
    each config's split nearest to 2 programs per SM first (enough to hide memory latency), then
    the configs' next-nearest, and so on, so that every tile shape keeps its best split within
    ``limit`` (a decode attention's fastest schedule, 256-key tiles cut in 8, was crowded out by
    the splits of smaller tiles when the nearest to 2 per SM came first over all configs)."""
    try:
        split_kind(program)
    except KernelError:
        return []
    out = []
    for k, c in enumerate(configs):
        n = grid_size(program, c)
        if c.split != 1 or c.prepass or n >= 4 * sms:
            continue
        tiles, _ = chunks(program, c)
        mine = []
        for s in SPLITS:
            per = -(-tiles // s)
            if s <= tiles and -(-tiles // per) == s and n * s <= 8 * sms:
                mine.append((abs(math.log2(n * s / (2 * sms))), k, replace(c, split=s)))
        out += [(rank,) + t for rank, t in enumerate(sorted(mine, key=lambda t: t[0]))]
    return [t[-1] for t in sorted(out, key=lambda t: t[:3])][:limit]


# ---- row-owning programs (a LayerNorm over the output rows in the epilogue) -------------------

#: a row-owning program's float32 output tile (BLOCK_M x padded N) holds at most this many
#: elements: they live in registers (64K: 256 per thread at 8 warps)
ROW_ACC_ELEMS = 64 * 1024
#: shared memory a config's pipelined loop tiles may take (an H100 gives a block 227 KB): each
#: stage keeps one tile of every loop load (a [K, N] weight tile is BLOCK_K x padded N)
SMEM_BYTES = 227 * 1024
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def row_dims(p: KernelProgram) -> tuple[str, ...]:
    """The full dims a row-owning program reduces its matmul's rows over after the loop: dims
    of an accumulator, not tiled by the grid, summed in the post-block (a LayerNorm over N).
    Empty for every other program (attention's full head dim is never summed over)."""
    if p.loop is None:
        return ()
    acc_dims = {d for a in p.accs for d in a.dims if d != p.loop}
    summed = {s.attr("dim") for s in p.post if s.op == "sum"}
    return tuple(d for d, _ in p.dims if p.role(d) == "full" and d in acc_dims and d in summed)


def _smem_bytes(p: KernelProgram, blocks: dict, stages: int) -> int:
    """Shared memory of the loop's pipelined loads: ``stages`` copies of each body load's tile."""
    total = 0
    for s in p.body:
        if s.op == "load":
            dims = p.tile_dims(s.out)
            total += math.prod(blocks[d] for d in dims) * _ITEMSIZE.get(p.tensor(s.tensor).dtype, 4)
    return total * stages


def row_configs(p: KernelProgram, limit: int = 24) -> list[TileConfig]:
    """The autotuning space of a row-owning program: the row tile BLOCK_M in 16, 32, 64 (the
    float32 output tile BLOCK_M x padded N at most :data:`ROW_ACC_ELEMS`), the loop tile in
    32, 64, 128 (what the dim and its lane accumulators allow; 16 where none of those fits), 4 or
    8 warps, 2 to 4 stages whose loop tiles fit :data:`SMEM_BYTES`; the smallest config is kept
    whatever it needs.
    Ordered from small to large tiles; at most ``limit``, spread over the space. Split
    schedules (few programs over M) are added by :func:`split_configs`.

    >>> from superopt.kernel.program import parse_program, EXAMPLE
    >>> p = parse_program(EXAMPLE.replace("grid M N", "grid M").replace("r = relu acc", "r = sum acc dim=N")
    ...                   .replace("store y[M,N] r", "store y[M] r").replace("output y f32[5,24]", "output y f32[5]"))
    >>> [c.text() for c in row_configs(p)][:2]
    ['M=16 K=32 warps=4 stages=2', 'M=16 K=32 warps=4 stages=3']
    """
    from .triton_lower import full_block
    sizes = p.dim_sizes
    padded = math.prod(full_block(sizes[d]) for d in row_dims(p))
    rows = [b for b in (16, 32, 64) if b * padded <= ROW_ACC_ELEMS and b <= max(16, full_block(sizes["M"]))] or [16]
    choices = block_choices(p, p.loop)
    grid_dims = [d for d, tiled in p.grid if tiled]
    full = {d: full_block(sizes[d]) for d in sizes if p.role(d) == "full"}
    out = []
    for loop in ([b for b in choices if b >= 32], choices[:1]):    # BLOCK_K 16 only where nothing larger fits
        for bm, bk, warps, stages in itertools.product(rows, loop, (4, 8), (2, 3, 4)):
            if _smem_bytes(p, dict({d: bm for d in grid_dims}, **{p.loop: bk}, **full), stages) <= SMEM_BYTES:
                out.append(TileConfig(tuple((d, bm) for d in grid_dims) + ((p.loop, bk),), warps, stages))
        if out:
            break
    if not out:
        out = [TileConfig(tuple((d, rows[0]) for d in grid_dims) + ((p.loop, choices[0]),), 4, 2)]
    if len(out) > limit:
        step = (len(out) - 1) / (limit - 1)
        out = list(dict.fromkeys(out[round(i * step)] for i in range(limit)))
    return out
