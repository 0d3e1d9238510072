"""Measuring operators with torch: the numbers behind a profile.

Each distinct operator application of the given graphs (same operator, attributes, input
shapes and dtype) is run on random inputs through the torch lowering. On CUDA: a warm-up,
then ``repeat`` timings of ``inner`` back-to-back calls between CUDA events (the eager time,
launch overhead included, since the GPU waits for the CPU on small kernels), and the same
calls captured in a CUDA graph and replayed (the kernel time alone: the graph's own launch is
left out, :func:`_cuda_graph`). The median of each is kept. On the CPU both come from
``time.perf_counter`` and the graph time is left out.

``precision`` says how: ``fp32`` with TF32 off for matmuls and convolutions, ``tf32`` with it
on, ``bf16``/``fp16`` on tensors of that dtype (a float32 graph is measured cast).

A convolution's CUDA-graph times are taken as a model runs it: its input hot in the L2 cache
(the previous kernel just wrote it) and its weights read from memory (a forward pass reads each
weight once, and a CNN's weights outgrow the L2). The graph calls it on copies of the weights in
turn, enough copies to spill the L2 (:func:`_conv_time`). Timed hot, as the other operators
are, fp32 NCHW convolutions at batch 1 ran 1.3x faster than inside ResNet-50 and Inception-v3
(H100, kernel sums from the profiler); with the weights cold, the sums came within 4% in both
layouts and precisions. They are timed in both layouts, the input and kernel also in
channels-last memory (``nhwc_us``): Inductor lays a convolutional graph out that way when its
heuristic says so (:mod:`superopt.cost.layout`), and some convolutions cost very differently
there (fp32: cuDNN transposes around an NCHW kernel; grouped ones in bf16), and as cuDNN's fused
convolution + bias + ReLU (``relu_us``, ``nhwc_relu_us``; :mod:`superopt.codegen.cudnn`).
A matmul by a matrix is also timed as the generated code runs it with a bias, one ``F.linear``
call (``linear_us``, :func:`_linear_time`).
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

__all__ = ["cuda_graph", "l2_flush", "replay_medians", "distinct_ops", "measure_graphs", "measure_convs", "measure_graph_times", "set_precision", "time_call"]


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


def l2_flush(nbytes: int = 256 << 20) -> Callable[[], object]:
    """A call that evicts the L2 cache by *reading* ``nbytes`` (a max over a zeroed buffer).
    A write (``zero_``) leaves the L2 full of dirty lines, and the next kernel then pays their
    write-back: on an H100 a 1x4096->4096 bf16 linear timed 19.6 us after a 256 MB write and
    16.2 us after a read (``scripts/check_split_gpu.py --calibrate``); in a model the kernel before a layer leaves mostly clean lines (the
    previous layer's weights), which is what a read leaves."""
    import torch
    buf = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
    return lambda: torch.amax(buf)


def cuda_graph(fn, calls: int = 1, warm: bool = True):
    """``calls`` calls of ``fn()`` captured in one CUDA graph, after three warm-up calls on a side
    stream (``warm``; capture needs the allocations and lazy initialisations done); the graph and
    the last captured call's output (what a replay writes)."""
    import torch
    if warm:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
    graph, out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    return graph, out


def _cuda_graph(fn, torch, repeat, inner):
    """Microseconds per call inside a CUDA graph, the graph's launch left out: two graphs, of
    ``inner`` and ``2 * inner`` calls, replayed in turn; a call costs the difference of their
    median times over ``inner``. (One graph's time over its calls charged each call a share of
    the launch, 7 to 12 us a replay on an H100: at 5 calls a ReLU was priced 3.4 us that ran
    1.4 us inside ResNet-50, and a view that runs no kernel 2 us.) What is left is the kernel
    and the gap before the next one, as in a model's graph."""
    graphs = []
    for calls in (inner, 2 * inner):
        graph, _ = cuda_graph(fn, calls, warm=not graphs)
        graph.replay()
        graphs.append(graph)
    one, two = replay_medians(graphs, repeat)
    return max(0.0, (two - one) / inner)


def replay_medians(graphs, repeat: int, before: Callable[[], object] | None = None) -> list[float]:
    """Median microseconds of one replay of each of ``graphs`` (CUDA events around the replay),
    the graphs replayed in turn ``repeat`` times, ``before()`` queued ahead of each replay."""
    import torch
    samples: list[list] = [[] for _ in graphs]
    for _ in range(max(1, repeat)):
        for graph, out in zip(graphs, samples):
            if before is not None:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
    return [statistics.median(x) for x in samples]


def _linear_time(args, torch, repeat, inner) -> float | None:
    """A matmul by a 2-d matrix as the generated code runs it with a bias: one ``F.linear``
    call, its matrix stored transposed (:mod:`superopt.codegen.epilogue`). cuBLAS picks other
    kernels for it than for ``x @ w``: in fp32 on an H100 some ran 2x slower (a split-K kernel
    for BERT's 768x768 projections at batch 1), in bf16 and TF32 most ran as fast or faster.
    None for other matmuls."""
    if len(args) != 2 or args[1].dim() != 2 or args[0].dim() < 2:
        return None
    x, w = args
    wt, b = w.t().contiguous(), torch.randn(w.shape[1], device=w.device, dtype=w.dtype)
    return round(_cuda_graph(lambda: torch.nn.functional.linear(x, wt, b), torch, repeat, inner), 3)


#: copies of a convolution's weights the timing cycles through: enough to spill the L2 twice
#: over, at most this many (below about 2 MB of weights the rest of the L2 misses cost little)
MAX_WEIGHT_COPIES = 64


def _conv_time(attrs, args, torch, repeat, channels_last: bool, relu: bool) -> float | None:
    """Microseconds of one convolution kernel inside a CUDA graph, in NCHW or channels-last
    memory, alone (``relu`` False: the lowering's ``conv2d``) or as cuDNN's fused convolution +
    bias + ReLU; its weights cold, its input hot (module docstring). None where it cannot run
    (no fused engine for the shape, a convolution that is not 2-d)."""
    if len(args) < 2 or args[0].dim() != 4 or args[1].dim() != 4:
        return None
    if relu and attrs.get("activation", "none") != "none":
        return None
    from ..semantics.torch_lowering import LOWERING
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, w = (a.contiguous(memory_format=fmt) for a in args[:2])
    if relu:
        bias = torch.randn(w.shape[0], device=w.device, dtype=w.dtype)
        stride, padding, groups = list(attrs["stride"]), list(attrs["padding"]), int(attrs["groups"])
        def call(k):
            return torch.cudnn_convolution_relu(x, k, bias, stride, padding, [1, 1], groups)
    else:
        rest = args[2:]
        def call(k):
            return LOWERING["conv2d"](attrs, x, k, *rest)
    l2 = getattr(torch.cuda.get_device_properties(w.device), "L2_cache_size", 50 * 2 ** 20)
    copies = max(2, min(MAX_WEIGHT_COPIES, -(-2 * l2 // (w.numel() * w.element_size()))))
    weights = [w.clone() for _ in range(copies)]

    def cycle():
        for k in weights:
            call(k)
    try:
        return round(_cuda_graph(cycle, torch, repeat, 1) / copies, 3)
    except RuntimeError:  # no engine for this shape or layout: not measured
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


def measure_convs(prof: Profile, repeat: int = 15, progress: bool = True, deadline: float | None = None) -> int:
    """Measure again every convolution of a CUDA profile the way :func:`measure_graphs` does
    (``graph_us``, ``nhwc_us``, ``relu_us``, ``nhwc_relu_us``: :func:`_conv_time`), keeping
    a time where it cannot be measured now; returns how many convolutions were measured."""
    import torch

    def fill(e, args):
        times = {(cl, relu): _conv_time(dict(e.attrs), args, torch, repeat, cl, relu)
                 for cl in (False, True) for relu in (False, True)}
        e.graph_us = times[False, False] if times[False, False] is not None else e.graph_us
        e.nhwc_us = times[True, False] if times[True, False] is not None else e.nhwc_us
        e.relu_us, e.nhwc_relu_us = times[False, True], times[True, True]
        return times[False, False] is not None
    done = _each_conv(prof, fill, progress, deadline, "convs_measured")
    prof.settings["conv_weights"] = "cold"
    return done


#: how graph times are taken (``settings.graph_times``): per call, the graph's launch left out
GRAPH_TIMES = "per call, launch left out"


def measure_graph_times(prof: Profile, repeat: int = 15, inner: int = 10, progress: bool = True,
                        deadline: float | None = None) -> int:
    """Measure again the CUDA-graph time of every operator of a CUDA profile but convolutions
    (:func:`_cuda_graph`; eager times are kept), and a matmul's time as ``F.linear`` with a bias
    (``linear_us``, :func:`_linear_time`); the launch overhead is recomputed. Returns how many
    were measured (also in ``settings.graph_times_measured``)."""
    import torch
    from ..semantics.torch_lowering import LOWERING
    _check_device(prof, torch)
    set_precision(prof.precision)
    torch.manual_seed(0)
    done = 0
    todo = [e for e in prof.entries.values() if e.op != "conv2d" and e.graph_us is not None]
    with torch.no_grad():
        for e in _progress(todo, progress):
            if deadline is not None and time.monotonic() > deadline:
                break
            args = _inputs(e.op, [TensorType(tuple(s), e.dtype) for s in e.inputs], "cuda", torch)
            fn, attrs = LOWERING[e.op], dict(e.attrs)
            try:
                e.graph_us = round(_cuda_graph(lambda: fn(attrs, *args), torch, repeat, inner), 3)
                e.linear_us = _linear_time(args, torch, repeat, inner) if e.op == "matmul" else None
            except RuntimeError:  # out of memory, say: keep the old time
                torch.cuda.synchronize()
                continue
            done += 1
    prof.settings.update(graph_times=GRAPH_TIMES, graph_times_measured=done, inner=inner, repeat=repeat)
    prof.launch_overhead_us = _launch_overhead(prof)
    return done


def measure_generated_kernels(prof: Profile, repeat: int = 15, inner: int = 10) -> tuple[float, float] | None:
    """Time kernels that Inductor generates (``relu(x + b)`` over 2^10 to 2^24 elements at the
    profile's precision, each inside a CUDA graph, as a compiled model runs them) and store the
    points (``generated_kernel_points``: bytes, us), which the Inductor cost model prices its
    fused kernels by (:meth:`superopt.cost.CostModel.generated_us`), and the fitted line
    ``time = floor + bytes / bandwidth`` (``generated_kernel_line``: floor in us, bandwidth in
    bytes/s), which profiles without points were priced by; returns the line. The profile's own pointwise operators are ATen
    kernels, about twice as slow at small sizes as Inductor's (H100, bf16: 3.5 us floor against
    about 1.5 us)."""
    import torch
    from .fusion import fit_kernel_line
    _check_device(prof, torch)
    dtype = getattr(torch, precision_dtype(prof.precision))
    torch._dynamo.reset()  # one compile per size: a second profile's would pass dynamo's recompile limit
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
            nhwc = relu = nhwc_relu = linear = None
            if device == "cuda" and op == "matmul":
                linear = _linear_time(args, torch, repeat, inner)
            if device == "cuda" and op == "conv2d":
                conv = {(cl, r): _conv_time(attrs, args, torch, repeat, cl, r) for cl in (False, True)
                        for r in (False, True)}
                graph = conv[False, False] if conv[False, False] is not None else graph
                nhwc, relu, nhwc_relu = conv[True, False], conv[False, True], conv[True, True]
            prof.add(ProfileEntry(op, {a: v for a, v in attrs.items()}, [list(t.shape) for t in ins],
                                  dtype, round(eager, 3), None if graph is None else round(graph, 3), models,
                                  nhwc_us=nhwc, relu_us=relu, nhwc_relu_us=nhwc_relu, linear_us=linear))
    prof.launch_overhead_us = _launch_overhead(prof)
    if device == "cuda":
        prof.settings["conv_weights"] = "cold"
        prof.settings["graph_times"] = GRAPH_TIMES
        measure_generated_kernels(prof, repeat, inner)
    return prof


def _launch_overhead(prof: Profile) -> float | None:
    """Median of eager minus graph time over the measured entries but convolutions, whose graph
    time is taken with cold weights (None on the CPU)."""
    gaps = [e.eager_us - e.graph_us for e in prof.entries.values() if e.graph_us is not None and e.op != "conv2d"]
    return round(statistics.median(gaps), 3) if gaps else None
