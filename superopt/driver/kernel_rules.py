"""Kernel rules from a kernel profile: what ``superopt tune --db`` stores in the rule database.

A profile entry says which program ran fastest for a region; a kernel rule adds what people need
to trust it: the region graph itself, the proof of the program it was measured as (the
candidate's proof record, and that the measured program is that candidate with a different
storage: half-precision loads or a weight stored transposed), the Triton source, and the models
whose whole-model verdict uses it. Built here, in the driver, because it needs the kernel level
(candidates, lowering) and the rule database (:mod:`superopt.rules.kernel_rules`) at once.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..ir.graph import Graph
from ..ir.serialize import graph_to_json
from ..kernel.choose import cached_candidates, match_candidate
from ..kernel.model_tuning import distinct_regions
from ..kernel.profile import KernelProfile, region_signature
from ..kernel.program import parse_program
from ..kernel.triton_lower import to_triton
from ..kernel.tune import describe, parse_config
from ..rules.db import RuleDB
from ..rules.kernel_rules import KernelRule, put_kernel_rules

__all__ = ["kernel_rules_for", "store_kernel_rules"]


def _models(profile: KernelProfile, sig: str, dtype: str) -> tuple:
    return tuple(sorted({v.model or v.signature[:12] for v in profile.models.values()
                         if v.dtype == dtype and sig in v.kernels}))


def _rule(region: Graph, profile: KernelProfile, dtype: str, device: str | None) -> KernelRule | None:
    sig = region_signature(region)
    entry = profile.lookup(sig, dtype, device)
    if entry is None:
        return None
    cands, _ = cached_candidates(region)
    cand = match_candidate(entry.program, cands, region, dtype)
    if cand is None:        # measured with a program no proved candidate accounts for: no rule
        return None
    program = parse_program(entry.program)
    proof = dict(cand.verdict.to_json(), variant="the program as proved" if program == cand.program else
                 "the proved program with another storage (half-precision loads or a weight stored transposed), "
                 "the same values")
    if cand.moves:
        proof["moves"] = cand.moves
    shape = json.dumps(graph_to_json(region, with_data=False))   # the structure; never a model's weights
    triton = to_triton(program, parse_config(entry.config))
    return KernelRule(sig, dtype, entry.device, entry.region or describe(region), shape, entry.program, entry.config,
                      triton, proof, entry.us, entry.inductor_us, entry.torch, entry.triton, _models(profile, sig, dtype))


def kernel_rules_for(graph: Graph, profile: KernelProfile, dtype: str = "bf16",
                     device: str | None = None) -> list[KernelRule]:
    """A kernel rule for every region of ``graph`` (as the kernel pass cuts it, with and without
    its prologue) that ``profile`` measured with a proved program."""
    out = []
    for full, bare in distinct_regions(graph):
        for region in (full, bare):
            if region is not None and (rule := _rule(region, profile, dtype, device)) is not None:
                out.append(rule)
    return out


def store_kernel_rules(path, rules: list[KernelRule]) -> int:
    """Write ``rules`` into the rule database at ``path`` (created empty where missing), in one
    transaction; how many."""
    db = RuleDB.open(path, writable=True) if Path(path).exists() else RuleDB.create(path)
    with db:
        return put_kernel_rules(db, rules)
