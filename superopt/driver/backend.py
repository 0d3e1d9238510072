"""``torch.compile(model, backend="superopt")``: the driver's ``optimize``, then Inductor.

A thin adapter: dynamo hands the backend an FX graph whose weights (parameters and buffers)
arrive as graph inputs; the backend freezes them (as Inductor's ``freezing`` does), imports the
graph (on the CPU in float32: the rules' proofs speak float32, the cost model prices the graph at
the inputs' precision all the same), runs :func:`superopt.driver.optimize` with the same
defaults, passes and output check as ``superopt optimize``, and hands Inductor the module the
CLI would write, under Inductor's own configuration (what a user's ``torch.compile`` of the
written program gets). Where nothing is rewritten and no layout or library-call choice is kept, or
anything on the way fails (a warning says what), Inductor gets exactly what ``torch.compile``
alone would give it: the same graph, the same configuration.

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
import operator
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Sequence

import torch
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

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

__all__ = ["BackendOptions", "superopt_backend", "register", "clear_cache", "last_report", "CACHE"]

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


def _optimize(frozen: torch.fx.GraphModule, user_inputs: list, opts: BackendOptions) -> tuple:
    """(module for Inductor, or None where Inductor should get the original; report dict)."""
    cost, said = _cost_model(user_inputs, opts)
    precision = _precision(user_inputs, opts)
    cpu_in = tuple(x.detach().cpu().float() if isinstance(x, torch.Tensor) and x.is_floating_point()
                   else (x.cpu() if isinstance(x, torch.Tensor) else x) for x in user_inputs)
    reference = copy.deepcopy(frozen).cpu().float()
    graph, _, sig = import_program(export_module(reference, cpu_in), "dynamo graph")
    if sig.mutated:  # an update updated_inputs did not see (through a view): kept all the same
        return None, {"cost_model": said, "kept": _updates_kept(sig.mutated)}
    model = LoadedModel("dynamo graph", graph, reference, cpu_in, format="fx")
    res = optimize(model, _rules(opts), cost, opts.driver, passes=_passes(opts), dtype=precision, profile_name=said)
    rep = {"cost_model": said, "cost_before_us": round(res.report.cost_before, 2),
           "cost_after_us": round(res.report.cost_after, 2), "passes": res.report.passes,
           "layout": res.report.layout}
    if res.report.layout:
        rep["inductor_would_pick_channels_last"] = cost.channels_last_for(res.graph, layout="inductor")
    if res.unchanged and opts.search:
        return None, {**rep, "kept": "original (no cheaper graph, no layout or library-call choice)"}
    rep["conv_relu_fused"] = len(res.plan.conv_relu)
    if res.plan.channels_last is not None:
        rep["channels_last"] = res.plan.channels_last
    module = tuple_output(to_fx(res.graph, **res.plan.fx_options()))
    first = next((x for x in user_inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    dev = next((x.device for x in user_inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    kept = "optimized" if opts.search else "imported (search off)"
    return module.to(dev, first.dtype if first is not None else None), {**rep, "kept": kept}


def _updates_kept(names) -> str:
    """Why a graph that writes into its inputs goes to Inductor as dynamo gave it (the written
    ``.pt2`` writes them; this adapter does not)."""
    return (f"original (the graph updates its inputs {', '.join(names)} in place; `superopt optimize` on the "
            f"exported program handles that)")


def updated_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """The placeholders dynamo's graph writes into (``cache.index_copy_(...)``, ``x[i] = v``,
    ``x.add_(y)``): the graph updates state in place, such as a static KV cache."""
    names = []
    for node in gm.graph.nodes:
        target = node.target
        inplace = (node.op == "call_method" and target.endswith("_") and not target.startswith("__")) or (
            node.op == "call_function" and (target is operator.setitem or getattr(target, "__name__", "").endswith("_")
                                            and not getattr(target, "__name__", "").startswith("__")))
        if inplace and node.args and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder":
            names.append(node.args[0].name)
    return list(dict.fromkeys(names))


def _cached(gm, example_inputs, opts: BackendOptions) -> tuple:
    key = _key(gm, example_inputs, opts)
    frozen, user = freeze(gm, example_inputs)
    updated = updated_inputs(gm) if key not in CACHE else []
    if updated:  # no warning: a decode step's cache update is expected
        CACHE[key] = (None, {"kept": _updates_kept(updated)})
    if key not in CACHE:
        try:
            with torch.no_grad():
                CACHE[key] = _optimize(frozen, [example_inputs[i] for i in user], opts)
        except Exception as e:  # any failure: a warning, and Inductor compiles the original graph
            warnings.warn(f"superopt backend: {type(e).__name__}: {str(e)[:300]}; compiling the original graph")
            CACHE[key] = (None, {"kept": f"original ({type(e).__name__})"})
    module, rep = CACHE[key]
    return module, rep, user


def superopt_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                     options: dict | None = None) -> Callable:
    """The dynamo backend (see the module docstring)."""
    opts = BackendOptions.from_dict(options)
    mode = mode or opts.mode
    module, rep, user = _cached(gm, example_inputs, opts)
    if module is None:  # exactly what torch.compile alone would do with this graph
        return compile_inductor(gm, list(example_inputs), mode) if opts.inductor else gm.forward
    if not opts.inductor:
        compiled = module
    else:
        # Inductor's own configuration, as a user's torch.compile of the written program gets:
        # the layout is in the module (channels-last inputs and weights; every convolution a
        # superopt call where the choice is not Inductor's rule). Forcing Inductor's layout
        # option here made ResNeXt-50 b16 bf16 3.9% faster than the written program on the H100.
        compiled = compile_inductor(module, [example_inputs[i] for i in user], mode, opts.freezing)

    def run(*args):
        return compiled(*[args[i] for i in user])
    return run


def last_report(gm_key: str | None = None) -> Any:
    """The report of the last (or a given) cached graph: cost model, costs, passes, what was kept."""
    if not CACHE:
        return None
    return CACHE[gm_key][1] if gm_key else list(CACHE.values())[-1][1]
