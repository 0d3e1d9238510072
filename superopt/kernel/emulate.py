"""The tile-level emulator: runs a kernel program tile by tile, exactly as the Triton lowering
does (same tile extents, same padding, same masks), over a pluggable arithmetic.

``semantics.py`` supplies two arithmetics: float64 numpy and the prime field GF(p). Padded
elements of a masked load hold ``other`` (0); an unmasked load (``mask=0``) reads *garbage*
outside the tensor (NaN in float64, fresh random elements in the field), so a program that
depends on what lies beyond an edge is caught. Outputs start unwritten (NaN / a sentinel), so
a grid or tile that misses part of an output is caught too. A config with ``split`` > 1 runs
the split schedule (:mod:`superopt.kernel.split`): per grid tile, the chunks' partial
accumulators, then their combine, then the post-block.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .errors import KernelError
from .program import KernelProgram, Stmt, TileConfig
from .split import check_split
from .triton_lower import block_sizes, dot_source, lane_accumulators

__all__ = ["emulate", "default_emulation_config"]

#: a dim's emulation block doubles (16 up to 128) while the dim spans more than this many blocks
EMULATION_TILES = 16


def default_emulation_config(p: KernelProgram, block: int = 16) -> TileConfig:
    """Blocks of ``block`` (edge tiles wherever a size is not a multiple of it), larger for big
    dims (up to 128, while a dim spans more than :data:`EMULATION_TILES` blocks) so that
    emulating a real-sized region stays at a few hundred tiles: a BERT-base b16 GEMM region
    (2048x768x3072) verified in 20 s with 128x128x64 tiles against 33 s with 64x128x32 (one BLAS
    thread; an earlier measurement that found larger tiles slower ran with OpenBLAS's threads
    fighting over the cores, see ``model_tuning.blas_threads``)."""
    blocks = []
    for d in p.tiled_dims():
        n = p.dim_sizes[d]
        b = block
        while b < 128 and n > EMULATION_TILES * b:
            b *= 2
        if d == p.loop and lane_accumulators(p):  # their loop block must divide the dim
            while b > 16 and n % b:
                b //= 2
        blocks.append((d, b))
    return TileConfig(tuple(blocks))


class _Tile:
    """Index vectors and validity of each dim for the current tile, for all the programs that
    differ only in their untiled grid dims at once: every tile value carries a leading axis,
    one entry per such program (``G``) or 1 where it does not depend on them. ``prog[d]`` is
    each program's index along untiled grid dim ``d`` (a ``[G]`` vector)."""

    def __init__(self, p: KernelProgram, blocks: dict[str, int], prog: dict[str, np.ndarray]):
        self.p, self.blocks, self.sizes = p, blocks, p.dim_sizes
        self.offs: dict[str, np.ndarray] = {}
        self.valid: dict[str, np.ndarray] = {}
        self.prog = prog

    def set(self, d: str, start: int):
        self.offs[d] = start + np.arange(self.blocks[d])
        self.valid[d] = self.offs[d] < self.sizes[d]

    def shaped(self, vec: np.ndarray, d: str, dims: tuple) -> np.ndarray:
        """``vec`` along ``d`` in a tile of ``dims``, with the leading program axis (1)."""
        shape = [1] * (len(dims) + 1)
        shape[1 + dims.index(d)] = len(vec)
        return vec.reshape(shape)

    def per_program(self, d: str, dims: tuple) -> np.ndarray:
        """Each program's index along untiled grid dim ``d``, shaped ``[G, 1, ...]``."""
        return self.prog[d].reshape([-1] + [1] * len(dims))

    def extent(self, dims: tuple) -> list[int]:
        return [1] + [self.blocks[d] for d in dims]

    def mask(self, dims: tuple) -> np.ndarray:
        m = np.ones(self.extent(dims), dtype=bool)
        for d in dims:
            m = m & self.shaped(self.valid[d], d, dims)
        return m


def _lead(v) -> int:
    """The size of a tile value's leading program axis (1 for a scalar)."""
    shape = np.shape(getattr(v, "x", v))
    return shape[0] if shape else 1


def _align(arith, v, vdims: tuple, dims: tuple, blocks):
    """``v`` (a tile of ``vdims``) shaped to broadcast in a tile of ``dims``."""
    if vdims == dims:
        return v
    return arith.reshape(v, [_lead(v)] + [blocks[d] if d in vdims else 1 for d in dims])


def _index(tile: _Tile, s: Stmt, dims: tuple, shape: tuple):
    """Flat element indices of a load/store tile (clipped in range) and its in-bounds mask,
    both with the leading program axis."""
    flat = np.zeros(tile.extent(dims), dtype=np.int64)
    inb = np.ones(flat.shape, dtype=bool)
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    for ax, n, st in zip(s.index, shape, strides):
        if ax.dim is None:
            ix = np.int64(ax.offset)
        elif ax.dim in tile.prog:
            ix = tile.per_program(ax.dim, dims) // ax.div + ax.offset
        else:
            ix = tile.shaped(tile.offs[ax.dim] + ax.offset, ax.dim, dims)
            inb = inb & tile.shaped(tile.valid[ax.dim], ax.dim, dims)
        flat = flat + np.clip(ix, 0, n - 1) * st
    return flat, np.broadcast_to(inb, flat.shape)


def _block(tile: _Tile, s: Stmt, dims: tuple, src: np.ndarray, shape: tuple, masked: bool):
    """A load as slices of ``src`` (viewed in ``shape``) where that reads what :func:`_index`'s
    gather would: every valid element of the tile inside the tensor, each tile dim indexing
    exactly one axis; an edge tile of a ``masked`` load is its valid slice padded with zeros
    (what the gather's masked lanes hold in both arithmetics). ``None`` where that does not hold
    (an unmasked load's edge tile, whose lanes past the edge read garbage; broadcast or
    repeated dims: the gather then). The gather built a ``[G, tile]`` index array per load, most
    of a decode attention region's verification (G = batch x heads programs at once), and all of
    it where a head dim that is not a power of two pads every key and value tile (Phi-3's 96)."""
    basic, progs, tile_axes, pads = [], [], [], []
    for ax, n in zip(s.index, shape):
        if ax.dim is None:
            if not 0 <= ax.offset < n:
                return None
            basic.append(int(ax.offset))
        elif ax.dim in tile.prog:
            ix = tile.prog[ax.dim] // ax.div + ax.offset
            if ix.size and (ix.min() < 0 or ix.max() >= n):
                return None
            basic.append(slice(None))
            progs.append(ix)
        else:
            start, b = int(tile.offs[ax.dim][0]) + ax.offset, tile.blocks[ax.dim]
            live = int(tile.valid[ax.dim].sum())   # the valid lanes: a prefix of the tile
            if ax.div != 1 or ax.dim in tile_axes or start < 0 or start + live > n or live < b and not masked:
                return None
            basic.append(slice(start, start + live))
            tile_axes.append(ax.dim)
            pads.append(b - live)
    if sorted(tile_axes) != sorted(dims):
        return None
    v = src.reshape(shape)[tuple(basic)]   # the program axes, then the tile axes, in tensor order
    kept = [k for k, b in enumerate(basic) if not isinstance(b, int)]
    prog_pos = [i for i, k in enumerate(kept) if s.index[k].dim in tile.prog]
    v = np.moveaxis(v, prog_pos, list(range(len(prog_pos))))
    v = v[tuple(progs)] if progs else np.array(v[None])   # a copy either way: never a view of an input
    if any(pads):
        v = np.pad(v, [(0, 0)] * (v.ndim - len(pads)) + [(0, k) for k in pads])
    return v.transpose([0] + [1 + tile_axes.index(d) for d in dims])


def _run(p, arith, tile: _Tile, stmts, env, inputs, outputs):
    for s in stmts:
        if s.op == "update":
            continue
        dims = p.tile_dims(s.out) if s.out else ()
        if s.op == "load":
            shape = p.tensor(s.tensor).shape
            masked = bool(s.attr("mask", 1))
            block = _block(tile, s, dims, inputs[s.tensor], shape, masked)
            if block is not None:
                env[s.out] = block
                continue
            flat, inb = _index(tile, s, dims, shape)
            keep = np.broadcast_to(tile.mask(dims), flat.shape) if masked else inb
            env[s.out] = arith.load(inputs[s.tensor], flat, keep, not masked)
        elif s.op == "store":
            vdims = p.tile_dims(s.args[0])
            flat, _ = _index(tile, s, vdims, p.tensor(s.tensor).shape)
            v = env[s.args[0]]
            shape = np.broadcast_shapes(flat.shape, (_lead(v),) + flat.shape[1:])
            arith.store(outputs[s.tensor], np.broadcast_to(flat, shape),
                        np.broadcast_to(tile.mask(vdims), shape), v)
        else:
            env[s.out] = _compute(p, arith, tile, s, dims, env)


def _unmasked_load(s: Stmt | None) -> bool:
    """A load with ``mask=0``: its padded lanes hold garbage, and a dot counts them."""
    return s is not None and s.op == "load" and not s.attr("mask", 1)


def _compute(p, arith, tile, s, dims, env):
    def arg(a, into):
        if not isinstance(a, str):
            return arith.const(a)
        return _align(arith, env[a], p.tile_dims(a), into, tile.blocks)

    if s.op in ("sum", "max"):
        src = p.tile_dims(s.args[0])
        ax = 1 + src.index(s.attr("dim"))
        valid = tile.shaped(tile.valid[s.attr("dim")], s.attr("dim"), src)
        x = env[s.args[0]]
        return arith.reduce(s.op, x, ax, np.broadcast_to(valid, [_lead(x)] + tile.extent(src)[1:]))
    if s.op == "dot":   # padded K lanes of a computed operand do not count (triton_lower.dot_source)
        valid = tile.valid[p.tile_dims(s.args[1])[0]]
        keep = [None if valid.all() or _unmasked_load(dot_source(p, a)) else valid for a in s.args]
        return arith.dot(env[s.args[0]], env[s.args[1]], *keep)
    if s.op == "trans":
        return arith.transpose(env[s.args[0]])
    if s.op == "causal":
        q, k = s.attr("q"), s.attr("k")
        keep = tile.shaped(tile.offs[k], k, dims) <= tile.shaped(tile.offs[q], q, dims)
        x = env[s.args[0]]
        return arith.causal(x, np.broadcast_to(keep, [_lead(x)] + tile.extent(dims)[1:]))
    args = [arg(a, dims) for a in s.args]
    return arith.apply(s.op, dict(s.attrs), *args)


def emulate(p: KernelProgram, inputs: dict, arith, config: TileConfig | None = None) -> list:
    """Run ``p`` on ``inputs`` (name -> array) with ``arith``; returns the outputs in order.
    The programs of the tiled grid dims run one after the other; those of the untiled grid
    dims (batch, heads) at once, as a leading axis of every tile value."""
    config = config or default_emulation_config(p)
    blocks = block_sizes(p, config)
    plan = check_split(p, config)
    missing = [t.name for t in p.inputs if t.name not in inputs]
    if missing:
        raise KernelError(f"kernel {p.name}: no value given for inputs {missing}")
    ins = {t.name: arith.flat_input(inputs[t.name], t.shape) for t in p.inputs}
    outs = {t.name: arith.new_output(math.prod(t.shape)) for t in p.outputs}
    sizes = p.dim_sizes
    untiled = [d for d, tiled in p.grid if not tiled]
    grids = np.meshgrid(*[np.arange(sizes[d]) for d in untiled], indexing="ij")
    prog = {d: g.reshape(-1) for d, g in zip(untiled, grids)}
    tiled = [d for d, t in p.grid if t]
    for gidx in itertools.product(*[range(-(-sizes[d] // blocks[d])) for d in tiled]):
        tile = _Tile(p, blocks, prog)
        for d, i in zip(tiled, gidx):
            tile.set(d, i * blocks[d])
        for d, _ in p.dims:
            if p.role(d) == "full":
                tile.set(d, 0)
        _program(p, arith, tile, ins, outs, plan, config.split)
    return [arith.finish(outs[t.name], t.shape, t.name) for t in p.outputs]


def _program(p, arith, tile, ins, outs, plan=None, split=1):
    env = {a.name: arith.full(tile.extent(a.dims), a.init) for a in p.accs}
    _run(p, arith, tile, p.pre, env, ins, outs)
    if p.loop:
        n = -(-p.dim_sizes[p.loop] // tile.blocks[p.loop])
        if plan is None:
            _loop(p, arith, tile, env, ins, outs, range(n))
        else:  # the split schedule: each chunk from fresh accumulators, then the combine
            per, parts = -(-n // split), []
            for c in range(split):
                local = dict(env)
                local.update({a.name: arith.full(tile.extent(a.dims), a.init) for a in p.accs})
                _loop(p, arith, tile, local, ins, outs, range(c * per, min((c + 1) * per, n)))
                parts.append({a.name: local[a.name] for a in p.accs})
            env.update(_combine(p, arith, tile, plan, parts))
    _run(p, arith, tile, p.post, env, ins, outs)


def _loop(p, arith, tile, env, ins, outs, tiles):
    for t in tiles:
        tile.set(p.loop, t * tile.blocks[p.loop])
        local = dict(env)
        _run(p, arith, tile, p.body, local, ins, outs)
        for s in p.body:
            if s.op == "update":
                acc_dims = p.tile_dims(s.out)
                v = _align(arith, local[s.args[0]], p.tile_dims(s.args[0]), acc_dims, tile.blocks)
                env[s.out] = arith.broadcast(v, [_lead(v)] + tile.extent(acc_dims)[1:])


def _combine(p, arith, tile, plan: dict, parts: list) -> dict:
    """The accumulators of the whole loop from the chunks' (see :mod:`superopt.kernel.split`)."""
    out = {}
    for name, kind in plan.items():
        if kind[0] in ("sum", "max"):
            op = "add" if kind[0] == "sum" else "maximum"
            out[name] = parts[0][name]
            for part in parts[1:]:
                out[name] = arith.apply(op, {}, out[name], part[name])
    for name, kind in plan.items():
        if kind[0] == "rescale":
            m, scale = kind[1], kind[2]
            total = None
            for part in parts:
                f = arith.apply("exp", {"scale": scale}, arith.apply("sub", {}, part[m], out[m]))
                f = _align(arith, f, p.tile_dims(m), p.tile_dims(name), tile.blocks)
                term = arith.apply("mul", {}, part[name], f)
                total = term if total is None else arith.apply("add", {}, total, term)
            out[name] = total
    return out
