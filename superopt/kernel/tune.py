"""Tuning on the device: every candidate kernel program over its tile configurations, compiled
in parallel worker processes, checked against its region, timed alone; the winner and
Inductor's time for the same region (measured in the same run) go into a kernel profile.

Timing (:func:`measure_us`): the call is captured in a CUDA graph (no launch overhead, as under
``mode="reduce-overhead"``; the graph's own launch subtracted), each call after a read of
``FLUSH_BYTES`` that evicts the L2 cache (:func:`~superopt.cost.measure.l2_flush`), since in a
model a layer's weights are never in L2 when its kernel starts (an H100's L2 holds 50 MB: a
4096x6144 bf16 weight nearly fits, and timing it warm would flatter every kernel). Every config is timed first with a tenth of the
replays, then the :data:`FINALISTS` fastest with all ``repeat`` (the median is kept).
Compilation happens in worker processes (``spawn``; Triton's on-disk cache carries the binaries
back: :func:`shared_triton_cache` makes sure it is the same cache), timing in this process alone.

>>> p = parse_program(EXAMPLE)
>>> [t.name for t in transposed(p, streamed_weights(p, {"w"})).inputs], specialize(p, "bf16").inputs[0].dtype
(['x', 'w__t'], 'bfloat16')
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

from ..cost.measure import cuda_graph, l2_flush, replay_medians
from ..errors import SuperoptError
from ..ir.graph import Graph
from .profile import KernelEntry, region_signature
from .configs import default_configs, row_dims, split_configs
from .errors import KernelError
from .program import DTYPES, EXAMPLE, KernelProgram, Stmt, Tensor, TileConfig, parse_program  # noqa: F401  (EXAMPLE: doctest)
from .regions import as_reference
from .triton_lower import blocked_arrays, blocked_loads, prepass_split, swapped_accs, tma_loads

__all__ = ["may_start_processes", "bake_constants", "tuning_space", "stream_configs", "specialize", "transposed", "variants", "timed_variant", "extra_inputs", "extra_arrays", "config_text", "parse_config", "measure_us", "triton_version", "torch_dtype", "tune_region", "tune_regions", "plan_region", "RegionPlan", "TuneResult",
           "TuneError", "shared_triton_cache", "FLUSH_BYTES", "BF16_TOL", "FINALISTS", "STREAM_SHAPES",
           "GEMV_SHAPES", "gemv_configs"]

#: bytes read before each timed call to evict the L2 cache (H100: 50 MB of L2)
FLUSH_BYTES = 256 << 20
#: relative error (max |a-b| / max |b|) a bf16 kernel may show against the float32 reference
BF16_TOL = 2e-2


class TuneError(SuperoptError):
    """Tuning cannot run here (no CUDA device, no Triton) or was given nothing to tune."""


def config_text(config: TileConfig | None) -> str:
    """A tile configuration as JSON (``""`` for None): the ``config`` of a kernel node. ``split``,
    ``prepass``, ``gemv``, ``tma``, ``blocked`` and ``swap`` are written only when they are not 1 /
    false (so configs without them read and print as before)."""
    if config is None:
        return ""
    d = asdict(config)
    if d["split"] == 1:
        del d["split"]
    for flag in ("prepass", "gemv", "tma", "blocked", "swap"):
        if not d[flag]:
            del d[flag]
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def parse_config(text: str) -> TileConfig:
    """The inverse of :func:`config_text` (a config without ``split`` has split 1, without
    ``prepass``, ``gemv``, ``tma``, ``blocked`` or ``swap`` none of them)."""
    d = json.loads(text)
    return TileConfig(tuple((str(k), int(v)) for k, v in d["blocks"]), int(d["num_warps"]), int(d["num_stages"]),
                      int(d.get("split", 1)), bool(d.get("prepass", False)), bool(d.get("gemv", False)),
                      bool(d.get("tma", False)), bool(d.get("blocked", False)), bool(d.get("swap", False)))


def specialize(program: KernelProgram, dtype: str) -> KernelProgram:
    """``program`` with its float32 global tensors stored in ``dtype`` (``bf16``/``fp16``):
    loads read that dtype, elementwise work and ``dot`` accumulation stay in float32, stores
    round to it, two half-precision ``dot`` operands run on the tensor cores. What is computed
    is unchanged; only storage precision is, and the tuner checks the outputs against Inductor's
    within :data:`BF16_TOL`."""
    if dtype == "fp32":
        return program
    dt = {"bf16": "bfloat16", "fp16": "float16"}[dtype]

    def retype(ts):
        return tuple(replace(t, dtype=dt) if t.dtype == "float32" else t for t in ts)
    return replace(program, inputs=retype(program.inputs), outputs=retype(program.outputs), _tiles={})


def streamed_weights(program: KernelProgram, weights: set[str]) -> list[str]:
    """Rank-2 inputs among ``weights`` read as ``[loop dim, other]`` tiles (a weight streamed
    through the K loop): stored transposed, each tile is a contiguous row segment."""
    out = []
    for t in program.inputs:
        if t.name in weights and len(t.shape) == 2:
            loads = [s for _, s in program.statements() if s.op == "load" and s.tensor == t.name]
            if loads and all(s.index[0].dim == program.loop and s.index[1].dim is not None for s in loads):
                out.append(t.name)
    return out


def transposed(program: KernelProgram, names: list[str]) -> KernelProgram:
    """``program`` reading each input of ``names`` from its transpose ``NAME__t`` (a weight
    layout chosen at compile time): the load reads the transposed tile and ``trans`` restores it."""
    if not names:
        return program
    ins = tuple(Tensor(t.name + "__t", t.dtype, t.shape[::-1]) if t.name in names else t for t in program.inputs)

    def fix(block):
        out = []
        for st in block:
            if st.op == "load" and st.tensor in names:
                out.append(replace(st, out=st.out + "__t", tensor=st.tensor + "__t", index=st.index[::-1]))
                out.append(Stmt(st.out, "trans", (st.out + "__t",)))
            else:
                out.append(st)
        return tuple(out)
    return replace(program, name=program.name + "_wt", inputs=ins, pre=fix(program.pre), body=fix(program.body),
                   post=fix(program.post), _tiles={})


def bake_constants(program: KernelProgram, values: dict[str, float]) -> KernelProgram:
    """``program`` with each one-element input of ``values`` read as that number instead: its
    loads (at a constant index) dropped, their uses given the literal, the input removed. A
    value the call would pass as a tensor that never changes (a norm's epsilon, a weight of
    the model) then costs nothing at run time: a one-element constant tensor handed to an
    extern call is rebuilt by Inductor's constant folding as ``full`` and filled by a kernel
    of its own on every call (RMSNorm -> 4096x6144 at 16 tokens under reduce-overhead: one more
    launch, the module no faster than Inductor's though its kernel was 2.8 us faster; session
    38). A substitution of one value for an input the program was proven for whatever it
    holds; an input also read at a tile index, or absent, is left as it is. ``values`` are the
    numbers as the input's dtype holds them (the caller rounds)."""
    loads = {t: [st for _, st in program.statements() if st.op == "load" and st.tensor == t] for t in values}
    baked = {t for t, ls in loads.items() if ls and math.prod(program.tensor(t).shape) == 1
             and all(ax.dim is None for st in ls for ax in st.index)}
    if not baked:
        return program
    lit = {st.out: float(values[t]) for t in baked for st in loads[t]}

    def fix(block):
        return tuple(replace(st, args=tuple(lit.get(a, a) if isinstance(a, str) else a for a in st.args))
                     for st in block if not (st.op == "load" and st.tensor in baked))
    return replace(program, inputs=tuple(t for t in program.inputs if t.name not in baked), pre=fix(program.pre),
                   body=fix(program.body), post=fix(program.post), _tiles={})


def low_dots(program: KernelProgram, dtype: str) -> KernelProgram:
    """``program`` (after :func:`specialize`) with the computed float32 operand of every ``dot``
    whose other operand is a half-precision load rounded to ``dtype`` first, so that the dot runs
    on the tensor cores in that precision, as Inductor's and cuDNN's code for a bf16 model do
    (attention's probabilities before ``dot P V``). A bf16 model is imported in float32, so its
    regions' programs kept that dot in float32: the Llama-3-8B decode attention's 256-key tiles
    then needed 276 KB of shared memory and were dropped, where the same program with the cast
    ran 10.7 us alone against cuDNN's 11.4 (H100, session 35). Precision only changes; the
    tuner checks the outputs against Inductor's within :data:`BF16_TOL`. The program itself
    where no dot qualifies."""
    if dtype == "fp32":
        return program
    low_in = {t.name for t in program.inputs if t.dtype in ("bfloat16", "float16")}
    low: set = set()   # tile values held in half precision
    changed = False

    def is_low(st) -> bool:
        if st.op == "load":
            return st.tensor in low_in
        if st.op == "cast":
            return st.attr("dtype") in ("bf16", "fp16")
        return st.op == "trans" and st.args[0] in low

    def fix(block, made: dict):
        """``block`` with the casts in; ``made``: the operands cast already where this block sees
        them (one cast of a value that feeds two dots: a gated pair's normalized input)."""
        nonlocal changed
        out, made = [], dict(made)
        for st in block:
            if is_low(st):
                low.add(st.out)
            if st.op == "dot" and len(st.args) == 2:
                a, b = st.args
                if (a in low) != (b in low) and all(isinstance(x, str) for x in (a, b)):
                    other = b if a in low else a
                    if other not in made:
                        made[other] = other + "__lo"
                        out.append(Stmt(made[other], "cast", (other,), (("dtype", dtype),)))
                    st = replace(st, args=tuple(made[other] if x == other else x for x in st.args))
                    changed = True
            out.append(st)
        return tuple(out), made
    pre, seen = fix(program.pre, {})
    body, post = fix(program.body, seen)[0], fix(program.post, seen)[0]
    if not changed:
        return program
    return replace(program, name=program.name + "_lo", pre=pre, body=body, post=post, _tiles={})


def variants(program: KernelProgram, weights: set[str], dtype: str) -> list[KernelProgram]:
    """The storage variants of a verified program: ``dtype`` storage, with the streamed weights
    as they are and transposed (a kernel node may carry either), each also with its dots on
    half-precision tiles (:func:`low_dots`) where that differs; the last is the one timed."""
    names = streamed_weights(program, weights)
    out = []
    for p in [specialize(program, dtype)] + ([specialize(transposed(program, names), dtype)] if names else []):
        out.append(p)
        low = low_dots(p, dtype)
        if low is not p:
            out.append(low)
    return out


def timed_variant(program: KernelProgram, weights: set[str], dtype: str) -> KernelProgram:
    """The variant the tuner times: the streamed weights transposed where there are any (each
    loop tile then a contiguous row segment of ``F.linear``'s weight; that layout won in every
    decode linear measured with both), else the program in ``dtype`` storage."""
    return variants(program, weights, dtype)[-1]


def extra_inputs(program: KernelProgram, ref: Graph) -> list[str]:
    """Program inputs that the region's reference graph does not have (folded at compile time:
    a prep output, or a weight transposed), in program order: a kernel call passes them after
    the reference's inputs."""
    have = set(ref.input_names)
    return [t.name for t in program.inputs if t.name not in have]


def extra_arrays(names: list[str], sources: dict, prep) -> dict:
    """Compile-time values of ``names`` (numpy): prep outputs evaluated in float64 on
    ``sources`` (name -> array), and ``X__t`` the transpose of ``X``."""
    import numpy as np
    from ..semantics.reference import evaluate
    vals = dict(sources)
    if prep is not None and any(n.removesuffix("__t") in prep.names for n in names):
        env = {prep.graph.nodes[i].name: np.asarray(sources[prep.graph.nodes[i].name], np.float64)
               for i in prep.graph.inputs + prep.graph.weights}
        vals.update(zip(prep.names, evaluate(prep.graph, env)))
    out = {}
    for n in names:
        base = n.removesuffix("__t")
        if base not in vals:
            raise TuneError(f"kernel input {n!r} is neither a region source nor a folded weight")
        arr = np.asarray(vals[base])
        out[n] = np.ascontiguousarray(arr.T if n.endswith("__t") else arr).astype(np.float32)
    return out


def torch_dtype(name: str):
    """The torch dtype of a precision name (``bf16``, ``fp16``, ``fp32``)."""
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def random_inputs(ref: Graph, dtype: str, device: str, seed: int = 0) -> list:
    """Inputs for a reference graph: normal draws scaled by 1/sqrt(last dim) (so matmul outputs
    stay near unit size), in ``dtype``."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for i in ref.inputs:
        t = ref.nodes[i].types[0]
        x = torch.randn(t.shape, generator=gen) / max(1.0, t.shape[-1] ** 0.5 if t.rank else 1.0) ** 0.5
        out.append(x.to(device=device, dtype=torch_dtype(dtype)))
    return out


def measure_us(fn, inputs, repeat: int = 50, flush: bool = True, calls: int = 8) -> float:
    """Median microseconds of one call of ``fn(*inputs)`` inside a CUDA graph with the L2 cache
    evicted before it (see the module docstring): two graphs, ``calls`` times (flush, call) and
    ``calls`` times flush alone, replayed in turn ``repeat`` times; a call costs the difference
    of their medians over ``calls``. Timing one replay of a one-call graph after a write charged
    every call the graph's launch and the write-back of the dirty L2 (on an H100 a 1x4096->4096
    bf16 linear read 22.98 us that way, 16.19 us this way: ``check_split_gpu.py --calibrate``)."""
    evict = l2_flush(FLUSH_BYTES if flush else 4)

    def step():
        evict()
        return fn(*inputs)
    with_call, _ = cuda_graph(step, calls)
    flush_only, _ = cuda_graph(evict, calls)
    both, alone = replay_medians([with_call, flush_only], repeat)
    return max(0.0, (both - alone) / calls)


def _warm(task) -> str:
    """Worker: compile one (program, config) and launch it once so Triton caches the binary."""
    text, cfg, dtype = task
    try:
        import torch
        from .compile import compile_program
        prog = parse_program(text)
        run = compile_program(prog, parse_config(cfg))
        run(*(torch.zeros(t.shape, device="cuda", dtype=torch_dtype(dtype)) for t in prog.inputs))
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a config Triton cannot compile (shared memory, registers): skipped
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def may_start_processes() -> bool:
    """Whether this process may start worker processes: not where it is itself a daemonic worker
    (a ``multiprocessing.Pool``'s, where ``torch.compile(backend="superopt")`` may well run),
    whose children multiprocessing refuses with an AssertionError; the work is then done here."""
    return not mp.current_process().daemon


def warm_all(tasks: list[tuple[str, str, str]], workers: int) -> list[str]:
    """Compile every task in ``workers`` spawned processes; the error of each ('' if none)."""
    if workers <= 1 or not may_start_processes():
        return [_warm(t) for t in tasks]
    with shared_triton_cache(), ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_warm, tasks))


@dataclass
class TuneResult:
    """What tuning one region did: its entry (None when no candidate ran correctly), Inductor's
    time, and per (program, config) the time or why it was dropped."""

    entry: KernelEntry | None
    inductor_us: float
    tried: list = field(default_factory=list)  # (program name, config text, us or None, note)
    seconds: float = 0.0
    ranked: list = field(default_factory=list)  # (us, program text, config text), fastest first
    # the compile phase of the tune_regions call this region was in (shared by its regions):
    # seconds until every (program, config) was compiled, and of them, Inductor's compile of the
    # regions here meanwhile; and how many (program, config) pairs were compiled
    compile_s: float = 0.0
    inductor_compile_s: float = 0.0
    compiled: int = 0


def _weight_data(region: Graph) -> dict:
    """The region's weight data (random where the graph has none: tuning only needs shapes)."""
    import numpy as np
    rng = np.random.default_rng(0)
    out = {}
    for i in region.weights:
        n = region.nodes[i]
        shape = n.types[0].shape
        out[n.name] = region.data[n.name] if n.name in region.data else \
            (rng.standard_normal(shape) / max(1.0, shape[0] if shape else 1.0) ** 0.5).astype(np.float32)
    return out


def inductor_module(region: Graph, dtype: str, device: str, data: dict):
    """The region as a module (its weights parameters, so freezing makes them constants)
    compiled by Inductor with freezing; call it with the region's boundary inputs."""
    import torch
    from ..semantics.interpret import interpret
    from ..semantics.torch_lowering import LOWERING
    names = [region.nodes[i].name for i in region.weights]

    class Region(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, nm in enumerate(names):
                self.register_parameter(f"w{k}", torch.nn.Parameter(torch.as_tensor(data[nm]), requires_grad=False))

        def forward(self, *xs):
            env = dict(zip(region.input_names, xs))
            env.update({nm: getattr(self, f"w{k}") for k, nm in enumerate(names)})
            out = interpret(region, env, LOWERING, "torch")
            return out[0] if len(out) == 1 else tuple(out)

    mod = Region().to(device=device, dtype=torch_dtype(dtype)).eval()
    xs = random_inputs_for(region, dtype, device)
    with torch.no_grad(), inductor_settings():
        # one eager call first: the graph's lazily computed attributes (input names, users)
        # exist before dynamo traces it, else its guards on them fail at the next call and
        # every region was compiled twice (the second time when it was being timed)
        mod(*xs)
        fn = torch.compile(mod, dynamic=False)
        fn(*xs)
    return fn


@contextmanager
def shared_triton_cache():
    """``TRITON_CACHE_DIR`` set (to superopt's kernel cache, where the user has not set it) while
    workers compile for this process. Inductor points it at its own directory the first time it
    compiles a kernel, where it is unset: workers spawned before that wrote their binaries to
    Triton's default cache and this process, reading Inductor's, compiled every kernel again
    (most of the timing phase: on an H100 host, 48 recompilations in a 36 s attention region)."""
    from .compile import cache_dir
    if os.environ.get("TRITON_CACHE_DIR"):
        yield
        return
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir() / "triton")
    try:
        yield
    finally:
        os.environ.pop("TRITON_CACHE_DIR", None)


@contextmanager
def inductor_settings():
    """What the regions' Inductor code is compiled under, held until it has been timed (a
    recompile then sees the same): freezing on, as the baseline a user turns on; dynamo's
    recompile limit raised, since every region's forward is one code object and after 8 (the
    default) dynamo ran later regions eagerly (timing eager code as Inductor's; H100 host,
    torch 2.11)."""
    import torch
    import torch._inductor.config as ic
    with torch._dynamo.config.patch(recompile_limit=max(torch._dynamo.config.recompile_limit, 1024)), \
            ic.patch(freezing=True):
        yield


def random_inputs_for(region: Graph, dtype: str, device: str) -> list:
    """Random boundary inputs of a region graph (its inputs only, not its weights)."""
    return random_inputs(as_reference(region), dtype, device)[:len(region.inputs)]


#: (column tile, loop tile, warps, stages) of :func:`stream_configs`
STREAM_SHAPES = ((16, 256, 4, 4), (32, 256, 4, 4), (16, 512, 4, 3), (32, 512, 8, 3), (64, 256, 4, 4),
                 (64, 512, 8, 3), (128, 256, 8, 3), (128, 512, 8, 2), (32, 256, 2, 4), (64, 256, 2, 4),
                 (32, 512, 2, 4), (16, 256, 4, 5), (32, 256, 4, 5), (32, 512, 4, 3), (64, 256, 4, 3))


def stream_configs(program: KernelProgram, shapes=STREAM_SHAPES) -> list[TileConfig]:
    """Configs for a weight-streaming kernel (few rows, a long K loop: a decode step's linear
    layers): narrow column tiles so that there are enough programs to fill the GPU, and long K
    tiles with deep pipelines so that each program keeps enough loads in flight; one per
    (column tile, loop tile, warps, stages) of ``shapes``."""
    sizes, grid = program.dim_sizes, [d for d, tiled in program.grid if tiled]
    loop = program.loop
    if loop is None or sizes[loop] < 1024 or not grid or row_dims(program):   # row-owning: its own space
        return []
    rows = [d for d in grid if sizes[d] <= 16]
    cols = [d for d in grid if d not in rows]
    if len(cols) != 1 or len(rows) + 1 != len(grid):
        return []
    return [TileConfig(tuple((d, 16 if d in rows else bn) for d in grid) + ((loop, bk),), warps, stages)
            for bn, bk, warps, stages in shapes]


#: (column tile, loop tile, warps, stages) of :func:`gemv_configs`: column tiles of 8 and 16
#: (768 and 384 programs for a 4096 -> 6144 linear) with long loop tiles, and of 4 for narrow
#: outputs. A hand-written RMSNorm -> 4096x6144 GEMV of these shapes streamed the weights in
#: 19.4-19.7 us on an H100 against 20.2 for the best ``tl.dot`` schedule (session 36,
#: docs/kernel-benchmarks.md)
GEMV_SHAPES = ((8, 512, 2, 4), (8, 512, 4, 3), (8, 256, 8, 3), (16, 512, 8, 3), (16, 512, 4, 3),
               (8, 256, 4, 4), (16, 256, 4, 4), (32, 512, 4, 3), (4, 512, 4, 3))


def gemv_configs(program: KernelProgram, shapes=GEMV_SHAPES) -> list[TileConfig]:
    """``gemv`` configs (:class:`~superopt.kernel.program.TileConfig`) of a weight-streaming
    kernel over one row (a batch-1 decode step's linear): its row dims in one-row tiles, every
    ``dot`` a sum of products; none where a row dim is longer than 1 or a dot's left operand is
    not tiled over the rows."""
    if not stream_configs(program):
        return []
    sizes, grid = program.dim_sizes, [d for d, tiled in program.grid if tiled]
    rows = [d for d in grid if sizes[d] <= 16]
    dots = [s for _, s in program.statements() if s.op == "dot"]
    if not rows or any(sizes[d] != 1 for d in rows) or not dots or \
            any(program.tile_dims(s.args[0])[0] not in rows for s in dots):
        return []
    return [TileConfig(tuple((d, 1 if d in rows else bn) for d in grid) + ((program.loop, bk),), warps, stages,
                       gemv=True) for bn, bk, warps, stages in shapes]


def tuning_space(program: KernelProgram, max_configs: int) -> list[TileConfig]:
    """:func:`~superopt.kernel.default_configs` (at most ``max_configs``), the
    :func:`stream_configs` of weight-streaming kernels, split schedules of those
    (:func:`~superopt.kernel.configs.split_configs`: the loop cut across programs where the grid
    alone would leave the GPU idle; the streaming configs' splits first), and the streaming
    configs with a prepass loop where the program has accumulators that can run in one
    (:func:`~superopt.kernel.triton_lower.prepass_split`: a norm's statistics before its matmul),
    the :func:`gemv_configs` of a one-row streaming kernel and their split schedules where their
    grid is small (a narrow output: Qwen2-1.5B's 8960 -> 1536 down projection is 192 programs of
    8 columns), and the streaming and prepass configs
    again with their 2-d loop tiles loaded through tensor descriptors (``tma``, where any
    qualifies: :func:`~superopt.kernel.triton_lower.tma_loads`): on an H100, a hand-written
    RMSNorm -> 4096x6144 kernel with both tiles through descriptors streamed in 20.3-20.6 us
    at 1-16 rows against 21.8-22.1 with the input tile a pointer load and 25.1-25.9 with
    both (session 38, docs/kernel-benchmarks.md). Where the streamed weight is a compile-time
    copy (``X__t``), that twin reads it ``blocked`` instead
    (:func:`~superopt.kernel.triton_lower.blocked_loads`: each weight tile one contiguous run;
    a hand-written 2-16 row GEMV of a 4096x6144 weight, its input tile through a descriptor:
    19.2-19.4 us blocked, 19.8-20.2 with the weight through a descriptor too; session 40). A
    blocked twin whose column tile is 64 or wider takes its dots swapped where it can
    (:func:`~superopt.kernel.triton_lower.swapped_accs`: the weight tile the tensor cores' left
    operand; the same hand-written kernel with the norm, 1-16 rows: 19.15-19.38 us swapped,
    19.25-19.62 not; session 41)."""
    stream = stream_configs(program)
    # a weight-streaming kernel never won with the small default tiles (their best was 6-10x
    # slower than the streaming configs in every decode region): keep only the largest two
    seen = default_configs(program, limit=max_configs)[-2:] if stream else default_configs(program, limit=max_configs)
    stream = [c for c in stream if c not in seen]
    splits = split_configs(program, stream + seen, limit=max(8, max_configs))
    prepass = [replace(c, prepass=True) for c in stream] if prepass_split(program) else []
    twins = []
    for c in stream + prepass:
        blocked = replace(c, tma=True, blocked=True)
        if blocked_loads(program, blocked):
            twin = blocked if tma_loads(program, blocked) else replace(blocked, tma=False)
            swapped = replace(twin, swap=True)
            wide = max(b for d, b in c.blocks if d != program.loop) >= 64
            twins.append(swapped if wide and swapped_accs(program, swapped) else twin)
        elif tma_loads(program, replace(c, tma=True)):
            twins.append(replace(c, tma=True))
    gemv = gemv_configs(program)
    return seen + stream + splits + prepass + twins + gemv + split_configs(program, gemv, limit=8)


#: configs re-timed with the full repeat after the quick first pass over the whole space
FINALISTS = 6


@dataclass
class RegionPlan:
    """One region's tuning work: the (program, config) pairs to compile in the workers, and
    what to time here afterwards (Inductor's code for the region, compiled meanwhile)."""

    region: Graph
    dtype: str
    data: dict
    progs: list  # (candidate, the program variant timed)
    tasks: list  # (program text, config text, dtype), in the order they are timed
    inductor: object = None


def cast_free_key(p: KernelProgram) -> str:
    """``p`` as text with every cast of a loaded value to the dtype it was loaded in left out (its
    uses read the load): two candidates that differ only by such a cast compile to the same
    kernel. A program exported in bf16 has one per linear region (the dot in the weights' dtype,
    the row loaded in it already), which doubled its tuning (632 (program, config) pairs for
    Llama-3-8B decode b1 against 338 for the float32 export)."""
    dtype_of = {t.name: t.dtype for t in p.inputs}
    loaded = {s.out: dtype_of.get(s.tensor) for block in (p.pre, p.body, p.post) for s in block if s.op == "load"}
    rename: dict = {}
    names = {a.name: f"a{k}" for k, a in enumerate(p.accs)}   # numbered as they come: a cast shifts the names
    lines = [repr((p.dims, p.inputs, p.outputs, p.grid, p.loop, [(a.dims, a.init) for a in p.accs]))]
    for name, block in (("pre", p.pre), ("body", p.body), ("post", p.post)):
        lines.append(name)
        for s in block:
            args = tuple(rename.get(a, a) if isinstance(a, str) else a for a in s.args)
            dt = s.attr("dtype")
            if s.op == "cast" and len(args) == 1 and loaded.get(args[0]) == DTYPES.get(dt, dt):
                rename[s.out] = args[0]
                continue
            if s.out and s.out not in names:
                names[s.out] = f"v{len(names)}"
            args = tuple(names.get(a, a) if isinstance(a, str) else a for a in args)
            lines.append(repr((names.get(s.out, s.out), s.op, args, s.attrs, s.tensor, s.index)))
    return "\n".join(lines)


def plan_region(region: Graph, candidates, dtype: str = "bf16", max_candidates: int = 2,
                max_configs: int = 12) -> RegionPlan:
    """The first ``max_candidates`` verified candidates of ``region``, each in its
    :func:`timed_variant`, over its :func:`tuning_space` (``max_configs`` default configs)."""
    data = _weight_data(region)
    progs, seen = [], set()
    for c in candidates:   # the first distinct ones: a no-op cast's twin compiles to the same kernel
        if len(progs) == max_candidates:
            break
        p = timed_variant(c.program, set(data) | set(c.prep.names if c.prep else ()), dtype)
        key = cast_free_key(p)
        if key not in seen:
            seen.add(key)
            progs.append((c, p))
    tasks = [(p.text(), config_text(cfg), dtype) for _, p in progs for cfg in tuning_space(p, max_configs)]
    return RegionPlan(region, dtype, data, progs, tasks)


def _need_cuda():
    import torch
    if not torch.cuda.is_available():
        raise TuneError("superopt tune needs a CUDA device; run it on a GPU machine (the shipped H100 profile "
                        "is used elsewhere)")


def tune_regions(plans: list[RegionPlan], workers: int = 8, repeat: int = 50, device_name: str = "",
                 tol: float = BF16_TOL) -> list[TuneResult]:
    """Tune planned regions: every distinct (program, config) of all of them compiled at once
    in ``workers`` processes while this process compiles Inductor's code for each region; then
    each region timed here alone (see the module docstring). One pool for a whole model: a pool
    per region paid the workers' start-up (importing torch) once per region."""
    _need_cuda()
    with shared_triton_cache(), inductor_settings():
        return _tune_regions(plans, workers, repeat, device_name, tol)


def _tune_regions(plans, workers, repeat, device_name, tol):
    unique = list(dict.fromkeys(t for p in plans for t in p.tasks))
    t0 = time.perf_counter()

    def compile_inductor() -> float:
        t = time.perf_counter()
        for p in plans:
            p.inductor = inductor_module(p.region, p.dtype, "cuda", p.data)
        return time.perf_counter() - t
    if workers <= 1 or not may_start_processes():
        errors = dict(zip(unique, map(_warm, unique)))
        ind_s = compile_inductor()
    else:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            futures = [ex.submit(_warm, t) for t in unique]
            ind_s = compile_inductor()
            errors = {t: f.result() for t, f in zip(unique, futures)}
    compile_s = time.perf_counter() - t0
    out = [_time_plan(p, errors, repeat, tol, device_name) for p in plans]
    for r in out:
        r.compile_s, r.inductor_compile_s, r.compiled = round(compile_s, 1), round(ind_s, 1), len(unique)
    return out


def tune_region(region: Graph, candidates, dtype: str = "bf16", workers: int = 8, repeat: int = 50,
                device_name: str = "", tol: float = BF16_TOL, max_candidates: int = 2,
                max_configs: int = 12) -> TuneResult:
    """Tune the verified ``candidates`` (objects with ``.program`` and ``.prep``, as
    :class:`superopt.kernel.KernelCandidate`) of one region on the CUDA device
    (:func:`plan_region`, :func:`tune_regions`). Program inputs are bound by name to the
    region's inputs and weights, prep outputs and transposed weights."""
    _need_cuda()
    plan = plan_region(region, candidates, dtype, max_candidates, max_configs)
    return tune_regions([plan], workers, repeat, device_name, tol)[0]


def _time_plan(plan: RegionPlan, errors: dict, repeat: int, tol: float, device_name: str) -> TuneResult:
    """Check every compiled (program, config) of ``plan`` against Inductor's output and time it
    with a tenth of ``repeat`` replays; re-time the :data:`FINALISTS` fastest with all of them."""
    import torch
    from .compile import compile_program, launch_errors
    t0, region, dt = time.perf_counter(), plan.region, torch_dtype(plan.dtype)
    xs = random_inputs_for(region, plan.dtype, "cuda")
    with torch.no_grad():
        ind_us = measure_us(plan.inductor, xs, repeat)
        want = plan.inductor(*xs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    env, host = dict(zip(region.input_names, xs)), {}
    for c, p in plan.progs:
        extras = extra_arrays(extra_inputs(p, as_reference(region)), plan.data, c.prep)
        host.update(extras)
        env.update({n: torch.as_tensor(a).to("cuda", dt) for n, a in extras.items()})
    env.update({n: torch.as_tensor(a).to("cuda", dt) for n, a in plan.data.items()})
    res, quick = TuneResult(None, ind_us), []
    programs = {p.text(): p for _, p in plan.progs}
    blocked: dict = {}   # (name, tile shape) -> the weight's blocked copy on the device
    for task in plan.tasks:
        prog, config = programs[task[0]], parse_config(task[1])
        if errors.get(task):
            res.tried.append((prog.name, config.text(), None, errors[task]))
            continue
        args = [env[t.name] for t in prog.inputs]
        loads = blocked_loads(prog, config)   # read as the chosen kernel will get them: one copy per tile shape
        if any((n, tile) not in blocked for n, tile in loads.items()):
            try:
                made = blocked_arrays(prog, config, {n: host[n] for n in loads if n in host})
            except KernelError as e:
                res.tried.append((prog.name, config.text(), None, str(e)))
                continue
            blocked.update({(n, tile): torch.as_tensor(made[n]).to("cuda", dt) for n, tile in loads.items()})
        for name, tile in loads.items():
            args[[t.name for t in prog.inputs].index(name)] = blocked[name, tile]
        run = compile_program(prog, config)
        errs = launch_errors(run, args, want)   # two launches: a split leaves its counters zero
        bad = max(errs) if all(e == e for e in errs) else float("nan")
        if not bad <= tol:
            res.tried.append((prog.name, config.text(), None, f"wrong: rel err {bad:.3g} (launches: "
                                                                f"{', '.join(f'{e:.3g}' for e in errs)})"))
            continue
        quick.append([measure_us(run, args, max(3, repeat // 10)), task, run, args, bad, prog.name, config.text()])
    quick.sort(key=lambda q: q[0])
    for q in quick[:FINALISTS]:
        q[0] = measure_us(q[2], q[3], repeat)
    for us, _, _, _, bad, name, cfg in quick:
        res.tried.append((name, cfg, us, f"rel err {bad:.2g}"))
    res.ranked = [(q[0], q[1][0], q[1][1]) for q in sorted(quick[:FINALISTS], key=lambda q: q[0]) + quick[FINALISTS:]]
    best = min(quick[:FINALISTS], key=lambda q: q[0], default=None)
    if best is not None:
        res.entry = KernelEntry(region_signature(region), plan.dtype, device_name or torch.cuda.get_device_name(),
                                best[1][0], best[1][1], round(best[0], 3), round(ind_us, 3), torch.__version__,
                                triton_version(), len(plan.tasks), describe(region))
    res.seconds = time.perf_counter() - t0
    return res


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return ""


def describe(region: Graph) -> str:
    """One line: the region's operators and its input shapes."""
    ops = [n.op for n in region.nodes if n.opdef.kind not in ("source", "constant")]
    shapes = ",".join("x".join(map(str, region.nodes[i].types[0].shape)) for i in region.inputs)
    return f"{'-'.join(ops)} @ {shapes}"
