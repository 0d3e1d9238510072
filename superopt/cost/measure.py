"""Measuring operators with torch: the numbers behind a profile.

Each distinct operator application of the given graphs (same operator, attributes, input
shapes and dtype) is run on random inputs through the torch lowering. On CUDA: a warm-up,
then ``repeat`` timings of ``inner`` back-to-back calls between CUDA events (the eager time,
launch overhead included, since the GPU waits for the CPU on small kernels), and the same
calls captured in a CUDA graph and replayed (the kernel time alone). The median of each is
kept. On the CPU both come from ``time.perf_counter`` and the graph time is left out.

``precision`` says how: ``fp32`` with TF32 off for matmuls and convolutions, ``tf32`` with it
on, ``bf16``/``fp16`` on tensors of that dtype (a float32 graph is measured cast).

Convolutions are also timed in a CUDA graph with input and kernel in channels-last memory
(``nhwc_us``): Inductor lays a convolutional graph out that way when its heuristic says so
(:mod:`superopt.cost.layout`), and some convolutions cost very differently there (grouped ones
in bf16: cuDNN adds layout transforms around them).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

from ..ir.graph import Graph
from ..ir.types import TensorType
from .devices import device_key
from .errors import CostError
from .model import constant_nodes
from .profile import Profile, ProfileEntry, op_key, precision_dtype

__all__ = ["distinct_ops", "measure_graphs", "measure_channels_last", "set_precision", "time_call"]


def distinct_ops(graphs: Mapping[str, Graph]) -> dict[str, tuple]:
    """``key -> (op, attrs, input types, model names)`` over the nodes that run (no opaque ones)."""
    out: dict[str, tuple] = {}
    for name, g in graphs.items():
        const = constant_nodes(g)
        for i in g.compute_nodes():
            n = g.nodes[i]
            if i in const or n.op == "opaque":
                continue
            ins = [g.type_of(r) for r in n.inputs]
            key = op_key(n.op, n.attr, [t.shape for t in ins], ins[0].dtype if ins else n.types[0].dtype)
            if key not in out:
                out[key] = (n.op, dict(n.attrs), ins, [])
            if name not in out[key][3]:
                out[key][3].append(name)
    return out


def _inputs(op, in_types, device, torch, dtype=None):
    """Random arguments (floats cast to ``dtype``); batch-norm variances positive."""
    args = []
    for pos, t in enumerate(in_types):
        dt = getattr(torch, dtype if dtype and t.dtype.startswith(("float", "bfloat")) else t.dtype)
        x = torch.randn(t.shape, device=device, dtype=dt)
        args.append(x.abs() + 0.5 if (op == "batchnorm" and pos == 4) else x)
    return args


def time_call(fn: Callable[[], object], device: str, warmup: int, repeat: int, inner: int) -> tuple[float, float | None]:
    """Median microseconds per call: (eager, inside a CUDA graph or None on the CPU)."""
    import torch
    for _ in range(warmup):
        fn()
    if device == "cpu":
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner * 1e6)
        return statistics.median(samples), None
    eager = _cuda_eager(fn, torch, repeat, inner)
    try:
        return eager, _cuda_graph(fn, torch, repeat, inner)
    except RuntimeError:  # an operator that cannot be captured: keep the eager time
        torch.cuda.synchronize()
        return eager, None


def _cuda_eager(fn, torch, repeat, inner):
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def _cuda_graph(fn, torch, repeat, inner):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def _nhwc_time(op, attrs, args, torch, repeat, inner) -> float | None:
    """A convolution's kernel time with input and kernel in channels-last memory (CUDA graph)."""
    if op != "conv2d" or len(args) < 2 or args[0].dim() != 4 or args[1].dim() != 4:
        return None
    from ..semantics.torch_lowering import LOWERING
    x, w = (a.contiguous(memory_format=torch.channels_last) for a in args[:2])
    rest = args[2:]
    try:
        return round(_cuda_graph(lambda: LOWERING[op](attrs, x, w, *rest), torch, repeat, inner), 3)
    except RuntimeError:
        torch.cuda.synchronize()
        return None


def _each_conv(prof: Profile, fill, progress: bool, deadline: float | None, setting: str) -> int:
    """Call ``fill(entry, args)`` for each convolution of a CUDA profile, at the profile's
    precision on the visible GPU (which must be the profile's device), with inputs of the
    entry's shapes; stops past ``deadline``. Returns how many were measured (also recorded in
    the profile's settings under ``setting``)."""
    import torch
    _check_device(prof, torch)
    set_precision(prof.precision)
    torch.manual_seed(0)
    done = 0
    convs = [e for e in prof.entries.values() if e.op == "conv2d"]
    with torch.no_grad():
        for e in _progress(convs, progress):
            if deadline is not None and time.monotonic() > deadline:
                break
            done += bool(fill(e, _inputs(e.op, [TensorType(tuple(s), e.dtype) for s in e.inputs], "cuda", torch)))
    prof.settings[setting] = done
    return done


def _check_device(prof: Profile, torch) -> None:
    key, _ = _device_names("cuda", torch)
    if key != prof.device:
        raise CostError(f"the profile was measured on {prof.device}, this GPU is {key}")


def measure_channels_last(prof: Profile, repeat: int = 15, inner: int = 10, progress: bool = True,
                          deadline: float | None = None) -> int:
    """Fill in ``nhwc_us`` of a CUDA profile's convolutions; returns how many were measured."""
    import torch

    def fill(e, args):
        t = _nhwc_time(e.op, dict(e.attrs), args, torch, repeat, inner)
        if t is not None:  # not measurable here: keep what the profile had
            e.nhwc_us = t
        return t is not None
    return _each_conv(prof, fill, progress, deadline, "channels_last_measured")


def _conv_relu_time(attrs, args, torch, repeat, inner, channels_last: bool) -> float | None:
    """Kernel time (CUDA graph) of cuDNN's convolution + bias + ReLU as one call, in the layout."""
    if len(args) < 2 or args[0].dim() != 4 or args[1].dim() != 4 or attrs.get("activation", "none") != "none":
        return None
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, w = (a.contiguous(memory_format=fmt) for a in args[:2])
    bias = torch.randn(w.shape[0], device=w.device, dtype=w.dtype)
    stride, padding, groups = list(attrs["stride"]), list(attrs["padding"]), int(attrs["groups"])
    try:
        return round(_cuda_graph(lambda: torch.cudnn_convolution_relu(x, w, bias, stride, padding, [1, 1], groups),
                                 torch, repeat, inner), 3)
    except RuntimeError:  # no fused engine for this shape: not measured, never fused
        torch.cuda.synchronize()
        return None


def measure_conv_relu(prof: Profile, repeat: int = 15, inner: int = 10, progress: bool = True,
                      deadline: float | None = None) -> int:
    """Fill in ``relu_us`` and ``nhwc_relu_us`` of a CUDA profile's convolutions (cuDNN's fused
    convolution + bias + ReLU); returns how many convolutions were measured."""
    import torch

    def fill(e, args):
        e.relu_us = _conv_relu_time(dict(e.attrs), args, torch, repeat, inner, False)
        e.nhwc_relu_us = _conv_relu_time(dict(e.attrs), args, torch, repeat, inner, True)
        return True
    return _each_conv(prof, fill, progress, deadline, "conv_relu_measured")


def measure_generated_kernels(prof: Profile, repeat: int = 15, inner: int = 10) -> tuple[float, float] | None:
    """Time kernels that Inductor generates (``relu(x + b)`` over 2^10 to 2^24 elements at the
    profile's precision, each inside a CUDA graph, as a compiled model runs them) and store the
    fitted line ``time = floor + bytes / bandwidth`` in the profile's settings
    (``generated_kernel_line``: floor in us, bandwidth in bytes/s), which the Inductor cost model
    prices its fused kernels by; returns it. The profile's own pointwise operators are ATen
    kernels, about twice as slow at small sizes as Inductor's (H100, bf16: 3.5 us floor against
    about 1.5 us)."""
    import torch
    from .fusion import fit_kernel_line
    _check_device(prof, torch)
    dtype = getattr(torch, precision_dtype(prof.precision))
    fn = torch.compile(lambda x, b: torch.relu(x + b), dynamic=False)
    points = []
    with torch.no_grad():
        for k in range(10, 25, 2):
            x, b = (torch.randn(2 ** k, device="cuda", dtype=dtype) for _ in range(2))
            t = _cuda_graph(lambda: fn(x, b), torch, repeat, inner)
            points.append((3.0 * x.numel() * x.element_size(), t))
    fit = fit_kernel_line(points)
    if fit is not None:
        prof.settings["generated_kernel_line"] = [round(fit[0], 3), round(fit[1])]
        prof.settings["generated_kernel_points"] = [[int(b), round(t, 3)] for b, t in points]
    return fit


def _device_names(device, torch):
    if device == "cpu":
        import platform
        return "cpu", platform.processor() or platform.machine() or "cpu"
    if not torch.cuda.is_available():
        raise CostError("torch sees no CUDA device here; profile with --device cpu, or run on a GPU machine")
    name = torch.cuda.get_device_name(0)
    return device_key(name), name


def set_precision(precision: str) -> None:
    """Turn TF32 on for ``tf32``, off otherwise (matmuls and cuDNN convolutions)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


def _progress(items, progress):
    if not progress:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="profiling", unit="op")


def measure_graphs(graphs: Mapping[str, Graph], device: str = "cuda", warmup: int = 5, repeat: int = 15,
                   inner: int = 10, progress: bool = True, deadline: float | None = None,
                   precision: str = "fp32", ops: dict | None = None) -> Profile:
    """Measure every distinct operator of ``graphs`` (name -> graph; or ``ops``, a table from
    :func:`distinct_ops`) on ``device`` at ``precision``; past ``deadline`` (a ``time.monotonic()``
    value) the rest is left out and counted in the settings."""
    import torch
    from ..semantics.torch_lowering import LOWERING
    if device not in ("cpu", "cuda"):
        raise CostError(f"--device must be cpu or cuda, got {device!r}")
    key, full = _device_names(device, torch)
    dtype = precision_dtype(precision)
    ops = distinct_ops(graphs) if ops is None else ops
    prof = Profile(device=key, device_name=full, torch_version=torch.__version__, dtype=dtype, precision=precision,
                   cuda_version=str(torch.version.cuda or ""),
                   settings={"warmup": warmup, "repeat": repeat, "inner": inner, "models": sorted(graphs)})
    set_precision(precision)
    torch.manual_seed(0)
    with torch.no_grad():
        for k, (op, attrs, ins, models) in _progress(list(ops.items()), progress):
            if deadline is not None and time.monotonic() > deadline:
                prof.settings["left_out_past_deadline"] = len(ops) - len(prof.entries)
                break
            args = _inputs(op, ins, device, torch, dtype)
            fn = LOWERING[op]
            try:
                eager, graph = time_call(lambda: fn(attrs, *args), device, warmup, repeat, inner)
            except RuntimeError as e:  # out of memory, an unsupported case: note it and go on
                prof.settings.setdefault("errors", {})[k] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            nhwc = relu = nhwc_relu = None
            if device == "cuda" and op == "conv2d":
                nhwc = _nhwc_time(op, attrs, args, torch, repeat, inner)
                relu = _conv_relu_time(attrs, args, torch, repeat, inner, False)
                nhwc_relu = _conv_relu_time(attrs, args, torch, repeat, inner, True)
            prof.add(ProfileEntry(op, {a: v for a, v in attrs.items()}, [list(t.shape) for t in ins],
                                  dtype, round(eager, 3), None if graph is None else round(graph, 3), models,
                                  nhwc_us=nhwc, relu_us=relu, nhwc_relu_us=nhwc_relu))
    prof.launch_overhead_us = _launch_overhead(prof)
    if device == "cuda":
        measure_generated_kernels(prof, repeat, inner)
    return prof


def _launch_overhead(prof: Profile) -> float | None:
    """Median of eager minus graph time over the measured entries (None on the CPU)."""
    gaps = [e.eager_us - e.graph_us for e in prof.entries.values() if e.graph_us is not None]
    return round(statistics.median(gaps), 3) if gaps else None
