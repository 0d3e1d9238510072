"""The rules compiled for one saturation, kept between runs.

Compiling the rules a model can reach into patterns (:class:`~superopt.pattern.RuleSet`) and
deciding each pattern's schedule class (merge, growing, folding at some matches: see
:mod:`superopt.search.schedule`) depends only on the rules and on the code, not on the model's
sizes, yet took 0.3-0.45 CPU s of every search (SqueezeNet's whole search is about 1 s). Both are
kept: in this process, and on disk under the cache directory
(``$XDG_CACHE_HOME/superopt/compiled/``), one file per set of rules, written atomically. The key
is the rules' content (a database's content hash and how it was loaded, with the operators the
model has, which decide the rules it reaches; or the text of the rules it reaches) and a digest
of the code that compiles and classifies them (:func:`code_digest`), so a change to either
compiles again. A file that cannot be read is
compiled again and rewritten; ``$SUPEROPT_COMPILE_CACHE`` names another folder, or ``off`` turns
the disk cache off.

The file is a pickle of the patterns without their rules (they are put back from the rules
given, by position): it is read only from the user's own cache directory, as the instance
proofs and the reversed rules' ids are.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..fileio import user_cache_dir, write_cache
from ..ir.ops import REGISTRY
from ..ir.rule import Rule
from ..pattern import RuleSet, height, is_merge, match_key, reachable_rules, tops_of
from ..pattern.ematch import memos, seed
from .schedule import grows_runs, may_fold, merges, pointwise_only, runs

__all__ = ["Compiled", "compile_rules", "code_digest", "cache_dir"]

#: bump when what is stored changes shape
_FORMAT = 3
#: the modules whose code decides the compiled patterns and their classes (relative to superopt/)
_CODE = ("pattern", "ir", "search/schedule.py", "search/compiled.py", "cost/model.py")
#: entries kept on disk (about 0.5 MB each: a model's reachable rules under one code version)
KEEP = 64
KEEP_IN_MEMORY = 16
_MEMO: dict[str, bytes] = {}  # key -> the pickled entry (each run unpickles its own copy)
_DIGEST: list[str] = []


@dataclass
class Compiled:
    """The patterns and their schedule classes (pattern indexes): ``multi``: merges, run in
    rounds; ``skipped_merges``: merges of pointwise operators only, not run; ``tops``: patterns
    with several tops (their tops); ``top``: each pattern's first top; ``grows``: growing rules;
    ``maybe``: growing as stated, folding where some inputs are weights (decided per match);
    ``height``: each pattern's height; ``same``: each pattern's first pattern with its match key
    (:func:`~superopt.pattern.ematch.match_key`: the same matches)."""

    ruleset: RuleSet
    multi: set
    skipped_merges: set
    tops: dict
    top: dict
    grows: set
    maybe: set
    height: dict
    same: dict


def compile_rules(rules: Sequence[Rule] | RuleSet, graph) -> Compiled:
    """The patterns of the rules ``graph`` can reach and their classes, from the cache when
    these rules were compiled before by this code. For a loaded database the entry is found by
    the graph's operators (which decide the rules it reaches) and names those rules, so a warm
    search does not walk the database for them (0.014 s of every search)."""
    if isinstance(rules, RuleSet):
        return _classify(rules)
    key = _ops_key(rules, graph)
    if key is not None:
        got = _cached(key, rules)
        if got is not None:
            return got
    reach = reachable_rules(list(rules), graph)
    if key is None:
        key = _key(rules, reach)
        got = _cached(key, rules)
        if got is not None:
            return got
    out = _classify(RuleSet(reach))
    blob = _freeze(out, reach, rules)
    if blob is not None:
        _remember(key, blob)
        _write(key, blob)
    return out


def _cached(key: str, rules: Sequence[Rule]) -> Compiled | None:
    """The entry under ``key`` (None where there is none, or it is damaged or names other rules:
    then it is compiled again and rewritten)."""
    blob = _MEMO.get(key) or _read(key)
    if blob is None:
        return None
    try:
        return _thaw(blob, rules)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, AttributeError, ImportError):
        _MEMO.pop(key, None)
        return None


def _remember(key: str, blob: bytes) -> None:
    """Keep an entry in this process (at most ``KEEP_IN_MEMORY``, the oldest dropped)."""
    _MEMO.pop(key, None)
    _MEMO[key] = blob
    while len(_MEMO) > KEEP_IN_MEMORY:
        _MEMO.pop(next(iter(_MEMO)))


def _classify(ruleset: RuleSet) -> Compiled:
    pats = ruleset.patterns
    memo: dict = {}  # a rule and its reversal share their sides' graphs
    ran = lambda g: memo[id(g)] if id(g) in memo else memo.setdefault(id(g), runs(g))  # noqa: E731
    sides = {p.index: (ran(p.rule.lhs), ran(p.rule.rhs)) for p in pats}
    multi = {p.index for p in pats if is_merge(p) or merges(p.rule, sides[p.index])}
    # merges of pointwise operators only (two bias adds as one add over a concat) are left
    # out: they save launches at most (Inductor fuses pointwise operators anyway), and they
    # tie the e-graph into cycles that the cycle filter resolves against the large merges
    skipped = {p.index for p in pats if p.index in multi and pointwise_only(p)}
    tops = {p.index: tops_of(p) for p in pats}
    growing = {p.index for p in pats if p.index not in multi and grows_runs(*sides[p.index])}
    maybe = {p.index for p in pats if p.index in growing and may_fold(p.rule)}
    first: dict = {}
    same = {p.index: first.setdefault(match_key(p), p.index) for p in pats}
    return Compiled(ruleset, multi, skipped, {i: t for i, t in tops.items() if len(t) > 1},
                    {i: t[0] for i, t in tops.items()}, growing - maybe, maybe, {p.index: height(p) for p in pats},
                    same)


def _freeze(c: Compiled, reach: list, rules: Sequence[Rule]) -> bytes | None:
    """The entry without its rules: the reachable rules by position in ``rules`` (with their
    ids, checked when read), patterns and skipped rules naming them by position among those."""
    at = {id(r): k for k, r in enumerate(rules)}
    where = {id(r): k for k, r in enumerate(reach)}
    rs = c.ruleset
    rules_of, skipped = [p.rule for p in rs.patterns], rs.skipped
    _share_types(rs)
    try:
        named = [(at[id(r)], r.id) for r in reach]
        for p in rs.patterns:
            p.rule = where[id(p.rule)]
        rs.skipped = [(where[id(r)], why) for r, why in skipped]
        return pickle.dumps((_FORMAT, named, memos(rs.patterns), rs, c.multi, c.skipped_merges, c.tops, c.top,
                             c.grows, c.maybe, c.height, c.same), protocol=pickle.HIGHEST_PROTOCOL)
    except (KeyError, pickle.PicklingError, TypeError, AttributeError):
        return None  # a rule not among those given (cannot happen) or an unpicklable attribute
    finally:
        for p, r in zip(rs.patterns, rules_of):
            p.rule = r
        rs.skipped = skipped


def _share_types(rs: RuleSet) -> None:
    """One object per distinct tensor type in the patterns (equal ones replaced in place): the
    pickle then holds each type once, and reading it back builds a few hundred types instead of
    one per use (7,700 on SqueezeNet: half the time of reading the entry)."""
    one: dict = {}
    for p in rs.patterns:
        if p.var_types is not None:
            p.var_types = [one.setdefault(t, t) for t in p.var_types]
        for pn in p.pnodes:
            if pn.types is not None:
                object.__setattr__(pn, "types", tuple(one.setdefault(t, t) for t in pn.types))  # (frozen)


def _thaw(blob: bytes, rules: Sequence[Rule]) -> Compiled:
    fmt, named, memo, rs, *classes = pickle.loads(blob)
    if fmt != _FORMAT or not isinstance(rs, RuleSet):
        raise ValueError("another format")
    reach = [rules[k] for k, _ in named]
    if any(r.id != rid for r, (_, rid) in zip(reach, named)):
        raise ValueError("other rules")
    for p in rs.patterns:
        p.rule = reach[p.rule]
    rs.skipped = [(reach[k], why) for k, why in rs.skipped]
    seed(memo)  # (the code's digest is in the key: the matcher's memos are this code's)
    return Compiled(rs, *classes)


def _ops_key(rules: Sequence[Rule], graph) -> str | None:
    """For a loaded database (its content digest, all its rules given): the key of its entry
    for ``graph``, from the operators the graph has (:func:`reachable_rules` reads nothing else
    of it) and the code's digest; None for other rules."""
    digest = getattr(rules, "digest", None)
    if digest is None or len(rules) != getattr(rules, "digest_count", -1):
        return None
    ops = sorted({n.op for n in graph.nodes})
    return hashlib.blake2b(f"{_FORMAT} {code_digest()} {digest} {ops}".encode(), digest_size=16).hexdigest()


def _key(rules: Sequence[Rule], reach: list) -> str:
    """The key of rules that are not a loaded database: the text of those the model reaches, in
    order, and the code's digest."""
    h = hashlib.blake2b(f"{_FORMAT} {code_digest()}".encode(), digest_size=16)
    for r in reach:
        h.update(repr((r.lhs.nodes, r.lhs.outputs, r.rhs.nodes, r.rhs.outputs)).encode())
    return h.hexdigest()


def code_digest() -> str:
    """A digest of the code that compiles and classifies the rules, and of the operator
    registry's facts they read (once per process)."""
    if not _DIGEST:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.blake2b(digest_size=16)
        for part in _CODE:
            p = root / part
            for f in sorted(p.glob("*.py")) if p.is_dir() else [p]:
                h.update(f.name.encode())
                h.update(f.read_bytes())
        facts = sorted((name, re.sub(r" at 0x[0-9a-f]+", "", repr(d))) for name, d in REGISTRY.items())
        h.update(repr(facts).encode())  # its flags and cost facts (functions by name: no addresses)
        _DIGEST.append(h.hexdigest())
    return _DIGEST[0]


def cache_dir() -> Path | None:
    """Where compiled rules are kept: ``$SUPEROPT_COMPILE_CACHE`` (a folder, or ``off``: None,
    no disk cache), else ``compiled/`` in the user's cache folder."""
    env = os.environ.get("SUPEROPT_COMPILE_CACHE", "")
    if env.lower() in ("off", "0", "no"):
        return None
    return Path(env) if env else user_cache_dir() / "compiled"


def _read(key: str) -> bytes | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        blob = (d / f"{key}.pickle").read_bytes()
    except OSError:
        return None
    _remember(key, blob)
    return blob


def _write(key: str, blob: bytes) -> None:
    """Best effort, atomic (a reader sees the whole file or none): a read-only home only costs
    the compilation next time."""
    d = cache_dir()
    if d is None or not write_cache(d / f"{key}.pickle", blob):
        return
    try:
        kept = sorted(d.glob("*.pickle"), key=lambda f: f.stat().st_mtime)
        for f in kept[:-KEEP]:  # the oldest go: entries of older code or databases are never read again
            f.unlink(missing_ok=True)
    except OSError:
        pass
