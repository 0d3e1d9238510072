"""Loading the rules to apply: the proven rules of a database (or the hand-written examples),
in both directions, with the labels reports print.

A reversed rule has no row of its own in the database: it is labelled with the id of the rule
it reverses followed by ``~`` (``45ea23b99cec15b5~`` is rule ``45ea23b99cec15b5`` applied right
to left), and ``superopt rules show ID~`` shows it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Sequence

from ..errors import RulesError, SuperoptError
from ..fileio import user_cache_dir, write_cache
from ..ir.graph import Graph, GraphBuilder, Ref
from ..ir.rule import Rule
from .. import verify  # its prover (z3) loads on first use: only the examples are proven here
from .db import RuleDB
from .examples import example_rules
from .paths import default_db_path

__all__ = ["RuleList", "load_rules", "at_dtypes", "DEFAULT_RULES", "REVERSED_SUFFIX", "split_label"]

DEFAULT_RULES = str(default_db_path())  # the shipped database, wherever the command runs from
#: what a report appends to a rule's id when the rule was applied right to left
REVERSED_SUFFIX = "~"


def split_label(label: str) -> tuple[str, bool]:
    """``(database id, reversed)`` of a label a report prints.

    >>> split_label("45ea23b99cec15b5~")
    ('45ea23b99cec15b5', True)
    """
    if label.endswith(REVERSED_SUFFIX):
        return label[:-len(REVERSED_SUFFIX)], True
    return label, False


class RuleList(list):
    """Rules to apply, with ``labels``: rule id -> how reports name it (a reversed rule as the
    database id of the rule it reverses, followed by ``~``) and ``source``: the database they
    came from (its instance proofs are kept there), None for the examples. ``digest``: the
    database's content hash and how it was loaded (None for the examples), which with
    ``digest_count`` (the rules it was computed for) keys the compiled rules' cache
    (:mod:`superopt.search.compiled`) without reading every rule."""

    def __init__(self, rules=(), labels=None, source=None, digest=None):
        super().__init__(rules)
        self.labels = dict(labels or {})
        self.source = source
        self.digest, self.digest_count = digest, len(self)


def load_rules(path: str | None = DEFAULT_RULES, examples: bool = False, both_ways: bool = True,
               exclude: Sequence[str] = ()) -> RuleList:
    """Proven rules of a rule database (or the hand-written examples), in both directions (except
    reversals whose left side would need a constant operator). ``exclude`` takes database ids
    (both directions go) and labels (``ID~``: the reversal only)."""
    if examples:
        rules, labels = _example_rules(both_ways)
    else:
        rules, labels = _db_rules(path if path is not None else DEFAULT_RULES, both_ways)
    dropped = set(exclude)
    known = set(labels.values())
    unknown = sorted(x for x in dropped if x not in known and split_label(x)[0] not in known)
    if unknown:
        raise RulesError(f"--exclude-rule: no rule {', '.join(unknown)} among the {len(labels)} rules loaded; "
                         f"ids are listed by `superopt rules list`")
    keep = [r for r in rules if labels[r.id] not in dropped and split_label(labels[r.id])[0] not in dropped]
    digest = None if examples else f"{_file_digest(path if path is not None else DEFAULT_RULES)} {both_ways} {sorted(dropped)}"
    return RuleList(keep, labels, None if examples else path, digest)


#: the examples as loaded, by ``both_ways``: fixed rules proven from the shipped axioms, so a
#: process optimizing many models (the fuzz, a test session) proves them and labels their
#: reversals once, not per model
_EXAMPLES_CACHE: dict = {}


def _example_rules(both_ways: bool) -> tuple[list, dict]:
    if both_ways not in _EXAMPLES_CACHE:
        candidates = example_rules()
        results = verify.verify_rules(candidates, progress=False)
        rules = [r for r, v in zip(candidates, results) if v.applicable]
        _EXAMPLES_CACHE[both_ways] = (len(candidates) - len(rules), *_both_ways(rules, both_ways))
    unproven, rules, labels = _EXAMPLES_CACHE[both_ways]
    if unproven:
        print(f"superopt: {unproven} example rule(s) not proven; they are not applied", file=sys.stderr)
    return list(rules), dict(labels)


_DB_CACHE: dict = {}
_DIGESTS: dict = {}


def _file_digest(path) -> str:
    """The file's content hash (kept per path, size and modification time)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS.clear()
        _DIGESTS[key] = hashlib.blake2b(p.read_bytes(), digest_size=16).hexdigest()
    return _DIGESTS[key]


def _db_rules(path, both_ways: bool) -> tuple[list, dict]:
    """The proven rules of a database and their labels; the last database read is kept in
    memory (keyed by its path, size and modification time), since computing the ids of the
    reversed rules takes seconds and a process optimizing many models reads the same file."""
    p = Path(path)
    if not p.exists():
        raise RulesError(f"no rule database at {path}; generate one with `superopt generate`, pass --db PATH, "
                         f"or try the built-in examples with --example-rules")
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, both_ways)
    if key not in _DB_CACHE:
        with RuleDB.open(path) as db:
            rules = _proven(db)
        if not rules:
            raise RulesError(f"{path} holds no proven, cross-checked rule; nothing to apply")
        _DB_CACHE.clear()
        _DB_CACHE[key] = _both_ways(rules, both_ways, key[:3])
    rules, labels = _DB_CACHE[key]
    return list(rules), dict(labels)


def _proven(db: RuleDB) -> list:
    """What the optimizer applies: proven, cross-checked rules in insertion order, each with its
    stored id (the id it was stored under: no canonical labelling to compute it again)."""
    rules = []
    for stored in db.query(status="proven"):
        if stored.crosscheck == "passed":
            rule = stored.rule
            rule.__dict__["id"] = stored.id  # Rule.id is a cached_property
            rules.append(rule)
    return rules


def _both_ways(rules: list, both_ways: bool, key: tuple | None = None) -> tuple[list, dict]:
    """The rules and, when ``both_ways``, their reversals, with labels (``ID``, ``ID~``). The
    ids of the reversals (a canonical labelling each: seconds for a thousand rules) are kept in
    a cache file per database ``key``."""
    labels = {r.id: r.id for r in rules}
    if both_ways:
        fwd = [r for r in rules if not _has_constants(r.rhs)]
        back = [r.reversed() for r in fwd]
        known = _read_ids(key)
        for r, b in zip(fwd, back):
            if r.id in known:
                b.__dict__["id"] = known[r.id]  # Rule.id is a cached_property: the stored value
        labels.update({b.id: f"{r.id}{REVERSED_SUFFIX}" for r, b in zip(fwd, back)})
        if len(known) < len(fwd):
            _write_ids(key, {r.id: b.id for r, b in zip(fwd, back)})
        rules = rules + back
    return rules, labels


def _ids_path(key: tuple | None) -> Path | None:
    if key is None:
        return None
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
    return user_cache_dir() / f"reversed-{digest}.json"


def _read_ids(key: tuple | None) -> dict:
    path = _ids_path(key)
    try:
        doc = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and all(isinstance(v, str) for v in doc.values()) else {}


def _write_ids(key: tuple | None, ids: dict) -> None:
    """Best effort: a read-only home only costs the seconds next time."""
    path = _ids_path(key)
    if path is not None:
        write_cache(path, json.dumps(ids).encode())


def _has_constants(g: Graph) -> bool:
    """Constants (ones, identity kernels...) appear in a graph only where a rule put them (the
    input is folded), so a rule whose left side needs one mostly undoes another rule."""
    return any(n.opdef.kind == "constant" for n in g.nodes)


#: the floating dtypes a float32 rule is also stated at (a model exported in half precision)
HALF_DTYPES = ("bfloat16", "float16")
_AT_DTYPES_CACHE: dict = {}


def at_dtypes(rules: RuleList, dtypes) -> RuleList:
    """``rules`` and, for each of ``dtypes`` (of :data:`HALF_DTYPES`), every rule over float32
    values stated over that dtype instead. Rules are found and proven at float32, and the matcher
    binds a rule's variables to values of their own dtype only, so a model exported in bf16 (its
    values bf16, a norm's statistics in float32) met no rule at all. A proof holds over the reals,
    whatever the storage; each instance applied is proven again at its own types, and the whole
    model's output check judges the rounding (at bf16, against the original's own error). A
    retyped rule whose sides no longer type-check (a cast to float32 inside) is left out. Labels
    are the original's (a report names the database rule); each retyped rule's id is the
    original's with ``@dtype`` (no canonical labelling to compute)."""
    dtypes = tuple(sorted(d for d in set(dtypes) if d in HALF_DTYPES))
    if not dtypes:
        return rules
    key = (getattr(rules, "digest", None), len(rules), dtypes)
    cached = _AT_DTYPES_CACHE.get(key) if key[0] is not None else None
    if cached is None:
        extra, labels = [], {}
        for dt in dtypes:
            for r in rules:
                t = _retyped(r, dt)
                if t is not None:
                    t.__dict__["id"] = f"{r.id}@{dt}"   # Rule.id is a cached_property
                    extra.append(t)
                    labels[t.id] = rules.labels.get(r.id, r.id) if hasattr(rules, "labels") else r.id
        cached = (extra, labels)
        if key[0] is not None:
            _AT_DTYPES_CACHE.clear()
            _AT_DTYPES_CACHE[key] = cached
    extra, labels = cached
    out = RuleList(list(rules) + extra, {**getattr(rules, "labels", {}), **labels}, getattr(rules, "source", None),
                   None if getattr(rules, "digest", None) is None else f"{rules.digest} at {','.join(dtypes)}")
    return out


def _retyped(rule: Rule, dtype: str) -> Rule | None:
    """``rule`` with its float32 variables at ``dtype`` (types re-inferred), or None where it has
    none or a side no longer type-checks to the other's types."""
    if not any(t.dtype == "float32" for g in (rule.lhs, rule.rhs) for n in g.nodes for t in n.types) \
            or rule.lhs.data or rule.rhs.data:   # (a rule's weights are variables: no data to retype)
        return None
    try:
        lhs, rhs = _retyped_graph(rule.lhs, dtype), _retyped_graph(rule.rhs, dtype)
        if [lhs.type_of(r) for r in lhs.outputs] != [rhs.type_of(r) for r in rhs.outputs]:
            return None
        return Rule(lhs, rhs)
    except SuperoptError:
        return None


def _retyped_graph(g: Graph, dtype: str) -> Graph:
    b = GraphBuilder()
    remap: dict[Ref, Ref] = {}
    for i, n in enumerate(g.nodes):
        if n.op in ("input", "weight"):
            t = n.types[0]
            dt = dtype if t.dtype == "float32" else t.dtype
            remap[Ref(i, 0)] = b.input(n.name, t.shape, dt) if n.op == "input" else b.weight(n.name, t.shape, None, dt)
        else:
            for k, o in enumerate(b.add(n.op, [remap[r] for r in n.inputs], n.attr)):
                remap[Ref(i, k)] = o
    return b.build([remap[r] for r in g.outputs])
