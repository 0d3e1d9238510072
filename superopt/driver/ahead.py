"""A zoo model built ahead while ``superopt optimize`` imports the rest of the pipeline: in a
thread (:class:`BuiltAhead`), or built here and exported and imported in a forked process
(:class:`ExportedAhead`) where a core is idle.

``superopt optimize --zoo NAME`` spends its first seconds importing (``torch._dynamo`` and the
exporter, the search: Python, one core) and then builds the model, whose weights are drawn by
torch kernels that release the interpreter. Started right after ``import torch``, the build's
draws run on a second core beside the imports (Llama-3-8B: 2.6 s of CPU drawing 218 M weights;
BERT-base and ViT-B/16 about 0.6 s, the CNNs 0.2-0.3 s). The build is the very call
:func:`superopt.driver.model.load_model` makes (same name, batch, seed: the same weights); every
module it needs is imported before the thread starts, so that the two threads never import the
same module at once. Only at batch 1: a larger batch is first checked against the memory free.

The model's ``torch.export`` and its import into the IR come after the imports, all on one core
(NASNet-A: 1.9 s of CPU, after 1.2-1.5 s importing ``torch._dynamo``). :class:`ExportedAhead`
forks a process right after ``import torch``, which builds the model beside its own import of the
exporter, exports and imports the model and sends the graph back, while this process builds the
same model beside its imports and loads the rules; the child then saves the model's own program
(written back where the search finds nothing worth writing) and runs the original on the
examples, as :class:`~superopt.driver.command.SavedBeside` does beside the search. The graph's
weights are views of the module's parameters (:func:`~superopt.frontend.context._weight_array`):
a weight goes back as the name of the tensor it views and its place in it, and is made a view
of this process's module, built alike (the few copies the importer makes go by value).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from bisect import bisect_right
from pathlib import Path

import numpy as np
import torch

from ..frontend import import_program
from ..frontend.torch_import import export_module
from ..frontend.trace_import import NotRecorded, record_module
from ..ir.graph import Graph, Node
from ..models import build
from ..models.zoo import ZOO  # the builders' modules, imported here, not in the threads
from .aside import Aside, AsideFailed, can_fork, put_in_place
from .idle import spare_core
from .outcheck import REFERENCE_BESIDE_BYTES, examples_reference, graph_bytes

__all__ = ["BuiltAhead", "ExportedAhead", "start_ahead"]


#: the largest zoo model (parameters) exported beside: the CNNs and BERT-base, ViT-B/16 (86-110 M);
#: not the Llama-3-8B layers, whose 0.9 GB of weights both processes would build and hold
EXPORT_BESIDE_PARAMS = 150_000_000


def start_ahead(zoo: str, out: Path | None = None):
    """The zoo model ahead (batch 1): exported in a forked process where one can be forked, a
    core is idle and the model is small (``out``: where the program will be written, for the
    save beside), else built in a thread."""
    spec = ZOO.get(zoo)
    if spec is not None and spec.published_params <= EXPORT_BESIDE_PARAMS and can_fork() and spare_core():
        return ExportedAhead(zoo, out)
    return BuiltAhead(zoo)


class BuiltAhead:
    """``build(zoo, batch_size, seed)`` in a daemon thread started now; :meth:`get` waits for
    it and returns its value or raises its error (an unknown name: the same ModelError)."""

    def __init__(self, zoo: str, batch_size: int = 1, seed: int = 0):
        self.key = (zoo, batch_size, seed)
        self._value: tuple | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="superopt-zoo-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = build(*self.key[:1], batch_size=self.key[1], seed=self.key[2])
        except BaseException as e:  # noqa: BLE001 (raised again by get, in the caller's thread)
            self._error = e

    def get(self) -> tuple:
        """``(module, inputs)`` as ``build`` returns them."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value

    def join(self) -> None:
        """Wait for the build to end (an interrupt or an early error ends the run before it is
        used): a daemon thread still in torch's C++ code as the interpreter exits aborts the
        process (``terminate called without an active exception``, exit 134 for 130 or 2)."""
        self._thread.join()


class ExportedAhead:
    """The zoo model exported and imported into the IR in a process forked now, and built in
    both (each beside its own imports, in a thread: :class:`BuiltAhead`; the build is seeded, the
    same weights; see the module docstring). :meth:`get` gives ``(module, inputs)`` (or raises
    the build's error), :meth:`imported` the graph and signature (or None where the process gave
    no answer: the caller exports here; :attr:`seconds`: how long it took there, and the wait
    here). As the saver beside the search (``out``: a ``.pt2``), it has
    :class:`~superopt.driver.command.SavedBeside`'s :meth:`reference`, :meth:`place` and
    :meth:`discard`."""

    def __init__(self, zoo: str, out: Path | None = None, batch_size: int = 1, seed: int = 0):
        self.key, self.tmp, self.out = (zoo, batch_size, seed), None, out
        self.seconds: dict = {}  # the export beside: wall from the fork and CPU until the graph was sent, the wait
        self._memo: dict | None = None
        if out is not None and out.suffix == ".pt2":
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp.pt2", dir=out.parent)
                os.close(fd)
                self.tmp = Path(tmp)
            except OSError:  # the output's folder is checked, and its error given, by the command
                self.tmp = None
        self._parent, self._forked = os.getpid(), time.perf_counter()
        self._job = Aside(self._work, early=True)  # forked before any thread starts here
        self._built = BuiltAhead(zoo, batch_size, seed)

    def _work(self, send) -> tuple:
        """In the child: the graph sent first, then the program saved and the original's runs.
        The exporter's modules (``torch._dynamo``, 1.2-1.5 s) are imported here, after the fork,
        while this process imports them too, and the model built beside them. A model the
        recording maps (:func:`~superopt.frontend.trace_import.record_module`, as this process
        records it) is neither exported nor saved here: only the original's runs, so that the
        core is idle again soon for the region check after the search (its own program is
        exported where it is written back, rarely: the CNNs are rewritten)."""
        cpu = time.process_time()
        built = BuiltAhead(*self.key)
        module, inputs = built.get()
        try:
            graph, saved = record_module(module, tuple(inputs))[0], False
        except NotRecorded:
            from ..codegen import write_program
            from .model import no_stack_traces
            with no_stack_traces():
                ep = export_module(module, inputs)
                graph, _, sig = import_program(ep, source=f"zoo:{self.key[0]}")
            send((pack_graph(graph, module), sig, (time.perf_counter() - self._forked, time.process_time() - cpu)))
            saved = False
            if self.tmp is not None:
                write_program(ep, self.tmp, self.out)
                saved = True
                if os.getppid() != self._parent:  # the run was killed meanwhile: its file goes too
                    self.tmp.unlink(missing_ok=True)
                    return False, {}
        act, weights = graph_bytes(graph)
        if act + weights > REFERENCE_BESIDE_BYTES:
            return saved, {}
        try:
            return saved, examples_reference(module, tuple(inputs), {})
        except Exception:  # noqa: BLE001 (the check runs the original again and says what failed)
            return saved, {}

    def get(self) -> tuple:
        """``(module, inputs)`` as ``build`` returns them."""
        return self._built.get()

    def join(self) -> None:
        """Wait for the build here to end (:meth:`BuiltAhead.join`)."""
        self._built.join()

    def imported(self):
        """``(graph, signature)`` of the model's program, as :func:`~superopt.frontend.import_program`
        gives them here; its refusal raised; None where the process gave no answer."""
        self.get()
        t = time.perf_counter()
        try:
            packed, sig, (wall, cpu) = self._job.first()
        except AsideFailed:
            return None
        self.seconds = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "waited_s": round(time.perf_counter() - t, 3)}
        return unpack_graph(packed, self.get()[0]), sig

    def skip_graph(self) -> None:
        """The graph is not wanted (recorded here: :func:`~superopt.frontend.trace_import.record_module`);
        the process goes on with the save and the original's runs."""
        self._job.drain_first()

    def reference(self) -> dict:
        """The original's outputs on the examples where the process has answered already (never
        waited for), else nothing."""
        if self._memo is None and self._job.ready():
            try:
                self._memo = self._job.result()[1]
            except Exception:  # noqa: BLE001 (AsideFailed, a refused save: the check runs them here)
                self._memo = {}
        return self._memo or {}

    def place(self, path: Path) -> bool:
        """Put the saved program at ``path``; False (and nothing there) where it was not saved."""
        try:
            saved, _ = self._job.result()
            if not saved:
                raise AsideFailed("not saved")
            put_in_place(self.tmp, path)
        except Exception:  # noqa: BLE001 (AsideFailed, a refused save, OSError: the write saves it here)
            self.discard()
            return False
        return True

    def discard(self) -> None:
        """End the process (where it still runs) and remove its file."""
        self._job.cancel()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def _tensors(module: torch.nn.Module) -> list:
    """The module's parameters and buffers by name (both processes name them alike)."""
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def pack_graph(graph, module: torch.nn.Module) -> tuple:
    """``graph`` as plain values to send to the process this one was forked from: each weight
    that views a tensor of ``module`` as ``("view", name, byte offset, shape, strides, dtype)``,
    any other as ``("value", array)``. :func:`unpack_graph` makes the graph again.

    >>> from superopt.ir.graph import GraphBuilder
    >>> m = torch.nn.Linear(2, 3)
    >>> b = GraphBuilder()
    >>> g = b.build([b.weight("w", data=m.weight.detach().numpy().T)])
    >>> pack_graph(g, m)[2]["w"][:3]
    ('view', 'weight', 0)
    >>> unpack_graph(pack_graph(g, m), m) == g
    True
    """
    spans = sorted({t.untyped_storage().data_ptr(): (t.untyped_storage().nbytes(), name)
                    for name, t in _tensors(module) if t.device.type == "cpu"}.items())
    starts = [s for s, _ in spans]
    data = {}
    for name, arr in graph.data.items():
        data[name] = ("value", arr)
        if not arr.size:
            continue
        at = arr.__array_interface__["data"][0]
        low = at + sum(min(0, (d - 1) * s) for d, s in zip(arr.shape, arr.strides))
        high = at + sum(max(0, (d - 1) * s) for d, s in zip(arr.shape, arr.strides)) + arr.itemsize
        i = bisect_right(starts, low) - 1
        if i >= 0 and high <= starts[i] + spans[i][1][0]:
            data[name] = ("view", spans[i][1][1], at - starts[i], arr.shape, arr.strides, arr.dtype.str)
    nodes = [(n.op, n.inputs, n.attrs, n.types) for n in graph.nodes]
    return nodes, graph.outputs, data


def unpack_graph(packed: tuple, module: torch.nn.Module):
    """The graph :func:`pack_graph` packed, its views made over ``module``'s own tensors."""
    nodes, outputs, data = packed
    tensors, whole = dict(_tensors(module)), {}
    arrays = {}
    for name, ref in data.items():
        if ref[0] == "value":
            arrays[name] = ref[1]
            continue
        _, key, offset, shape, strides, dtype = ref
        if key not in whole:
            storage = tensors[key].untyped_storage()
            whole[key] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        arrays[name] = np.ndarray(shape, np.dtype(dtype), buffer=whole[key], offset=offset, strides=strides)
    return Graph([Node(*n) for n in nodes], outputs, arrays)
