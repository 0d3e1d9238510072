"""Tuning on the device: every candidate kernel program over its tile configurations, compiled
in parallel worker processes, checked against its region, timed alone; the winner and
Inductor's time for the same region (measured in the same run) go into a kernel profile.

Timing (:func:`measure_us`): the call is captured in a CUDA graph (no launch overhead, as under
``mode="reduce-overhead"``), and each replay is timed with CUDA events after a write of
``FLUSH_BYTES`` that evicts the L2 cache, since in a model a layer's weights are never in L2
when its kernel starts (an H100's L2 holds 50 MB: a 4096x6144 bf16 weight nearly fits, and
timing it warm would flatter every kernel). The median of ``repeat`` replays is kept.
Compilation happens in worker processes (``spawn``; Triton's on-disk cache carries the binaries
back), timing in this process alone.

>>> [c.text() for c in config_space(parse_program(EXAMPLE))][:2]
['M=16 N=16 K=32 warps=4 stages=3', 'M=16 N=16 K=64 warps=8 stages=3']
"""

from __future__ import annotations

import json
import itertools
import multiprocessing as mp
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

from ..errors import SuperoptError
from ..ir.graph import Graph
from .profile import KernelEntry, region_signature
from .program import EXAMPLE, KernelProgram, TileConfig, parse_program  # noqa: F401  (EXAMPLE: doctest)
from .regions import as_reference

__all__ = ["config_space", "config_text", "parse_config", "measure_us", "tune_region", "TuneResult",
           "TuneError", "FLUSH_BYTES", "BF16_TOL"]

#: bytes written between timed replays to evict the L2 cache (H100: 50 MB of L2)
FLUSH_BYTES = 256 << 20
#: relative error (max |a-b| / max |b|) a bf16 kernel may show against the float32 reference
BF16_TOL = 2e-2
_SIZES = (16, 32, 64, 128, 256)


class TuneError(SuperoptError):
    """Tuning cannot run here (no CUDA device, no Triton) or was given nothing to tune."""


def config_text(config: TileConfig | None) -> str:
    """A tile configuration as JSON (``""`` for None): the ``config`` of a kernel node."""
    if config is None:
        return ""
    return json.dumps(asdict(config), sort_keys=True, separators=(",", ":"))


def parse_config(text: str) -> TileConfig:
    """The inverse of :func:`config_text`."""
    d = json.loads(text)
    return TileConfig(tuple((str(k), int(v)) for k, v in d["blocks"]), int(d["num_warps"]), int(d["num_stages"]))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def config_space(program: KernelProgram, limit: int = 24) -> list[TileConfig]:
    """The autotuning space of ``program``: block sizes (powers of two from 16, no larger than
    the dim's padded size; the loop dim from 32) for each tiled dim, 4 warps (8 for tiles of
    16K elements and more), 3 stages; at most ``limit`` configs, smallest tiles first."""
    sizes = program.dim_sizes
    dims = program.tiled_dims()
    choices = []
    for d in dims:
        top = _pow2_at_least(sizes[d])
        opts = [b for b in _SIZES if b <= max(16, top) and (d != program.loop or b >= min(32, top))]
        choices.append(opts or [16])
    out = []
    for blocks in itertools.product(*choices):
        elems = 1
        for b in blocks:
            elems *= b
        if elems > 64 * 1024:
            continue
        out.append(TileConfig(tuple(zip(dims, blocks)), 8 if elems >= 16 * 1024 else 4, 3))
    return out[:limit] if len(out) <= limit else [out[round(k * (len(out) - 1) / (limit - 1))] for k in range(limit)]


def _torch_dtype(name: str):
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
        out.append(x.to(device=device, dtype=_torch_dtype(dtype)))
    return out


def measure_us(fn, inputs, repeat: int = 50, flush: bool = True) -> float:
    """Median microseconds of one call of ``fn(*inputs)`` replayed from a CUDA graph, the L2
    cache flushed before each replay (see the module docstring)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs)
    scratch = torch.empty(FLUSH_BYTES if flush else 1, dtype=torch.uint8, device="cuda")
    samples = []
    for _ in range(repeat):
        scratch.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(samples)


def _warm(task) -> str:
    """Worker: compile one (program, config) and launch it once so Triton caches the binary."""
    text, cfg, dtype = task
    try:
        import torch
        from .compile import compile_program
        prog = parse_program(text)
        run = compile_program(prog, parse_config(cfg))
        run(*(torch.zeros(t.shape, device="cuda", dtype=_torch_dtype(dtype)) for t in prog.inputs))
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a config Triton cannot compile (shared memory, registers): skipped
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def warm_all(tasks: list[tuple[str, str, str]], workers: int) -> list[str]:
    """Compile every task in ``workers`` spawned processes; the error of each ('' if none)."""
    if workers <= 1:
        return [_warm(t) for t in tasks]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_warm, tasks))


@dataclass
class TuneResult:
    """What tuning one region did: its entry (None when no candidate ran correctly), Inductor's
    time, and per (program, config) the time or why it was dropped."""

    entry: KernelEntry | None
    inductor_us: float
    tried: list = field(default_factory=list)  # (program name, config text, us or None, note)
    seconds: float = 0.0


def _rel_err(got, want) -> float:
    want = want.float()
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6))


def inductor_module(region: Graph, dtype: str, device: str):
    """The region as a module (its weights parameters, so freezing makes them constants)
    compiled by Inductor with freezing; call it with the region's boundary inputs."""
    import torch
    from ..semantics.interpret import interpret
    from ..semantics.torch_lowering import LOWERING

    class Region(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = [region.nodes[i].name for i in region.weights]
            for k, i in enumerate(region.weights):
                data = torch.as_tensor(region.data[self.names[k]]) if self.names[k] in region.data else \
                    torch.randn(region.nodes[i].types[0].shape) * 0.05
                self.register_parameter(f"w{k}", torch.nn.Parameter(data.to(_torch_dtype(dtype)), requires_grad=False))

        def forward(self, *xs):
            env = dict(zip(region.input_names, xs))
            env.update({n: getattr(self, f"w{k}") for k, n in enumerate(self.names)})
            out = interpret(region, env, LOWERING, "torch")
            return out[0] if len(out) == 1 else tuple(out)

    import torch._inductor.config as ic
    mod = Region().to(device).eval()
    old = ic.freezing
    ic.freezing = True
    try:
        fn = torch.compile(mod)
        with torch.no_grad():
            fn(*random_inputs_for(region, dtype, device))
    finally:
        ic.freezing = old
    return fn, mod


def random_inputs_for(region: Graph, dtype: str, device: str) -> list:
    """Random boundary inputs of a region graph (its inputs only, not its weights)."""
    ref = as_reference(region)
    xs = random_inputs(ref, dtype, device)
    return xs[:len(region.inputs)]


def tune_region(region: Graph, programs: list[KernelProgram], dtype: str = "bf16", workers: int = 8,
                repeat: int = 50, device_name: str = "", configs=config_space, tol: float = BF16_TOL) -> TuneResult:
    """Tune ``programs`` (each proven equal to ``region``) on the CUDA device; see the module
    docstring. Inputs of the programs are bound by name to the region's inputs and weights."""
    import torch
    if not torch.cuda.is_available():
        raise TuneError("superopt tune needs a CUDA device; run it on a GPU machine (the shipped H100 profile "
                        "is used elsewhere)")
    t0 = time.perf_counter()
    ref = as_reference(region)
    fn, mod = inductor_module(region, dtype, "cuda")
    xs = random_inputs_for(region, dtype, "cuda")
    with torch.no_grad():
        ind_us = measure_us(fn, xs, repeat)
        weights = [getattr(mod, f"w{k}") for k in range(len(region.weights))]
        want = fn(*xs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    env = dict(zip(ref.input_names, xs + weights))
    tasks = [(p.text(), config_text(c), dtype) for p in programs for c in configs(p)]
    errors = warm_all(tasks, workers)
    res = TuneResult(None, ind_us)
    best = None
    from .compile import compile_program
    for (text, cfg, _), err in zip(tasks, errors):
        prog = parse_program(text)
        if err:
            res.tried.append((prog.name, parse_config(cfg).text(), None, err))
            continue
        args = [env[t.name] for t in prog.inputs]
        run = compile_program(prog, parse_config(cfg))
        got = run(*args)
        bad = max(_rel_err(g, w) for g, w in zip(got, want))
        if bad > tol:
            res.tried.append((prog.name, parse_config(cfg).text(), None, f"wrong: rel err {bad:.3g}"))
            continue
        us = measure_us(run, args, repeat)
        res.tried.append((prog.name, parse_config(cfg).text(), us, f"rel err {bad:.2g}"))
        if best is None or us < best[0]:
            best = (us, text, cfg)
    if best is not None:
        res.entry = KernelEntry(region_signature(region), dtype, device_name or torch.cuda.get_device_name(),
                                best[1], best[2], round(best[0], 3), round(ind_us, 3), torch.__version__,
                                _triton_version(), len(tasks), describe(region))
    res.seconds = time.perf_counter() - t0
    return res


def _triton_version() -> str:
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
