"""The rule database: one SQLite file (standard library ``sqlite3``, no server).

Schema, version 3 (``meta.schema_version``)::

    meta(key TEXT PRIMARY KEY, value TEXT)   -- format = superopt.rules, schema_version,
                                             -- superopt_version, created, settings (JSON),
                                             -- last_verification (JSON)
    settings(id INTEGER PRIMARY KEY, json TEXT UNIQUE, generator_version TEXT, created TEXT)
    rules(seq INTEGER PRIMARY KEY,           -- insertion order
          id TEXT UNIQUE,                    -- Rule.id: hash of the canonical rule
          lhs TEXT, rhs TEXT,                -- both graphs as the IR's JSON
          text TEXT,                         -- the one-line form "lhs => rhs"
          lhs_ops INTEGER, rhs_ops INTEGER, n_outputs INTEGER,
          ops TEXT,                          -- JSON list of the operators used
          status TEXT,                       -- proven | unproven | refuted
          reason TEXT, seconds REAL,         -- proof outcome and proof time
          axioms_used TEXT,                  -- JSON list: the unsat core
          crosscheck TEXT, crosscheck_error REAL,
          settings_id INTEGER REFERENCES settings(id),
          created TEXT, verified TEXT,       -- UTC ISO times
          shape_key TEXT,                    -- superopt.pattern.family.shape_key: the parametric group
          all_ranks INTEGER,                 -- 1: proven for every number of extra leading axes
          batch_inputs TEXT,                 -- JSON list: the inputs those axes are added to
          ranks TEXT)                        -- how all_ranks was decided (superopt.verify.ranks)
    rule_ops(op TEXT, rule_seq INTEGER)      -- index: the rules that use an operator
    instance_proofs(rule_id TEXT, instance_id TEXT, theory TEXT,   -- proofs of a rule at the sizes
                    answer TEXT, axioms TEXT, seconds REAL)        -- and attributes it was applied
                                                                   -- at (superopt.search.instance_proofs)

Version 1 lacked ``shape_key`` and ``instance_proofs``, version 2 ``all_ranks``,
``batch_inputs`` and ``ranks``: :func:`migrate` (``superopt rules migrate --db PATH``) upgrades
such a file in place, in one transaction (migrated rules are per instance until ``superopt verify
--db PATH`` proves them again); until then it is refused with a message naming that command.

Every write is one transaction (rollback journal): a job killed during a write leaves the
file as it was before. A file that is not a superopt rule database, is corrupt, or has a
newer schema version is refused with one clear :class:`RuleDBError` and is not written.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "r.db")
>>> with RuleDB.create(path, {"max_ops": 2}) as db:
...     len(db), db.meta["schema_version"], db.meta["settings"]
(0, 3, {'max_ops': 2})
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Iterable

from .. import __version__
from ..errors import SuperoptError
from ..pattern.family import shape_key
from ..ir.rule import Rule
from ..verify.result import VerifyResult
from .busy import is_locked, locked_message

__all__ = ["RuleDB", "RuleDBError", "StoredRule", "SCHEMA_VERSION", "FORMAT", "ORDERS", "INSTANCE_PROOFS_SQL",
           "migrate", "refuse_if_being_written", "BUSY_TIMEOUT_S"]

FORMAT = "superopt.rules"
SCHEMA_VERSION = 3

#: the instance-proof table (also the whole of the search's cache file)
INSTANCE_PROOFS_SQL = (
    "CREATE TABLE IF NOT EXISTS instance_proofs (rule_id TEXT NOT NULL, instance_id TEXT NOT NULL, "
    "theory TEXT NOT NULL, answer TEXT NOT NULL, axioms TEXT NOT NULL, seconds REAL NOT NULL, "
    "PRIMARY KEY (rule_id, instance_id, theory)) WITHOUT ROWID")

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE settings (id INTEGER PRIMARY KEY, json TEXT NOT NULL UNIQUE, generator_version TEXT NOT NULL,
                       created TEXT NOT NULL);
CREATE TABLE rules (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, lhs TEXT NOT NULL, rhs TEXT NOT NULL, text TEXT NOT NULL,
    lhs_ops INTEGER NOT NULL, rhs_ops INTEGER NOT NULL, n_outputs INTEGER NOT NULL, ops TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('proven', 'unproven', 'refuted')),
    reason TEXT NOT NULL, seconds REAL NOT NULL, axioms_used TEXT NOT NULL,
    crosscheck TEXT NOT NULL CHECK (crosscheck IN ('passed', 'failed', 'skipped')), crosscheck_error REAL,
    settings_id INTEGER REFERENCES settings(id), created TEXT NOT NULL, verified TEXT NOT NULL, shape_key TEXT,
    all_ranks INTEGER NOT NULL DEFAULT 0, batch_inputs TEXT NOT NULL DEFAULT '[]', ranks TEXT NOT NULL DEFAULT '');
CREATE TABLE rule_ops (op TEXT NOT NULL, rule_seq INTEGER NOT NULL REFERENCES rules(seq),
                       PRIMARY KEY (op, rule_seq)) WITHOUT ROWID;
CREATE INDEX rules_status ON rules(status);
CREATE INDEX rules_size ON rules(lhs_ops, rhs_ops);
CREATE INDEX rules_shape ON rules(shape_key);
""" + INSTANCE_PROOFS_SQL

_COLUMNS = ("id, lhs, rhs, text, lhs_ops, rhs_ops, n_outputs, ops, status, reason, seconds, axioms_used, "
            "crosscheck, crosscheck_error, settings_id, created, verified, shape_key, all_ranks, batch_inputs, ranks")

#: how ``query`` may sort: name -> SQL
ORDERS = {"seq": ("seq",), "id": ("id",), "size": ("lhs_ops + rhs_ops", "lhs_ops", "seq"),
          "seconds": ("seconds", "seq"), "status": ("status", "seq"), "created": ("created", "seq")}


class RuleDBError(SuperoptError):
    """A rule database cannot be opened, read or written (the message says which and why)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass
class StoredRule:
    """One row of the database; ``rule`` is rebuilt (and re-checked) from JSON on first use."""
    id: str
    text: str
    status: str
    reason: str
    seconds: float
    axioms_used: tuple[str, ...]
    crosscheck: str
    crosscheck_error: float
    sizes: tuple[int, int]
    n_outputs: int
    ops: tuple[str, ...]
    settings_id: int | None
    created: str
    verified: str
    lhs_json: str = field(repr=False, default="")
    rhs_json: str = field(repr=False, default="")
    shape_key: str = ""
    all_ranks: bool = False
    batch_inputs: tuple[str, ...] = ()
    ranks: str = ""

    @cached_property
    def rule(self) -> Rule:
        try:
            return Rule(*(_graph(j) for j in (self.lhs_json, self.rhs_json)))
        except (SuperoptError, ValueError) as e:
            raise RuleDBError(f"rule {self.id}: its stored graphs cannot be read ({e}); the database is corrupt") from None

    @property
    def result(self) -> VerifyResult:
        try:
            return VerifyResult(self.status, self.reason, self.seconds, self.axioms_used, self.crosscheck,
                                self.crosscheck_error, self.all_ranks, self.batch_inputs, self.ranks)
        except ValueError as e:
            raise RuleDBError(f"rule {self.id}: its stored result cannot be read ({e}); the database is corrupt") from None

    def to_json(self, graphs: bool = True) -> dict:
        d = {"id": self.id, "text": self.text, **self.result.to_json(), "lhs_ops": self.sizes[0],
             "rhs_ops": self.sizes[1], "n_outputs": self.n_outputs, "ops": list(self.ops),
             "settings_id": self.settings_id, "created": self.created, "verified": self.verified,
             "shape_key": self.shape_key}
        if graphs:
            try:
                d["lhs"], d["rhs"] = json.loads(self.lhs_json), json.loads(self.rhs_json)
            except ValueError as e:
                raise RuleDBError(f"rule {self.id}: its stored graphs are not valid JSON ({e}); the database is "
                                  f"corrupt (leave the rule out with a filter, or generate the database again)") from None
        return d


def _graph(text: str):
    from ..ir.serialize import graph_from_json
    return graph_from_json(json.loads(text))


def _stored(row, path) -> StoredRule:
    (rid, lhs, rhs, text, lo, ro, nout, ops, status, reason, sec, axs, cc, err, sid, created, verified, key,
     every, names, ranks) = row
    try:
        out = _stored_row(rid, lhs, rhs, text, lo, ro, nout, ops, status, reason, sec, axs, cc, err, sid, created,
                          verified, key or "")
        out.all_ranks, out.batch_inputs, out.ranks = bool(every), tuple(json.loads(names or "[]")), ranks or ""
        return out
    except (ValueError, TypeError) as e:
        raise RuleDBError(f"{path}: rule {rid} cannot be read ({e}); the database is corrupt") from None


def _stored_row(rid, lhs, rhs, text, lo, ro, nout, ops, status, reason, sec, axs, cc, err, sid, created, verified,
                key):
    return StoredRule(rid, text, status, reason, sec, tuple(json.loads(axs)), cc,
                      float("inf") if err is None else err, (lo, ro), nout, tuple(json.loads(ops)), sid,
                      created, verified, lhs, rhs, key)


class RuleDB:
    """A rule database file; use :meth:`create` or :meth:`open`, as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path, writable: bool):
        self._conn, self.path, self.writable = conn, path, writable

    # ---- opening ------------------------------------------------------------------------------
    @classmethod
    def create(cls, path, settings: dict | None = None, overwrite: bool = False) -> "RuleDB":
        """A new, empty database at ``path``; an existing non-empty file is refused unless
        ``overwrite`` (then it is replaced)."""
        p = Path(path)
        try:
            text = _dumps(settings or {})
        except (TypeError, ValueError) as e:
            raise RuleDBError(f"generator settings must be JSON-able: {e}") from None
        if p.exists() and p.stat().st_size > 0 and not overwrite:
            raise RuleDBError(f"{p} already exists; choose another path or allow overwriting it")
        if not p.parent.is_dir():
            raise RuleDBError(f"{p}: the folder {p.parent} does not exist")
        if p.is_file() and p.stat().st_size > 0:
            refuse_if_being_written(p)  # replacing it would throw away another process's writes
        tmp = p.with_name(f".{p.name}.creating")  # built aside, then renamed: never half a schema at p
        tmp.unlink(missing_ok=True)
        db = cls(_connect(tmp, "rwc"), tmp, True)
        meta = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION), "superopt_version": __version__,
                "created": _now(), "settings": text}
        try:
            with db._tx() as c:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        c.execute(statement)
                c.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
        finally:
            db.close()
        try:
            os.replace(tmp, p)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RuleDBError(f"cannot create {p}: {e.strerror or e}") from None
        return cls(_connect(p, "rw"), p, True)

    @classmethod
    def open(cls, path, writable: bool = False) -> "RuleDB":
        """Open an existing database (read-only unless ``writable``) after checking it is ours."""
        p = Path(path)
        if p.is_dir():
            raise RuleDBError(f"{p} is a folder; pass the rule database file inside it (e.g. {p / 'default.db'})")
        if not p.is_file():
            raise RuleDBError(f"{p}: no such rule database (generate one with `superopt generate`, or pass --db)")
        if Path(str(p) + "-journal").exists():
            _recover(p)
        conn = _connect(p, "rw" if writable else "ro")
        _check_ours(conn, p, writable)
        return cls(conn, p, writable)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- low level ------------------------------------------------------------------------------
    def _sql(self, sql: str, args=()) -> list:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise _db_error(self.path, e, "cannot read the rule database") from None
        except UnicodeDecodeError:  # a damaged page: sqlite hands back bytes that are not text
            raise RuleDBError(f"{self.path}: the rule database is corrupt (text that is not UTF-8)") from None

    @contextmanager
    def _tx(self):
        """One transaction: everything or nothing is written."""
        if not self.writable:
            raise RuleDBError(f"{self.path} is open read-only; open it with writable=True to change it")
        c = self._conn
        try:
            c.execute("BEGIN IMMEDIATE")
            yield c
            c.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise _db_error(self.path, e, "write failed and was rolled back") from None
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    # ---- metadata ----------------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        """Schema version, superopt version, creation time, settings, last verification."""
        raw = dict(self._sql("SELECT key, value FROM meta"))
        out = dict(raw)
        out["schema_version"] = _version(raw["schema_version"], self.path)
        for k in ("settings", "last_verification"):
            if k in raw:
                out[k] = json.loads(raw[k])
        return out

    def set_meta(self, key: str, value: str) -> None:
        """Set one metadata entry (``complete``: "0" while a generate job is filling the file)."""
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def __len__(self) -> int:
        return self._sql("SELECT count(*) FROM rules")[0][0]

    def ids(self) -> set[str]:
        return {r[0] for r in self._sql("SELECT id FROM rules")}

    def settings(self) -> dict[int, dict]:
        """Generator settings rows by id, each with its generator version."""
        return {i: {**json.loads(j), "generator_version": v}
                for i, j, v in self._sql("SELECT id, json, generator_version FROM settings")}

    # ---- writing --------------------------------------------------------------------------------------
    def _settings_id(self, c, settings: dict | None) -> int | None:
        if not settings:
            return None
        text = _dumps(settings)
        row = c.execute("SELECT id FROM settings WHERE json = ?", (text,)).fetchone()
        if row:
            return row[0]
        return c.execute("INSERT INTO settings (json, generator_version, created) VALUES (?, ?, ?)",
                         (text, str(settings.get("generator_version", __version__)), _now())).lastrowid

    def add(self, pairs: Iterable[tuple[Rule, VerifyResult]], settings: dict | None = None) -> int:
        """Store rules with their results in one transaction; rules already stored (same
        canonical id) are skipped. ``settings`` defaults to the database's own. Returns how
        many were new."""
        added = 0
        with self._tx() as c:
            sid = self._settings_id(c, settings if settings is not None else self.meta.get("settings"))
            now = _now()
            for rule, res in pairs:
                if c.execute("SELECT 1 FROM rules WHERE id = ?", (rule.id,)).fetchone():
                    continue
                seq = c.execute(f"INSERT INTO rules ({_COLUMNS}) VALUES ({', '.join('?' * 21)})",
                                _row(rule, res, sid, now)).lastrowid
                c.executemany("INSERT INTO rule_ops VALUES (?, ?)", [(op, seq) for op in rule.ops])
                added += 1
        return added

    def update_results(self, results: Iterable[tuple[str, VerifyResult]], note: dict | None = None) -> int:
        """Replace the verification results of stored rules (one transaction); an id that is
        not stored is an error and nothing is written. ``note`` (limits, axioms) is kept in
        ``meta['last_verification']``."""
        n = 0
        with self._tx() as c:
            now = _now()
            for rid, res in results:
                cur = c.execute("UPDATE rules SET status=?, reason=?, seconds=?, axioms_used=?, crosscheck=?, "
                                "crosscheck_error=?, verified=?, all_ranks=?, batch_inputs=?, ranks=? WHERE id=?",
                                (res.status, res.reason, res.seconds, _dumps(list(res.axioms_used)), res.crosscheck,
                                 _finite(res.crosscheck_error), now, int(res.all_ranks),
                                 _dumps(list(res.batch_inputs)), res.ranks, rid))
                if cur.rowcount != 1:
                    raise RuleDBError(f"{self.path}: no rule with id {rid!r}; nothing was updated")
                n += 1
            if note is not None:
                c.execute("INSERT OR REPLACE INTO meta VALUES ('last_verification', ?)",
                          (_dumps({**note, "time": now, "rules": n}),))
        return n

    # ---- reading ----------------------------------------------------------------------------------------
    def get(self, rule_id: str) -> StoredRule:
        """The rule with this id, or the only one whose id starts with it."""
        rows = self._sql(f"SELECT {_COLUMNS} FROM rules WHERE id = ?", (rule_id,))
        if not rows:
            rows = self._sql(f"SELECT {_COLUMNS} FROM rules WHERE id LIKE ? ESCAPE '!' LIMIT 3",
                             (rule_id.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%",))
        if len(rows) != 1:
            what = "no rule" if not rows else "several rules"
            raise RuleDBError(f"{self.path}: {what} with id {rule_id!r} (see `superopt rules list`)")
        return _stored(rows[0], self.path)

    def query(self, status: str | None = None, op: str | None = None, max_ops: int | None = None,
              min_ops: int | None = None, order_by: str = "seq", descending: bool = False,
              limit: int | None = None) -> list[StoredRule]:
        """Rules filtered by status, by an operator they use, and by the larger side's size."""
        where, args = [], []
        if status is not None:
            where.append("status = ?"), args.append(status)
        if op is not None:
            where.append("seq IN (SELECT rule_seq FROM rule_ops WHERE op = ?)"), args.append(op)
        if max_ops is not None:
            where.append("max(lhs_ops, rhs_ops) <= ?"), args.append(max_ops)
        if min_ops is not None:
            where.append("max(lhs_ops, rhs_ops) >= ?"), args.append(min_ops)
        if order_by not in ORDERS:
            raise RuleDBError(f"cannot sort by {order_by!r}; choose one of {', '.join(ORDERS)}")
        order = ", ".join(f"{c} DESC" if descending else c for c in ORDERS[order_by])
        sql = f"SELECT {_COLUMNS} FROM rules" + (" WHERE " + " AND ".join(where) if where else "")
        sql += f" ORDER BY {order}" + (f" LIMIT {int(limit)}" if limit is not None else "")
        return [_stored(r, self.path) for r in self._sql(sql, args)]

    def proven_rules(self) -> list[Rule]:
        """What the optimizer applies: proven and cross-checked rules, in insertion order."""
        return [s.rule for s in self.query(status="proven") if s.crosscheck == "passed"]


def _finite(x: float):
    return None if x == float("inf") else x


def _row(rule: Rule, res: VerifyResult, sid, now) -> tuple:
    lhs_n, rhs_n = rule.size
    doc = rule.to_json()
    return (rule.id, _dumps(doc["lhs"]), _dumps(doc["rhs"]), rule.text(), lhs_n, rhs_n, len(rule.lhs.outputs),
            _dumps(list(rule.ops)), res.status, res.reason, res.seconds, _dumps(list(res.axioms_used)),
            res.crosscheck, _finite(res.crosscheck_error), sid, now, now, shape_key(rule), int(res.all_ranks),
            _dumps(list(res.batch_inputs)), res.ranks)


#: how long a command waits for another process's write to end before it says the database is locked
BUSY_TIMEOUT_S = 5.0


def _connect(p: Path, mode: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None,
                               timeout=BUSY_TIMEOUT_S)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn
    except sqlite3.Error as e:
        raise RuleDBError(f"{p}: cannot open ({e})") from None


def refuse_if_being_written(path) -> None:
    """Raise the locked message when another process is writing the database at ``path`` (holds
    its write lock): replacing or deleting it then would throw that process's writes away."""
    p = Path(path)
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None,
                               timeout=BUSY_TIMEOUT_S)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as e:
        if is_locked(e):
            raise RuleDBError(locked_message(p, "cannot replace the rule database")) from None
        # not a database SQLite can lock (any other file): replacing it is what was asked


def _recover(p: Path) -> None:
    """Roll back a transaction that a killed job left behind (SQLite's hot journal)."""
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        conn.close()
    except sqlite3.Error as e:
        if is_locked(e):  # a journal and a lock: a write under way, not an interrupted one
            raise RuleDBError(locked_message(p, "cannot open the rule database")) from None
        raise RuleDBError(f"{p}: an interrupted write could not be rolled back ({e})") from None


def _check_ours(conn: sqlite3.Connection, p: Path, writable: bool) -> None:
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('format', 'schema_version')"))
        if writable:
            bad = conn.execute("PRAGMA quick_check").fetchall()
            if bad != [("ok",)]:
                raise RuleDBError(f"{p}: the rule database is corrupt ({bad[0][0]}); it was not changed")
    except UnicodeDecodeError:
        conn.close()
        raise RuleDBError(f"{p}: the rule database is corrupt (text that is not UTF-8); it was not changed") from None
    except sqlite3.DatabaseError as e:
        conn.close()
        msg = str(e)
        if "no such table" in msg:
            raise RuleDBError(f"{p}: a SQLite database, but not a superopt rule database (no meta table)") from None
        if is_locked(e):
            raise _db_error(p, e, "cannot open the rule database") from None
        if "not a database" in msg:
            raise RuleDBError(f"{p}: not a superopt rule database (not a SQLite file)") from None
        raise RuleDBError(f"{p}: the rule database is corrupt ({msg}); it was not changed") from None
    if rows.get("format") != FORMAT:
        conn.close()
        raise RuleDBError(f"{p}: a SQLite database, but not a superopt rule database (format {rows.get('format')!r})")
    version = _version(rows.get("schema_version", "0"), p)
    if version is None:
        conn.close()
        raise RuleDBError(f"{p}: the rule database is corrupt (schema_version {rows.get('schema_version')!r} is not "
                          f"a number); generate it again")
    if version > SCHEMA_VERSION:
        conn.close()
        raise RuleDBError(f"{p}: rule database schema version {version} is newer than this superopt reads "
                          f"({SCHEMA_VERSION}); upgrade superopt")
    if version < SCHEMA_VERSION:
        conn.close()
        raise RuleDBError(f"{p}: rule database schema version {version} is older than this superopt reads "
                          f"({SCHEMA_VERSION}); upgrade it in place with `superopt rules migrate --db {p}`")


def migrate(path) -> int:
    """Upgrade a rule database of an older schema to the current one in place, in one
    transaction (a failure leaves the file as it was); returns the version it had. Version 1 ->
    2 adds ``rules.shape_key`` (filled from each rule) and the ``instance_proofs`` table; 2 -> 3
    adds ``all_ranks`` (0: per instance until re-verified), ``batch_inputs`` and ``ranks``."""
    p = Path(path)
    if not p.is_file():
        raise RuleDBError(f"{p}: no such rule database")
    conn = _connect(p, "rw")
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('format', 'schema_version')"))
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        conn.close()
        if is_locked(e):
            raise RuleDBError(locked_message(p, "cannot migrate the rule database")) from None
        raise RuleDBError(f"{p}: not a superopt rule database ({type(e).__name__})") from None
    version = _version(rows.get("schema_version"), p) or 0
    if rows.get("format") != FORMAT or version > SCHEMA_VERSION or version < 1:
        conn.close()
        raise RuleDBError(f"{p}: not a superopt rule database of a schema this superopt can migrate "
                          f"(format {rows.get('format')!r}, schema {version})")
    db = RuleDB(conn, p, True)
    with db._tx() as c:
        if version < 2:
            _to_v2(c, p)
        if version < 3:
            _to_v3(c)
    db.close()
    return version


def _to_v2(c, p: Path) -> None:
    c.execute("ALTER TABLE rules ADD COLUMN shape_key TEXT")
    c.execute("CREATE INDEX rules_shape ON rules(shape_key)")
    c.execute(INSTANCE_PROOFS_SQL)
    for seq, rid, lhs, rhs in c.execute("SELECT seq, id, lhs, rhs FROM rules").fetchall():
        try:
            rule = Rule(_graph(lhs), _graph(rhs))
        except (SuperoptError, ValueError) as e:
            raise RuleDBError(f"{p}: rule {rid} cannot be read ({e}); the database is corrupt") from None
        c.execute("UPDATE rules SET shape_key = ? WHERE seq = ?", (shape_key(rule), seq))
    c.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")


def _to_v3(c) -> None:
    c.execute("ALTER TABLE rules ADD COLUMN all_ranks INTEGER NOT NULL DEFAULT 0")
    c.execute("ALTER TABLE rules ADD COLUMN batch_inputs TEXT NOT NULL DEFAULT '[]'")
    c.execute("ALTER TABLE rules ADD COLUMN ranks TEXT NOT NULL DEFAULT 'per instance: not verified since schema 3'")
    c.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def _version(text, path) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _db_error(path, e: Exception, doing: str) -> RuleDBError:
    """A locked database is busy, not corrupt: say so (another generate or verify writes it)."""
    if is_locked(e):
        return RuleDBError(locked_message(path, doing))
    return RuleDBError(f"{path}: {doing} ({e}); it may be corrupt")
