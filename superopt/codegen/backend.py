"""``torch.compile(model, backend="superopt")``: superopt's rewrites, then Inductor.

Dynamo hands the backend an FX graph whose weights (parameters and buffers) arrive as graph
inputs. The backend freezes them (as Inductor's ``freezing`` does: the compiled function
assumes they do not change), exports the graph with ``torch.export`` at the example inputs'
shapes, imports it into the IR (unknown operators become opaque nodes), searches for a cheaper
equal graph under the Inductor cost model of the device and precision the inputs are on,
checks the result's outputs against the original graph's, and hands the optimized graph to
Inductor (``compile_fx``). When anything on the way fails, or the cost model says the
rewritten graph is not cheaper, Inductor compiles the original graph instead: the backend is
never worse than Inductor by its own model, and a failure costs a warning, not the program.

Options (``torch.compile(m, backend="superopt", mode=..., options={...})``): ``rules`` (a rule
database path, or ``examples``), ``budget``, ``time_limit``, ``alpha`` (the search),
``device``/``dtype`` (the cost model; default: where the inputs are), ``freezing`` (Inductor's,
default True), ``inductor`` (False: run the optimized FX module without Inductor), ``mode``
(Inductor's: ``reduce-overhead``, ``max-autotune``...; torch.compile refuses ``mode=`` together
with ``options=``, so it goes here when options are given), ``search`` (False: import and
generate code without rewriting, to measure what the rewrites alone change), ``layout``
(``choose``, the default: run the convolutions in the memory layout the profile says is
cheaper and set Inductor's layout flags to it; ``inductor``: leave it to Inductor's own rule,
which on an H100 picks channels-last for most CNNs also in fp32, where cuDNN's channels-last
convolutions are slower), ``conv_relu`` (True, the default: a convolution with its bias, residual
add and ReLU runs as one cuDNN call, :mod:`.cudnn`, where the profile measured that call faster
than Inductor's convolution plus its Triton epilogue; H100, ResNet-50 at batch 1 in bf16: 1.15x).
Optimized graphs are cached by a
hash of the graph's code, the inputs' types and the weights' identity, so a recompile of the
same graph skips the search (and Inductor's own cache skips its compile).

The ``torch_dynamo_backends`` entry point in ``pyproject.toml`` names :func:`superopt_backend`,
so an installed superopt is found by name; :func:`register` does the same by hand.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import torch

__all__ = ["BackendOptions", "superopt_backend", "register", "clear_cache", "last_report", "CACHE"]

#: graph key -> (optimized GraphModule or None for "keep the original", report dict)
CACHE: dict[str, tuple] = {}


@dataclass
class BackendOptions:
    """What ``options={...}`` may set (see the module docstring)."""

    rules: str | None = None
    budget: int = 300
    time_limit: float = 20.0
    alpha: float = 1.05
    device: str | None = None
    dtype: str | None = None
    freezing: bool = True
    inductor: bool = True
    mode: str | None = None
    tolerance: float | None = None
    search: bool = True
    layout: str = "choose"
    conv_relu: bool = True

    @staticmethod
    def from_dict(options: dict | None) -> "BackendOptions":
        names = {f.name for f in fields(BackendOptions)}
        bad = set(options or {}) - names
        if bad:
            raise ValueError(f"superopt backend: unknown option(s) {', '.join(sorted(bad))}; known: "
                             f"{', '.join(sorted(names))}")
        opts = BackendOptions(**(options or {}))
        if opts.layout not in ("choose", "inductor"):
            raise ValueError(f"superopt backend: layout must be 'choose' or 'inductor', got {opts.layout!r}")
        return opts


def register() -> None:
    """Make ``backend="superopt"`` known to dynamo without installing the package."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "superopt" not in _BACKENDS:
        register_backend(name="superopt")(superopt_backend)


def clear_cache() -> None:
    CACHE.clear()


def _is_weight(x) -> bool:
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None


def _key(gm: torch.fx.GraphModule, inputs: Sequence, opts: BackendOptions) -> str:
    h = hashlib.sha256(gm.code.encode())
    for x in inputs:
        if isinstance(x, torch.Tensor):
            h.update(repr((tuple(x.shape), x.dtype, x.device.type)).encode())
            if _is_weight(x):
                h.update(repr((x.data_ptr(), x._version)).encode())
        else:
            h.update(repr(x).encode())
    search = (opts.rules, opts.budget, opts.time_limit, opts.alpha, opts.device, opts.dtype, opts.tolerance, opts.search,
              opts.layout, opts.conv_relu)
    h.update(repr((search, torch.backends.cuda.matmul.allow_tf32)).encode())  # not mode/freezing: same search
    return h.hexdigest()


def _frozen(gm: torch.fx.GraphModule, inputs: Sequence) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of ``gm`` whose weight inputs are buffers; the positions of the remaining inputs."""
    graph = torch.fx.Graph()
    env: dict = {}
    root = torch.nn.Module()
    user: list[int] = []
    pos = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            x = inputs[pos]
            if _is_weight(x):
                name = f"w{pos}"
                root.register_buffer(name, x.detach())
                env[node] = graph.get_attr(name)
            else:
                env[node] = graph.placeholder(node.name)
                user.append(pos)
            pos += 1
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    for name, mod in gm.named_children():
        root.add_module(name, mod)
    for name, buf in gm.named_buffers(recurse=False):
        root.register_buffer(name, buf)
    for name, p in gm.named_parameters(recurse=False):
        root.register_parameter(name, p)
    return torch.fx.GraphModule(root, graph), user


def _precision(inputs: Sequence, opts: BackendOptions) -> str:
    if opts.dtype:
        return opts.dtype
    dts = {x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()}
    if torch.bfloat16 in dts:
        return "bf16"
    if torch.float16 in dts:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def _cost_model(inputs: Sequence, opts: BackendOptions):
    from ..cost import choose_cost_model
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    device = opts.device or ("cuda" if on_gpu else "cpu")
    # Inductor's freezing passes merge sibling matmuls themselves; without Inductor nothing does
    layout = "choose" if opts.layout == "choose" and opts.inductor else "inductor"
    return choose_cost_model(device, _precision(inputs, opts), "inductor", freezing=opts.freezing and opts.inductor,
                             layout=layout, conv_relu=opts.conv_relu)


def _rules(opts: BackendOptions):
    from ..search.pipeline import DEFAULT_RULES, load_rules
    if opts.rules == "examples":
        return load_rules(examples=True)
    return load_rules(opts.rules or DEFAULT_RULES)


def _search(graph, rules, cost, opts: BackendOptions):
    """The one call into the search (kept here alone so that a new search API changes one place)."""
    from ..search import search
    return search(graph, rules, cost, alpha=opts.alpha, budget=opts.budget, time_limit=opts.time_limit,
                  progress=False).graph


def _optimize(frozen: torch.fx.GraphModule, user_inputs: list, opts: BackendOptions) -> tuple:
    """(optimized GraphModule or None, report): None when nothing cheaper was found."""
    from ..frontend import from_module
    from ..search.cse import eliminate_common_subexpressions as cse
    from ..search.fold import fold_constants
    from .fx import to_fx
    cost, said = _cost_model(user_inputs, opts)
    # imported on the CPU in float32 (the rules' proofs speak float32; the cost model prices the
    # graph at the inputs' precision all the same), run in the inputs' dtype again below
    cpu_in = [x.detach().cpu().float() if isinstance(x, torch.Tensor) and x.is_floating_point()
              else (x.cpu() if isinstance(x, torch.Tensor) else x) for x in user_inputs]
    graph = cse(fold_constants(from_module(copy.deepcopy(frozen).cpu().float(), cpu_in, source="dynamo graph")[0]))
    best = cse(fold_constants(_search(graph, _rules(opts), cost, opts))) if opts.search else graph
    before, after = cost.graph_cost(graph), cost.graph_cost(best)
    rep = {"cost_model": said, "cost_before_us": round(before, 2), "cost_after_us": round(after, 2)}
    no_gain = opts.search and not after < before
    if no_gain:
        best = graph
    nhwc = cost.channels_last_for(best)
    if cost.layout == "choose":  # the layout Inductor is told to use, and what its own rule would do
        rep["channels_last"] = nhwc
        rep["inductor_would_pick_channels_last"] = cost.channels_last_for(best, layout="inductor")
        # what Inductor alone makes of the imported graph
        rep["cost_inductor_rule_us"] = round(cost.graph_cost(graph, layout="inductor", conv_relu=False), 2)
    if no_gain:
        return None, {**rep, "kept": "original (no cheaper graph)"}
    fusions = cost.conv_relu_fusions(best)
    rep["conv_relu_fused"] = len(fusions)
    # attention as one sdpa call only where a flash kernel runs it (half precision; H100, ViT-B/16
    # at batch 1: 1.17x in bf16, 0.95x in float32 against Inductor's own code for the ops)
    module = to_fx(best, attention=_precision(user_inputs, opts) in ("bf16", "fp16"), conv_relu=fusions,
                   channels_last=nhwc)
    _tuple_output(module)
    first = next((x for x in user_inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    dev = next((x.device for x in user_inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    kept = "optimized" if opts.search else "imported (search off)"
    return module.to(dev, first.dtype if first is not None else None), {**rep, "kept": kept}


def _tuple_output(gm: torch.fx.GraphModule) -> None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
        gm.recompile()


def _same_outputs(got, want, tolerance: float) -> bool:
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape:
                return False
            a, b = a.double(), b.double()
            scale = max(b.abs().max().item() if b.numel() else 0.0, 1e-30)
            if not (a - b).abs().max().item() / scale <= tolerance:
                return False
    return True


def _inductor(gm: torch.fx.GraphModule, inputs: list, mode, opts: BackendOptions,
              channels_last: bool | None = None) -> Callable:
    """Inductor's compile of ``gm``; ``channels_last`` (the cost model's layout, None: Inductor's
    own rule) sets its layout optimization on or off."""
    if not opts.inductor:
        return gm
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    patches = dict(list_mode_options(mode) if mode else {})
    patches["freezing"] = opts.freezing
    if channels_last is not None:
        patches["layout_optimization"] = patches["force_layout_optimization"] = channels_last
    return compile_fx(gm, inputs, config_patches=patches)


def superopt_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                     options: dict | None = None) -> Callable:
    """The dynamo backend (see the module docstring)."""
    opts = BackendOptions.from_dict(options)
    mode = mode or opts.mode
    key = _key(gm, example_inputs, opts)
    frozen, user = _frozen(gm, example_inputs)
    user_inputs = [example_inputs[i] for i in user]
    if key not in CACHE:
        try:
            with torch.no_grad():
                module, rep = _optimize(frozen, user_inputs, opts)
                if module is not None:
                    tol = opts.tolerance or (5e-2 if _precision(user_inputs, opts) in ("bf16", "fp16") else 1e-3)
                    if not _same_outputs(module(*user_inputs), frozen(*user_inputs), tol):
                        module, rep = None, {**rep, "kept": "original (outputs differ)"}
        except Exception as e:  # any failure: Inductor on the original graph
            warnings.warn(f"superopt backend: {type(e).__name__}: {str(e)[:300]}; compiling the original graph")
            module, rep = None, {"kept": f"original ({type(e).__name__})"}
        CACHE[key] = (module, rep)
    module, rep = CACHE[key]
    layout = rep.get("channels_last")
    if module is None and not opts.inductor:
        return gm.forward
    if module is None and len(user) == len(example_inputs):
        # dynamo made the weights constants itself (Inductor's freezing flag was set while it
        # traced): the original graph goes to Inductor exactly as torch.compile would send it
        return _inductor(gm, list(example_inputs), mode, opts, layout)
    # else the original graph goes to Inductor frozen as well (weights as constants, like the
    # optimized one): handed Inductor's freezing flag with the weights still graph inputs, it
    # compiled code up to 1.3x slower than with no freezing at all (H100, ResNet-50 at batch 16)
    compiled = _inductor(frozen if module is None else module, user_inputs, mode, opts, layout)

    def run(*args):
        return compiled(*[args[i] for i in user])
    return run


def last_report(gm_key: str | None = None) -> Any:
    """The report of the last (or a given) cached graph: cost model, costs, what was kept."""
    if not CACHE:
        return None
    return CACHE[gm_key][1] if gm_key else list(CACHE.values())[-1][1]
