"""Tuning a whole model's kernels (what ``superopt tune`` runs on the graph ``optimize`` searched).

Cuts the graph's regions (:func:`~superopt.kernel.regions.find_regions`), translates each
distinct region's kernels, tunes them on the GPU against Inductor's code for the same region
(:func:`~superopt.kernel.tune.tune_region`), verifies those that won (cached by signature; one
worker process per region), and writes the winners as a kernel profile that
``optimize`` and the backend read (:func:`~superopt.kernel.choose.choose_kernels`). Without a
CUDA device it stops at once: "superopt tune needs a CUDA device". The command itself is in
:mod:`superopt.driver.tune`: the regions to tune are those of the graph the driver's search
returns, which is what the kernel pass looks up.

A region timed alone misjudges the model for small, launch-bound regions (Inductor fuses across
their boundaries in the model), so the command then times the whole model with kernel sets
(:func:`pick_kernel_set`) and keeps the set that made the model faster as the profile's model
verdict; the original program is timed in the same run (:func:`pick_program`), and where the
rewrite does not beat it by the same margin, the verdict says the original is written.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

from ..ir.graph import Graph
from .profile import KernelProfile, region_signature
from .tune import TuneError, describe, may_start_processes

__all__ = ["tune_graph", "generate_all", "distinct_regions", "tune_line", "pick_kernel_set", "pick_program", "pick_split",
           "ProgramPick", "ORIGINAL", "IN_MODEL_MARGIN", "ROW_REGIONS"]

#: a kernel set must make the whole model this much faster than no kernel to be kept (the
#: spread of one model's median time between compilations, H100: 0.1-1%)
IN_MODEL_MARGIN = 0.01

#: what a whole-model timer is given to time the original program (as imported) instead of the
#: searched graph with a kernel set
ORIGINAL = None


def _gen(task):
    from ..ir.serialize import graph_from_json
    from .choose import cached_candidates
    doc, limit = task
    region = graph_from_json(doc)
    t0 = time.perf_counter()
    try:
        cands, counts = cached_candidates(region, time_limit=limit)
        return len(cands), dict(counts, wall=round(time.perf_counter() - t0, 1))
    except Exception as e:  # reported per region; the other regions still tune
        return 0, {"error": f"{type(e).__name__}: {e}"[:200]}


#: thread counts of the BLAS and OpenMP pools, set to one in the generation workers
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def blas_threads(n: int = 1):
    """Processes started inside see ``n`` BLAS threads each (the environment is read when numpy
    loads). The verifier's float64 emulation is thousands of tile-sized matmuls: with one
    worker per region each spawning a thread per core, OpenBLAS's threads fought over the cores
    (a BERT-base b16 region's float64 checks took 40 s with the default threads and 9 s with one,
    on a loaded 2-core host; the regions already run in parallel, one process each)."""
    old = {k: os.environ.get(k) for k in BLAS_THREADS}
    os.environ.update({k: str(max(1, n)) for k in BLAS_THREADS})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def generate_all(regions: list[Graph], workers: int, time_limit: float = 120.0, threads: int = 1) -> list[dict]:
    """Generate (and cache) the candidates of every region, one worker process per region,
    each with ``threads`` BLAS threads (:func:`blas_threads`)."""
    from ..ir.serialize import graph_to_json
    tasks = [(graph_to_json(r), time_limit) for r in regions]  # graphs travel as JSON
    if workers <= 1 or len(regions) <= 1 or not may_start_processes():
        return [_gen(t)[1] for t in tasks]
    with blas_threads(threads), ProcessPoolExecutor(min(workers, len(regions)), mp_context=mp.get_context("spawn")) as ex:
        return [c for _, c in ex.map(_gen, tasks)]


#: whether tuning also tries row-owning regions (a linear with the LayerNorm after it in one
#: kernel) unless asked: on an H100 they ran 2.4-2.6x slower alone than Inductor's GEMM plus its
#: LayerNorm kernel (BERT-base b1 bf16: 18.1 vs 7.4 us, 27.3 vs 10.5 us; session 33), and trying
#: them doubled BERT's tuning time
ROW_REGIONS = False


def distinct_regions(graph: Graph, rows: bool = ROW_REGIONS) -> list[tuple[Graph, Graph | None]]:
    """The regions of ``graph`` in canonical names, one per signature, in graph order, each with
    its form without prologue (None where that is the same); ``rows``: a row-owning region
    (:func:`~superopt.kernel.regions.row_regions`) just before the region of its linear. Then
    those of its form with fused gated projections split
    (:func:`~superopt.kernel.merge.split_gated_projections`) that the graph does not have: the
    whole-model timing decides between the two forms (:func:`~superopt.driver.tune.model_verdict`)."""
    from .merge import merge_linear_siblings, split_gated_projections
    from .regions import canonical_region, find_regions, row_regions
    split, parts = split_gated_projections(graph)
    seen, out = set(), []
    for form in (graph, split) if parts else (graph,):
        form = merge_linear_siblings(form)[0]   # as the kernel pass cuts them (choose_kernels)
        bare = {r.anchors: r for r in find_regions(form, prologue=False)}
        rowd, rows_bare = (row_regions(form), row_regions(form, prologue=False)) if rows else ({}, {})
        for region in find_regions(form):   # a row-owning region first where the anchors have one
            for r, alt in ((rowd.get(region.anchors), rows_bare.get(region.anchors)), (region, bare.get(region.anchors))):
                if r is None:
                    continue
                canon = canonical_region(r.graph)[0]
                sig = region_signature(canon)
                if sig not in seen:
                    seen.add(sig)
                    alt = canonical_region(alt.graph)[0] if alt is not None and alt.nodes != r.nodes else None
                    out.append((canon, alt))
    return out


def _translations(region: Graph) -> tuple[list, dict]:
    """The candidates of ``region`` to time: its proved ones where the cache has them, else the
    translations not yet verified (milliseconds; the proof comes after the timing, for a kernel
    that beat Inductor's code: :func:`tune_graph`)."""
    from .choose import timing_candidates
    try:
        cands, counts = timing_candidates(region)
    except Exception as e:  # reported per region; the other regions still tune
        return [], {"error": f"{type(e).__name__}: {e}"[:200]}
    if not counts.get("cached"):
        counts = dict(counts, verified="after the timing")
    return cands, counts


def _proved_entry(region: Graph, res, dtype: str):
    """``res.entry`` if its program is a storage variant of a proved candidate of ``region``,
    else the fastest timed program that is (its entry), else None; proved candidates come from
    the cache :func:`generate_all` filled."""
    from dataclasses import replace
    from .choose import cached_candidates, match_candidate
    cands = cached_candidates(region)[0]
    if match_candidate(res.entry.program, cands, region, dtype) is not None:
        return res.entry
    for us, program, config in res.ranked:
        if match_candidate(program, cands, region, dtype) is not None:
            return replace(res.entry, program=program, config=config, us=round(us, 3))
    return None


def tune_graph(graph: Graph, dtype: str = "bf16", workers: int = 8, repeat: int = 50,
               profile: KernelProfile | None = None, log=print, rows: bool = ROW_REGIONS,
               during_proofs=None, **tune_args) -> tuple[KernelProfile, list[dict]]:
    """Generate and tune every distinct region of ``graph`` (``rows``: row-owning ones too); the
    profile of the winners and one row per region (what was generated, tried, measured).

    The translations are timed before they are proved, and only a region whose kernel beat
    Inductor's code is verified (in ``workers`` processes, cached): the proof is what takes the
    time (ViT-B/16 at batch 16: 74 and 83 s for two regions on a CPU core, against 0.02 s to
    translate), and a kernel that loses is never used. A profile entry whose kernel won is
    always of a proved program (the fastest timed one that is; none where the verifier refuses
    every one); an entry that lost may hold a program not yet proved, which the kernel pass
    proves before any use (:func:`~superopt.kernel.choose.choose_kernels`), as for any entry.

    ``during_proofs(profile)`` is called while the proofs run, with the profile they leave if
    every one holds (the whole-model timing: it needs the GPU, the proofs the CPU; the Llama-3-8B
    decode step's longest proof took 20 s on the H100 host); where a proof then changes an entry
    (a winner refused, or proved only as a slower program), it is called again with the proved
    profile, so that what it last saw is what was proved; with nothing to prove, once, after
    the timing."""
    import torch
    from .tune import plan_region, tune_regions
    if not torch.cuda.is_available():
        raise TuneError("superopt tune needs a CUDA device; run it on a GPU machine (elsewhere the shipped "
                        "H100 kernel profile decides)")
    profile = KernelProfile() if profile is None else profile
    rows, plans = [], []
    for full, bare in distinct_regions(graph, rows):
        region, (cands, counts) = full, _translations(full)
        if not cands and bare is not None:
            region, (cands, counts) = bare, _translations(bare)
        rows.append({"region": describe(region), "signature": region_signature(region), "generated": counts})
        plans.append(plan_region(region, cands, dtype, **tune_args) if cands else None)
    measured = iter(tune_regions([p for p in plans if p is not None], workers, repeat))
    results = [None if p is None else next(measured) for p in plans]
    won = [p.region for p, res, row in zip(plans, results, rows)   # proved unless the cache had them proved
           if res is not None and res.entry is not None and res.entry.us < res.inductor_us
           and not row["generated"].get("cached")]
    won_sigs = [region_signature(g) for g in won]
    if during_proofs is None or not won:
        proofs = dict(zip(won_sigs, generate_all(won, workers)))
    else:
        hoped = _entries(rows, plans, results, dict.fromkeys(won_sigs), dtype)
        with ThreadPoolExecutor(1, thread_name_prefix="superopt-proofs") as ex:
            running = ex.submit(generate_all, won, workers)
            during_proofs(_with(profile, hoped))
            proofs = dict(zip(won_sigs, running.result()))
    final = _entries(rows, plans, results, proofs, dtype)
    for row, plan, res in zip(rows, plans, results):
        if plan is not None:
            timed = sorted((t for t in res.tried if t[2] is not None), key=lambda t: t[2])
            row.update(tried=len(res.tried), inductor_us=round(res.inductor_us, 2), time_s=round(res.seconds, 1),
                       compile_s=res.compile_s, inductor_compile_s=res.inductor_compile_s, compiled=res.compiled,
                       fastest=[f"{t[0]} {t[1]}: {t[2]:.1f}" for t in timed[:3]],
                       slowest=[f"{t[0]} {t[1]}: {t[2]:.1f}" for t in timed[-2:]],
                       dropped=[f"{t[0]} {t[1]}: {t[3]}" for t in res.tried if t[2] is None][:3])
            entry = final.get(row["signature"])
            if row["signature"] in proofs:
                row["generated"] = proofs[row["signature"]]
                if entry is None:
                    row["error"] = "the verifier proved no program that was timed: " + \
                        str(proofs[row["signature"]].get("error", "every candidate refused"))
            if entry is not None:
                row.update(kernel_us=entry.us, speedup=entry.speedup)
            elif res.entry is None:
                row["error"] = "no candidate ran correctly: " + "; ".join(str(t[3]) for t in res.tried[:2])
        log(row)
    if during_proofs is not None and (not won or final != hoped):
        during_proofs(_with(profile, final))
    for entry in final.values():
        profile.add(entry)
    return profile, rows


def _entries(rows, plans, results, proofs: dict, dtype: str) -> dict:
    """Each timed region's profile entry by signature: for a region in ``proofs`` (signature ->
    the proof's counts; None: not known yet, taken to hold), the proved program's
    (:func:`_proved_entry`), none where the proof failed; else the timed winner's."""
    out = {}
    for row, plan, res in zip(rows, plans, results):
        if plan is None or res.entry is None:
            continue
        entry, proof = res.entry, proofs.get(row["signature"])
        if proof is not None:
            entry = None if "error" in proof else _proved_entry(plan.region, res, dtype)
        if entry is not None:
            out[row["signature"]] = entry
    return out


def _with(profile: KernelProfile, entries: dict) -> KernelProfile:
    """A copy of ``profile`` with ``entries`` (signature -> entry) added."""
    return profile.merge(KernelProfile({(e.signature, e.dtype, e.device): e for e in entries.values()}))


def tune_line(r: dict) -> str:
    """One region's row of :func:`tune_graph` as a line of text."""
    if "kernel_us" in r:
        return f"{r['region'][:70]:<70} kernel {r['kernel_us']:8.1f} us  inductor {r['inductor_us']:8.1f} us"
    return f"{r['region'][:70]:<70} {r.get('error') or 'no verified kernel'}"


def pick_kernel_set(candidates: list[str], time_set, margin: float = IN_MODEL_MARGIN,
                    deadline: float | None = None, log=print) -> tuple[frozenset, float, float, list]:
    """The set of candidate regions (signatures, best first) whose kernels make the whole model
    fastest: ``time_set(frozenset)`` -> microseconds of the model with kernels in exactly those
    regions. Times no kernel and all of them; where all do not win by ``margin``, each alone
    (best first, until ``deadline``, a ``time.monotonic()`` value), then the winners together.
    The fastest set measured that beats no kernel by ``margin`` wins (none: the empty set), and
    it is timed once more against no kernel, both again, so that one lucky median does not
    decide. Returns ``(chosen, no-kernel us, chosen us, [(set, us), ...] as timed)``."""
    tried: list = []

    def timed(s: frozenset) -> float:
        us = time_set(s)
        tried.append((s, us))
        log(f"  kernels of {len(s)} kind(s) of region: {us:.1f} us")
        return us

    def wins(us: float, base: float) -> bool:
        return us < base * (1 - margin)

    everything = frozenset(candidates)
    base = timed(frozenset())
    results = {everything: timed(everything)} if everything else {}
    if len(candidates) > 1 and not wins(results[everything], base):
        alone = []
        for sig in candidates:
            if deadline is not None and time.monotonic() > deadline:
                break
            one = frozenset([sig])
            results[one] = timed(one)
            if wins(results[one], base):
                alone.append(sig)
        if len(alone) > 1 and frozenset(alone) not in results and (deadline is None or time.monotonic() <= deadline):
            results[frozenset(alone)] = timed(frozenset(alone))
    good = [(us, s) for s, us in results.items() if wins(us, base)]
    if not good:
        return frozenset(), base, base, tried
    _, best = min(good, key=lambda p: (p[0], len(p[1])))
    base2, us2 = timed(frozenset()), timed(best)       # again, both: the choice must hold twice
    base, us = min(base, base2), max(results[best], us2)
    if not wins(us, base):
        return frozenset(), base, base, tried
    return best, base, us, tried


@dataclass(frozen=True)
class ProgramPick:
    """:func:`pick_program`'s decision: the rewrite's kernel set and times, the original's time,
    and whether the original is what gets written (then ``kernels`` is not used)."""

    kernels: frozenset
    us: float            # the rewrite's time: the slower of two with its kernel set, or without kernels where
    #                      the original won; else (no kernel, the rewrite written) ``inductor_us``
    inductor_us: float   # the searched graph without kernels (the faster of its two timings)
    original_us: float   # the original program (the faster of its two timings)
    original: bool
    tried: list          # [(kernel set, us), ...] as timed, the original's timings left out


def pick_program(candidates: list[str], time_set, margin: float = IN_MODEL_MARGIN, deadline: float | None = None,
                 log=print) -> ProgramPick:
    """Which program to write: the original (``time_set(ORIGINAL)``), the searched graph without
    kernels, or with the kernel set :func:`pick_kernel_set` keeps. The original is timed first
    and again after the kernel sets, and the searched graph without kernels twice, so the two
    alternate; the rewrite (with its set, else without) is written only where its slower timing
    beats the original's faster one by ``margin`` (the rule a kernel set meets against no
    kernel), else the original is: superopt is never slower than what it hands back to.

    >>> times = {ORIGINAL: 100.0, frozenset(): 103.0, frozenset({"a"}): 99.5}
    >>> p = pick_program(["a"], times.__getitem__, log=lambda m: None)
    >>> p.original, p.us, p.original_us
    (True, 99.5, 100.0)
    """
    originals: list = []
    tried: list = []

    def original() -> None:
        originals.append(time_set(ORIGINAL))
        log(f"  the original program: {originals[-1]:.1f} us")

    def timed(s: frozenset) -> float:
        us = time_set(s)
        tried.append((s, us))
        return us

    original()
    chosen, _, us, _ = pick_kernel_set(candidates, timed, margin, deadline, log)
    original()
    if sum(not s for s, _ in tried) < 2:    # no kernel set won: no second look at the searched graph yet
        log(f"  the searched graph without kernels: {timed(frozenset()):.1f} us")
    bare = [t for s, t in tried if not s]
    rewrite = us if chosen else max(bare)
    keep = rewrite < min(originals) * (1 - margin)
    return ProgramPick(chosen if keep else frozenset(), rewrite if chosen or not keep else min(bare), min(bare),
                       min(originals), not keep, tried)


def pick_split(pick: ProgramPick, split_set: frozenset, time_set, margin: float = IN_MODEL_MARGIN,
               log=print) -> ProgramPick:
    """``pick`` (:func:`pick_program`'s decision for the graph as searched), or the kernel set
    ``split_set`` of its form with fused gated projections split where that wins: it is timed
    twice, around the program ``pick`` writes timed again, and kept only where its slower
    timing beats the faster of that program's by ``margin`` (the rule every choice here meets).

    >>> times = {ORIGINAL: 100.0, frozenset({"a"}): 90.0, frozenset({"b"}): 80.0}
    >>> pick = ProgramPick(frozenset({"a"}), 90.0, 95.0, 100.0, False, [])
    >>> p = pick_split(pick, frozenset({"b"}), times.__getitem__, log=lambda m: None)
    >>> sorted(p.kernels), p.us, p.original
    (['b'], 80.0, False)
    """
    written = ORIGINAL if pick.original else pick.kernels
    first = time_set(split_set)
    again = time_set(written)
    second = time_set(split_set)
    log(f"  the fused gated projections split, kernels of {len(split_set)} kind(s) of region: "
        f"{first:.1f} and {second:.1f} us")
    tried = list(pick.tried) + [(split_set, first), (split_set, second)]
    before = min(again, pick.original_us if pick.original else pick.us)
    us = max(first, second)
    if us < before * (1 - margin):
        return ProgramPick(split_set, us, pick.inductor_us, pick.original_us, False, tried)
    return ProgramPick(pick.kernels, pick.us, pick.inductor_us, pick.original_us, pick.original, tried)
