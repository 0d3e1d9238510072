"""The output check of ``optimize``: the last line of defence against a wrong model.

The original program and the optimized one run on several input sets (the example inputs,
unit normal draws, the same scaled by 0.01 and by 30, and small integers with many ties) and
every output is compared separately. Tolerance is scale-aware: the original also runs in
float64 (when it can), and an output passes when

    max |opt - ref64| <= tolerance * max |ref64| + SLACK * max |ref32 - ref64|

that is, within ``tolerance`` of the output's own magnitude, or no further from the exact
value than a few times the original's own float32 rounding error. So an output that is small
because of cancellation (rounding noise dominates it) is not refused for noise, and an output
that is small because it is small is compared at its own scale. Positions where the original
is not finite (overflow at scale 30) are skipped; an optimized output that overflows where
the original does not is a difference.

A program may update inputs in place (a decode step's static KV cache, as Hugging Face's
``StaticCache`` does): every call gets its own copy of the input set, and the inputs as the call
left them count as outputs after the real ones, so a candidate that forgets an update, or makes
one the original does not, is a difference like any other.

>>> import torch
>>> f = lambda x: (x * 2, x.sum())
>>> check_outputs(f, lambda x: (x + x, x.sum()), [("examples", (torch.ones(3),), {})]).worst
0.0
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree

from ..ir.graph import Graph

__all__ = ["OutputCheck", "OutputMismatch", "INPUT_SETS", "make_input_sets", "check_outputs", "output_error",
           "ReferenceAhead", "examples_reference", "graph_bytes", "REFERENCE_BESIDE_BYTES", "tensors_swapped"]

#: the largest model (weights and activations of one run, float32) whose original runs on the
#: examples go beside the search: the CNNs (40-280 MB), not BERT-base or ViT-B/16 (530 and 680 MB,
#: written back unchanged: the runs would be for nothing) nor the LLM layers (a float64 copy of
#: gigabytes beside the search)
REFERENCE_BESIDE_BYTES = 320 << 20

#: input sets beyond the examples: (name, scale of a normal draw, or "integers")
INPUT_SETS = (("normal", 1.0), ("normal x0.01", 0.01), ("normal x30", 30.0), ("integers", "integers"))
#: how many times the original's own float32 error the optimized one may make
SLACK = 8.0


@dataclass
class OutputCheck:
    """Per input set, the largest relative error over outputs; ``worst`` over all sets."""

    worst: float = 0.0
    sets: dict = field(default_factory=dict)


@dataclass
class OutputMismatch:
    """The first output that differs: input set, output position, relative error."""

    input_set: str
    output: int
    error: float
    args: tuple
    kwargs: dict

    def describe(self) -> str:
        return f"output {self.output} on input set '{self.input_set}' (relative error {self.error:.2e})"


def make_input_sets(args: tuple, kwargs: dict, count: int = 1 + len(INPUT_SETS), seed: int = 1234) -> list:
    """``[(name, args, kwargs)]``: the examples first, then the sets of :data:`INPUT_SETS`
    (integer and boolean inputs such as token ids are kept as given)."""
    gen = torch.Generator().manual_seed(seed)
    out = [("examples", tuple(args), dict(kwargs))]
    for name, scale in INPUT_SETS[:max(0, count - 1)]:
        def draw(x, scale=scale):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return x
            if scale == "integers":
                return torch.randint(-3, 4, x.shape, generator=gen).to(x.dtype)
            return (torch.randn(x.shape, generator=gen) * scale).to(x.dtype)
        a, k = pytree.tree_map(draw, (tuple(args), dict(kwargs)))
        out.append((name, a, k))
    return out


def _leaves(fn: Callable, args, kwargs, state: Sequence[str] = ()) -> list[np.ndarray]:
    """The call's outputs, then its tensor inputs as the call left them (on a copy of each),
    then the buffers at the paths ``state`` names as the call left them; those buffers are put
    back as they were after the call, so that every call starts from the same state."""
    own = lambda x: x.clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
    args, kwargs = pytree.tree_map(own, (tuple(args), dict(kwargs)))
    before = [fn.get_buffer(p) for p in state]
    saved = [b.detach().clone() for b in before]
    try:
        with torch.no_grad():
            out = fn(*args, **kwargs)
        after = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        after += [fn.get_buffer(p).detach().clone() for p in state]
    finally:
        _put_back(fn, state, before, saved)
    return [t.detach().to(torch.float64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)
            for t in pytree.tree_leaves(out) + after]


def _put_back(fn, state: Sequence[str], before: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    """The buffers at ``state``'s paths as they were: the same tensors, their values ``saved``."""
    with torch.no_grad():
        for path, tensor, value in zip(state, before, saved):
            owner, _, leaf = path.rpartition(".")
            mod = fn.get_submodule(owner) if isinstance(fn, torch.nn.Module) else None
            if mod is not None and mod._buffers.get(leaf) is not tensor:  # the call assigned another tensor
                mod._buffers[leaf] = tensor
            tensor.copy_(value)


@contextlib.contextmanager
def tensors_swapped(module: torch.nn.Module, new: Callable):
    """``module`` with each parameter and buffer ``t`` its modules hold replaced by ``new(t)``
    (kept where that is None), each module's own once however many paths reach it, and put back
    after (``torch.func.functional_call`` swaps by path, so a module reachable at two paths was
    swapped twice and kept the replacements)."""
    swapped = []
    for mod in module.modules():   # (each module once)
        for table in (mod._parameters, mod._buffers):
            for key, t in table.items():
                if t is not None and (r := new(t)) is not None:
                    swapped.append((table, key, t, r))
    try:
        for table, key, _, r in swapped:
            table[key] = r
        yield module
    finally:
        for table, key, t, _ in swapped:
            table[key] = t


class _Float64Run:
    """A module run with its floating parameters and buffers in float64 (see :func:`_float64`);
    ``get_buffer`` answers with the float64 copy that the run reads and updates in place.

    Each module's own tensors are swapped once and put back after the call, however many paths
    reach it: ``functional_call`` swapped a module reachable at two paths (a wrapper that keeps
    ``self.layers = inner.layers``) twice and put one path's float64 copy back as its own, so
    the original ran in float64 from then on (in bf16 it failed: ``index_copy_`` of a float64
    key into a bf16 cache)."""

    def __init__(self, fn: torch.nn.Module, state: dict):
        self.fn, self.state = fn, state   # every path -> its float64 copy

    def __call__(self, *args, **kwargs):
        wide = {id(t): self.state[name] for name, t in itertools.chain(
            self.fn.named_parameters(remove_duplicate=False), self.fn.named_buffers(remove_duplicate=False))}
        with tensors_swapped(self.fn, lambda t: wide.get(id(t))):
            return self.fn(*args, **kwargs)

    def get_buffer(self, path: str) -> torch.Tensor:
        return self.state[path]


#: the floating dtypes a program may name (casts, asserts): float64 in its exact run
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _exact_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A graph module (``torch.export``'s ``ep.module()``) as its float64 run computes it: the
    floating dtypes its calls name are float64 (a bf16 program's casts, RMSNorm's upcast) and
    its dtype asserts (``_assert_tensor_metadata``, which would refuse float64 tensors in a bf16
    program) are gone; its parameters and buffers are the module's own (the same attributes)."""
    graph = copy.deepcopy(gm.graph)
    wide = lambda a: torch.float64 if isinstance(a, torch.dtype) and a in _FLOATS else a  # noqa: E731
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default:
            graph.erase_node(node)
            continue
        node.args = torch.fx.node.map_aggregate(node.args, wide)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, wide)
    out = torch.fx.GraphModule(gm, graph)
    out.recompile()
    return out


def _float64(fn: Callable):
    """``fn`` run in float64, or None when it has no such form: a torch module called with its
    floating parameters and buffers in float64 (the others cloned, so that a run changes none of
    the module's own), which is what a float64 copy of it computes, without copying the module
    (a deep copy took 0.27 s of NASNet-A's check, this 0.035 s); a graph module (an exported
    program's) with the dtypes it names widened too (:func:`_exact_graph`), so that a bf16
    program has an exact reference (without it, its check fell back to the bare tolerance and
    refused every rewrite of a bf16 program for bf16 rounding: measured on the H200)."""
    if not isinstance(fn, torch.nn.Module):
        return None
    try:
        fn = _exact_graph(fn) if isinstance(fn, torch.fx.GraphModule) else fn
        state, done = {}, {}
        for name, t in [*fn.named_parameters(remove_duplicate=False), *fn.named_buffers(remove_duplicate=False)]:
            if id(t) not in done:  # tied tensors stay tied
                done[id(t)] = t.detach().to(torch.float64) if t.is_floating_point() else t.detach().clone()
            state[name] = done[id(t)]
    except Exception:  # modules with unusual state: the check falls back to relative error
        return None
    return _Float64Run(fn, state)


def output_error(got: np.ndarray, want32: np.ndarray, want64: np.ndarray | None, tolerance: float) -> tuple[float, bool]:
    """(relative error of ``got``, whether it passes) for one output (see the module docstring)."""
    if got.shape != want32.shape:
        return float("inf"), False
    if got.size == 0:
        return 0.0, True
    finite = np.isfinite(want32)
    if not np.all(np.isfinite(got)[finite]):
        return float("inf"), False
    exact = want64 if want64 is not None and want64.shape == want32.shape else want32
    finite &= np.isfinite(exact)
    if not finite.any():
        return 0.0, True
    g, w32, w = got[finite], want32[finite], exact[finite]
    scale = float(np.max(np.abs(w)))
    err = float(np.max(np.abs(g - w)))
    own = float(np.max(np.abs(w32 - w))) if exact is not want32 else 0.0
    rel = err / max(scale, 1e-30)
    return rel, err <= tolerance * scale + SLACK * own


def check_outputs(reference: Callable, candidate: Callable, sets: Sequence, tolerance: float = 1e-4,
                  memo: dict | None = None, state: Sequence[str] = ()) -> OutputCheck | OutputMismatch:
    """Compare ``candidate`` with ``reference`` (both called ``f(*args, **kwargs)``) output by
    output on every input set; the check, or the first mismatch. ``memo`` (a dict kept by the
    caller) holds the reference's outputs by input-set name, so a second check of the same
    model (the written file) runs only the candidate. ``state``: the paths of buffers both
    modules update in place (:attr:`~superopt.frontend.signature.Signature.state`), compared as
    outputs and put back after every call."""
    memo = {} if memo is None else memo
    ref64: list = []  # the float64 copy, made on first need
    report = OutputCheck()
    for name, args, kwargs in sets:
        if name not in memo:
            if not ref64:
                ref64.append(_float64(reference))
            memo[name] = _reference(reference, ref64[0], args, kwargs, state)
        want, exact = memo[name]
        got = _leaves(candidate, args, kwargs, state)
        if len(got) != len(want):
            return OutputMismatch(name, len(want), float("inf"), args, kwargs)
        worst = 0.0
        for k, (g, w32) in enumerate(zip(got, want)):
            rel, ok = output_error(g, w32, exact[k], tolerance)
            if not ok:
                return OutputMismatch(name, k, rel, args, kwargs)
            worst = max(worst, rel)
        report.sets[name] = worst
        report.worst = max(report.worst, worst)
    return report


def _reference(reference: Callable, ref64, args, kwargs, state: Sequence[str] = ()) -> tuple[list, list]:
    """The original's outputs on one input set, in float32 and (Nones where it cannot) float64."""
    want = _leaves(reference, args, kwargs, state)
    return want, _exact(ref64, args, kwargs, len(want), state)


class ReferenceAhead:
    """The original's outputs on the examples, computed in a thread into ``memo``
    (:func:`check_outputs`'s) while other work goes on, so that the whole-model check after it
    runs only the candidate: the original's run is mostly torch kernels, which release the
    interpreter (``superopt optimize`` runs it beside the region check). :meth:`join` before
    anything traces a module (``torch.export`` patches ``torch.nn.Module.__call__`` for every
    thread while it traces). A failure leaves ``memo`` as it was: the check runs the original
    again and says what failed."""

    def __init__(self, reference: Callable, args: tuple, kwargs: dict, memo: dict, state: Sequence[str] = ()):
        self._thread = threading.Thread(target=self._run, args=(reference, args, kwargs, memo, state),
                                        name="superopt-reference", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(reference, args, kwargs, memo, state) -> None:
        try:
            memo.update(examples_reference(reference, args, kwargs, memo, state))
        except Exception:  # noqa: BLE001 (said by the check, which runs it again)
            return

    def join(self) -> None:
        self._thread.join()


def examples_reference(reference: Callable, args: tuple, kwargs: dict, memo: dict | None = None,
                       state: Sequence[str] = ()) -> dict:
    """``{"examples": outputs}``: the original's outputs on the examples (float32, float64), as
    :func:`check_outputs` keeps them in its ``memo``; nothing where ``memo`` has them already."""
    name, args, kwargs = make_input_sets(args, kwargs, 1)[0]
    if memo is not None and name in memo:
        return {}
    return {name: _reference(reference, _float64(reference), args, kwargs, state)}


def _exact(ref64, args, kwargs, n: int, state: Sequence[str] = ()) -> list:
    """The float64 outputs of the original, or Nones where it cannot run in float64."""
    if ref64 is None:
        return [None] * n
    up = lambda x: x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
    try:
        out = _leaves(ref64, *pytree.tree_map(up, (tuple(args), dict(kwargs))), state)
    except Exception:  # an operator without a float64 kernel: compare against float32 only
        return [None] * n
    return out if len(out) == n else [None] * n


def graph_bytes(g: Graph) -> tuple[int, int]:
    """(activation bytes: every value a node computes, weight bytes) of one run of ``g``."""
    act = weights = 0
    for n in g.nodes:
        for ty in n.types:
            size = ty.numel * torch.empty((), dtype=_dtype(ty.dtype)).element_size()
            if n.op == "weight":
                weights += size
            elif n.op != "input":
                act += size
    return act, weights


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else torch.float32
