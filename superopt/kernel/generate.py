"""``generate_kernels``: enumerate, prune and verify kernel programs for one region.

A region (an ``ir.Graph`` cut from a model) is classified — a matmul region (norm -> one or two
matmuls sharing their input -> epilogue) or an attention region (``sdpa``, causal or not, with
grouped-query heads) — and its translator is run once per combination of the moves it may use
(:class:`~superopt.kernel.linear.LinearOptions`, :class:`~superopt.kernel.attention.AttentionOptions`).
A combination whose partial program computes a value that is not a subexpression of the
(rewritten) target is pruned at that statement; one larger than ``max_ops`` statements is pruned
on size; the rest are verified (:func:`~superopt.kernel.verify.verify_kernel`). The report
says what was enumerated, pruned (and why), verified, and the time taken.

>>> from superopt.ir import GraphBuilder
>>> b = GraphBuilder(); x = b.input("x", (4, 32)); w = b.weight("w", (32, 16))
>>> rep = generate_kernels(b.build([b.op("relu", b.op("matmul", x, w))]))
>>> rep.kind, len(rep.candidates) > 0, rep.candidates[0].verdict.status
('matmul', True, 'proved')
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..ir.graph import Graph
from .attention import AttentionOptions, attention_shape, translate_attention
from .build import Pruned
from ..errors import SuperoptError
from .linear import LinearOptions, linear_shape, translate_linear
from .program import KernelProgram
from .verify import Identity, KernelVerdict, Prep, check_identity, region_evidence, verify_kernel

__all__ = ["KernelCandidate", "KernelSearchReport", "generate_kernels", "region_kind", "SIDE_BY_SIDE_ELEMENTS"]

#: a region with at least this many input elements has its candidates verified side by side, in
#: threads: the checks are numpy work on large arrays, which releases the GIL (the batch-16
#: Llama-3-8B decode attention, two 16x8x2048x128 caches: two translations of 26 s each, one
#: after the other, the long pole of that model's kernel search)
SIDE_BY_SIDE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class KernelCandidate:
    """A verified-or-refused kernel for a region: the program, its verdict, the identities it
    relies on, its compile-time inputs (``prep``), and the moves that made it."""

    program: KernelProgram
    verdict: KernelVerdict
    identities: tuple[Identity, ...] = ()
    prep: Prep | None = None
    moves: str = ""

    def to_json(self) -> dict:
        return {"program": self.program.text(), "verdict": self.verdict.to_json(), "moves": self.moves,
                "identities": [i.name for i in self.identities],
                "prep": list(self.prep.names) if self.prep else []}


@dataclass
class KernelSearchReport:
    kind: str
    enumerated: int = 0
    pruned: int = 0
    verified: int = 0
    refused: int = 0
    seconds: float = 0.0
    stop: str = "exhausted"
    prune_reasons: Counter = field(default_factory=Counter)
    candidates: list[KernelCandidate] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)

    @property
    def best(self) -> KernelCandidate | None:
        """The first proved candidate (the generator lists the moves' preferred order first)."""
        return next((c for c in self.candidates if c.verdict.ok), None)

    def table(self) -> str:
        rows = [("region", self.kind), ("enumerated", self.enumerated), ("pruned", self.pruned),
                ("verified", self.verified), ("refused", self.refused), ("seconds", f"{self.seconds:.2f}"),
                ("stop", self.stop)]
        lines = [f"{k:<11} {v}" for k, v in rows]
        lines += [f"  pruned {n}x: {why}" for why, n in self.prune_reasons.most_common()]
        lines += [f"  candidate [{c.moves}] {c.verdict.status}: {len(c.program.body) + len(c.program.pre) + len(c.program.post)} "
                  f"statements" for c in self.candidates]
        lines += [f"  refused [{m}]: {why}" for m, why in self.refusals]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"kind": self.kind, "enumerated": self.enumerated, "pruned": self.pruned, "verified": self.verified,
                "refused": self.refused, "seconds": self.seconds, "stop": self.stop,
                "prune_reasons": dict(self.prune_reasons), "candidates": [c.to_json() for c in self.candidates],
                "refusals": [list(r) for r in self.refusals]}

    def __str__(self):
        return self.table()


def region_kind(region: Graph) -> str:
    """``attention``, ``matmul`` or ``none`` (no translator applies)."""
    if attention_shape(region) is not None:
        return "attention"
    if linear_shape(region) is not None:
        return "matmul"
    return "none"


def _options(kind: str, region: Graph):
    if kind == "matmul":
        low = [True, False] if any(region.nodes[i].types[0].dtype != "float32" for i in region.weights + region.inputs) \
            else [False]
        return [LinearOptions(c, f, lo) for c, f, lo in itertools.product([True, False], [True, False], low)]
    shape = attention_shape(region)
    packs = [True, False] if shape.group > 1 else [False]
    return [AttentionOptions(online, pack) for online, pack in itertools.product([True, False], packs)]


def generate_kernels(region: Graph, max_ops: int = 64, time_limit: float = 120.0, verify: bool = True,
                     name: str = "region") -> KernelSearchReport:
    """Enumerate kernel programs for ``region`` (see the module docstring); with ``verify=False``
    every program that survives pruning is a candidate with an ``unknown`` verdict (never use
    such a candidate: it is for inspecting or compiling the translations)."""
    start = time.perf_counter()
    kind = region_kind(region)
    rep = KernelSearchReport(kind)
    if kind == "none":
        rep.stop = "no translator: a region needs one or two matmuls by a [K, N] weight, or one sdpa"
        return rep
    seen: set[str] = set()
    memo: dict = {}  # the region's inputs and outputs, shared by the candidates' verifications
    found: list = []  # the translations to verify
    for opt in _options(kind, region):
        if time.perf_counter() - start > time_limit:
            rep.stop = "time limit"
            break
        rep.enumerated += 1
        try:
            if kind == "matmul":
                program, idents, prep = translate_linear(region, linear_shape(region), opt, name)
            else:
                program, idents, prep = translate_attention(region, attention_shape(region), opt, name)
        except Pruned as e:
            rep.pruned += 1
            rep.prune_reasons[str(e)] += 1
            continue
        except SuperoptError as e:   # a program or compile-time graph the move cannot build
            rep.pruned += 1
            rep.prune_reasons[f"ill-formed: {e}"] += 1
            continue
        text = program.text()
        if text in seen:
            rep.pruned += 1
            rep.prune_reasons["the same program as an earlier combination"] += 1
            continue
        seen.add(text)
        size = len(program.pre) + len(program.body) + len(program.post)
        if size > max_ops:
            rep.pruned += 1
            rep.prune_reasons[f"more than max_ops={max_ops} statements"] += 1
            continue
        if not verify:
            rep.candidates.append(KernelCandidate(program, KernelVerdict("unknown", "not verified (verify=False)"),
                                                  idents, prep, opt.text()))
            continue
        found.append((opt, program, idents, prep))
    verdicts = _verify_all(region, found, memo, start + time_limit)
    if None in verdicts:
        rep.stop = "time limit"
    for (opt, program, idents, prep), verdict in zip(found, verdicts):
        if verdict is None:
            continue
        if verdict.ok:
            rep.verified += 1
            rep.candidates.append(KernelCandidate(program, verdict, idents, prep, opt.text()))
        else:
            rep.refused += 1
            rep.refusals.append((opt.text(), verdict.reason))
    rep.seconds = time.perf_counter() - start
    return rep


def _verify_all(region: Graph, found: list, memo: dict, deadline: float) -> list[KernelVerdict | None]:
    """The verdicts of the translations ``found`` ((options, program, identities, prep)), in
    order (None: not verified, the time limit passed first); side by side where the region is
    large (:data:`SIDE_BY_SIDE_ELEMENTS`), and each candidate's seeds and input sets side by side
    in the cores left (one candidate: all of them): the region's own inputs and outputs computed once
    first, and the identities proved first (Z3's default context is not for threads; each is
    cached after its first proof)."""
    cores = os.cpu_count() or 1
    elements = sum(region.nodes[i].types[0].numel for i in region.inputs)
    large = elements >= SIDE_BY_SIDE_ELEMENTS
    threads = max(1, cores // max(1, len(found))) if large else 1   # each candidate's checks side by side

    def one(item):
        _, program, idents, prep = item
        return verify_kernel(program, region, idents, prep, memo=memo, threads=threads)
    if len(found) < 2 or not large:
        return [one(item) if time.perf_counter() <= deadline else None for item in found]
    for _, _, idents, _ in found:
        for ident in idents:
            check_identity(ident)
    region_evidence(region, memo, threads=os.cpu_count() or 1)
    with ThreadPoolExecutor(len(found), thread_name_prefix="superopt-verify") as ex:
        return list(ex.map(one, found))


def report_json(rep: KernelSearchReport) -> str:
    return json.dumps(rep.to_json(), indent=1)
