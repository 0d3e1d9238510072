"""``choose_kernels``: the pass that puts superopt's fused kernels into a graph.

For each region of the graph (:func:`~superopt.kernel.regions.find_regions`), it looks up the
region's signature in the kernel profile (the shipped H100 and H200 profiles by default, with the ones
``superopt tune`` measured on top where ``$SUPEROPT_KERNEL_PROFILE`` names them). Where a
kernel was measured, the region's verified candidates are
generated (:func:`~superopt.kernel.generate_kernels`, cached on disk by signature) and the
measured program must be one of their storage variants (:func:`~superopt.kernel.tune.variants`:
the same program with half-precision storage or a weight stored transposed), so that only a
proven kernel is ever used. The region is replaced by a ``kernel`` node only where the measured
kernel beats both Inductor's measured time for the region and the cost model's price of it by
more than ``margin`` (the cost model's error). Both are needed: a region's Inductor code timed
alone is slower than in the model, where Inductor fuses the region's epilogue into the next
kernel (BERT's residual add into its LayerNorm); choosing on the measured time alone put 48
kernels into BERT-base at batch 1 that won 1.1-1.2x each and made the model 0.80x on an H100
(ViT-B/16 0.77x). Sibling linears (q, k, v) whose merged projection gets no kernel keep
Inductor's code: Inductor merges them itself under freezing, so one kernel per projection
competes with one merged GEMM, not with the three that each region's timing saw. A region without a measured kernel is tried
again without its prologue (a linear layer whose norm the generator cannot put in a kernel). The report says, per region, what was
enumerated, pruned, verified, measured and chosen, and why.

Where the profile holds a **model verdict** for the graph (its signature: ``superopt tune``
timed the whole model with and without its candidate kernels, :mod:`superopt.driver.tune`),
the verdict decides instead: exactly the regions whose kernels made the model faster get them
(still only proved kernels), whatever the margin says; the others keep Inductor's code.

The candidate cache lives in ``$SUPEROPT_KERNEL_CACHE/candidates`` (default
``~/.cache/superopt/kernels/candidates``): one JSON file per region signature with the proved
candidates' programs, compile-time preps and proof records (the kernel rules' proofs).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field

from ..ir.graph import Graph
from ..ir.serialize import graph_from_json, graph_to_json
from .compile import cache_dir
from .errors import KernelError
from .generate import KernelCandidate, generate_kernels
from .masks import expand_shared_masks, reads_expanded_mask
from .merge import MERGED_SUFFIX, merge_linear_siblings, sibling_matmuls, split_gated_projections
from .profile import KernelProfile, default_profile, region_signature
from .program import parse_program
from .regions import Region, as_reference, canonical_region, find_regions, replace_regions, row_regions
from .torch_op import kernel_emitter
from .triton_lower import blocked_arrays
from .tune import describe, extra_arrays, extra_inputs, may_start_processes, parse_config, variants
from .verify import KernelVerdict, Prep

__all__ = ["choose_kernels", "KernelChoiceReport", "RegionChoice", "cached_candidates", "timing_candidates",
           "match_candidate", "model_signature", "MARGIN"]

#: a kernel must be this much faster than Inductor's code (measured and priced) to be used
MARGIN = 0.10


@dataclass
class RegionChoice:
    """What happened to one region."""

    kind: str
    region: str
    signature: str
    decision: str  # "kernel", "inductor", "not measured", "not verified"
    reason: str
    kernel_us: float | None = None
    inductor_us: float | None = None
    model_us: float | None = None
    generated: dict = field(default_factory=dict)


@dataclass
class KernelChoiceReport:
    """The regions found and what was chosen for each; timings of the pass."""

    device: str
    dtype: str
    regions: list[RegionChoice] = field(default_factory=list)
    seconds: float = 0.0
    merged: int = 0     # groups of sibling linears merged into one projection (kept: a kernel uses it)
    split: int = 0      # fused gated projections split into gate and up (a whole-model verdict kept that form)
    verdict: dict | None = None  # the model verdict followed, if any (model_us, inductor_us, kernels)
    proved_ahead: int = 0  # regions proved side by side in worker processes before deciding
    masks: int = 0      # attention masks without the batch axis (shared, or of rank 2/3), expanded to it (kept: a kernel reads one)

    @property
    def chosen(self) -> int:
        return sum(r.decision == "kernel" for r in self.regions)

    def table(self) -> str:
        head = f"{'kind':<9} {'decision':<13} {'kernel':>8} {'inductor':>9} {'model':>8}  region / reason"
        lines = [head]
        for r in self.regions:
            def us(v):
                return f"{v:8.1f}" if v is not None else f"{'-':>8}"
            lines.append(f"{r.kind:<9} {r.decision:<13} {us(r.kernel_us)} {us(r.inductor_us)} {us(r.model_us)}  "
                         f"{r.region[:60]} / {r.reason}")
        merged = f", {self.merged} sibling projections merged" if self.merged else ""
        merged += f", {self.split} fused gated projections split" if self.split else ""
        merged += f", {self.masks} attention masks without the batch axis expanded to it" if self.masks else ""
        ahead = f", {self.proved_ahead} proved side by side" if self.proved_ahead else ""
        lines.append(f"{len(self.regions)} regions, {self.chosen} kernels chosen ({self.device}, {self.dtype}){merged}"
                     f"{ahead}, {self.seconds:.1f} s")
        if self.verdict:
            v = self.verdict
            lines.append(f"as measured in the whole model on {v['device']}: {v['us']:.1f} us with these kernels, "
                         f"{v['inductor_us']:.1f} us without" +
                         (f" (measured on {v['carried_from']}: the same kernel regions, a few operators outside "
                          f"them differ)" if v.get("carried_from") else ""))
            if v.get("original"):
                lines.append(f"the original program is written instead: {v['original']}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"device": self.device, "dtype": self.dtype, "seconds": round(self.seconds, 3),
                "chosen": self.chosen, "merged": self.merged, "split": self.split, "masks": self.masks, "verdict": self.verdict,
                "proved_ahead": self.proved_ahead,
                "regions": [asdict(r) for r in self.regions]}


def _cache_file(sig: str):
    return cache_dir() / "candidates" / f"{sig}.json"


def read_cached_candidates(region: Graph) -> tuple[list, dict] | None:
    """The proved candidates of ``region`` and the generator's counts from the cache, or None
    (not cached, or a damaged entry)."""
    path = _cache_file(region_signature(region))
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        cands = [KernelCandidate(parse_program(c["program"]), _verdict(c["verdict"]), (),
                                 Prep(graph_from_json(c["prep"]), tuple(c["names"])) if c["prep"] else None,
                                 c["moves"]) for c in doc["candidates"]]
        return cands, dict(doc["counts"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged cache entry: generated again


def cached_candidates(region: Graph, time_limit: float = 120.0) -> tuple[list, dict]:
    """The proved candidates of ``region`` (program, prep) and the generator's counts, from the
    cache or generated now (and cached)."""
    hit = read_cached_candidates(region)
    if hit is not None:
        return hit
    path = _cache_file(region_signature(region))
    rep = generate_kernels(region, time_limit=time_limit)
    proved = [c for c in rep.candidates if c.verdict.ok]
    counts = {"enumerated": rep.enumerated, "pruned": rep.pruned, "verified": rep.verified,
              "refused": rep.refused, "seconds": round(rep.seconds, 2), "stop": rep.stop}
    doc = {"counts": counts, "candidates": [
        {"program": c.program.text(), "moves": c.moves, "verdict": c.verdict.to_json(),
         "prep": graph_to_json(c.prep.graph) if c.prep else None, "names": list(c.prep.names) if c.prep else []}
        for c in proved]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")   # writers may race: each its own
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    return proved, dict(counts, cached=False)


def timing_candidates(region: Graph) -> tuple[list, dict]:
    """Candidates of ``region`` to *time*, not to apply: the proved ones where the cache has
    them, else the translations not yet verified (milliseconds: ``superopt tune`` times kernels,
    in a region or in the whole model, while their proofs run, and keeps only what was proved)."""
    hit = read_cached_candidates(region)
    if hit is not None:
        return hit
    rep = generate_kernels(region, verify=False)
    return rep.candidates, {"enumerated": rep.enumerated, "pruned": rep.pruned, "verified": "not yet",
                            "stop": rep.stop}


def _verdict(doc: dict) -> KernelVerdict:
    """A cached candidate's proof record (a cache written before it was kept: regenerated)."""
    return KernelVerdict(doc["status"], doc["reason"], tuple(doc["checks"]), tuple(tuple(i) for i in doc["identities"]),
                         doc["seconds"], doc["max_error"])


def match_candidate(entry_program: str, cands: list, region: Graph, dtype: str):
    """The candidate of which the measured program is a storage variant, or None."""
    want = parse_program(entry_program)
    weights = {region.nodes[i].name for i in region.weights}
    for c in cands:
        names = weights | set(c.prep.names if c.prep else ())
        if any(v == want for v in variants(c.program, names, dtype)):
            return c
    return None


def _measured(kind: str, canon: Graph, profile: KernelProfile, cost_model, device: str, dtype: str, margin: float,
              only: frozenset | None):
    """``(RegionChoice, entry)`` for a region in canonical names, decided before generating
    anything: the profile entry whose kernel the region will get if its proof holds, or None
    (not measured, not in the model verdict, or not winning by ``margin``: said in the choice)."""
    sig = region_signature(canon)
    choice = RegionChoice(kind, describe(canon), sig, "not measured",
                          "no kernel measured for this region: `superopt tune` measures it")
    entry = profile.lookup(sig, dtype, device)
    if entry is None:
        return choice, None
    choice.kernel_us, choice.inductor_us = entry.us, entry.inductor_us
    choice.model_us = round(cost_model.graph_cost(canon), 3) if cost_model is not None else None
    rivals = [v for v in (entry.inductor_us, choice.model_us) if v]
    if only is not None and sig not in only:
        choice.decision, choice.reason = "inductor", ("not among the kernels the whole-model timing kept (or its "
                                                      "kernel was measured again since)")
        return choice, None
    if only is None and not all(entry.us * (1 + margin) < v for v in rivals):
        choice.decision, choice.reason = "inductor", f"the kernel does not win by {margin:.0%}"
        return choice, None
    return choice, entry


#: the regions to prove hold at least this many elements (inputs and weights) together, on a
#: machine of at least :data:`PROVE_AHEAD_CORES` cores: they are proved in worker processes, one a
#: region, the cores shared among them as BLAS threads, before the pass decides. A first `optimize`
#: of the Llama-3-8B decode step on the 16-core H200 host (cold caches, session 45): the kernel pass
#: 37.3 -> 31.8 s at batch 1, 67.9 -> 46.6 s at batch 16 (one BLAS thread a worker had made batch
#: 1 slower: its gated region's checks are BLAS-bound). Otherwise one after the other here: a
#: worker's start (importing torch) costs more than small proofs, and on 2 cores the five Llama b1
#: proofs took 86.8 s in workers against 78.1 s here.
PROVE_AHEAD_ELEMENTS = 1 << 24
PROVE_AHEAD_CORES = 8


def _prove_ahead(graph: Graph, profile: KernelProfile, cost_model, device: str, dtype: str, margin: float,
                 only: frozenset | None) -> int:
    """Prove side by side, in worker processes, the regions of ``graph`` that will get a kernel
    and whose proofs are not cached (:data:`PROVE_AHEAD_ELEMENTS`); the pass then reads them
    from the cache. Returns how many were proved here."""
    cores = os.cpu_count() or 1
    if cores < PROVE_AHEAD_CORES or not may_start_processes():   # the pass proves them one after the other
        return 0
    bare = {r.anchors: r for r in find_regions(graph, prologue=False)}
    todo, seen = [], set()
    for region in find_regions(graph):
        for cut in (region, bare.get(region.anchors)):
            if cut is None:
                continue
            canon = canonical_region(cut.graph)[0]
            choice, entry = _measured(cut.kind, canon, profile, cost_model, device, dtype, margin, only)
            if entry is not None and choice.signature not in seen and not _cache_file(choice.signature).exists():
                seen.add(choice.signature)
                todo.append(canon)
            if choice.decision != "not measured":
                break   # the bare form is tried only where the full one was not measured
    size = sum(g.nodes[i].types[0].numel for g in todo for i in g.inputs + g.weights)
    if len(todo) < 2 or size < PROVE_AHEAD_ELEMENTS:
        return 0
    from .model_tuning import generate_all
    workers = min(len(todo), cores // 2)
    generate_all(todo, workers, threads=cores // workers)   # a region's float64 checks are BLAS-bound
    return len(todo)


def _decide(region: Region, profile: KernelProfile, cost_model, device: str, dtype: str, margin: float,
            only: frozenset | None = None, proved: bool = True):
    """``(RegionChoice, emit or None)`` for one region (worked on in its canonical names);
    ``only``: the region signatures a model verdict gives kernels (None: decide by the margin);
    ``proved=False``: for timing only (:func:`timing_candidates`)."""
    canon, names = canonical_region(region.graph)
    choice, entry = _measured(region.kind, canon, profile, cost_model, device, dtype, margin, only)
    if entry is None:
        return choice, None
    cands, counts = cached_candidates(canon) if proved else timing_candidates(canon)
    choice.generated = counts
    cand = match_candidate(entry.program, cands, canon, dtype)
    if cand is None:
        choice.decision, choice.reason = "not verified", "the measured program is not a variant of a proved candidate"
        return choice, None
    program = parse_program(entry.program)
    data = {canon.nodes[i].name: canon.data[canon.nodes[i].name] for i in canon.weights if canon.nodes[i].name in canon.data}
    extras = extra_arrays(extra_inputs(program, as_reference(canon)), data, cand.prep)
    if entry.config:   # a ``blocked`` config reads its compile-time weights tile by tile
        try:
            extras = blocked_arrays(program, parse_config(entry.config), extras)
        except KernelError as e:
            choice.decision, choice.reason = "inductor", str(e)
            return choice, None
    choice.decision, choice.reason = "kernel", f"{entry.inductor_us / entry.us:.2f}x measured on {entry.device}" + \
        (", and faster in the whole model" if only is not None else "")
    tag = f"k{region.anchors[0]}"
    return choice, kernel_emitter(entry.program, entry.config, canon, extras, tag=tag, names=names, us=entry.us)


def choose_kernels(graph: Graph, cost_model, device: str, dtype: str, profile: KernelProfile | None = None,
                   margin: float = MARGIN, only=None, proved: bool = True,
                   split: bool = False) -> tuple[Graph, KernelChoiceReport]:
    """``graph`` with each region whose measured kernel wins replaced by a ``kernel`` node (see
    the module docstring). ``device``: the GPU (name or key) the profile is looked up for (an
    entry measured there first, else the H100's, else the fastest anywhere:
    :meth:`KernelProfile.lookup`); ``dtype``: ``bf16``, ``fp16`` or ``fp32``; ``cost_model``: a :class:`superopt.cost.CostModel` (or None: measured times only).

    Sibling linears of one input (q, k, v) are merged first (:func:`merge_linear_siblings`),
    and the merge is kept only where a merged projection's region got a kernel and the merge's
    identity is proven (proved only then: it costs a verifier call per rank). A fused gated
    projection (Phi-3's ``gate_up_proj``) is split into gate and up
    (:func:`~superopt.kernel.merge.split_gated_projections`) where ``only`` (or the verdict)
    names a region that only the split form has, or ``split`` asks for that form (the
    whole-model timing's candidates), and the identity is proven; never on the margin alone
    (at batch 1 the split form ran slower in the model: see :mod:`superopt.kernel.merge`). An
    attention mask the batch shares (``[1, 1, l, s]`` at batch 16) is expanded to the batch, a view,
    so that the attention's region is the one measured with transformers' ``[b, 1, l, s]``
    (:mod:`superopt.kernel.masks`); kept only where a kernel reads the expanded mask.

    ``only`` (region signatures) puts kernels into exactly those regions (proved kernels still;
    ``superopt tune`` uses it to time kernel sets in the model); without it, the profile's model
    verdict for ``graph`` decides where it has one (:func:`model_signature`), else the margin.

    ``proved=False`` is for timing only (``superopt tune``'s whole-model timing, which runs while
    the kernels' proofs do): a kernel whose proof is not cached yet goes in as the translation
    it was timed as, not proven, and the sibling merge is not proven either; nothing that writes
    or runs a user's model passes it.

    Contract: a valid graph in, a valid graph out computing the same values (each kernel proven
    equal to its region, unless ``proved=False``); nothing changes where no profile entry is found."""
    t0 = time.perf_counter()
    profile = default_profile() if profile is None else profile
    verdict = profile.lookup_model(model_signature(graph), dtype, device) if only is None and profile.models else None
    carried = verdict is None and only is None and bool(profile.models)
    if carried:
        verdict = _carried_verdict(graph, profile, device, dtype)
    if verdict is not None:
        only = verdict.approved(profile)
    only = frozenset(only) if only is not None else None
    graph, parts = _split_form(graph, only, split, proved)
    expanded, masks = expand_shared_masks(graph, prove=proved)
    out, report, count, ahead = _merged_and_chosen(expanded, profile, cost_model, device, dtype, margin, only, proved)
    if masks and not reads_expanded_mask(out):   # the expanded masks are kept where a kernel reads them
        out, report, count, ahead = _merged_and_chosen(graph, profile, cost_model, device, dtype, margin, only, proved)
        masks = 0
    report.merged, report.proved_ahead, report.split, report.masks = count, ahead, parts, masks
    if verdict is not None:
        report.verdict = {"device": verdict.device, "us": verdict.us, "inductor_us": verdict.inductor_us,
                          "kernels": len(verdict.kernels), "remeasured": len(verdict.kernels) - len(only),
                          "original_us": verdict.original_us, "original": verdict.why_original,
                          "carried_from": (verdict.model or verdict.signature) if carried else None}
    report.seconds = time.perf_counter() - t0
    return out, report


def _carried_verdict(graph: Graph, profile: KernelProfile, device: str, dtype: str):
    """The verdict of another searched graph with the same candidate regions as ``graph`` (those
    whose kernel beat Inductor's region alone, as ``superopt tune`` finds them: the choice at
    margin 0 without verdicts), or None. A step that builds its attention mask in the graph has a
    few more small operators than the same step given its mask, all outside the kernel regions:
    its regions, their kernels and what the device measured of them together are the other's."""
    candidates = frozenset(r.signature for r in candidate_regions(graph, profile, device, dtype))
    return profile.lookup_model_by_candidates(candidates, dtype, device) if candidates else None


def candidate_regions(graph: Graph, profile: KernelProfile, device: str, dtype: str,
                      split: bool = False) -> list[RegionChoice]:
    """The regions of ``graph`` (its fused gated projections split where ``split``) whose measured
    kernel beat Inductor's code alone: the choice at margin 0 over the profile's entries, without
    its verdicts, unproved. What ``superopt tune``'s whole-model timing tries."""
    regions = KernelProfile(dict(profile.entries))
    _, rep = choose_kernels(graph, None, device, dtype, regions, margin=0.0, proved=False, split=split)
    return [r for r in rep.regions if r.decision == "kernel"]


def _merged_and_chosen(graph: Graph, profile, cost_model, device: str, dtype: str, margin: float, only, proved: bool):
    """``(graph with kernels, report, sibling linears merged, regions proved ahead)``: the choice
    over ``graph`` with its sibling linears merged, kept where a merged projection got a kernel and
    the merge is proven (see :func:`choose_kernels`)."""
    merged, count = merge_linear_siblings(graph, prove=False)
    ahead = _prove_ahead(merged, profile, cost_model, device, dtype, margin, only) if proved else 0
    out, report, used = _choose(merged, profile, cost_model, device, dtype, margin, only=only, proved=proved)
    if count and not (used and merge_linear_siblings(graph, prove=proved)[1] == count):   # kept if used and proven
        out, report, used = _choose(graph, profile, cost_model, device, dtype, margin, sibling_matmuls(graph), only,
                                    proved)
    return out, report, (count if used else 0), ahead


def region_signatures(graph: Graph) -> set[str]:
    """The signatures of the regions the kernel pass may cut in ``graph`` (sibling linears
    merged; with and without prologues)."""
    g = merge_linear_siblings(graph, prove=False)[0]
    return {region_signature(canonical_region(r.graph)[0]) for p in (True, False) for r in find_regions(g, prologue=p)}


def split_only_signatures(graph: Graph) -> set[str]:
    """The signatures of the regions that only ``graph``'s form with its fused gated projections
    split has (:func:`~superopt.kernel.merge.split_gated_projections`); empty where none splits."""
    trial, parts = split_gated_projections(graph, prove=False)
    return region_signatures(trial) - region_signatures(graph) if parts else set()


def _split_form(graph: Graph, only, split: bool, proved: bool) -> tuple[Graph, int]:
    """``graph`` with its fused gated projections split (and how many) where ``split`` or
    ``only`` asks for that form (see :func:`choose_kernels`) and the identity is proven (unless
    not ``proved``: timing only); else ``graph`` and 0."""
    trial, parts = split_gated_projections(graph, prove=False)
    if not parts or not (split or only and only & split_only_signatures(graph)):
        return graph, 0
    if proved and split_gated_projections(graph, prove=True)[1] != parts:
        return graph, 0
    return trial, parts


def model_signature(graph: Graph) -> str:
    """The key of a model verdict: the signature of the graph the kernel pass is given."""
    return region_signature(graph)


def _row_kernel(anchors, rows, siblings, decide_args):
    """``(choice, region, emit)`` for the row-owning region of ``anchors`` (with its prologue,
    else without) whose kernel is measured and chosen, or None."""
    for cut in rows:
        row = cut.get(anchors)
        if row is not None and not siblings & set(row.nodes):
            choice, emit = _decide(row, *decide_args)
            if emit is not None:
                return choice, row, emit
    return None


def _choose(graph: Graph, profile, cost_model, device: str, dtype: str, margin: float,
            siblings: frozenset | set = frozenset(), only: frozenset | None = None, proved: bool = True):
    report = KernelChoiceReport(device, dtype)
    todo = []
    bare = {r.anchors: r for r in find_regions(graph, prologue=False)}
    rows = (row_regions(graph), row_regions(graph, prologue=False))
    for region in find_regions(graph):
        row = _row_kernel(region.anchors, rows, siblings, (profile, cost_model, device, dtype, margin, only, proved))
        if row is not None:   # the region with the LayerNorm after it, measured and chosen
            report.regions.append(row[0])
            todo.append(row[1:])
            continue
        if siblings & set(region.nodes):
            canon = canonical_region(region.graph)[0]
            report.regions.append(RegionChoice(region.kind, describe(canon), region_signature(canon), "inductor",
                                               "a sibling projection: the merged one's kernel does not win, and "
                                               "Inductor merges them itself"))
            continue
        choice, emit = _decide(region, profile, cost_model, device, dtype, margin, only, proved)
        alt = bare.get(region.anchors)
        if emit is None and alt is not None and alt.nodes != region.nodes and choice.decision == "not measured":
            alt_choice, alt_emit = _decide(alt, profile, cost_model, device, dtype, margin, only, proved)
            if alt_choice.decision != "not measured":
                choice, emit, region = alt_choice, alt_emit, alt
        report.regions.append(choice)
        if emit is not None:
            todo.append((region, emit))
    out = replace_regions(graph, todo) if todo else graph
    used = any(graph.nodes[i].op == "weight" and graph.nodes[i].name.endswith(MERGED_SUFFIX)
               for r, _ in todo for i in r.nodes)
    return out, report, used
