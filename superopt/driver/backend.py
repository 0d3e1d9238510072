"""``torch.compile(model, backend="superopt")``: the driver's ``optimize``, then Inductor.

A thin adapter: dynamo hands the backend an FX graph whose weights (parameters and buffers)
arrive as graph inputs; the backend freezes them (as Inductor's ``freezing`` does), imports the
graph (on the CPU in float32: the rules' proofs speak float32, the cost model prices the graph at
the inputs' precision all the same), runs :func:`superopt.driver.optimize` with the same
defaults, passes and output check as ``superopt optimize``, and hands Inductor the module the
CLI would write, under Inductor's own configuration (what a user's ``torch.compile`` of the
written program gets). A graph that writes into its inputs (a decode step's static KV cache:
``cache.index_copy_(...)``, ``x[i] = v``, also through a view) is optimized too: the import
functionalizes the writes (the new values become outputs, as ``torch.export`` does), and the
module Inductor gets copies them back into the caller's tensors (``aten.copy_`` inside the
compiled graph, so ``mode="reduce-overhead"`` keeps one CUDA graph where the inputs are static
addresses, as HF's ``StaticCache`` marks them). Where nothing is rewritten and no layout or
library-call choice is kept, or anything on the way fails (a warning says what), Inductor gets
exactly what ``torch.compile`` alone would give it: the same graph, the same configuration.

Options (``torch.compile(m, backend="superopt", mode=..., options={...})``): every field of
:class:`superopt.driver.Options` (``search`` excepted: here ``method``), and ``rules`` (a rule
database path, or ``examples``), ``device``/``dtype`` (the cost model; default: where the
inputs are), ``freezing`` (Inductor's, for the optimized module; default True), ``inductor``
(False: run the optimized FX module without Inductor), ``mode`` (Inductor's; torch.compile
refuses ``mode=`` together with ``options=``, so it goes here when options are given),
``search`` (False: no rewriting, the layout and library-call choices alone). Optimized graphs
are cached by a hash of the graph's code, the inputs' types and the weights' identity.

The ``torch_dynamo_backends`` entry point in ``pyproject.toml`` names :func:`superopt_backend`,
so an installed superopt is found by name; :func:`register` does the same by hand.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import operator
import warnings
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Sequence

import torch
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend
from torch._dynamo.source import ConstantSource
from torch._dynamo.utils import counters

from ..codegen import to_fx
from ..codegen.inductor import compile_inductor, freeze, is_weight, tuple_output
from ..cost import choose_cost_model
from ..frontend import import_program
from ..frontend.torch_import import export_module
from ..rules.load import DEFAULT_RULES, load_rules
from .model import LoadedModel
from .options import OptionError, Options
from .passes import PASSES, Pass
from .pipeline import optimize
from .precision import HALF, as_float32, code_at_precision, dtypes_of, output_types, runs_at_precision

__all__ = ["BackendOptions", "superopt_backend", "register", "clear_cache", "last_report", "CACHE",
           "updated_inputs", "write_back", "as_float32", "as_cpu", "as_dynamo_graph",
           "lift_written_attributes"]

#: graph key -> (optimized GraphModule or None for "Inductor gets the original", report dict)
CACHE: dict[str, tuple] = {}
_DRIVER = {f.name for f in fields(Options)} - {"search"}


@dataclass
class BackendOptions:
    """What ``options={...}`` may set beyond :class:`Options` (see the module docstring)."""

    rules: str | None = None
    device: str | None = None
    dtype: str | None = None
    freezing: bool = True
    inductor: bool = True
    mode: str | None = None
    search: bool = True
    method: str = "saturate"
    driver: Options = Options()

    @staticmethod
    def from_dict(options: dict | None) -> "BackendOptions":
        own = {f.name for f in fields(BackendOptions)} - {"driver"}
        options = dict(options or {})
        bad = set(options) - own - _DRIVER
        if bad:
            raise OptionError(f"superopt backend: unknown option(s) {', '.join(sorted(bad))}; known: "
                              f"{', '.join(sorted(own | _DRIVER))}")
        driver = {k: options.pop(k) for k in list(options) if k in _DRIVER}
        opts = BackendOptions(**options)
        opts.driver = Options.from_dict({**driver, "search": opts.method})
        return opts


def register() -> None:
    """Make ``backend="superopt"`` name this module's backend, whatever an installed package's
    entry point says (an older install may name another module)."""
    if _COMPILER_FNS.get("superopt") is not superopt_backend:
        _COMPILER_FNS.pop("superopt", None)
        _BACKENDS.pop("superopt", None)
        register_backend(name="superopt")(superopt_backend)


def clear_cache() -> None:
    CACHE.clear()


def _key(gm: torch.fx.GraphModule, inputs: Sequence, opts: BackendOptions) -> str:
    h = hashlib.sha256(gm.code.encode())
    for x in inputs:
        if isinstance(x, torch.Tensor):
            h.update(repr((tuple(x.shape), x.dtype, x.device.type)).encode())
            if is_weight(x):
                h.update(repr((x.data_ptr(), x._version)).encode())
        else:
            h.update(repr(x).encode())
    search = (opts.rules, opts.device, opts.dtype, opts.search, opts.inductor, asdict(opts.driver))
    h.update(repr((search, torch.backends.cuda.matmul.allow_tf32)).encode())  # not mode/freezing: same search
    return h.hexdigest()


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
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    device = opts.device or ("cuda" if on_gpu else "cpu")
    # without Inductor nothing merges sibling matmuls or picks a layout: price what runs
    layout = opts.driver.layout if opts.inductor else "inductor"
    return choose_cost_model(device, _precision(inputs, opts), "inductor", freezing=opts.freezing and opts.inductor,
                             layout=layout, conv_relu=opts.driver.conv_relu)


def _rules(opts: BackendOptions):
    if opts.rules == "examples":
        return load_rules(examples=True)
    return load_rules(opts.rules or DEFAULT_RULES)


def _as_imported(run) -> None:
    run.best = run.graph
    run.report.cost_after = run.report.cost_before


def _passes(opts: BackendOptions) -> list[Pass]:
    """The driver's passes; with ``search`` off, the imported graph instead of the search's."""
    if opts.search:
        return PASSES
    return [p if p.name != "search" else Pass("as imported", _as_imported) for p in PASSES if p.name != "keep if cheaper"]


def _on_cpu(x, float32: bool = True):
    """An input as the import wants it (CPU; float32, or its own dtype), never sharing memory with
    the caller's tensor: the reference run writes into the inputs of a graph that updates them."""
    if not isinstance(x, torch.Tensor):
        return x
    y = x.detach().cpu()
    y = y.float() if float32 and y.is_floating_point() else y
    return y.clone() if y.data_ptr() == x.data_ptr() else y


def _imported(frozen: torch.fx.GraphModule, user_inputs: list, want: tuple) -> tuple:
    """(reference module, its CPU inputs, graph, signature, how a half-precision graph was
    imported, whether the graph holds the inputs' own dtypes): dynamo's graph imported as ``superopt optimize`` imports a program, in float32 (a
    half-precision graph as its float32 form, :mod:`.precision`: the regions and the measured
    kernels of the float32 model), or, where the inputs are half precision and the code of that
    form does not run at it (a table computed in float32 from integer positions meets bf16
    values), as it is (the rules stated at its dtypes); before, Inductor got the original there.
    ``want``: dynamo's graph's :func:`~.precision.output_types`."""
    cpu_in = tuple(_on_cpu(x) for x in user_inputs)
    reference = as_cpu(as_float32(copy.deepcopy(frozen).cpu().float()))
    graph, _, sig = import_program(export_module(reference, cpu_in), "dynamo graph")
    half = next((k for x in user_inputs for k, dt in HALF.items() if isinstance(x, torch.Tensor) and x.dtype == dt), None)
    if half is None:
        return reference, cpu_in, graph, sig, "", False
    cpu_half = tuple(_on_cpu(x, float32=False) for x in user_inputs)
    sig = replace(sig, out_dtypes=dtypes_of(want))   # (an output upcast: ``.float()``)
    code, why = code_at_precision(write_back(tuple_output(to_fx(graph)), graph.input_names, sig.mutated), HALF[half],
                                  cpu_half, outputs=sig.out_dtypes)
    why = why or runs_at_precision(code, cpu_half, {}, want)
    if not why:
        return reference, cpu_in, graph, sig, f"the float32 form of the {half} graph", False
    original = as_cpu(copy.deepcopy(frozen).cpu())
    graph, _, sig = import_program(export_module(original, cpu_half), "dynamo graph")
    return original, cpu_half, graph, sig, f"the {half} graph as it is: its float32 form does not run at {half}: {why}", True


def as_cpu(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` (in place) with every device it names the CPU: dynamo's graph of a model on the
    GPU makes tensors there (``torch.arange(n, device=cache_position.device)``: a mask built from
    positions, as transformers' decode export builds it), and the import runs it on the CPU; the
    values it computes are the same, and the module handed on is moved to the inputs' device."""
    def cpu(a):
        if isinstance(a, torch.device) and a.type != "cpu":
            return torch.device("cpu")
        if isinstance(a, str) and a.split(":")[0] in _DEVICES:
            return "cpu"
        return a
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target in _DEVICES:
            node.target, node.args, node.kwargs = "cpu", node.args[:1], {}
            continue
        dev = lambda a: cpu(a) if isinstance(a, torch.device) else a  # noqa: E731  (a string only where it is one)
        node.kwargs = {k: cpu(v) if k == "device" else torch.fx.node.map_aggregate(v, dev) for k, v in node.kwargs.items()}
        to = node.op == "call_method" and node.target == "to"
        node.args = torch.fx.node.map_aggregate(node.args, cpu if to else dev)
    gm.recompile()
    return gm


#: device types a graph may name (``torch.device``, ``.to("cuda")``, ``.cuda()``)
_DEVICES = ("cuda", "mps", "xpu", "hpu")


def _optimize(frozen: torch.fx.GraphModule, user_inputs: list, opts: BackendOptions) -> tuple:
    """(module for Inductor, or None where Inductor should get the original; report dict)."""
    cost, said = _cost_model(user_inputs, opts)
    precision = _precision(user_inputs, opts)
    want = output_types(frozen, user_inputs)   # (dtypes and shapes the module handed on must give)
    reference, cpu_in, graph, sig, how, own_dtypes = _imported(frozen, user_inputs, want)
    # a graph that writes into its inputs: its updates are outputs of the (functional) graph,
    # and the signature makes the checked module copy them back, as the written program does
    model = LoadedModel("dynamo graph", graph, reference, cpu_in, format="fx", signature=sig if sig.mutated else None,
                        imported_as=how)
    res = optimize(model, _rules(opts), cost, opts.driver, passes=_passes(opts), dtype=precision, profile_name=said)
    rep = {"cost_model": said, "cost_before_us": round(res.report.cost_before, 2),
           "cost_after_us": round(res.report.cost_after, 2), "passes": res.report.passes,
           "layout": res.report.layout, "kernels": _kernels_chosen(res.report.kernels)}
    if how:
        rep["imported_as"] = how
    if sig.mutated:
        rep["updates"] = list(sig.mutated)
    if res.report.layout:
        rep["inductor_would_pick_channels_last"] = cost.channels_last_for(res.graph, layout="inductor")
    if res.unchanged and opts.search:  # or a device verdict timed the original faster (superopt tune)
        why = getattr(res.report, "kept_original", "") or "no cheaper graph, no layout or library-call choice"
        return None, {**rep, "kept": f"original ({why})"}
    rep["conv_relu_fused"] = len(res.plan.conv_relu)
    if res.plan.channels_last is not None:
        rep["channels_last"] = res.plan.channels_last
    module = tuple_output(to_fx(res.graph, **res.plan.fx_options()))
    module = write_back(module, graph.input_names, sig.mutated)
    first = next((x for x in user_inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    dev = next((x.device for x in user_inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    kept = "optimized" if opts.search else "imported (search off)"
    module, refused = module.to(dev), ""
    if first is not None and first.dtype in HALF.values() and not own_dtypes:   # the float32 form's casts back
        module, refused = code_at_precision(module, first.dtype, user_inputs, outputs=sig.out_dtypes)
    elif first is not None and not own_dtypes:   # (a graph imported as it is keeps its float32 weights)
        module = module.to(first.dtype)
    refused = refused or runs_at_precision(module, user_inputs, {}, want)
    if refused:
        return None, {**rep, "kept": f"original (the optimized graph does not run at the inputs' precision: {refused})"}
    return module, {**rep, "kept": kept}


def _kernels_chosen(kreport) -> dict | None:
    """The kernel pass's outcome in short (None: it did not run): kernels chosen, regions, and
    the model verdict followed (where ``superopt tune`` timed the whole model)."""
    if not isinstance(kreport, dict):
        return None
    verdict = kreport.get("verdict") or {}
    return {"chosen": kreport.get("chosen"), "regions": len(kreport.get("regions", [])),
            "verdict": bool(verdict), "original": verdict.get("original")}


def write_back(opt: torch.fx.GraphModule, order: Sequence[str], mutated: Sequence[str] = ()) -> torch.fx.GraphModule:
    """``opt`` (inputs bound by name; its own outputs, then the new values of the inputs named
    ``mutated``) as a module taking the inputs ``order`` names, positionally, that copies each
    new value into its input (``aten.copy_``, in ``mutated``'s order: the program's) and returns
    the own outputs; an output that is an updated input is that input, as in eager."""
    graph = torch.fx.Graph()
    ph = {name: graph.placeholder(name) for name in order}
    env: dict = {}
    out = None
    for node in opt.graph.nodes:
        if node.op == "placeholder":
            env[node] = ph[node.target]
        elif node.op == "output":
            out = node
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    values = [env[v] if isinstance(v, torch.fx.Node) else v for v in out.args[0]]
    own, new = values[:len(values) - len(mutated)], values[len(values) - len(mutated):]
    for name, value in zip(mutated, new):
        graph.call_function(torch.ops.aten.copy_.default, (ph[name], value))
    own = [ph[mutated[[v is n for n in new].index(True)]] if any(v is n for n in new) else v for v in own]
    graph.output(tuple(own))
    return torch.fx.GraphModule(opt, graph)


#: tensor methods and functions whose result shares the memory of their first argument: a
#: write into it is a write into that argument (``cache[:, :, pos] = v``, ``cache.view(...)[i].copy_``)
_VIEWS = frozenset({"view", "view_as", "reshape", "transpose", "permute", "select", "narrow", "unsqueeze", "squeeze",
                    "expand", "expand_as", "flatten", "unflatten", "movedim", "t", "T", "diagonal", "unfold", "split",
                    "chunk", "unbind", "as_strided", "__getitem__", "getitem", "contiguous", "detach", "view_as_real"})


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def updated_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """The placeholders (or attributes) dynamo's graph writes into (``cache.index_copy_(...)``,
    ``x[i] = v``, ``x.add_(y)``), directly or through a view of them: the graph updates state in
    place, such as a static KV cache (an attribute of the graph where dynamo traced under
    Inductor's ``freezing`` flag: the caller's tensor all the same)."""
    root: dict = {}  # node -> the placeholder or attribute whose memory it may share
    names = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            root[node] = node
            continue
        if node.op not in ("call_method", "call_function") or not node.args:
            continue
        base = root.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
        name = _name(node.target)
        if base is None:
            continue
        if node.target is operator.setitem or (name.endswith("_") and not name.startswith("__")):
            names.append(base.name)
        if name in _VIEWS or node.target is operator.getitem or node.target is operator.setitem:
            root[node] = base  # a view (or a list of views) of the same memory
    return list(dict.fromkeys(names))


def _placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def lift_written_attributes(gm: torch.fx.GraphModule, written) -> tuple[torch.fx.GraphModule, list]:
    """``gm`` with the attributes it writes into made inputs after its own (same names), and
    those tensors (the caller's: the call passes them); ``gm`` itself where there are none."""
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr" and n.name in written]
    if not attrs:
        return gm, []
    graph, env = torch.fx.Graph(), {}
    for node in _placeholders(gm):
        env[node] = graph.node_copy(node)
    for node in attrs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node not in env:
            env[node] = graph.node_copy(node, lambda n: env[n])
    lifted = torch.fx.GraphModule(gm, graph)
    lifted.meta.update(gm.meta)
    return lifted, [operator.attrgetter(n.target)(gm) for n in attrs]


def _cached(gm, example_inputs, opts: BackendOptions, written) -> tuple:
    """(module or None, report, user input positions, cache key); the inputs the graph writes
    into are never frozen into the module, even where dynamo marked them static (a KV cache)."""
    inputs = [x.detach() if isinstance(x, torch.Tensor) and n.name in written else x
              for n, x in zip(_placeholders(gm), example_inputs)]
    key = _key(gm, inputs, opts)
    frozen, user = freeze(gm, inputs)
    if key not in CACHE:
        try:
            with torch.no_grad():
                CACHE[key] = _optimize(frozen, [example_inputs[i] for i in user], opts)
        except Exception as e:  # any failure: a warning, and Inductor compiles the original graph
            warnings.warn(f"superopt backend: {type(e).__name__}: {str(e)[:300]}; compiling the original graph")
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            CACHE[key] = (None, {"kept": f"original ({type(e).__name__}{': ' + first if first else ''})"})
    module, rep = CACHE[key]
    return module, rep, user, key


def as_dynamo_graph(module: torch.fx.GraphModule, gm: torch.fx.GraphModule, user: Sequence[int]):
    """``module`` carrying what dynamo's graph ``gm`` tells Inductor about its inputs (each
    placeholder's source and static mark, ``user``: the positions in ``gm`` of ``module``'s
    inputs; a source for each weight), so that an input marked static
    (``torch._dynamo.mark_static_address``: a KV cache) stays a static address under CUDA
    graphs and its update is captured in the graph (else reduce-overhead copies the input in and
    skips the graph that writes it). Attributes written into are buffers by then (:func:`as_state`)."""
    if "dynamo_compile_id" not in gm.meta:
        return module
    theirs = _placeholders(gm)
    for node, pos in zip(_placeholders(module), user):
        node._dynamo_source = getattr(theirs[pos], "_dynamo_source", None)
        if "tensor_dict" in theirs[pos].meta:
            node.meta["tensor_dict"] = theirs[pos].meta["tensor_dict"]
    weights = itertools.chain(module.named_parameters(remove_duplicate=False),
                              module.named_buffers(remove_duplicate=False))
    module._param_name_to_source = {name: ConstantSource(f"superopt_{name}") for name, _ in weights}
    module.meta["dynamo_compile_id"] = gm.meta["dynamo_compile_id"]
    return module


def superopt_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                     options: dict | None = None) -> Callable:
    """The dynamo backend (see the module docstring)."""
    opts = BackendOptions.from_dict(options)
    mode = mode or opts.mode
    written = set(updated_inputs(gm))
    lifted, attrs = lift_written_attributes(gm, written)
    full = [*example_inputs, *attrs]
    module, rep, user, key = _cached(lifted, full, opts, written)
    if module is None:  # exactly what torch.compile alone would do with this graph
        return _original(gm, example_inputs, mode, opts)
    if not opts.inductor:
        compiled = module
    else:
        # Inductor's own configuration, as a user's torch.compile of the written program gets:
        # the layout is in the module (channels-last inputs and weights; every convolution a
        # superopt call where the choice is not Inductor's rule). Forcing Inductor's layout
        # option here made ResNeXt-50 b16 bf16 3.9% faster than the written program on the H100.
        # a graph that writes into its inputs: Inductor sees them as dynamo gave them (static or not)
        n_args = len(example_inputs)
        state = {k: attrs[i - n_args] for k, i in enumerate(user) if i >= n_args}
        keep = [i for i in user if i < n_args]
        handed = as_state(module, state) if state else module
        handed = as_dynamo_graph(handed, gm, keep) if written else handed
        skips = _cudagraph_skips()
        try:
            compiled = compile_inductor(handed, [full[i] for i in keep], mode, opts.freezing)
        except Exception as e:  # Inductor refused the optimized module: it compiles the original
            warnings.warn(f"superopt backend: Inductor failed on the optimized graph ({type(e).__name__}: "
                          f"{str(e)[:300]}); compiling the original graph")
            CACHE[key] = (None, {**rep, "kept": f"original (Inductor: {type(e).__name__})"})
            return _original(gm, example_inputs, mode, opts)
        if written and _cudagraph_skips() > skips:
            # Inductor runs the optimized graph without CUDA graphs: the original is kept unless it
            # would run without them too (a step then pays every launch: 1.0 ms against 0.39 for a
            # Llama decode step on the H100, though its GPU time was 1.26x shorter)
            skips = _cudagraph_skips()
            original = _original(gm, example_inputs, mode, opts)
            if _cudagraph_skips() == skips:
                warnings.warn("superopt backend: Inductor would run the optimized graph without CUDA graphs "
                              "(an input it writes into is not a static address); compiling the original graph")
                CACHE[key] = (None, {**rep, "kept": "original (the optimized graph would run without CUDA graphs)"})
                return original

    if not opts.inductor:
        def run(*args):
            call = (*args, *attrs)  # the attributes written into: the caller's tensors, as dynamo's graph holds them
            return compiled(*[call[i] for i in user])
        return run
    return lambda *args: compiled(*[args[i] for i in keep])


def _cudagraph_skips() -> int:
    """Inductor's count of graphs it compiled to run without CUDA graphs (``mode`` asked for them)."""
    return counters["inductor"]["cudagraph_skips"]


def as_state(module: torch.fx.GraphModule, state: dict) -> torch.fx.GraphModule:
    """``module`` with the inputs at the positions ``state`` maps (to the caller's tensors: the
    attributes dynamo's graph writes into) made buffers of it again, as dynamo's graph holds
    them: Inductor then treats their updates as it treats the original's (in place, inside the
    CUDA graph of ``mode="reduce-overhead"``; as inputs, their positions past the frozen weights
    were not marked static, and the H100 ran the graph without CUDA graphs: 1.0 ms a Llama
    decode step against 0.39 under reduce-overhead)."""
    out = torch.fx.GraphModule(module, module.graph)   # a new module sharing the weights
    out.meta.update(getattr(module, "meta", {}))
    graph, env = torch.fx.Graph(), {}
    for k, node in enumerate(_placeholders(module)):
        if k in state:
            name = f"superopt_state_{k}"
            out.register_buffer(name, state[k], persistent=False)
            env[node] = graph.get_attr(name)
        else:
            env[node] = graph.node_copy(node)
        env[node].meta = dict(node.meta)
    for node in module.graph.nodes:
        if node not in env:
            env[node] = graph.node_copy(node, lambda n: env[n])
    out.graph = graph
    out.recompile()
    return out


def _original(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None, opts: BackendOptions) -> Callable:
    return compile_inductor(gm, list(example_inputs), mode) if opts.inductor else gm.forward


def last_report(gm_key: str | None = None) -> Any:
    """The report of the last (or a given) cached graph: cost model, costs, passes, what was kept."""
    if not CACHE:
        return None
    return CACHE[gm_key][1] if gm_key else list(CACHE.values())[-1][1]
