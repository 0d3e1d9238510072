"""``superopt tune MODEL --device cuda``: measure superopt's kernels for a model's own shapes.

The regions tuned are those of the graph the driver's search returns (fold and merge, the
search, keep if cheaper: the passes before the kernel pass), since the kernel pass looks each of
that graph's regions up in the profile; tuning the imported graph measured regions the search
had already changed (a norm weight folded into the next linear), and nothing was chosen.
Generation, verification and timing: :func:`superopt.kernel.model_tuning.tune_graph`.

Then the **whole model** is timed with kernel sets (:func:`model_verdict`): the searched graph
emitted as ``optimize`` writes it, compiled by Inductor with freezing, with no kernel, with every
kernel that beat Inductor's region alone, and (where that set does not win) each alone
(:func:`~superopt.kernel.model_tuning.pick_kernel_set`). The set that made the model faster is
written into the profile as its model verdict, which the kernel pass then follows: a kernel
that wins alone but not in the model (BERT's linears at batch 1: 1.1-1.2x alone, the model
0.80x with them) stays out, and one that wins in the model by less than the per-region margin
(a weight-streaming linear 5% faster) goes in. The whole model is timed while the winners'
proofs run (``tune_graph``'s ``during_proofs``: the GPU and the CPU at once), and again with
the proved profile where a proof changed an entry.

The **original program** (as imported, compiled and timed the same way) is timed in the same
run, first and again after the kernel sets (:func:`~superopt.kernel.model_tuning.pick_program`):
a graph-level rewrite can run slower on the device than the cost model priced it (BERT-base
b16 bf16 was written at 0.960x in session 33), and kernels must beat the original, not only the
searched graph without them. Where the rewrite does not win by the same margin, the verdict
says so and ``optimize`` writes the original for that model on that device (no rewrite, no
kernel, no layout choice), its report saying why. A rewritten graph is timed against the
original even where no region has a kernel.

Kernels are launched plainly. Programmatic dependent launch (each kernel's launch overlapping
the one before it) was decided here per model in session 45, from this timing; timed as users
run the model (reduce-overhead with freezing, ``scripts/check_pdl_model.py``) it was slower or
equal in every case (H200: Llama-3.2-1B decode b1 0.973x, b16 1.001x, Llama-3-8B b1 0.977x, b16
0.962x; session 46), so the decision was removed.
"""

from __future__ import annotations

import copy
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from ..cliargs import print_json
from ..codegen.export import device_free
from ..cost import choose_cost_model
from ..errors import ModelError
from ..fileio import check_writable
from ..ir.graph import Graph
from ..ir.serialize import graph_from_json, graph_to_json
from ..kernel import model_tuning
from ..kernel.choose import candidate_regions, choose_kernels, model_signature, split_only_signatures
from ..kernel.model_tuning import IN_MODEL_MARGIN, ORIGINAL, pick_program, pick_split
from ..kernel.profile import KernelProfile, ModelVerdict
from ..kernel.tune import TuneError, inductor_settings, may_start_processes, measure_us, torch_dtype, triton_version
from ..rules.db import RuleDB
from ..rules.load import load_rules
from .kernel_rules import kernel_rules_for, store_kernel_rules
from .model import LoadedModel, load_model, program_dtype
from .options import Options
from .passes import PASSES
from .pipeline import Optimized, candidate_module, optimize
from .verdict_pool import TimerPool

try:  # torch.export's pass that moves a program and the devices its graph names
    from torch.export.passes import move_to_device_pass
except ImportError:
    move_to_device_pass = None

__all__ = ["run_tune", "searched", "searched_graph", "model_verdict", "ModelSource"]


def searched(model: LoadedModel, dtype: str = "bf16", cost_device: str = "h100") -> Optimized:
    """``model`` through ``optimize``'s passes but the kernel pass and the output check: the
    graph the kernel pass sees, and the plan ``optimize`` emits it by (one search serves the
    tuning and the whole-model timing)."""
    cost, _ = choose_cost_model(cost_device, dtype)
    passes = [p for p in PASSES if p.name not in ("kernels", "output check")]
    return optimize(model, load_rules(), cost, Options(input_sets=1), passes=passes, dtype=dtype)


def searched_graph(model: LoadedModel, dtype: str = "bf16", cost_device: str = "h100"):
    """The graph the driver's kernel pass sees for ``model``."""
    return searched(model, dtype, cost_device).graph


def _cuda_inputs(model: LoadedModel, dtype: str):
    """The model's example call on the GPU, floating inputs at ``dtype``."""
    tdt = torch_dtype(dtype)

    def move(a):
        if not isinstance(a, torch.Tensor):
            return a
        return a.to("cuda", tdt) if a.is_floating_point() else a.to("cuda")
    return tdt, tuple(move(a) for a in model.inputs), {k: move(v) for k, v in model.kwargs.items()}


def original_on(model: LoadedModel, device: str) -> torch.nn.Module:
    """A copy of the original program on ``device``: a ``torch.export`` program moved by
    torch's own pass, which also rewrites the devices its graph names (a mask built from
    positions, ``torch.arange(n, device=cpu)`` as traced on the CPU, fails on a GPU once the
    module alone is moved: measured on the H200); else a copy of the module, moved."""
    ep = model.program if isinstance(model.program, torch.export.ExportedProgram) else None
    if ep is not None and move_to_device_pass is not None:   # its asserts' devices dropped: "cuda" is not "cuda:0"
        return device_free(move_to_device_pass(copy.deepcopy(ep), device)).module()
    return copy.deepcopy(model.reference).to(device)


class _ModelTimer:
    """Times the searched graph with kernels in a given set of regions: emitted as ``optimize``
    writes it, compiled by Inductor with freezing (dynamic shapes off), timed as the tuner times
    a region (:func:`~superopt.kernel.tune.measure_us`: in a CUDA graph, the L2 evicted first);
    given :data:`~superopt.kernel.model_tuning.ORIGINAL`, the original program instead (the
    model as imported, what ``optimize`` writes back when nothing changes), compiled and timed
    the same way. The compiled original, the model without kernels and the last one timed are
    kept, so timing them again (the picker's second look) costs no compilation; at most four
    copies of the model's weights are on the device at once."""

    def __init__(self, model: LoadedModel, found, profile: KernelProfile, dtype: str, repeat: int):
        self.model, self.found, self.profile, self.dtype, self.repeat = model, found, profile, dtype, repeat
        self.tdt, self.xs, self.kw = _cuda_inputs(model, dtype)
        self.device = torch.cuda.get_device_name()
        self.kept: dict = {}      # frozenset -> compiled callable: no kernel, and the last set timed
        self.compiled = 0

    def _compile(self, kernels: frozenset | None):
        # a program exported at half precision runs with its own dtypes (a weight it keeps in float32,
        # a folded ``inv_freq.float()``, stays so); a float32 model is cast to the precision timed
        cast = (lambda m: m.to(self.tdt)) if program_dtype(self.model) == "fp32" else (lambda m: m)
        if kernels is ORIGINAL:   # a copy: the model's own reference stays on the CPU for the output checks
            mod = cast(original_on(self.model, "cuda"))  # an inference program as given (an exported
            # program's module refuses .eval(): torch.export's own, "not supported yet")
        else:
            # timing only: kernels whose proofs still run go in as timed (tune_graph's during_proofs)
            graph, _ = choose_kernels(self.found.graph, None, self.device, self.dtype, self.profile, only=kernels,
                                      proved=False)
            mod = cast(candidate_module(self.model, graph, self.found.plan).to("cuda")).eval()
        with torch.no_grad(), inductor_settings():
            mod(*self.xs, **self.kw)      # eagerly first: lazily built attributes exist before dynamo traces
            fn = torch.compile(mod, dynamic=False)
            fn(*self.xs, **self.kw)
        self.compiled += 1
        return fn

    def prepare(self, kernels: frozenset | None):
        """The compiled program with kernels in ``kernels`` (compiled now unless kept)."""
        fn = self.kept.get(kernels)
        if fn is None:
            for s in [s for s in self.kept if s]:   # the previous set's model leaves the device first
                del self.kept[s]
            fn = self.kept[kernels] = self._compile(kernels)
        return fn

    def __call__(self, kernels: frozenset | None) -> float:
        fn = self.prepare(kernels)
        kw = self.kw
        with torch.no_grad(), inductor_settings():
            return measure_us(lambda *xs: fn(*xs, **kw), self.xs, self.repeat, calls=4)


@dataclass(frozen=True)
class ModelSource:
    """How a worker process loads the model again (:func:`~superopt.driver.model.load_model`'s
    arguments): the whole-model programs are compiled in workers (:mod:`.verdict_pool`)."""

    path: str | None = None
    zoo: str | None = None
    batch_size: int = 1
    seed: int = 0


def _worker_timer(source: ModelSource, graph_doc: dict, data_path: str, plan, profile_doc: dict, dtype: str,
                  repeat: int) -> "_ModelTimer":
    """In a worker: the model loaded again and a timer of the searched graph (sent as its JSON
    without weights, the weights read from one file that every worker shares: the same graph)."""
    model = load_model(source.path, source.zoo, source.batch_size, source.seed)
    with open(data_path, "rb") as f:
        data = pickle.load(f)
    bare = graph_from_json(graph_doc)
    found = SimpleNamespace(graph=Graph(bare.nodes, bare.outputs, data), plan=plan)
    return _ModelTimer(model, found, KernelProfile.from_json(profile_doc), dtype, repeat)


def _variants(sigs: list) -> list:
    """The programs the picker asks for before knowing which kernels win alone: the original,
    no kernel, every kernel, and (several candidates) each alone."""
    out = [ORIGINAL, frozenset()] + ([frozenset(sigs)] if sigs else [])
    return out + ([frozenset([s]) for s in sigs] if len(sigs) > 1 else [])


def _pool_size(model: LoadedModel, dtype: str, want: int) -> int:
    """How many programs may be compiled at once: each worker holds the weights (twice, with
    freezing's folded copies) and a CUDA context on the device; at most 60% of its free memory."""
    ref = model.reference
    tensors = list(ref.parameters()) + list(ref.buffers()) if isinstance(ref, torch.nn.Module) else []
    weights = sum(t.numel() for t in tensors) * torch_dtype(dtype).itemsize
    free, _ = torch.cuda.mem_get_info()
    return max(0, min(want, int(0.6 * free // (2 * weights + (3 << 29)))))


def model_verdict(model: LoadedModel, profile: KernelProfile, dtype: str = "bf16", cost_device: str = "h100",
                  repeat: int = 50, budget_s: float = 180.0, log=print,
                  found: Optimized | None = None, source: ModelSource | None = None,
                  workers: int = 8) -> ModelVerdict | None:
    """Time ``model`` (as ``optimize`` searches and writes it: ``found``, :func:`searched`'s
    result, searched now if not given) with the profile's candidate kernels and as the original
    program, and decide what to write (the module docstring); the verdict, or None where the
    searched graph is the original and no region has a kernel that beat Inductor's region alone
    (nothing to decide). With ``source`` (how to load the model again) and ``workers`` > 1, the
    programs are compiled at once in worker processes and timed one at a time
    (:class:`~superopt.driver.verdict_pool.TimerPool`)."""
    deadline, started = time.monotonic() + budget_s, time.perf_counter()

    def stamped(m: str) -> None:   # each step with the seconds since the verdict started
        log(f"{m}  [{time.perf_counter() - started:.0f} s]")
    if model.signature is None:   # an ONNX import: no torch module called like the original to time
        log("no whole-model timing for a model imported without a torch signature (ONNX): kernels decided per region")
        return None
    found = searched(model, dtype, cost_device) if found is None else found
    device = torch.cuda.get_device_name()
    cands = sorted(candidate_regions(found.graph, profile, device, dtype), key=lambda r: r.kernel_us - r.inductor_us)
    if not cands and found.unchanged:
        return None
    sigs = list(dict.fromkeys(r.signature for r in cands))
    split_set = _split_candidates(found.graph, device, dtype, profile)
    log("timing the whole model: the original program and the searched graph without kernels" +
        (f" and with those of {len(sigs)} kind(s) of region ({len(cands)} regions) that beat Inductor's code alone"
         if sigs else " (no region has a kernel that beat Inductor's code alone)") +
        (f"; then its fused gated projections split, with {len(split_set)} kind(s) of region" if split_set else ""))
    local = _ModelTimer(model, found, profile, dtype, repeat)
    variants = _variants(sigs)
    if split_set:   # compiled with the first programs: it is timed in any case
        variants.insert(3, split_set)
    pooled = source is not None and workers > 1 and torch.cuda.is_available() and may_start_processes()
    n = _pool_size(model, dtype, min(workers, len(variants))) if pooled else 0
    if n > 1:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="superopt-verdict-") as tmp:
            data_path = str(Path(tmp) / "weights.pkl")
            with open(data_path, "wb") as f:
                pickle.dump(dict(found.graph.data), f, protocol=pickle.HIGHEST_PROTOCOL)
            args = (source, graph_to_json(found.graph, with_data=False), data_path, found.plan, profile.to_json(),
                    dtype, repeat)
            with TimerPool(_worker_timer, args, variants[:n], local, log=stamped) as pool:
                stamped(f"  {len(pool.ready)} of {len(variants)} programs compiled at once in "
                        f"{time.perf_counter() - t0:.0f} s")
                pick = pick_program(sigs, pool, IN_MODEL_MARGIN, deadline, stamped)
                if split_set:
                    pick = pick_split(pick, split_set, pool, IN_MODEL_MARGIN, stamped)
    else:
        pick = pick_program(sigs, local, IN_MODEL_MARGIN, deadline, stamped)
        if split_set:
            pick = pick_split(pick, split_set, local, IN_MODEL_MARGIN, stamped)
    stamped("  the whole-model timing is done")
    programs = tuple((sig, profile.lookup(sig, dtype, device).program) for sig in sorted(pick.kernels))
    return ModelVerdict(model_signature(found.graph), dtype, device, tuple(sorted(pick.kernels)), round(pick.us, 2),
                        round(pick.inductor_us, 2), tuple((tuple(sorted(s)), round(t, 2)) for s, t in pick.tried),
                        torch.__version__, triton_version(), model.name, programs,
                        original_us=round(pick.original_us, 2), original=pick.original)


def _split_candidates(graph, device: str, dtype: str, profile: KernelProfile) -> frozenset:
    """The kernel set of ``graph``'s form with its fused gated projections split
    (:func:`~superopt.kernel.merge.split_gated_projections`): every region there whose kernel beat
    Inductor's code alone; empty where no projection splits or no region of the split form's
    own has such a kernel (the kernel pass then keeps the graph's form)."""
    own = split_only_signatures(graph)
    if not own:
        return frozenset()
    chosen = frozenset(r.signature for r in candidate_regions(graph, profile, device, dtype, split=True))
    return chosen if chosen & own else frozenset()


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def run_tune(args) -> int:
    """The command: a CUDA device, the model, its searched graph, then the kernel tuning."""
    if not _has_cuda():
        raise TuneError("superopt tune needs a CUDA device; run it on a GPU machine (elsewhere the shipped "
                        "H100 kernel profile decides)")
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 or --zoo NAME (not both)")
    check_writable(args.output, "kernel profile")
    if args.db:
        check_writable(args.db, "rule database")
        if Path(args.db).exists():
            RuleDB.open(args.db).close()     # not a rule database: refused before the long work
    quiet = args.json
    if not quiet:
        print(f"superopt: searching the graph of {args.model or args.zoo}...", file=sys.stderr, flush=True)
    model = load_model(args.model, args.zoo, args.batch_size)
    if args.dtype == "auto":   # a program's own precision (as optimize's); a zoo model (float32) at bf16
        args.dtype = program_dtype(model) if args.model else "bf16"
    found = searched(model, args.dtype, args.cost_device)
    graph = found.graph
    if not quiet:
        print("superopt: generating and tuning its kernels (minutes)...", file=sys.stderr, flush=True)
    line = model_tuning.tune_line
    verdicts: list = []

    def whole_model(prof: KernelProfile) -> None:
        """The model verdict, while the winners' proofs run (again if a proof changed an entry)."""
        verdicts[:] = [None]
        if found.unchanged and not prof.entries:   # nothing to decide
            return
        try:
            verdicts[0] = model_verdict(model, prof, args.dtype, args.cost_device, args.repeat, args.model_budget,
                                        log=(lambda m: None) if quiet else (lambda m: print(m, flush=True)),
                                        found=found, source=ModelSource(args.model, args.zoo, args.batch_size),
                                        workers=args.workers)
        except (RuntimeError, TypeError, ValueError, AssertionError) as e:  # Inductor, dynamo, CUDA OOM
            # the regions' measurements are kept: without a verdict the kernel pass decides per region
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            own = program_dtype(model) if args.model else args.dtype
            hint = (f" (the program was exported in {own}: the original cannot run in {args.dtype}; export it in "
                    f"{args.dtype} to time it so)") if own != args.dtype else ""
            print(f"superopt: the whole-model timing failed ({type(e).__name__}: {first}){hint}; the profile keeps "
                  f"the regions' times and the kernel pass decides per region", file=sys.stderr, flush=True)
    prof, rows = model_tuning.tune_graph(graph, args.dtype, args.workers, args.repeat, rows=args.row_kernels,
                                         log=(lambda r: None) if quiet else (lambda r: print(line(r), flush=True)),
                                         during_proofs=whole_model if args.in_model else None)
    verdict = verdicts[0] if verdicts else None
    if verdict is not None:
        prof.add_model(verdict)
    prof.save(args.output)
    stored = None
    if args.db:
        stored = store_kernel_rules(args.db, kernel_rules_for(graph, prof, args.dtype))
    if args.json:
        print_json({"profile": args.output, "regions": rows, "kernel_rules": stored,
                    "model": None if verdict is None else {"kernels": len(verdict.kernels), "us": verdict.us,
                                                           "inductor_us": verdict.inductor_us,
                                                           "original_us": verdict.original_us,
                                                           "original": verdict.original,
                                                           "reason": verdict.why_original}})
    else:
        print(f"{len(rows)} regions, {len(prof.entries)} kernels measured; wrote {args.output}"
              + (f"; {stored} kernel rule(s) stored in {args.db}" if stored is not None else ""))
        timed = next((r for r in rows if r.get("compiled")), None)
        if timed is not None:
            print(f"compiled {timed['compiled']} (program, tile config) pairs in {timed['compile_s']} s "
                  f"(Inductor's code for the regions meanwhile: {timed['inductor_compile_s']} s)")
        if verdict is not None:
            print(_verdict_line(verdict))
    return 0


def _verdict_line(v: ModelVerdict) -> str:
    """The whole-model timing's outcome, in one line."""
    if v.original:
        return (f"in the whole model: {v.why_original}; `superopt optimize` writes the original program for this "
                f"model on this device")
    return (f"in the whole model: {len(v.kernels)} kernel region(s) kept, {v.us:.1f} us against {v.inductor_us:.1f} us "
            f"without ({v.speedup:.3f}x) and {v.original_us:.1f} us for the original program "
            f"({v.original_us / v.us if v.us > 0 else 0.0:.3f}x)")
