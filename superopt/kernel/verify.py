"""``verify_kernel``: a kernel program is used only if it is equal to its region graph.

Three checks, all required (the first failure is the verdict's reason):

1. **identities**: every graph identity the program relies on (recorded by the generator, e.g.
   "a row scale moves out of a matmul") is a proven rule: found proven and cross-checked in the
   rule database, or else proven now by :func:`superopt.verify.verify_rule` at the region's
   shapes;
2. **fingerprint**: on two random points of GF(p) (two seeds of the field's random functions),
   the program's outputs, emulated tile by tile, equal the region graph's fingerprint exactly
   (see :mod:`superopt.kernel.semantics` for exp, rsqrt, division and the running max);
3. **float64**: on five random input sets the emulated outputs match the graph's reference
   semantics within ``tol`` (relative to the output's largest magnitude), and so do they when
   every running max is shifted by a random offset (the shift-invariance the field check
   assumes).

The fingerprint runs with blocks of 16 (edge tiles wherever a size is not a multiple of 16),
the float64 check alternates between those and the largest tiles of the autotuning space, so
two tilings are checked (a loop of several tiles, and the fewest tiles), and, for a program
that admits a split schedule (:func:`~superopt.kernel.split.split_kind`), a third: the blocks
of 16 with the loop split in 3 chunks (partials, then their combine). The fingerprint needs no
split run: a split only reassociates sums, exact in GF(p) (see :mod:`superopt.kernel.split`).
Program inputs that are not sources of the region are computed by ``prep``: a weight-only graph
over the region's sources, folded at compile time (a norm weight folded into the next weight).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..errors import SuperoptError
from ..ir.graph import Graph
from ..ir.rule import Rule
from ..semantics.field import Field
from ..semantics.reference import evaluate, random_inputs
from .emulate import default_emulation_config
from .errors import KernelError
from .program import KernelProgram, TileConfig
from .semantics import ShiftError, run_field, run_reference
from .split import chunks, split_kind

__all__ = ["Identity", "Prep", "KernelVerdict", "verify_kernel", "check_identity", "region_evidence", "SEEDS",
           "INPUT_SETS"]

_UNSET = -2


@dataclass(frozen=True)
class Identity:
    """A graph identity a program relies on: a named rule (lhs == rhs) at the region's shapes."""

    name: str
    rule: Rule


@dataclass(frozen=True)
class Prep:
    """Compile-time inputs of a program: ``graph`` over the region's sources, its outputs named."""

    graph: Graph
    names: tuple[str, ...]


@dataclass(frozen=True)
class KernelVerdict:
    """``proved`` (every check passed), ``refuted`` (a check failed: ``reason`` says which output
    and which input set) or ``unknown`` (a check could not run)."""

    status: str
    reason: str
    checks: tuple[str, ...] = ()
    identities: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    max_error: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "proved"

    def to_json(self) -> dict:
        return {"status": self.status, "reason": self.reason, "checks": list(self.checks),
                "identities": [list(i) for i in self.identities], "seconds": self.seconds,
                "max_error": self.max_error}


class _Refuted(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


_PROVEN: dict[str, str] = {}


def _from_db(rule: Rule) -> str | None:
    from ..rules.db import RuleDB
    from ..rules.paths import default_db_path
    path = default_db_path()
    if not path.exists():
        return None
    try:
        with RuleDB.open(path) as db:
            s = db.get(rule.id)
    except SuperoptError:
        return None
    return "proven (rule database)" if s.status == "proven" and s.crosscheck == "passed" else None


def check_identity(identity: Identity) -> str:
    """``proven (...)`` or the reason it is not; cached per process by rule id."""
    rid = identity.rule.id
    if rid not in _PROVEN:
        status = _from_db(identity.rule)
        if status is None:
            from ..verify.verifier import verify_rule
            res = verify_rule(identity.rule)
            status = "proven (verifier)" if res.applicable else f"{res.status}: {res.reason}"
        _PROVEN[rid] = status
    return _PROVEN[rid]


def _bind(program: KernelProgram, region: Graph, env: dict, prep: Prep | None, evaluate_prep) -> dict:
    values = dict(env)
    if prep is not None:
        for name, v in zip(prep.names, evaluate_prep(prep.graph, env)):
            values[name] = v
    out = {}
    for t in program.inputs:
        if t.name not in values:
            raise _Refuted("refuted", f"program input {t.name!r} is neither a source of the region nor prepared")
        v = np.asarray(values[t.name])
        if v.size != int(np.prod(t.shape)):
            raise _Refuted("refuted", f"program input {t.name} has shape {list(t.shape)}, the region's {list(v.shape)}")
        out[t.name] = v.reshape(t.shape)
    return out


def _check_outputs(program: KernelProgram, region: Graph):
    if len(program.outputs) != len(region.outputs):
        raise _Refuted("refuted", f"the program has {len(program.outputs)} outputs, the region {len(region.outputs)}")
    for t, r in zip(program.outputs, region.outputs):
        if int(np.prod(t.shape)) != region.type_of(r).numel:
            raise _Refuted("refuted", f"output {t.name} has shape {list(t.shape)}, the region's is "
                                      f"{list(region.type_of(r).shape)}")


#: the fingerprint's seeds and the float64 check's input sets, unless asked otherwise
SEEDS, INPUT_SETS = (0, 1), 5


def _field_evidence(region: Graph, seed: int, memo: dict):
    """The region's field inputs and outputs for ``seed`` (kept in ``memo``)."""
    if ("field", seed) not in memo:
        f = Field(seed)
        env = f.random_inputs(region, np.random.default_rng(seed))
        memo["field", seed] = env, f.evaluate(region, env)
    return memo["field", seed]


def _weights64(region: Graph, memo: dict) -> dict:
    """The region's own weights in float64, once for every input set (kept in ``memo``)."""
    if "data" not in memo:
        memo["data"] = {n: np.asarray(v, dtype=np.float64) for n, v in region.data.items()}
    return memo["data"]


def _float_evidence(region: Graph, k: int, memo: dict):
    """The region's float64 inputs and outputs of input set ``k`` (kept in ``memo``)."""
    if ("float", k) not in memo:
        env = random_inputs(region, np.random.default_rng(1000 + k))
        env.update({n: v for n, v in _weights64(region, memo).items() if n not in env})
        memo["float", k] = env, evaluate(region, env)
    return memo["float", k]


def region_evidence(region: Graph, memo: dict, seeds: Sequence[int] = SEEDS, input_sets: int = INPUT_SETS,
                    threads: int = 1) -> dict:
    """Fill ``memo`` with everything :func:`verify_kernel` computes of the region alone (its
    inputs and outputs per seed and input set), so that candidates verified side by side share
    it rather than each computing it (a batch-16 decode attention region: 10 s of drawing inputs,
    6 s of field evaluation). ``threads`` > 1: the seeds and input sets side by side (numpy's
    generators and array operations release the GIL). Returns ``memo``."""
    _weights64(region, memo)   # before the threads: each input set reads them
    jobs = [lambda s=s: _field_evidence(region, s, memo) for s in seeds] + \
        [lambda k=k: _float_evidence(region, k, memo) for k in range(input_sets)]
    if threads <= 1:
        for job in jobs:
            job()
        return memo
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(threads, len(jobs)), thread_name_prefix="superopt-evidence") as ex:
        list(ex.map(lambda job: job(), jobs))
    return memo


def _fingerprint(program, region, prep, seed, memo: dict):
    # rng: the garbage loaded past a tile's edge, a stream apart from the inputs' (a later
    # candidate, finding the inputs in ``memo``, once drew garbage equal to the first inputs)
    f, rng = Field(seed), np.random.default_rng([seed, 1])
    env, want = _field_evidence(region, seed, memo)
    try:
        got = run_field(program, _bind(program, region, env, prep, lambda g, e: f.evaluate(g, e)), f, rng)
    except ShiftError as e:
        raise _Refuted("unknown", f"fingerprint (seed {seed}): {e}") from None
    for t, a, b in zip(program.outputs, got, want):
        a = a.reshape(-1)
        if (a == _UNSET).any():
            raise _Refuted("refuted", f"output {t.name}: element {int(np.argmax(a == _UNSET))} is never written "
                                      f"(fingerprint, seed {seed})")
        if not np.array_equal(a, np.asarray(b).reshape(-1)):
            bad = int(np.argmax(a != np.asarray(b).reshape(-1)))
            raise _Refuted("refuted", f"output {t.name}: fingerprint differs from the region's at element {bad} "
                                      f"(seed {seed})")


def _float_check(program, region, prep, k, tol, config, memo: dict) -> float:
    env, want = _float_evidence(region, k, memo)
    ins = _bind(program, region, env, prep, lambda g, e: evaluate(g, e))
    runs = [("", None)]
    if any(s.op == "max" for _, s in program.statements()):
        runs.append(("shifted max", np.random.default_rng(2000 + k)))
    worst = 0.0
    for what, shift in runs:
        got = run_reference(program, ins, config, shift)
        for t, a, b in zip(program.outputs, got, want):
            a, b = a.reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
            err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)) if b.size else 0.0
            if not np.isfinite(a).all() or not err <= tol:
                raise _Refuted("refuted", f"output {t.name}: float64 error {err:.3g} > {tol:g} on input set {k}"
                                          + (f" ({what})" if what else ""))
            worst = max(worst, err)
    return worst


def _run_checks(jobs: list, threads: int) -> list:
    """What ``jobs`` return, in order, up to and including the first exception raised (in that
    order), which is in the list in place of a result. ``threads`` > 1: side by side in threads
    (numpy's work on large arrays releases the GIL: a batch-16 Phi-3 decode attention region's
    one candidate was 100 s of checks one after the other on one core, each seed's fingerprint
    13 s and each input set 5 s), the jobs not yet started cancelled once one has raised."""
    out: list = []
    if threads <= 1 or len(jobs) < 2:
        for job in jobs:
            try:
                out.append(job())
            except Exception as e:   # the caller raises it, after the checks before it
                return out + [e]
        return out
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(threads, len(jobs)), thread_name_prefix="superopt-checks") as ex:
        futures = [ex.submit(job) for job in jobs]
        for f in futures:   # jobs start in order: those before a failed one all ran
            try:
                out.append(f.result())
            except Exception as e:
                for g in futures:
                    g.cancel()
                return out + [e]
    return out


def _split_tiling(program: KernelProgram, config: TileConfig) -> list[TileConfig]:
    """``config`` split in 3 (2 for a loop of 2 tiles) where the program admits a split: the
    float64 check then covers the split schedule too (partials, then their combine)."""
    try:
        split_kind(program)
    except KernelError:
        return []
    tiles, _ = chunks(program, config)
    return [replace(config, split=min(3, tiles))] if tiles >= 2 else []


def verify_kernel(program: KernelProgram, region: Graph, identities: Sequence[Identity] = (),
                  prep: Prep | None = None, seeds: Sequence[int] = SEEDS, input_sets: int = INPUT_SETS,
                  tol: float = 1e-7, memo: dict | None = None, threads: int = 1) -> KernelVerdict:
    """Check ``program`` against ``region`` (see the module docstring); never raises on a wrong
    program, only on malformed arguments. ``memo``: a dict kept across the candidates of one
    region, holding the region's inputs and outputs per seed and input set (they do not depend
    on the program: evaluating the region was a third of a decode-attention verification).
    ``threads`` > 1: the seeds' and input sets' checks side by side (:func:`_run_checks`)."""
    memo = {} if memo is None else memo
    from .configs import default_configs
    start, checks, idents, worst = time.perf_counter(), [], [], 0.0
    try:
        _check_outputs(program, region)
        for ident in identities:
            status = check_identity(ident)
            idents.append((ident.name, status))
            if not status.startswith("proven"):
                raise _Refuted("refuted", f"identity {ident.name} is not a proven rule ({status})")
        tilings = [default_emulation_config(program), default_configs(program)[-1]]
        tilings += _split_tiling(program, tilings[0])
        if threads > 1:
            region_evidence(region, memo, seeds, input_sets, threads)
        jobs = [lambda s=s: _fingerprint(program, region, prep, s, memo) for s in seeds] + \
            [lambda k=k: _float_check(program, region, prep, k, tol, tilings[k % len(tilings)], memo)
             for k in range(input_sets)]
        outcomes = _run_checks(jobs, threads)
        for o in outcomes[:len(seeds)]:
            if isinstance(o, Exception):
                raise o
        checks.append(f"fingerprint: {len(seeds)} seeds, blocks {default_emulation_config(program).text()}")
        for o in outcomes[len(seeds):]:
            if isinstance(o, Exception):
                raise o
            worst = max(worst, o)
        checks.append(f"float64: {input_sets} input sets, blocks {' / '.join(t.text() for t in tilings)}, "
                      f"max error {worst:.2g}")
    except _Refuted as r:
        return KernelVerdict(r.status, r.reason, tuple(checks), tuple(idents), time.perf_counter() - start, worst)
    except KernelError as e:
        return KernelVerdict("unknown", str(e), tuple(checks), tuple(idents), time.perf_counter() - start, worst)
    return KernelVerdict("proved", "every check passed", tuple(checks), tuple(idents),
                         time.perf_counter() - start, worst)
