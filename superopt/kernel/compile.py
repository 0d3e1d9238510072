"""Compiling a kernel program: its Triton source written to a cache file, imported, launched.

Triton's ``@jit`` reads the function's source file, so the rendered source is written to
``$SUPEROPT_KERNEL_CACHE`` (default ``kernels`` in superopt's user cache,
``$XDG_CACHE_HOME/superopt`` or ``~/.cache/superopt``, as every other cache) under the hash of the
program text and the config, then imported as a module. Triton is imported here only, and only
when a kernel is compiled: everything else in ``superopt.kernel`` works without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
from pathlib import Path
from typing import Callable

from ..fileio import user_cache_dir
from .errors import KernelCompileError
from .program import KernelProgram, TileConfig
from .triton_lower import KERNEL_NAME, blocked_loads, grid_size, launch_grid, tma_loads, to_triton, workspace_elems

__all__ = ["compile_program", "compile_ptx", "launch_errors", "cache_dir", "source_path", "interpreting", "dependent_launch"]

_LOADED: dict[str, Callable] = {}


def cache_dir() -> Path:
    env = os.environ.get("SUPEROPT_KERNEL_CACHE")
    return Path(env) if env else user_cache_dir() / "kernels"


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dependent_launch() -> bool:
    """Whether kernels are launched with programmatic dependent launch (:func:`to_triton`'s
    ``pdl``): only where ``SUPEROPT_PDL=1`` asks for it, on a GPU of compute capability 9.0 or
    later (Hopper), not under the interpreter. Off by default: on an H100 it changed nothing
    measurable (Llama-3-8B decode's four kernels in a chain: 1.006x, within the 0.7% spread
    of repeated runs; an L2 prefetch of the first loop tiles before the wait gained nothing
    either, and 128 KB or more of it lost 3-15%: ``scripts/check_pdl_gpu.py``, session 34). In
    the whole model as users run it (reduce-overhead with freezing), on an H200, it was slower
    or equal: Llama-3.2-1B decode b1 0.973x, b16 1.001x, Llama-3-8B b1 0.977x, b16 0.962x
    (``scripts/check_pdl_model.py``, session 46)."""
    if interpreting() or os.environ.get("SUPEROPT_PDL", "0") != "1":
        return False
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    except Exception:  # no usable CUDA: nothing to launch on
        return False


def source_path(program: KernelProgram, config: TileConfig, pdl: bool = False, strides: dict | None = None) -> Path:
    """Where the source of ``program`` under ``config`` is cached (keyed by their hash)."""
    views = repr(sorted(strides.items())) if strides else ""
    key = hashlib.sha256((program.text() + config.text() + str(interpreting()) + ("pdl" if pdl else "")
                          + views).encode()).hexdigest()[:20]
    return cache_dir() / f"k_{key}.py"


def _import(path: Path, source: str):
    if not path.exists() or path.read_text() != source:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"superopt_kernels.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_program(program: KernelProgram, config: TileConfig, strides: dict | None = None) -> Callable[..., list]:
    """A launcher: ``run(*inputs) -> [outputs]`` for torch tensors in the program's input order.

    A config with ``split`` > 1 launches one kernel whose last program per grid tile combines
    the chunks' partials (:class:`~superopt.kernel.triton_lower._SplitRender`): a float32
    workspace allocated per call, and int32 ticket counters allocated and zeroed once per
    launcher and device (on its first call there; the kernel leaves them zero). No host sync
    and no data-dependent size, so the call can be captured in a CUDA graph; launches of one
    launcher must not overlap (one stream at a time, as a model runs), since they share the
    counters.
    With ``SUPEROPT_PDL=1`` on a Hopper GPU, launches are programmatic dependent launches
    (:func:`dependent_launch`).
    Inputs must have the declared number of elements and are viewed in the declared shape (a
    region's [1, 16, 4096] is a program's [16, 4096]). An input that is a strided view there
    (the query slice of a merged q/k/v projection's output at 16 rows) is read in place: the
    launcher compiles, on first sight of those strides, a variant whose loads address the view
    (``strides``, :func:`~superopt.kernel.triton_lower.to_triton`), rather than copying it (a
    copy kernel of 2.4 us per call in the Llama-3-8B decode step at batch 16). Only an input
    that cannot be viewed so, or is read through a tensor descriptor or as tiles, is copied
    row-major. Outputs are allocated in the declared shapes and dtypes on the first input's
    device.
    """
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as e:
        raise KernelCompileError(f"compiling a kernel needs triton and torch ({e}); "
                                 f"install superopt[kernels]") from None
    pdl = dependent_launch()
    path = source_path(program, config, pdl, strides)
    key = str(path)
    if key not in _LOADED:
        _LOADED[key] = _import(path, to_triton(program, config, interpreting(), pdl, strides))
    return _launcher(program, config, _LOADED[key], pdl, strides)


def launch_errors(run: Callable[..., list], inputs, want, launches: int = 2) -> list[float]:
    """The error of each of ``launches`` calls in a row of the launcher ``run`` on ``inputs``:
    max |got - want| / max |want| over the outputs (NaN where an output is not finite). More
    than one call, since a split schedule's counters must be left zero for the next launch
    (a kernel that forgot to reset them is right once, then wrong). Every call's outputs are
    kept until the end, so a later call cannot find an earlier one's result in reused memory."""
    import torch
    kept, errs = [], []
    for _ in range(launches):
        outs = run(*inputs)
        kept.append(outs)
        worst = 0.0
        for g, w in zip(outs, want):
            g, w = g.float().reshape(w.shape), w.float()
            if not torch.isfinite(g).all():
                worst = float("nan")
                break
            if w.numel():
                worst = max(worst, float((g - w).abs().max() / w.abs().max().clamp_min(1e-6)))
        errs.append(worst)
    return errs


def compile_ptx(program: KernelProgram, config: TileConfig, capability: int = 90, pdl: bool = False) -> str:
    """The PTX Triton makes of ``program`` under ``config`` for an NVIDIA GPU of compute
    ``capability`` (90: Hopper), compiled here without a GPU (Triton ships ``ptxas``): a CPU
    check that the source compiles for the device, beyond what the interpreter checks (types
    of values merged at an ``if``, operand layouts), and what it does with memory."""
    if interpreting():
        raise KernelCompileError("compiling PTX needs Triton's compiler, not its interpreter; unset TRITON_INTERPRET")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile as triton_compile
    except ImportError as e:
        raise KernelCompileError(f"compiling a kernel needs triton ({e}); install superopt[kernels]") from None
    module = _import(source_path(program, config, pdl), to_triton(program, config, False, pdl))
    ptr = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}
    sig = {f"p_{t.name}": ptr[t.dtype] for t in program.inputs + program.outputs}
    sig.update({f"d_{n}": f"tensordesc<{ptr[program.tensor(n).dtype][1:]}[{box[0]},{box[1]}]>"
                for n, box in tma_loads(program, config).items()})
    if workspace_elems(program, config):
        sig.update(p_ws="*fp32", p_cnt="*i32")
    src = ASTSource(getattr(module, KERNEL_NAME), sig, {})
    opts = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    return triton_compile(src, target=GPUTarget("cuda", capability, 32), options=opts).asm["ptx"]


def _zeroed_counters(program: KernelProgram, n: int, device):
    """``n`` int32 zeros that outlive the call, allocated outside any CUDA-graph memory pool.
    ``torch.compile``'s CUDA-graph trees run a warm-up call with the current thread's
    allocations routed to a graph's private pool, whose allocator state they later restore to
    what they know is live: a tensor kept there behind their back may be handed out again and
    overwritten. So the counters are allocated and zeroed by a helper thread (its allocations
    are not routed) and synchronized before use. Not while a graph is being captured (no
    synchronization is allowed then): a launcher is called once before capture, as torch's
    warm-up and :func:`superopt.cost.measure.cuda_graph` do."""
    import torch
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int32, device=device)
    if torch.cuda.is_current_stream_capturing():
        raise KernelCompileError(f"kernel {program.name}: a split schedule's counters are allocated on its first "
                                 f"call on a device; call it once before capturing a CUDA graph")
    made: list = []

    def alloc():
        try:
            with torch.cuda.device(device):
                made.append(torch.zeros(n, dtype=torch.int32, device=device))
                torch.cuda.synchronize(device)
        except Exception as e:  # re-raised in the caller's thread
            made.append(e)
    worker = threading.Thread(target=alloc, name="superopt-counters")
    worker.start()
    worker.join()
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]


def _as_declared(x, t, dtype, row_major: bool):
    """``x`` in the declared shape of input ``t``: a view where its strides allow one whose rows
    are contiguous (a load then reads whole rows, as from a row-major copy) and ``row_major`` is
    not asked, else a row-major copy (a transposed input is copied: read in place, every load
    would gather)."""
    x = x.to(dtype)
    if not row_major:
        try:
            v = x.view(t.shape)
        except RuntimeError:   # strides a view of that shape cannot express
            v = None
        if v is not None and (v.dim() == 0 or v.shape[-1] == 1 or v.stride(-1) == 1):
            return v
    return x.contiguous().reshape(t.shape)


def _launcher(program: KernelProgram, config: TileConfig, module, pdl: bool = False,
              strides: dict | None = None) -> Callable[..., list]:
    import torch
    n_programs, ws_elems = grid_size(program, config), workspace_elems(program, config)
    grid = (launch_grid(program, config),)
    opts = dict(num_warps=config.num_warps, num_stages=config.num_stages, **({"launch_pdl": True} if pdl else {}))
    kernel = getattr(module, KERNEL_NAME)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    counters: dict = {}   # device -> the split's ticket counters (zero between launches)
    boxes = tma_loads(program, config)
    described = [(i, boxes[t.name]) for i, t in enumerate(program.inputs) if t.name in boxes]
    if described:
        from triton.tools.tensor_descriptor import TensorDescriptor

    row_major = set(boxes) | set(blocked_loads(program, config))
    mine = {k: tuple(v) for k, v in (strides or {}).items()}
    views: dict = {}   # strides of the inputs that are views -> the launcher compiled for them

    def run(*inputs):
        if len(inputs) != len(program.inputs):
            raise KernelCompileError(f"kernel {program.name} takes {len(program.inputs)} inputs "
                                     f"({', '.join(t.name for t in program.inputs)}), got {len(inputs)}")
        args, seen = [], {}
        for t, x in zip(program.inputs, inputs):
            if x.numel() != math.prod(t.shape):
                raise KernelCompileError(f"kernel {program.name}: input {t.name} must have shape {list(t.shape)} "
                                         f"(or as many elements), got {list(x.shape)}")
            a = _as_declared(x, t, dtypes[t.dtype], t.name in row_major)
            if not a.is_contiguous():
                seen[t.name] = tuple(a.stride())
            args.append(a)
        if seen != mine:   # inputs laid out otherwise than this launcher was compiled for
            key = tuple(sorted(seen.items()))
            if key not in views:
                views[key] = compile_program(program, config, dict(key))
            return views[key](*args)
        device = args[0].device if args else torch.device("cpu")
        outs = [torch.empty(t.shape, dtype=dtypes[t.dtype], device=device) for t in program.outputs]
        descs = []
        for i, box in described:   # a descriptor's base must be 16-byte aligned (a view may not be)
            x = args[i] if args[i].data_ptr() % 16 == 0 else args[i].clone()
            descs.append(TensorDescriptor.from_tensor(x, list(box)))
        if ws_elems:  # the split schedule: partials into the workspace, the last program combines
            if device not in counters:
                counters[device] = _zeroed_counters(program, n_programs, device)
            ws = torch.empty(ws_elems, dtype=torch.float32, device=device)
            kernel[grid](*args, *outs, *descs, ws, counters[device], **opts)
        else:
            kernel[grid](*args, *outs, *descs, **opts)
        return outs

    run.program, run.config, run.counters, run.views = program, config, counters, views
    return run
