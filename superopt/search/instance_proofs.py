"""The one gate every search passes before it trusts a rewrite: a proof of that very instance.

A rule is proven at the small shapes it was generated at; a search applies it at a model's
sizes and attributes. Before a rewrite can be part of a result, the search builds the
*instance* (the rule's two sides at the match's real types and attributes, an ``ir.Rule``) and
asks :meth:`InstanceProofs.admit`. The gate proves the instance with the verifier (Z3 from the
shipped axioms; a few milliseconds, no float64 cross-check) on first use and remembers the
answer, keyed by (rule id, instance id, axioms), in memory and in a SQLite table:

* the rule database's ``instance_proofs`` table when the database is writable (schema 2) and
  is not the shipped ``rules/default.db``, so a database carries the proofs of the instances it
  was used at;
* else the file ``$SUPEROPT_PROOF_CACHE`` when set, else ``~/.cache/superopt/instance_proofs.db``.

Proven (``unsat``) and disproven (``sat``: the axioms, instantiated to saturation at these
shapes, do not imply it) answers are stored, and so is ``unknown`` where the instantiation
stopped at its round or e-node limit (the same answer every time under the same limits, which
are stored with it: Inception-v3 re-ran 18 such proofs, 4 s, on every run); a time-out is kept
in memory only.

>>> from superopt.ir import GraphBuilder, Rule
>>> def side(f, n):
...     b = GraphBuilder(); x = b.input("x", (n, 4))
...     return b.build([f(b, x)])
>>> gate = InstanceProofs(store=None)
>>> tt = lambda b, x: b.op("transpose", b.op("transpose", x, perm=(1, 0)), perm=(1, 0))
>>> gate.admit("r", Rule(side(tt, 8), side(lambda b, x: x, 8))), (gate.ran, gate.proved, gate.refused)
(True, (1, 1, 0))
>>> gate.admit("r", Rule(side(tt, 8), side(lambda b, x: x, 8))), gate.ran  # the same instance: no new proof
(True, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

from ..fileio import user_cache_dir, write_cache
from ..ir.rule import Rule
from ..rules.db import INSTANCE_PROOFS_SQL

__all__ = ["InstanceProofs", "default_cache_path", "theory_key", "TABLE_SQL", "PROOF_TIMEOUT_S"]

#: time limit of one instance proof (a proof takes milliseconds; the limit only bounds a bad case)
PROOF_TIMEOUT_S = 2.0

#: the table, in a rule database (schema 2) and in the cache file alike
TABLE_SQL = INSTANCE_PROOFS_SQL

_STORED = ("unsat", "sat")
#: where a proof that found nothing stopped for a reason that does not depend on the clock
_DETERMINISTIC_STOPS = ("round limit", "e-node limit")


def _limits_tag() -> str:
    """The instantiation's limits an ``unknown`` answer holds under (stored with it)."""
    from ..verify.prove import Limits
    lim = Limits()
    return json.dumps({"limits": [lim.rounds, lim.nodes]})


def default_cache_path() -> Path:
    """Where instance proofs go when the rule database cannot take them."""
    env = os.environ.get("SUPEROPT_PROOF_CACHE")
    if env:
        return Path(env)
    return user_cache_dir() / "instance_proofs.db"


def theory_key(theory) -> str:
    """A short hash of the axioms a proof used (a change of the axioms invalidates the cache)."""
    text = "\n".join(sorted(f"{a.name}: {a} {sorted(a.shapes.items())!r}" for a in theory.axioms))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class InstanceProofs:
    """Answers "is this instance of this rule proven?" (see the module docstring).

    ``store``: a SQLite file (a rule database of schema 2, or a cache file), ``None`` for
    memory only; by default the cache file. Counters: ``ran`` proofs run (``proved`` of them
    succeeded), ``reused`` answers found in the store, ``refused`` instances not admitted
    (run or reused), ``seconds`` spent proving.
    """

    def __init__(self, store: str | Path | None = "default", theory=None, timeout_s: float = PROOF_TIMEOUT_S):
        self._theory, self.timeout_s = theory, timeout_s
        self._answers: dict[tuple[str, str], bool] = {}
        self._rows: dict[tuple[str, str], tuple | None] = {}  # (rule id, instance as built) -> its stored row
        self._new: list[tuple] = []
        self.ran = self.proved = self.reused = self.refused = 0
        self.seconds = 0.0
        self.store = default_cache_path() if store == "default" else (None if store is None else Path(store))
        self._stored: dict[tuple[str, str], str] = {}
        self._parts: set = set()  # the parts of the store read so far (:func:`_part`)
        self._unknown: dict[tuple[str, str], tuple] = {}  # stored ``unknown`` rows, their limits not yet read
        self._tag: str | None = None
        self._key: str | None = None

    @classmethod
    def for_rules(cls, db_path: str | Path | None) -> "InstanceProofs":
        """The gate for rules from ``db_path``: its own table when it is a writable schema-2
        rule database and ``$SUPEROPT_PROOF_CACHE`` is not set, else the cache file. The shipped
        ``rules/default.db`` is never written (optimizing a model must not change a file of the
        installed package or of a git checkout): its proofs go to the cache file."""
        if (db_path is not None and not os.environ.get("SUPEROPT_PROOF_CACHE") and not _is_shipped(Path(db_path))
                and _takes_proofs(Path(db_path))):
            return cls(db_path)
        return cls()

    @property
    def theory(self):
        if self._theory is None:
            from ..verify.verifier import theory_for
            self._theory = theory_for(None)
        return self._theory

    def theory_key(self) -> str:
        """:func:`theory_key` of the theory; for the shipped axioms, read from a small cache
        keyed by the axiom files and the code that parses them, so a search whose answers are
        all stored never compiles the axioms (0.05-0.1 s of every process)."""
        if self._key is None:
            self._key = theory_key(self._theory) if self._theory is not None else _default_theory_key(self)
        return self._key

    def admit(self, rule_id: str, instance: Rule) -> bool:
        """True when ``instance`` (rule ``rule_id`` at a match's types and attributes) is proven."""
        return self._admit((rule_id, _as_built(instance)), instance)[0]

    def admit_keyed(self, rule_id: str, made: str, build) -> bool:
        """:meth:`admit` for the instance ``build()`` returns, where ``made`` names it without
        building it: a digest of everything it is built from (the code that builds it, the
        rule, the match's types and attributes), so that one ``made`` is always one instance.
        The answer is stored under ``made`` too, and a search that finds it there builds
        nothing (building and hashing each instance was a tenth of SqueezeNet's search).
        It answers as :meth:`admit` does: where ``admit`` was replaced (a subclass, a test's
        gate that admits everything), that ``admit`` is asked."""
        if type(self).admit is not _OWN_ADMIT or "admit" in vars(self):
            return self.admit(rule_id, build())
        key = (rule_id, _MADE + made)
        ok = self._answers.get(key)
        if ok is None:
            got = self._lookup(key)
            if got is not None:
                self.reused += 1
                ok = got[0] == "unsat"
                self.refused += not ok
            else:
                instance = build()
                ok, row = self._admit((rule_id, _as_built(instance)), instance)
                if row is not None:
                    self._new.append((*key, *row))
            self._answers[key] = ok
        return ok

    def _admit(self, key: tuple, instance: Rule | None) -> tuple[bool, tuple | None]:
        """The answer for ``key`` (rule id, instance as built) and the row stored for it (None
        where nothing is stored: a time-out)."""
        ok = self._answers.get(key)
        if ok is None:
            ok, row = self._decide(key, instance)
            self._answers[key] = ok
            self._rows[key] = row
            self.refused += not ok
        return ok, self._rows.get(key)

    def _decide(self, key, instance: Rule) -> tuple[bool, tuple | None]:
        """The answer stored under the instance as built (no canonical form needed: a search
        builds an instance the same way every time), else under its canonical id (then also
        stored as built), else a proof's."""
        got = self._lookup(key)
        if got is None:
            canon = (key[0], instance.id)
            got = self._lookup(canon)
            if got is None:
                return self._prove(canon, key, instance)
            self._new.append((*key, *got))
        self.reused += 1
        return got[0] == "unsat", got

    def _prove(self, canon: tuple, key: tuple, instance: Rule) -> tuple[bool, tuple | None]:
        from ..verify.prove import prove
        t0 = time.perf_counter()
        out = prove(instance, self.theory, self.timeout_s)
        self.seconds += time.perf_counter() - t0
        self.ran += 1
        self.proved += out.answer == "unsat"
        row = None
        if out.answer in _STORED:
            row = (out.answer, json.dumps(list(out.axioms)), round(out.seconds, 4))
        elif out.answer == "unknown" and out.stop in _DETERMINISTIC_STOPS:
            row = ("unknown", _limits_tag(), round(out.seconds, 4))
        if row is not None:
            self._new += [(*canon, *row), (*key, *row)]
        return out.answer == "unsat", row

    def counts(self) -> dict:
        return {"ran": self.ran, "proved": self.proved, "reused": self.reused, "refused": self.refused,
                "seconds": round(self.seconds, 4), "store": None if self.store is None else str(self.store)}

    # ---- the store ---------------------------------------------------------------------------
    def _load(self, instance_id: str) -> dict:
        """The stored rows, with the part of the store that holds ``instance_id`` read
        (:func:`_part`: a warm search reads only the instances named by its own code version,
        not the rows every earlier version of the code left)."""
        part = _part(instance_id)
        if part not in self._parts:
            self._parts.add(part)
            if self.store is not None and self.store.exists():
                sql = "SELECT rule_id, instance_id, answer, axioms, seconds FROM instance_proofs WHERE theory = ? AND "
                sql += "instance_id NOT LIKE ?" if part is None else "instance_id >= ? AND instance_id < ?"
                args = (_MADE + "%:%",) if part is None else part
                try:
                    with _open(self.store, "ro") as conn:
                        rows = conn.execute(sql, (self.theory_key(), *args)).fetchall()
                except (sqlite3.Error, UnicodeDecodeError):
                    rows = []  # no table yet, or unreadable: prove again
                for r, i, a, ax, s in rows:
                    (self._stored if a in _STORED else self._unknown)[(r, i)] = (a, ax, s)
        return self._stored

    def _lookup(self, key: tuple) -> tuple | None:
        """The stored row of ``key``; an ``unknown`` only where it was found under the
        instantiation's limits of now (else it is proven again). The limits are read on the
        first such row: reading them imports the verifier (0.04 s), which a search whose
        answers are all proofs or refutations does not need."""
        got = self._load(key[1]).get(key)
        if got is None and key in self._unknown:
            if self._tag is None:
                self._tag = _limits_tag()
            row = self._unknown.pop(key)
            if row[1] == self._tag:
                got = self._stored[key] = row
        return got

    def flush(self) -> int:
        """Write the new answers to the store (one transaction), each under the instance's
        canonical id and as built; how many answers were written. A store that cannot be
        written is left alone: the answers stay in memory."""
        if not self._new or self.store is None:
            return 0
        theory = self.theory_key()
        answers = sum(not i.startswith((_BUILT, _MADE)) for _, i, *_ in self._new)  # (each also stored as built)
        rows = [(r, i, theory, a, ax, s) for r, i, a, ax, s in self._new]
        try:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            with _open(self.store, "rwc") as conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(TABLE_SQL)
                conn.executemany("INSERT OR REPLACE INTO instance_proofs VALUES (?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
        except (sqlite3.Error, OSError):
            return 0
        self._new.clear()
        return answers


_OWN_ADMIT = InstanceProofs.admit  # (admit_keyed asks an admit put in its place)
_BUILT = "built:"
_MADE = "made:"  # an instance named by what it is built from (:meth:`InstanceProofs.admit_keyed`)


def _part(instance_id: str) -> tuple[str, str] | None:
    """The part of the store read together with ``instance_id``: for a name of the form
    ``made:VERSION:DIGEST`` (the code version that builds it first), the range of ids of that
    version; None for every other row."""
    if instance_id.startswith(_MADE):
        version, colon, _ = instance_id[len(_MADE):].partition(":")
        if colon:
            return f"{_MADE}{version}:", f"{_MADE}{version};"  # (';' sorts right after ':')
    return None


def _specs_dir() -> Path:
    """``axioms.parse.default_specs_dir()`` without importing the axioms package (11 ms of every
    search, which reads only the files): the source tree's ``specs/`` where there is one (this
    file and ``axioms/parse.py`` sit at the same depth), else that function's answer."""
    here = Path(__file__).resolve().parents[2] / "specs"
    if here.is_dir():
        return here
    from ..axioms.parse import default_specs_dir
    return default_specs_dir()


def _default_theory_key(gate: InstanceProofs) -> str:
    """The shipped axioms' :func:`theory_key`, kept in ``theory-keys.json`` beside the default
    cache file under a digest of the axiom files and of the parser's code."""
    h = hashlib.blake2b(digest_size=16)
    try:
        axioms = Path(__file__).resolve().parent.parent / "axioms"
        for f in sorted(_specs_dir().glob("*.axioms")) + sorted(axioms.glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    except OSError:
        return theory_key(gate.theory)
    digest, path = h.hexdigest(), default_cache_path().with_name("theory-keys.json")
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(digest), str):
        return known[digest]
    key = theory_key(gate.theory)
    write_cache(path, json.dumps({digest: key}).encode())
    return key


def _as_built(instance: Rule) -> str:
    """The instance's id as built: its sides' hashes with their names (``Graph.key``), marked
    apart from canonical ids. Cheaper than the canonical form, which orders tied sources."""
    return _BUILT + hashlib.blake2b(repr((instance.lhs.key(), instance.rhs.key())).encode(),
                                      digest_size=8).hexdigest()


class _open:
    """A short-lived SQLite connection (autocommit; closed on exit)."""

    def __init__(self, path: Path, mode: str):
        self.conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None,
                                    timeout=5.0)

    def __enter__(self):
        return self.conn

    def __exit__(self, *exc):
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self.conn.close()


def _is_shipped(p: Path) -> bool:
    from ..rules.paths import default_db_path
    try:
        return p.resolve() == default_db_path()
    except OSError:
        return False


def _takes_proofs(p: Path) -> bool:
    """A writable rule database of schema 2 or later (it has the ``instance_proofs`` table)."""
    if not p.is_file() or not os.access(p, os.W_OK) or not os.access(p.parent, os.W_OK):
        return False
    try:
        with _open(p, "ro") as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return row is not None and int(row[0]) >= 2
    except (sqlite3.Error, ValueError):
        return False
