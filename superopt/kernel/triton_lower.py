"""The Triton renderer: a kernel program and a tile config -> Triton source (it only prints).

Shapes are concrete, so sizes, strides, tile counts and block sizes are literals in the source.
One program id runs one grid tile (grid dims decomposed row-major, the last fastest); the loop
walks its dim tile by tile. Every load and store is masked on every dim whose size the block
does not divide (``mask=0`` on a load drops it, which the emulator models as garbage);
reductions never count padded elements (nor does a ``dot`` those of a computed operand:
:func:`dot_source`); elementwise operators compute in float32, ``dot``
accumulates in float32 (IEEE for float32 operands), and stores cast to the output's dtype.
Accumulator updates take effect at the end of the iteration, as in the emulator.

Two choices change the code, not what it computes. A tile loaded in the loop that feeds both a
``dot`` and other statements is loaded twice, once for each: the tensor cores want it in their
operand layout, elementwise work in another, and converting between them every iteration cost
more than the second load, which hits the L1 (RMSNorm -> 4096x4096 on an H100: 26.1 us with one
load, 16.0 with two, 14.2 without the norm). A config with ``prepass`` walks the loop twice
(:func:`prepass_split`): first the accumulators that need no ``dot``, then the rest (14.7 us).

>>> from superopt.kernel.program import parse_program, EXAMPLE, TileConfig
>>> src = to_triton(parse_program(EXAMPLE), TileConfig((("M", 16), ("N", 16), ("K", 16))))
>>> "tl.dot" in src and "@triton.jit" in src
True
"""

from __future__ import annotations

import math

import numpy as np

from .errors import KernelError
from .program import KernelProgram, Stmt, TileConfig
from .split import check_split, chunks, needed_pre
from .textform import stmt_text

__all__ = ["swapped_accs", "lane_accumulators", "prepass_split", "to_triton", "block_sizes", "dot_source", "grid_size", "full_block",
           "workspace_elems", "launch_grid", "tma_loads", "blocked_loads", "blocked_arrays", "KERNEL_NAME"]

KERNEL_NAME = "superopt_kernel"
_TL = {"float32": "tl.float32", "bfloat16": "tl.bfloat16", "float16": "tl.float16"}
_SHORT = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
_LOG2E = 1.4426950408889634


def full_block(size: int) -> int:
    """The padded tile extent of a full dim: a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << max(0, math.ceil(math.log2(size))))


def lane_accumulators(p: KernelProgram) -> list[str]:
    """Accumulators over the loop dim: element-wise partial sums of each lane of the loop tile,
    summed over the lanes after the loop (a row reduction deferred out of the loop, so an
    iteration does no cross-lane reduction). Their loop blocks must divide the loop dim: the
    lanes past an edge are not tracked, and a tile that covers the dim exactly has none."""
    return [a.name for a in p.accs if p.loop in a.dims]


def _slice(body, roots) -> list:
    """The statements of ``body`` that ``roots`` (statements of it) need, roots included, in order."""
    made = {s.out: s for s in body if s.op not in ("update", "store")}
    need, todo = set(), list(roots)
    while todo:
        s = todo.pop()
        if id(s) in need:
            continue
        need.add(id(s))
        todo += [made[a] for a in s.args if isinstance(a, str) and a in made]
    return [s for s in body if id(s) in need]


def prepass_split(p: KernelProgram) -> tuple[list, list] | None:
    """The loop body cut in two loops run one after the other: (first, second). The first
    updates the accumulators whose values need no ``dot`` and no other accumulator (a norm's sum
    of squares); the second everything else, and reads none of the first's accumulators (their
    per-iteration values are gone by then). Each loop carries the loads it needs. None when no
    accumulator can move, or none would be left (then there is nothing to separate)."""
    if not p.loop:
        return None
    body, accs = p.body, {a.name for a in p.accs}
    roots = [s for s in body if s.op in ("update", "store")]

    def reads(stmts) -> set:
        return {a for s in stmts for a in s.args if isinstance(a, str) and a in accs}
    first = {u.out for u in roots if u.op == "update"}
    first = {a for a in first if not any(s.op == "dot" for s in _slice(body, [_update(body, a)]))
             and reads(_slice(body, [_update(body, a)])) <= {a}}
    while True:
        rest = [r for r in roots if r.op == "store" or r.out not in first]
        moved = first - reads(_slice(body, rest))
        if moved == first:
            break
        first = moved
    if not first or not rest:
        return None
    return _slice(body, [_update(body, a) for a in sorted(first)]), _slice(body, rest)


def _update(body, acc: str):
    return next(s for s in body if s.op == "update" and s.out == acc)


def swapped_accs(p: KernelProgram, config: TileConfig) -> dict[str, str]:
    """Accumulators a ``swap`` config keeps transposed, each with the ``dot`` it sums: a 2-d
    accumulator whose one update in the loop is ``acc + dot x y``, the dot and the sum used
    nowhere else. The dot is taken as ``dot(yᵀ, xᵀ)`` into ``accᵀ`` and the accumulator is
    transposed back after the loop: (yᵀxᵀ)ᵀ = xy, the same products summed over the same
    tiles, so only the order of the float32 sums inside a tile's product may differ, as
    between two tile shapes. Why: with a few rows (a decode step's 1-16 tokens, padded to 16),
    ``dot x y`` has the 16-row input tile as the tensor cores' left operand, and the weight tile
    goes through registers; swapped, the weight tile is the left operand with the column tile
    (64-128) as its rows, which Hopper's wgmma reads from shared memory. On an H100 a
    hand-written RMSNorm -> 4096x6144 kernel, the weight tile-blocked, ran 19.15-19.38 us at
    1-16 rows swapped against 19.25-19.62 (session 41). Empty unless ``config.swap``."""
    if not config.swap or not p.loop:
        return {}
    users: dict[str, list] = {}
    for _, st in p.statements():
        for a in st.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(st)
    defs = {st.out: st for st in p.body if st.out and st.op not in ("update", "store")}
    out = {}
    for a in p.accs:
        upd = next((st for st in p.body if st.op == "update" and st.out == a.name), None)
        add = defs.get(upd.args[0]) if upd is not None else None
        in_loop = [u for u in users.get(a.name, []) if any(u is b for b in p.body)]
        if add is None or add.op != "add" or len(a.dims) != 2 or users.get(add.out) != [upd] or \
                len(in_loop) != 1 or in_loop[0] is not add:
            continue
        others = [x for x in add.args if x != a.name]
        dot = defs.get(others[0]) if len(others) == 1 and a.name in add.args else None
        if dot is not None and dot.op == "dot" and users.get(dot.out) == [add] and \
                p.tile_dims(dot.out) == a.dims:
            out[a.name] = dot.out
    return out


def _dual_loads(stmts) -> tuple[set[str], set[str]]:
    """Loads in ``stmts`` whose tile feeds a ``dot`` (directly or through ``cast``/``trans``)
    and also other statements: rendered as two loads (module docstring); and the values that
    only feed dots (those casts and transposes)."""
    users: dict[str, list] = {}
    for s in stmts:
        for a in s.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(s)
    feeds_dot = set()
    for s in reversed(stmts):
        us = users.get(s.out, []) if s.out else []
        if s.op in ("cast", "trans") and us and all(u.op == "dot" or u.out in feeds_dot for u in us):
            feeds_dot.add(s.out)
    out = set()
    for s in stmts:
        if s.op == "load":
            kinds = {u.op == "dot" or u.out in feeds_dot for u in users.get(s.out, [])}
            if kinds == {True, False}:
                out.add(s.out)
    return out, feeds_dot


def _streamed_loads(p: KernelProgram) -> set[str]:
    """Loop loads used only as a ``dot``'s right operand (directly or through ``trans``/``cast``):
    a weight tile each program reads once, which a ``gemv`` config loads with ``evict_first``."""
    users: dict[str, list] = {}
    for s in p.body:
        for a in s.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(s)

    def rhs_only(name: str) -> bool:
        us = users.get(name, [])
        return bool(us) and all(u.op == "dot" and u.args[1] == name and u.args[0] != name
                                or u.op in ("trans", "cast") and rhs_only(u.out) for u in us)
    return {s.out for s in p.body if s.op == "load" and rhs_only(s.out)}


def dot_source(p: KernelProgram, name: str) -> Stmt | None:
    """The statement a ``dot`` operand comes from, through ``cast`` and ``trans`` (None for an
    accumulator). Its padded contraction lanes count in the dot only where it is a load (0 if
    masked, garbage if not); a computed value's are zeroed (the lowering and the emulator alike)."""
    defs = {s.out: s for _, s in p.statements() if s.out and s.op not in ("update", "store")}
    s = defs.get(name)
    while s is not None and s.op in ("cast", "trans"):
        s = defs.get(s.args[0])
    return s


def block_sizes(p: KernelProgram, config: TileConfig) -> dict[str, int]:
    """The tile extent of every dim that is a tile axis (program dims have none)."""
    if p.loop and lane_accumulators(p) and p.dim_sizes[p.loop] % config.block(p.loop):
        raise KernelError(f"kernel {p.name}: loop block {config.block(p.loop)} does not divide {p.loop}="
                          f"{p.dim_sizes[p.loop]}, which the lane accumulators {lane_accumulators(p)} need")
    out = {}
    for d, n in p.dims:
        role = p.role(d)
        if role in ("grid", "loop"):
            b = config.block(d)
            if b < 1 or b & (b - 1):
                raise KernelError(f"block size {b} for dim {d!r} must be a power of two")
            out[d] = b
        elif role == "full":
            out[d] = full_block(n)
    return out


_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def tma_loads(p: KernelProgram, config: TileConfig) -> dict[str, tuple[int, int]]:
    """Tensors a ``tma`` config loads through a tensor descriptor, and each one's block (box)
    shape: 2-d tensors whose every loop load reads a whole tile at the tile's start (each axis a
    grid-tiled or loop dim of the tensor's full extent, no offset, in the tile's dim order), one
    box shape for all of them, boxes of at most 256 per axis and rows of 16 bytes or more, a
    row stride a multiple of 16 bytes (the hardware's alignment). A box past the tensor's edge
    reads zeros, which is what the masked load (``other=0``) reads; an unmasked load reads
    anything there. Empty unless ``config.tma``; the other loads stay pointer loads, and so do
    the tiles a ``blocked`` config reads blocked (:func:`blocked_loads`). In the program's input
    order, the order the kernel takes them in (after its pointers)."""
    if not config.tma or not p.loop:
        return {}
    blocks, blocked = block_sizes(p, config), blocked_loads(p, config)
    found: dict[str, tuple[int, int] | None] = {}
    for s in p.body:
        if s.op != "load":
            continue
        t, box = p.tensor(s.tensor), None
        dims = tuple(ax.dim for ax in s.index)
        size = _ITEMSIZE.get(t.dtype, 4)
        if len(t.shape) == 2 and len(s.index) == 2 and dims == p.tile_dims(s.out) and \
                all(ax.dim is not None and ax.offset == 0 and ax.div == 1 and p.role(ax.dim) in ("grid", "loop")
                    and p.dim_sizes[ax.dim] == n for ax, n in zip(s.index, t.shape)):
            box = (blocks[dims[0]], blocks[dims[1]])
            if max(box) > 256 or box[1] * size < 16 or t.shape[1] * size % 16:
                box = None
        if s.tensor in found and found[s.tensor] != box or s.tensor in blocked:   # blocked: pointer loads
            box = None
        found[s.tensor] = box
    return {t.name: found[t.name] for t in p.inputs if found.get(t.name) is not None}   # in input order


#: the suffix of a compile-time weight layout (:func:`superopt.kernel.tune.transposed`): arrays made
#: when the kernel is chosen, so that they can be stored in any order the kernel reads
COMPILE_TIME = "__t"


def blocked_loads(p: KernelProgram, config: TileConfig) -> dict[str, tuple[int, int, int]]:
    """Compile-time weights (``X__t``) a ``blocked`` config reads from a tile-blocked copy, each
    with its tile shape and which of its axes is the loop's: 2-d tensors loaded only in the loop,
    every load a whole tile at the tile's start (a tiled grid dim and the loop dim, each of the
    tensor's full extent, no offset, in the tile's dim order), both blocks dividing their
    extents (no tile past an edge, so no mask). Each tile is then one contiguous run of memory
    and each program's tiles follow one another: on an H100 a 2-16 row GEMV of a 4096x6144
    bf16 weight streamed it in 19.2-19.4 us this way against 19.8-20.2 us row-major (session
    40). Empty unless ``config.blocked``."""
    if not config.blocked or not p.loop:
        return {}
    blocks = block_sizes(p, config)
    found: dict[str, tuple[int, int, int] | None] = {}
    for block, s in p.statements():
        if s.op != "load":
            continue
        t, got = p.tensor(s.tensor), None
        dims = tuple(ax.dim for ax in s.index)
        if block == "body" and t.name.endswith(COMPILE_TIME) and len(t.shape) == 2 and len(s.index) == 2 and \
                dims == p.tile_dims(s.out) and sorted(p.role(d) for d in dims if d) == ["grid", "loop"] and \
                all(ax.offset == 0 and ax.div == 1 and p.dim_sizes[ax.dim] == n and n % blocks[ax.dim] == 0
                    for ax, n in zip(s.index, t.shape)):
            got = (blocks[dims[0]], blocks[dims[1]], dims.index(p.loop))
        if s.tensor in found and found[s.tensor] != got:
            got = None
        found[s.tensor] = got
    return {t.name: found[t.name] for t in p.inputs if found.get(t.name) is not None}


def blocked_arrays(p: KernelProgram, config: TileConfig, arrays: dict) -> dict:
    """``arrays`` (name -> numpy array: the program's inputs as the region computes them) with
    each one a ``blocked`` config reads blocked (:func:`blocked_loads`) reordered so: tile by
    tile, each tile row-major, a grid tile's loop tiles one after another in loop order; in the
    same shape, so that it goes wherever the array went. A weight the config reads blocked that
    is not among ``arrays`` is refused (:class:`KernelError`): passed as it is at run time, it
    would be read in the wrong order.

    >>> from superopt.kernel.program import parse_program, EXAMPLE
    >>> blocked_arrays(parse_program(EXAMPLE), TileConfig((("M", 16), ("N", 16), ("K", 16)), blocked=True), {})
    {}
    """
    loads = blocked_loads(p, config)
    missing = sorted(set(loads) - set(arrays))
    if missing:
        raise KernelError(f"kernel {p.name}: the config reads {', '.join(missing)} blocked, which is not a "
                          f"compile-time weight of the region")
    out = dict(arrays)
    for name, (b0, b1, loop_axis) in loads.items():
        a = np.asarray(out[name])
        s0, s1 = a.shape
        order = (2, 0, 1, 3) if loop_axis == 0 else (0, 2, 1, 3)   # grid tiles outside, loop tiles inside
        out[name] = np.ascontiguousarray(a.reshape(s0 // b0, b0, s1 // b1, b1).transpose(order)).reshape(s0, s1)
    return out


def grid_size(p: KernelProgram, config: TileConfig) -> int:
    """The number of programs the kernel is launched with."""
    sizes, n = p.dim_sizes, 1
    for d, tiled in p.grid:
        n *= -(-sizes[d] // config.block(d)) if tiled else sizes[d]
    return n


class _Render:
    def __init__(self, p: KernelProgram, config: TileConfig, interpret: bool = False, pdl: bool = False,
                 strides: dict | None = None):
        self.p, self.cfg, self.interpret, self.pdl = p, config, interpret, pdl
        self.strides = dict(strides or {})   # input name -> element strides (a view's), else row-major
        self.sizes, self.blocks = p.dim_sizes, block_sizes(p, config)
        self.dtypes: dict[str, str] = {a.name: "float32" for a in p.accs}
        self.lines: list[str] = []
        self.dual: set[str] = set()     # loads of the current loop rendered twice (_dual_loads)
        self.dot_inputs: set[str] = set()
        self.on_dot_path = False        # rendering a statement that feeds a dot (uses the first load)
        self.defs = {s.out: s for _, s in p.statements() if s.out and s.op not in ("update", "store")}
        self.streamed: set[str] = _streamed_loads(p) if config.gemv else set()
        self.tma = tma_loads(p, config)
        self.blocked = blocked_loads(p, config)
        self.swapped = swapped_accs(p, config)
        self.swapped_dots = set(self.swapped.values())

    # ---- helpers ---------------------------------------------------------------------------
    def emit(self, line: str, depth: int = 1):
        self.lines.append("    " * depth + line)

    def needs_mask(self, d: str) -> bool:
        return self.sizes[d] % self.blocks[d] != 0

    @staticmethod
    def expand(expr: str, dims: tuple, into: tuple) -> str:
        if dims == into or not dims or len(into) < 2:
            return expr
        return f"{expr}[{', '.join(':' if d in dims else 'None' for d in into)}]"

    def mask(self, dims: tuple) -> str | None:
        parts = [self.expand(f"mask_{d}", (d,), dims) for d in dims if self.needs_mask(d)]
        return " & ".join(parts) if parts else None

    def operand(self, a, dims: tuple, f32: bool = True) -> str:
        if not isinstance(a, str):
            return _lit(a)
        expr = f"v_{a}" + ("__e" if a in self.dual and not self.on_dot_path else "")
        if f32 and self.dtypes.get(a, "float32") != "float32":
            expr = f"{expr}.to(tl.float32)"
        return self.expand(expr, self.p.tile_dims(a), dims)

    # ---- structure -------------------------------------------------------------------------
    def render(self) -> str:
        p = self.p
        args = [f"p_{t.name}" for t in p.inputs + p.outputs] + [f"d_{t.name}" for t in p.inputs if t.name in self.tma]
        self.lines = self.head(KERNEL_NAME, args)
        self.grid_prologue()
        self.dependent_launch()
        self.acc_init()
        self.block(p.pre, 1)
        if p.loop:
            d, bk = p.loop, self.blocks[p.loop]
            parts = prepass_split(p) if self.cfg.prepass else None
            if self.cfg.prepass and parts is None:
                raise KernelError(f"kernel {p.name}: no accumulator can run in a prepass loop; use a config "
                                  f"without prepass")
            for stmts in parts or [list(p.body)]:
                self.loop(f"range(0, {-(-self.sizes[d] // bk)})", stmts)
            self.unswap(1)
        self.block(p.post, 1)
        return "\n".join(self.lines) + "\n"

    def head(self, name: str, args: list) -> list:
        return ["import triton", "import triton.language as tl", "", "",
                f"# kernel {self.p.name}; config: {self.cfg.text()}", "@triton.jit",
                f"def {name}({', '.join(args)}):", "    pid = tl.program_id(0)"]

    def acc_init(self):
        for a in self.p.accs:
            dims = a.dims[::-1] if a.name in self.swapped else a.dims
            shape = ", ".join(str(self.blocks[d]) for d in dims)
            self.emit(f"v_{a.name} = tl.full(({shape}{',' if len(a.dims) == 1 else ''}), "
                      f"{_lit(a.init)}, tl.float32)")

    def loop(self, tiles: str, stmts=None):
        d, bk = self.p.loop, self.blocks[self.p.loop]
        stmts = list(self.p.body) if stmts is None else stmts
        self.emit(f"for t_{d} in {tiles}:")
        self.dim_offsets(d, f"t_{d} * {bk}", 2)
        self.dual, self.dot_inputs = _dual_loads(stmts)
        # a descriptor's box lands in shared memory and is read from there in each use's layout
        self.dual = {v for v in self.dual if self.defs[v].tensor not in self.tma}
        self.block(stmts, 2)
        self.dual, self.dot_inputs = set(), set()
        for s in stmts:
            if s.op == "update":
                self.emit(f"v_{s.out} = {self.operand(s.args[0], self.p.tile_dims(s.out))}", 2)

    def unswap(self, depth: int):
        """The accumulators a ``swap`` config kept transposed, back in their own dim order."""
        for a in self.swapped:
            self.emit(f"v_{a} = tl.trans(v_{a})  # kept transposed in the loop (swap)", depth)

    def dim_offsets(self, d: str, start: str, depth: int):
        self.emit(f"offs_{d} = {start} + tl.arange(0, {self.blocks[d]})", depth)
        if self.needs_mask(d):
            self.emit(f"mask_{d} = offs_{d} < {self.sizes[d]}", depth)

    def grid_prologue(self):
        for d, tiled in reversed(self.p.grid):
            n = -(-self.sizes[d] // self.blocks[d]) if tiled else self.sizes[d]
            self.emit(f"i_{d} = pid % {n}")
            self.emit(f"pid = pid // {n}")
        for d, tiled in self.p.grid:
            if tiled:
                self.dim_offsets(d, f"i_{d} * {self.blocks[d]}", 1)
        for d, _ in self.p.dims:
            if self.p.role(d) == "full":
                self.dim_offsets(d, "0", 1)

    def dependent_launch(self):
        """Under programmatic dependent launch (``pdl``): let the next kernel launch now, then
        wait for the previous one (``griddepcontrol.wait``: its grid complete, its writes
        visible) before any load or store."""
        if self.pdl:
            self.emit("tl.extra.cuda.gdc_launch_dependents()")
            self.emit("tl.extra.cuda.gdc_wait()")

    def block(self, stmts, depth: int):
        for s in stmts:
            if s.op == "update":
                continue
            self.emit(f"# {stmt_text(s)}", depth)
            code = self.stmt(s)
            self.emit(code, depth)

    # ---- statements ------------------------------------------------------------------------
    def address(self, s: Stmt, dims: tuple) -> str:
        if s.tensor in self.blocked:   # the tile's place in the blocked copy, then its elements
            b0, b1, loop_axis = self.blocked[s.tensor]
            loop, grid = self.p.loop, s.index[1 - loop_axis].dim
            tile = f"(i_{grid} * {self.sizes[loop] // self.blocks[loop]} + t_{loop}) * {b0 * b1}"
            return f"p_{s.tensor} + {tile} + tl.arange(0, {b0})[:, None] * {b1} + tl.arange(0, {b1})[None, :]"
        shape = self.p.tensor(s.tensor).shape
        strides = self.strides.get(s.tensor) or [math.prod(shape[k + 1:]) for k in range(len(shape))]
        terms = []
        for ax, st in zip(s.index, strides):
            if ax.dim is None:
                e = str(ax.offset)
            elif self.p.role(ax.dim) == "program":
                e = f"(i_{ax.dim} // {ax.div} + {ax.offset})" if ax.div != 1 or ax.offset else f"i_{ax.dim}"
            else:
                e = self.expand(f"offs_{ax.dim}", (ax.dim,), dims) + (f" + {ax.offset}" if ax.offset else "")
                e = f"({e})"
            terms.append(f"{e} * {st}" if st != 1 else e)
        return f"p_{s.tensor} + " + " + ".join(terms) if terms else f"p_{s.tensor}"

    def stmt(self, s: Stmt) -> str:
        dims = self.p.tile_dims(s.out) if s.out else ()
        if s.op == "load":
            self.dtypes[s.out] = self.p.tensor(s.tensor).dtype
            m = self.mask(dims) if s.attr("mask", 1) else None
            extra = f", mask={m}, other=0.0" if m else ""
            if s.out in self.streamed:   # read once by one program: keep it out of the L2's way
                extra += ", eviction_policy='evict_first'"
            code = f"v_{s.out} = tl.load({self.address(s, dims)}{extra})"
            if s.tensor in self.tma and self.p.loop in dims:   # a loop tile: a box of the descriptor
                at = ", ".join(f"t_{d} * {self.blocks[d]}" if d == self.p.loop else f"i_{d} * {self.blocks[d]}"
                               for d in dims)
                code = f"v_{s.out} = d_{s.tensor}.load([{at}])"
            if s.out in self.dual:   # the elementwise uses' own copy (module docstring)
                code += f"\n{'    ' * 2}v_{s.out}__e = tl.load({self.address(s, dims)}{extra}, eviction_policy='evict_last')"
            return code
        if s.op == "store":
            vd = self.p.tile_dims(s.args[0])
            m = self.mask(vd)
            val = f"v_{s.args[0]}.to(p_{s.tensor}.dtype.element_ty)"
            return f"tl.store({self.address(s, vd)}, {val}{', mask=' + m if m else ''})"
        self.dtypes[s.out] = "float32"
        self.on_dot_path = s.op in ("dot", "cast", "trans") and any(a in self.dual for a in s.args) and \
            (s.op == "dot" or s.out in self.dot_inputs)
        try:
            return f"v_{s.out} = {self.expr(s, dims)}"
        finally:
            self.on_dot_path = False

    def expr(self, s: Stmt, dims: tuple) -> str:
        op, a = s.op, [self.operand(x, dims) for x in s.args]
        infix = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
        if op in infix:
            return f"{a[0]} {infix[op]} {a[1]}"
        if op == "dot":
            return self.dot(s)
        if op == "cast":
            to = _SHORT[s.attr("dtype")]
            self.dtypes[s.out] = to
            if isinstance(s.args[0], str) and self.dtypes.get(s.args[0], "float32") == to:
                return self.operand(s.args[0], dims, f32=False)   # already in that dtype: no round trip
            return f"{a[0]}.to({_TL[to]})"
        if op == "trans":
            self.dtypes[s.out] = self.dtypes.get(s.args[0], "float32")
            return f"tl.trans({self.operand(s.args[0], self.p.tile_dims(s.args[0]), f32=False)})"
        if op in ("sum", "max"):
            return self.reduce(s)
        if op == "causal":
            q, k = s.attr("q"), s.attr("k")
            cond = f"{self.expand(f'offs_{k}', (k,), dims)} <= {self.expand(f'offs_{q}', (q,), dims)}"
            return f"tl.where({cond}, {a[0]}, float('-inf'))"
        return _unary(s, a)

    def dot(self, s: Stmt) -> str:
        if self.cfg.gemv:
            return self.gemv_dot(s)
        x, y = s.args
        dx, dy = self.dtypes.get(x, "float32"), self.dtypes.get(y, "float32")
        if dx == dy and dx != "float32" and not self.interpret:
            ex, ey = self.contracted(x, f"v_{x}", 1), self.contracted(y, f"v_{y}", 0)
            tail = "out_dtype=tl.float32"
        else:
            ex, ey = self.contracted(x, self.operand(x, ()), 1), self.contracted(y, self.operand(y, ()), 0)
            tail = "input_precision='ieee'"
        if s.out in self.swapped_dots:   # dot(yᵀ, xᵀ) = (x·y)ᵀ (swapped_accs)
            return f"tl.dot({self.transposed(y, ey)}, tl.trans({ex}), {tail})"
        return f"tl.dot({ex}, {ey}, {tail})"

    def transposed(self, name: str, expr: str) -> str:
        """``expr`` (the tile of ``name``) transposed: the tile it was transposed from where
        ``name`` is a ``trans`` of a value (a weight loaded [N, K]), so no transpose is left."""
        src = self.defs.get(name)
        if expr == f"v_{name}" and src is not None and src.op == "trans" and isinstance(src.args[0], str) \
                and src.args[0] not in self.dual:
            return f"v_{src.args[0]}"
        return f"tl.trans({expr})"

    def gemv_dot(self, s: Stmt) -> str:
        """``dot x y`` of a ``gemv`` config: the products summed over the contraction in float32
        (no tensor cores, so x's rows may be one-row tiles), on 2-d tiles: x's one row broadcast
        over y's tile, then a row of the sums (a 3-d broadcast made Triton move the weight tile
        between layouts every iteration). Where y is a transposed load (a ``[N, K]`` weight, K
        contiguous, as ``nn.Linear`` stores it) the products are taken against the load itself
        and summed along its contiguous axis."""
        x, y = s.args
        xd = self.p.tile_dims(x)
        if len(xd) != 2 or len(self.p.tile_dims(y)) != 2 or self.blocks.get(xd[0]) != 1:
            raise KernelError(f"kernel {self.p.name}: a gemv config needs every dot's left operand in one-row "
                              f"tiles ({xd[0]}=1) and 2-d operands; use a config without gemv")
        ex = self.contracted(x, self.operand(x, ()), 1)
        src = self.defs.get(y)
        if src is not None and src.op == "trans":
            w = src.args[0]
            ew = self.contracted(w, self.operand(w, ()), 1)
            return f"tl.sum({ew} * {ex}, axis=1)[None, :]"
        ey = self.contracted(y, self.operand(y, ()), 0)
        return f"tl.sum({ey} * tl.trans({ex}), axis=0)[None, :]"

    def contracted(self, name: str, expr: str, axis: int) -> str:
        """A ``dot`` operand with the padded lanes of its contraction dim (axis ``axis`` of its
        tile) zeroed unless it is a load (:func:`dot_source`): an online softmax's exp of a padded
        key is inf where a split's chunk is masked whole (its max stays -1e30), and inf·0 is NaN."""
        d = self.p.tile_dims(name)[axis]
        src = dot_source(self.p, name)
        if not self.needs_mask(d) or src is not None and src.op == "load":
            return expr
        m = self.expand(f"mask_{d}", (d,), self.p.tile_dims(name))
        return f"tl.where({m}, {expr}, 0.0)"

    def reduce(self, s: Stmt) -> str:
        src = s.args[0]
        sd, d = self.p.tile_dims(src), s.attr("dim")
        x = self.operand(src, sd)
        if self.needs_mask(d):
            fill = "0.0" if s.op == "sum" else "float('-inf')"
            x = f"tl.where({self.expand(f'mask_{d}', (d,), sd)}, {x}, {fill})"
        return f"tl.{s.op}({x}, axis={sd.index(d)})"


class _SplitRender(_Render):
    """The split schedule (:mod:`superopt.kernel.split`) in one kernel over grid x split
    programs, program ``g·S + c`` running chunk ``c`` of grid tile ``g``: it stores the chunk's
    accumulators, float32, to the workspace (per accumulator ``[S, G programs, padded tile]``,
    masked to the elements inside the tensor), then draws a ticket (``tl.debug_barrier()``, then
    ``tl.atomic_add`` on the tile's int32 counter, acq_rel, GPU scope). The program that draws
    ticket S - 1, the last of its tile, loads the S partials (``.cg``: from the L2), combines
    them in chunk order (:meth:`combine`, as the emulator), stores 0 to the counter for the
    next launch (the tile's other programs have drawn theirs) and runs the post-block.

    Why it sees every partial: the barrier orders all the program's stores before its atomic
    (issued by one thread), whose release half publishes them at GPU scope (cumulative); the
    counter's read-modify-writes form one release sequence, so the last ticket's acquire makes
    every earlier program's stores visible, and Triton's barrier after a scalar atomic (its
    result is broadcast) carries that to all the program's threads. The CUDA samples'
    threadFenceReduction pattern; no program waits for another, so it cannot deadlock. The
    counters: :func:`~superopt.kernel.compile.compile_program`; ``docs/kernels.md``."""

    def __init__(self, p: KernelProgram, config: TileConfig, plan: dict, interpret: bool = False, pdl: bool = False,
                 strides: dict | None = None):
        super().__init__(p, config, interpret, pdl, strides)
        self.plan, self.n = plan, grid_size(p, config)
        self.base, off = {}, 0
        for a in p.accs:
            self.base[a.name] = off
            off += config.split * self.n * self.elems(a)

    def elems(self, acc) -> int:
        return math.prod(self.blocks[d] for d in acc.dims)

    def ws(self, acc, chunk: str) -> str:
        """The workspace address tile of ``acc`` for chunk ``chunk`` of this grid tile."""
        a = next(x for x in self.p.accs if x.name == acc)
        terms, stride = [], 1
        for d in reversed(a.dims):
            ar = self.expand(f"tl.arange(0, {self.blocks[d]})", (d,), a.dims)
            terms.append(f"{ar} * {stride}" if stride != 1 else ar)
            stride *= self.blocks[d]
        tile = " + ".join(reversed(terms)) if terms else "0"
        return f"p_ws + {self.base[acc]} + ({chunk} * {self.n} + pid0) * {self.elems(a)} + {tile}"

    def ws_load(self, acc: str) -> str:
        """A partial of ``acc`` (chunk ``i_s``), read from the L2 (``.cg``); the elements past an
        edge were never written (the store is masked, so a few-row tile moves only its rows)
        and read as the init."""
        a = next(x for x in self.p.accs if x.name == acc)
        m = self.mask(a.dims)
        return f"tl.load({self.ws(acc, 'i_s')}{f', mask={m}, other={_lit(a.init)}' if m else ''}, cache_modifier='.cg')"

    def render(self) -> str:
        p, split = self.p, self.cfg.split
        args = [f"p_{t.name}" for t in p.inputs + p.outputs] + [f"d_{t.name}" for t in p.inputs if t.name in self.tma] \
            + ["p_ws", "p_cnt"]
        self.lines = self.head(KERNEL_NAME, args)
        self.emit(f"i_split = pid % {split}")
        self.emit(f"pid = pid // {split}")
        self.emit("pid0 = pid")
        self.grid_prologue()
        total, per = chunks(p, self.cfg)
        self.emit(f"t_lo = i_split * {per}")
        self.emit(f"t_hi = tl.minimum(t_lo + {per}, {total})")
        self.dependent_launch()
        self.acc_init()
        early = needed_pre(p, p.body)
        self.block(early, 1)
        self.loop("range(t_lo, t_hi)")
        self.unswap(1)
        for a in p.accs:
            m = self.mask(a.dims)
            self.emit(f"tl.store({self.ws(a.name, 'i_split')}, v_{a.name}{', mask=' + m if m else ''})")
        self.emit("# the last program of this grid tile to store its partials combines them (class docstring)")
        self.emit("tl.debug_barrier()")
        self.emit("ticket = tl.atomic_add(p_cnt + pid0, 1, sem='acq_rel', scope='gpu')")
        self.emit(f"if ticket == {split - 1}:")
        self.block([s for s in needed_pre(p, p.post) if s not in early], 2)
        self.combine(split, 2)
        self.emit("tl.store(p_cnt + pid0, 0)", 2)
        self.block(p.post, 2)
        return "\n".join(self.lines) + "\n"

    def combine(self, split: int, depth: int = 1):
        """The partials merged in chunk order, the loop over chunks unrolled
        (``tl.static_range``): its loads do not depend on each other, so they are issued
        together, one L2 round trip rather than one per chunk (a decode attention's combine of
        8-16 partials is what made its larger splits slower)."""
        self.emit(f"# combine the {split} partials (split schedule)", depth)
        accs = {a.name: a for a in self.p.accs}
        for name, kind in self.plan.items():
            a = accs[name]
            shape = ", ".join(str(self.blocks[d]) for d in a.dims) + ("," if len(a.dims) == 1 else "")
            init = _lit(a.init) if kind[0] == "max" else "0.0"
            self.emit(f"v_{name} = tl.full(({shape}), {init}, tl.float32)", depth)
        maxes = [n for n, k in self.plan.items() if k[0] == "max"]
        if maxes:
            self.emit(f"for i_s in tl.static_range(0, {split}):", depth)
            for m in maxes:
                self.emit(f"v_{m} = tl.maximum(v_{m}, {self.ws_load(m)})", depth + 1)
        rest = [(n, k) for n, k in self.plan.items() if k[0] != "max"]
        if rest:
            self.emit(f"for i_s in tl.static_range(0, {split}):", depth)
            for m in sorted({k[1] for _, k in rest if k[0] == "rescale"}):
                scale = next(k[2] for _, k in rest if k[0] == "rescale" and k[1] == m)
                self.emit(f"f_{m} = tl.exp2(({self.ws_load(m)} - v_{m}) * {scale * _LOG2E!r})", depth + 1)
            for name, kind in rest:
                part = self.ws_load(name)
                if kind[0] == "rescale":
                    part += f" * {self.expand(f'f_{kind[1]}', self.p.tile_dims(kind[1]), self.p.tile_dims(name))}"
                self.emit(f"v_{name} = v_{name} + {part}", depth + 1)


def launch_grid(program: KernelProgram, config: TileConfig) -> int:
    """Programs ``superopt_kernel`` is launched with: the grid, times the split's chunks."""
    return grid_size(program, config) * config.split


def workspace_elems(program: KernelProgram, config: TileConfig) -> int:
    """float32 elements of the workspace a split config needs (0 without a split); it also
    takes ``grid_size`` int32 ticket counters, zero before the launch (it leaves them zero)."""
    if config.split == 1:
        return 0
    n = grid_size(program, config)
    blocks = block_sizes(program, config)
    return config.split * n * sum(math.prod(blocks[d] for d in a.dims) for a in program.accs)


def _lit(c) -> str:
    c = float(c)
    return repr(c) if math.isfinite(c) else f"float('{c}')"


#: elementwise operators whose Triton form depends on the operand alone ({x}: the operand)
_ELEMENTWISE = {
    "neg": "-{x}",
    "relu": "tl.maximum({x}, 0.0)",
    "sigmoid": "tl.sigmoid({x})",
    "silu": "{x} * tl.sigmoid({x})",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)",
    "gelu": "0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))",
    "gelu_tanh": "0.5 * {x} * (2.0 * tl.sigmoid(2.0 * 0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))",
}


def _unary(s: Stmt, a: list) -> str:
    x, op = a[0], s.op
    if op in _ELEMENTWISE:
        return _ELEMENTWISE[op].format(x=x)
    if op == "maximum":
        return f"tl.maximum({x}, {a[1]})"
    if op == "addmask":
        return f"{x} + {a[1]} * {1.0 / s.attr('scale')!r}"
    if op == "exp":
        return f"tl.exp2({x} * {s.attr('scale', 1.0) * _LOG2E!r})"
    if op == "rsqrt":
        eps = s.attr("eps")
        return f"tl.rsqrt({x} + {eps!r})" if eps is not None else f"tl.rsqrt({x})"
    if op == "pow":
        c = s.attr("exponent")
        if c == int(c) and 0 <= c <= 8:
            return " * ".join([f"({x})"] * int(c)) if c else f"tl.full({x}.shape, 1.0, tl.float32)"
        return f"tl.exp2({c!r} * tl.log2({x}))"
    raise KernelError(f"no Triton lowering for operator {op!r}")


def to_triton(program: KernelProgram, config: TileConfig, interpret: bool = False, pdl: bool = False,
              strides: dict | None = None) -> str:
    """The Triton source of ``program`` under ``config``: one kernel, ``superopt_kernel``, over
    :func:`launch_grid` programs; with a split it takes two more arguments, the float32
    workspace (:func:`workspace_elems`) and the int32 ticket counters (``grid_size`` of them,
    zero), and the last program of each grid tile combines (:class:`_SplitRender`).

    ``interpret``: for Triton's CPU interpreter, whose ``tl.dot`` of bfloat16 tiles is wrong
    (triton 3.9: it multiplies the raw bits), low-precision dot operands are widened to float32.
    ``pdl``: for programmatic dependent launch (a Hopper GPU, launched with ``launch_pdl``):
    the kernel lets the next one launch at once and waits for the previous one before any load
    or store (:meth:`_Render.dependent_launch`); what it computes is the same.
    ``strides``: input name -> its element strides, for an input passed as a strided view (a
    slice of a merged projection's output) rather than row-major in its declared shape; the
    loads then address it as it lies, and no copy is made. Literals, like every other size.
    """
    plan = check_split(program, config)
    if pdl and interpret:
        raise KernelError("dependent launch (pdl) needs a GPU: Triton's interpreter has no griddepcontrol")
    for name, st in (strides or {}).items():
        t = program.tensor(name)
        if len(st) != len(t.shape) or any(not isinstance(x, int) or x < 0 for x in st):
            raise KernelError(f"strides {list(st)} for input {name} {list(t.shape)}: one non-negative integer per axis")
        if name in tma_loads(program, config) or name in blocked_loads(program, config):
            raise KernelError(f"input {name} is read through a tensor descriptor or as tiles: it must be row-major")
    if plan is not None:
        return _SplitRender(program, config, plan, interpret, pdl, strides).render()
    return _Render(program, config, interpret, pdl, strides).render()
