"""``superopt optimize``: import a model, run the driver's passes, write what the backend runs."""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

try:
    import resource
except ImportError:  # not Unix: no CPU seconds in the report
    resource = None

from ..cliargs import cores, print_json, show_progress
from ..cost import choose_cost_model
from ..codegen import write_program
from ..errors import ModelError, ResourceLimitError, SuperoptError
from ..fileio import check_writable, write_text
from ..rules.load import REVERSED_SUFFIX, load_rules
from ..search.report import format_table
from .aside import Aside, AsideFailed, can_fork, put_in_place, raise_if_terminated, terminate_as_interrupt
from .idle import METER, others as _others, spare_core as idle_spare_core
from .model import graph_bytes, load_model, program_dtype
from .options import DEFAULT_THREADS, Options, output_path
from .outcheck import REFERENCE_BESIDE_BYTES, ReferenceAhead, examples_reference
from .passes import PASSES
from .pipeline import optimize
from .write import write_model, write_onnx

__all__ = ["run_optimize", "set_threads", "fit_threads", "spare_core", "fewer_collections", "GC_THRESHOLDS",
           "RegionsBeside", "SavedBeside", "terminate_as_interrupt"]

#: the garbage collector's thresholds during ``optimize`` (CPython's default: 700, 10, 10)
GC_THRESHOLDS = (10_000, 10, 1000)


def _check_outputs(args, out: Path) -> None:
    """Before any work: the outputs can be written and none of them is the input."""
    wanted = [out] + [Path(x) for x in (args.pt2, args.report) if x]
    onnx_in = args.model is not None and Path(args.model).suffix.lower() == ".onnx"
    if out.suffix not in (".pt2", ".onnx") or (out.suffix == ".onnx" and not onnx_in):
        raise ModelError(f"{out}: the output must end in .pt2" + (" or .onnx" if onnx_in else ""))
    if args.pt2 and not args.pt2.endswith(".pt2"):
        raise ModelError(f"--pt2 {args.pt2}: the name must end in .pt2")
    for p in wanted:
        check_writable(p)
        if args.model and Path(args.model).exists() and p.resolve() == Path(args.model).resolve():
            raise ModelError(f"{p} is the input model; write the optimized model elsewhere (-o OUT)")
    if len({p.resolve() for p in wanted}) < len(wanted):
        raise ModelError("two outputs have the same name; give each its own file")


def set_threads(threads: int | None) -> int:
    """Intra-op threads of this process: ``threads`` (at most the cores), else this process's
    share of the cores among those running now (the cores over the runnable tasks, itself
    included), at most 4. Busy cores make extra threads spin against other processes:
    SqueezeNet's forward pass took 0.85 s with 2 threads and 0.14 s with 1 on 2 cores at load
    9.5; and eight runs started at once on 16 cores each took 4 while the load average, a
    minute behind, still read idle."""
    if threads is not None and threads > cores():
        raise ResourceLimitError(f"--threads {threads} on a machine with {cores()} cores; give at most {cores()}")
    n = threads or max(1, min(DEFAULT_THREADS, cores() // (1 + _others())))
    torch.set_num_threads(n)
    return n


def fit_threads(threads: int | None, beside: list = ()) -> int | None:
    """Intra-op threads again before the run's torch work after the search (the region check,
    the whole-model check), where the user gave none: 1 plus the idle cores measured over the
    last seconds (:mod:`.idle`), less the processes forked beside that still run, and no more
    than :func:`set_threads`' share of the cores among the tasks running now (eight runs on 16
    cores: 2 each) nor :data:`DEFAULT_THREADS`; None (unchanged) where nothing can be measured.
    :func:`set_threads` counts the tasks of one instant as the run starts, which read idle at load 3:
    there NASNet-A's forward pass took 3.3 s with 2 threads against 0.25 s with 1 (OpenMP's
    threads wait on each other for a core), and a region check 7.6 s against 0.5."""
    if threads is not None:
        return None
    idle = METER.cores()
    if idle is None:
        return None
    running = sum(1 for job in beside if isinstance(job, RegionsBeside) and not job.ready())
    n = max(1, min(DEFAULT_THREADS, cores() // (1 + _others()), 1 + int(idle + 0.25) - running))
    torch.set_num_threads(n)
    return n


def spare_core() -> bool:
    """Whether a core is idle (:func:`.idle.spare_core`, with this module's meter)."""
    return idle_spare_core(METER, _others)


def _options(args) -> Options:
    return Options(search=args.search, iterations=args.iter_limit, nodes=args.node_limit, time_limit=args.time_limit,
                   alpha=args.alpha, budget=args.budget, min_gain=args.min_gain, tolerance=args.tolerance,
                   input_sets=args.input_sets, layout=args.layout, portable=args.portable,
                   kernel_profile=args.kernel_profile, progress=show_progress(args)).check()


def _cli_passes(beside: list, threads: int | None = None, saver: SavedBeside | None = None) -> list:
    """The passes the command runs: all but the output check (done on the program written).
    Where a core is idle, the region check goes beside the rest (into ``beside``, joined by
    the write before its whole-model check): in a forked process with the original's run on the
    examples (:class:`RegionsBeside`), or where no process can be forked, the original's run
    alone in a thread (``ReferenceAhead``; Inception-v3 near idle: the write 2.6-2.9 -> 1.8-1.9 s).
    Only there, when a changed program will be checked: started before the search, the
    original's run cost BERT-base 1.2-2.0 s of CPU for nothing (its program is written unchanged)
    and slowed the search by sharing the interpreter with it.

    The forked region check starts right after the search where the search's own figures promise
    a change worth keeping (:func:`_promising`): it compares the graph the search started from
    with the one it extracted, which the passes between (keep if cheaper, kernels, layout) do
    not change, so it runs beside them too (0.1-0.5 s of CPU on the CNNs, NASNet-A the most).
    Where the region check pass is then skipped (the rewrite not kept, or rewritten again),
    :func:`_drop_regions_beside` ends it. The intra-op threads are fitted to the idle cores
    after the search (:func:`fit_threads`; ``threads``: the user's ``--threads``, kept). Where
    the process saving the model's own program beside the search (``saver``) has also run the
    original on the examples by the search's end, those outputs go to the model's memo first, so
    that neither the region check's process nor the whole-model check runs them again."""
    def search_then_regions(r) -> None:
        search(r)
        if saver is not None:  # the original's runs on the examples, done beside the search
            for name, value in saver.reference().items():
                r.model.memo.setdefault(name, value)
        if _promising(r) and can_fork() and spare_core():
            beside.append(RegionsBeside(r, check))
        fit_threads(threads, beside)

    def region_check(r) -> None:
        if any(isinstance(job, RegionsBeside) for job in beside):
            return  # started after the search, on the same graphs
        if not spare_core():
            check(r)
        elif can_fork():
            beside.append(RegionsBeside(r, check))
        else:
            beside.append(ReferenceAhead(r.model.reference, r.model.inputs, r.model.kwargs, r.model.memo, r.model.state))
            check(r)
    passes = {p.name: p for p in PASSES}
    search, check = passes["search"].run, passes["region check"].run
    out = []
    for p in PASSES:
        if p.name == "search":
            p = replace(p, run=search_then_regions)
        if p.name == "region check":
            p = replace(p, run=region_check)
        if p.name != "output check":
            out.append(p)
    return out


def _promising(r) -> bool:
    """Whether the region check will likely run on this search's result: the search priced its
    graph ``min_gain`` cheaper than the one it started from, records e-classes, and random input
    sets are asked for (the keep pass decides; a wrong guess costs the idle core's time only)."""
    rep = getattr(r.result, "report", None)
    before, after = getattr(rep, "cost_before", 0.0), getattr(rep, "cost_after", 0.0)
    return (r.options.input_sets > 1 and callable(getattr(r.result, "classes", None)) and r.check_regions is not None
            and before > 0 and before - after > 0 and before - after >= r.options.min_gain * before)


def _drop_regions_beside(beside: list, report) -> None:
    """End the region checks started beside whose pass did not run (``report.passes``): the graph
    written is not the one they check, or a pass failed."""
    if "region check" in report.passes:
        return
    for job in [j for j in beside if isinstance(j, RegionsBeside)]:
        job.cancel()
        beside.remove(job)


class SavedBeside:
    """The model's own program saved in a forked process while this one searches (on a core
    that is idle), into a temporary file beside the output: where the search finds nothing
    worth writing, that program is what gets written (BERT-base: its 0.34 GB save, 1.4 s, off the
    critical path), and :meth:`place` renames the file into place; otherwise :meth:`discard`
    ends the process and removes the file. The bytes are those the write would save.

    A model recorded without its program (``program`` None: the zoo CNNs) is not saved there,
    only run (its export would keep the core busy past the search; it is written back rarely).
    After the save the process also runs the original on the examples (float32 and float64, as
    the whole-model check does: :func:`examples_reference`; ``model``, where it is given: small
    models, :data:`REFERENCE_BESIDE_BYTES`), which :meth:`reference` hands over
    where it is done when the search ends: then the region check beside it no longer runs them
    (Inception-v3 on an idle machine: the write waited 0.43 s for that check's process)."""

    def __init__(self, program, out: Path, model=None):
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp.pt2", dir=out.parent)
        os.close(fd)
        self.tmp, self.saves = Path(tmp), program is not None
        self._memo: dict = {}

        def work() -> dict:
            if program is not None:
                write_program(program, self.tmp, out)
            if model is None:
                return {}
            try:
                return examples_reference(model.reference, model.inputs, model.kwargs, state=model.state)
            except Exception:  # noqa: BLE001 (the check runs the original again and says what failed)
                return {}
        self._job = Aside(work)

    def reference(self) -> dict:
        """The original's outputs on the examples (:func:`check_outputs`'s memo) where the
        process has answered already (never waited for: a save longer than the search, Llama-3-8B's
        0.9 GB, would hold the run up), else nothing."""
        if not self._memo and self._job.ready():
            try:
                self._memo = self._job.result() or {}
            except (AsideFailed, SuperoptError):
                self._memo = {}
        return self._memo

    def place(self, path: Path) -> bool:
        """Put the saved program at ``path``; False (and nothing there) where it was not saved."""
        try:
            self._job.result()
            if not self.saves:
                raise AsideFailed("recorded: not saved")
            put_in_place(self.tmp, path)
        except (AsideFailed, SuperoptError, OSError):
            self.discard()
            return False
        return True

    def discard(self) -> None:
        self._job.cancel()
        self.tmp.unlink(missing_ok=True)


class RegionsBeside:
    """The region check and the original's run on the examples in a forked process
    (:class:`~superopt.driver.aside.Aside`), while this one exports and saves the chosen graph:
    they share nothing but the run's state at the fork (Inception-v3: the region check 1.4 s
    and the original's runs off the critical path). :meth:`join` puts the child's answers where
    the region check and the output check would have put them (the report, the model's memo), or
    raises its refusal; where the child gives no answer, the region check runs here."""

    def __init__(self, r, check):
        self.r, self._check, self._done = r, check, False
        self._job = Aside(self._work)

    def _work(self) -> tuple:
        t, model = time.perf_counter(), self.r.model
        self._check(self.r)
        seconds = time.perf_counter() - t
        return self.r.report.region_check, seconds, examples_reference(model.reference, model.inputs, model.kwargs,
                                                                       model.memo, model.state)

    def ready(self) -> bool:
        """Whether :meth:`join` would not wait (the child answered, or it was joined)."""
        return self._done or self._job.ready()

    def cancel(self) -> None:
        """End the child if it was not joined (the write failed before its check)."""
        self._done = True
        self._job.cancel()

    def join(self) -> None:
        if self._done:
            return
        self._done = True
        t = time.perf_counter()
        try:
            region, seconds, memo = self._job.result()
        except AsideFailed:
            self._check(self.r)  # here, as without a spare core
            self.r.report.region_check["beside"] = "no answer: the check ran after the export"
            return
        self.r.report.region_check = {**region, "beside": f"{seconds:.3f} s in a second process, "
                                                         f"waited {time.perf_counter() - t:.3f} s"}
        for name, value in memo.items():
            self.r.model.memo.setdefault(name, value)


def _phase(args, name: str) -> None:
    raise_if_terminated()  # a SIGTERM whose interrupt an import swallowed ends the run here
    if show_progress(args):
        print(f"superopt: {name}...", file=sys.stderr, flush=True)


@contextmanager
def fewer_collections(thresholds: tuple = GC_THRESHOLDS):
    """The garbage collector at ``thresholds`` for the block, put back after. A run allocates
    millions of objects that live until its end (the exported programs, the e-graph), and at
    CPython's defaults the collector traversed all of them 8-10 times a run (full collections:
    1.0 s of ResNet-50's run, 1.5-1.9 s of NASNet-A's); at :data:`GC_THRESHOLDS` no full
    collection happens within a run and the young ones cost 0.3-0.7 s, at the same peak memory
    (ResNet-50, BERT, NASNet-A, Inception-v3: maximum resident size within 1%)."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def run_optimize(args, ahead=None) -> int:
    """The command: options checked, outputs writable, then import, passes, write, report
    (``ahead``: the zoo model being built already, :class:`~superopt.driver.ahead.BuiltAhead`, or
    exported in a second process, :class:`~superopt.driver.ahead.ExportedAhead`)."""
    METER.mark()  # where the command line did not already (spare_core's window)
    with fewer_collections(), terminate_as_interrupt():
        return _run(args, ahead)


def _run(args, ahead=None) -> int:
    if (args.model is None) == (args.zoo is None):
        raise ModelError("give a MODEL.pt2 / MODEL.onnx or --zoo NAME (exactly one)")
    opts = _options(args)
    set_threads(args.threads)
    out = output_path(args)
    _check_outputs(args, out)
    auto = args.dtype == "auto"   # the program's own precision, known once it is imported
    cost, modelled = choose_cost_model(args.device, "fp32" if auto else args.dtype, args.target,
                                       None if auto else args.profile, freezing=args.freezing, layout=args.layout,
                                       conv_relu=not args.portable)
    _phase(args, "loading rules")
    t, cpu = time.perf_counter(), time.process_time()
    rules = load_rules(args.db, args.example_rules, not args.one_way, args.exclude_rule)
    rules_s = (time.perf_counter() - t, time.process_time() - cpu)
    _phase(args, "importing the model")
    model = load_model(args.model, args.zoo, args.batch_size, specialize=args.specialize, ahead=ahead)
    if auto:
        args.dtype = program_dtype(model)
    if auto and (args.dtype != "fp32" or args.profile):   # else the model chosen above is the one
        cost, modelled = choose_cost_model(args.device, args.dtype, args.target, args.profile,
                                           freezing=args.freezing, layout=args.layout, conv_relu=not args.portable)
    saver = _save_beside(model, out, ahead)
    try:
        res = _passes(model, (rules, rules_s), cost, opts, args, modelled, out, saver)
    finally:
        if saver is not None:
            saver.discard()
    rep = res.report
    rep.cpu_s = _cpu_seconds()
    if getattr(ahead, "seconds", None):  # the model exported and imported beside (ExportedAhead)
        rep.cpu_s["import beside"] = ahead.seconds
    if args.report:
        write_text(args.report, json.dumps(rep.to_json(), indent=2, default=str) + "\n")
    if args.json:
        print_json(rep.to_json())
    else:
        print(_summary(res, rules))
    return 0


def _cpu_seconds() -> dict:
    """User + system seconds so far: this process (``run``: on an idle machine, about the wall
    time less the waits) and the processes forked beside it that ended (``beside``)."""
    if resource is None:
        return {}
    own, forked = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"run": round(own.ru_utime + own.ru_stime, 3), "beside": round(forked.ru_utime + forked.ru_stime, 3)}


def _save_beside(model, out: Path, ahead=None):
    """The model's own program saved beside the search (:class:`SavedBeside`), where a core is
    idle and the output is a ``.pt2``; a zoo model exported in a second process is saved there
    (``ahead``, :class:`~superopt.driver.ahead.ExportedAhead`, whose file is for ``out``)."""
    if model.program is None and model.export is not None and hasattr(ahead, "place"):
        return ahead if out.suffix == ".pt2" and ahead.out == out else None
    if not model.has_program() or out.suffix != ".pt2" or not can_fork() or not spare_core():
        return None
    act, weights = graph_bytes(model.graph)  # the original's float64 run beside too, where it is small
    try:
        return SavedBeside(model.program, out, model if act + weights <= REFERENCE_BESIDE_BYTES else None)
    except OSError:  # no temporary file there (/proc, a full disk): the write says why, with nothing written
        return None


def _passes(model, rules, cost, opts: Options, args, modelled, out: Path, saver: SavedBeside | None):
    """The passes, then the write. The output check runs on the program written (write_model /
    write_onnx), not on a module generated apart from it: one export, one whole-model check per
    input set, whose original side runs beside the region check (a thread is joined before
    anything is traced, a forked process before the whole-model check)."""
    rules, rules_s = rules
    beside: list = []
    try:
        res = optimize(model, rules, cost, opts, passes=_cli_passes(beside, args.threads, saver), dtype=args.dtype,
                       profile_name=modelled)
    except BaseException:
        for job in beside:
            if isinstance(job, RegionsBeside):
                job.cancel()
        raise
    finally:
        for job in beside:
            if isinstance(job, ReferenceAhead):
                job.join()
    _drop_regions_beside(beside, res.report)
    _phase(args, "export + output check + write")
    fit_threads(args.threads, beside)
    rep = res.report
    rep.seconds = {"rules": round(rules_s[0], 3), **rep.seconds}
    rep.cpu_seconds = {"rules": round(rules_s[1], 3), **rep.cpu_seconds}
    t, cpu = time.perf_counter(), time.process_time()

    def joined() -> None:
        for job in beside:
            job.join()
    try:
        if out.suffix == ".onnx":
            rep.output = str(write_onnx(res, out, args.tolerance, opts.input_sets, before_check=joined))
        else:
            rep.output = str(write_model(res, out, args.tolerance, opts.input_sets, before_check=joined,
                                         saved=saver.place if saver is not None else None,
                                         save_beside=_save_beside_check(beside, args.threads)))
    finally:
        for job in beside:
            if isinstance(job, RegionsBeside):
                job.cancel()  # joined already, or not wanted any more
    if args.pt2:
        rep.output += f", {write_model(res, args.pt2, args.tolerance, opts.input_sets)}"
    rep.seconds["export + check + write"] = round(time.perf_counter() - t, 3)
    rep.cpu_seconds["export + check + write"] = round(time.process_time() - cpu, 3)
    return res


def _save_beside_check(beside: list, threads: int | None = None):
    """Whether the written program is saved in a forked process while this one checks it, asked
    once it is exported: where the region check went beside, only if that process has answered
    (its core is free again; while it still runs, this process saves the program instead of
    waiting for it: ResNet-50's region check and original's runs take 2.2 s of CPU, its export
    0.3 s, its save 0.45 s); else where a core is idle now. Where it is, the check here runs
    with one intra-op thread fewer (the save takes a core; ``threads``, the user's, is kept)."""
    def ask() -> bool:
        regions = [job for job in beside if isinstance(job, RegionsBeside)]
        yes = can_fork() and (all(job.ready() for job in regions) if regions else spare_core())
        if yes and threads is None:
            torch.set_num_threads(max(1, torch.get_num_threads() - 1))
        return yes
    return ask


def _rule_names(rep, rules) -> str:
    """Applied rules as ``id xN: one-line form``, most used first."""
    texts = {getattr(rules, "labels", {}).get(r.id, r.id): r.text() for r in rules}
    applied = sorted(rep.search.get("rules_applied", {}).items(), key=lambda kv: -kv[1])
    lines = [f"{k} x{v}: {texts.get(k, '?')}" for k, v in applied]
    if any(k.endswith(REVERSED_SUFFIX) for k, _ in applied):
        lines.append(f"(ID{REVERSED_SUFFIX}: rule ID applied right to left; `superopt rules show ID{REVERSED_SUFFIX}`)")
    return "\n".join(lines) or "none"


def _unchanged(res) -> str:
    """Why the original program was written, if it was."""
    rep = res.report
    if not res.unchanged:
        return ""
    if rep.kept_original:
        return f" ({rep.kept_original}: the original program, unchanged)"
    if rep.cost_found is not None and rep.cost_found < rep.cost_before:
        return (f" (the best graph found is priced {100 * (1 - rep.cost_found / rep.cost_before):.2f}% cheaper, "
                f"under --min-gain {rep.min_gain:g}: the original program, unchanged)")
    return " (nothing priced cheaper: the original program, unchanged)"


def _code(res) -> str:
    """The layout and library-call choice, and what loading the written program needs."""
    lay, plan = res.report.layout, res.plan
    if not lay:
        text = "Inductor's own layout"
    elif not lay["kept"]:
        text = (f"Inductor's own layout (the chosen one is priced {lay['cost_chosen_us']:.2f} us against "
                f"{lay['cost_inductor_rule_us']:.2f}: within --min-gain)")
    else:
        text = (f"{'channels-last' if plan.channels_last else 'NCHW'} convolutions, {len(plan.conv_relu)} fused "
                f"cuDNN conv+bias+residual+ReLU calls")
    ops = res.report.custom_ops
    return text + (f"; loading needs `import superopt` ({', '.join(ops)}; --portable for none)" if ops else "")


def _regions(check: dict) -> str:
    """The rewritten regions' check, in one line."""
    if not check:
        return "none (the whole model ran on every input set)"
    where = "from the graph inputs" if check["from_graph_inputs"] else "drawn at their boundaries"
    return (f"{check['region_outputs']} rewritten values ({check['operators']} operators), max relative error "
            f"{check['worst']:.1e} on {_sets(len(check['sets']))} {where}: {', '.join(check['sets'])}")


def _sets(n: int) -> str:
    return f"{n} input set" + ("" if n == 1 else "s")


def _summary(res, rules=()) -> str:
    rep, s = res.report, res.report.search
    rows = [
        ("model", f"{rep.model} -> {rep.output}" + _unchanged(res)),
        ("cost model", rep.profile or rep.device),
        ("operators", f"{rep.nodes_before} -> {rep.nodes_after}"),
        ("cost (us)", f"{rep.cost_before:.2f} -> {rep.cost_after:.2f} "
                      f"({100 * (1 - rep.cost_after / rep.cost_before) if rep.cost_before else 0:.2f}% less)"),
        ("graphs explored", f"{s['explored']} (stopped by {s['stop_reason']}; {s['candidates']} candidates)")
        if "explored" in s else
        ("e-graph", f"{s['enodes']} e-nodes, {s['eclasses']} classes, {s['iterations']} iterations (stopped by "
                    f"{s['stop_reason']}); extracted by {s['extraction']} ({s['ilp_status']})"
                    + (f"; {s['kept_original']} value{'s' if s['kept_original'] != 1 else ''} kept as written "
                       f"(rewrites that did not lower the price)" if s.get("kept_original") else "")),
        ("rules applied", _rule_names(rep, rules)),
        ("code", _code(res)),
        ("output check", f"max relative error {rep.max_relative_error:.1e} (tolerance {rep.tolerance:g}) on "
                         f"{_sets(len(rep.output_check))}: {', '.join(rep.output_check)}"
         if rep.max_relative_error is not None else "none needed: the original program was written"),
        ("region check", _regions(rep.region_check) if rep.max_relative_error is not None else
         "none needed: the original program was written"),
        ("passes", ", ".join(rep.passes)),
        ("time (s)", ", ".join(f"{k} {v:.2f}" for k, v in rep.seconds.items())),
    ]
    return format_table(rows)
