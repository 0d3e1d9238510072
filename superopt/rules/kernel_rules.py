"""Kernel rules in the rule database: a region graph => a proved fused kernel, measured.

A kernel rule says: this region (a subgraph cut from a model: its operators, attributes and
shapes) computes the same values as this kernel program, by this proof, and on this device the
program ran this fast (with this tile configuration) against Inductor's code for the region. It
is the kernel level's counterpart of a graph rule and lives beside them in the same SQLite file,
in a table of its own (created by the first write; a database without it has no kernel rules)::

    kernel_rules(id TEXT PRIMARY KEY,        -- K + hash of (signature, dtype, device)
                 signature TEXT, dtype TEXT, device TEXT,
                 region TEXT,                -- one line: the region's operators and shapes
                 region_json TEXT,           -- the region graph (the rule's left side), IR JSON, no weight data
                 program TEXT,               -- the kernel program as measured (its right side)
                 config TEXT,                -- the tile configuration measured (JSON)
                 triton TEXT,                -- the Triton source the program lowers to
                 proof TEXT,                 -- JSON: status, checks, identities, max float64 error
                 us REAL, inductor_us REAL,  -- measured on ``device`` (microseconds)
                 torch TEXT, triton_version TEXT,
                 models TEXT,                -- JSON list: models whose measured verdict uses it
                 created TEXT)

The rules package stores and prints them (``superopt rules list --kernels``, ``rules show K...``);
building one (proving, lowering) is the kernel level's job, and :mod:`superopt.driver.kernel_rules`
does it for ``superopt tune --db``. Every write is one transaction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from .db import RuleDB, RuleDBError, _now

__all__ = ["KernelRule", "KERNEL_RULES_SQL", "put_kernel_rules", "kernel_rules", "get_kernel_rule",
           "kernel_rule_line", "kernel_rule_text", "kernel_rule_id"]

KERNEL_RULES_SQL = (
    "CREATE TABLE IF NOT EXISTS kernel_rules (id TEXT PRIMARY KEY, signature TEXT NOT NULL, dtype TEXT NOT NULL, "
    "device TEXT NOT NULL, region TEXT NOT NULL, region_json TEXT NOT NULL, program TEXT NOT NULL, "
    "config TEXT NOT NULL, triton TEXT NOT NULL, proof TEXT NOT NULL, us REAL NOT NULL, inductor_us REAL NOT NULL, "
    "torch TEXT NOT NULL, triton_version TEXT NOT NULL, models TEXT NOT NULL, created TEXT NOT NULL)")
_COLUMNS = ("id", "signature", "dtype", "device", "region", "region_json", "program", "config", "triton", "proof",
            "us", "inductor_us", "torch", "triton_version", "models", "created")


def kernel_rule_id(signature: str, dtype: str, device: str) -> str:
    """``K`` and 15 hex digits: a kernel rule is one region at one precision on one device."""
    return "K" + hashlib.sha256(f"{signature}|{dtype}|{device}".encode()).hexdigest()[:15]


@dataclass(frozen=True)
class KernelRule:
    """One kernel rule (see the module docstring); ``proof`` and ``models`` as Python values."""

    signature: str
    dtype: str
    device: str
    region: str
    region_json: str
    program: str
    config: str
    triton: str
    proof: dict = field(default_factory=dict)
    us: float = 0.0
    inductor_us: float = 0.0
    torch: str = ""
    triton_version: str = ""
    models: tuple = ()
    created: str = ""

    @property
    def id(self) -> str:
        return kernel_rule_id(self.signature, self.dtype, self.device)

    @property
    def speedup(self) -> float:
        return round(self.inductor_us / self.us, 3) if self.us > 0 else 0.0

    def to_json(self, full: bool = True) -> dict:
        out = {"id": self.id, **asdict(self), "models": list(self.models), "speedup": self.speedup}
        if not full:
            for k in ("region_json", "program", "triton"):
                out.pop(k)
        return out


def _row(k: KernelRule) -> tuple:
    return (k.id, k.signature, k.dtype, k.device, k.region, k.region_json, k.program, k.config, k.triton,
            json.dumps(k.proof, sort_keys=True), float(k.us), float(k.inductor_us), k.torch, k.triton_version,
            json.dumps(list(k.models)), k.created or _now())


def put_kernel_rules(db: RuleDB, rules) -> int:
    """Store ``rules`` in ``db`` (opened writable), replacing any of the same id, in one
    transaction; how many were written."""
    rows = [_row(k) for k in rules]
    with db._tx() as c:
        c.execute(KERNEL_RULES_SQL)
        c.executemany(f"INSERT OR REPLACE INTO kernel_rules ({', '.join(_COLUMNS)}) "
                      f"VALUES ({', '.join('?' * len(_COLUMNS))})", rows)
    return len(rows)


def _has_table(db: RuleDB) -> bool:
    return bool(db._sql("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'kernel_rules'"))


def _from_row(row, path) -> KernelRule:
    d = dict(zip(_COLUMNS, row))
    try:
        return KernelRule(d["signature"], d["dtype"], d["device"], d["region"], d["region_json"], d["program"],
                          d["config"], d["triton"], json.loads(d["proof"]), d["us"], d["inductor_us"], d["torch"],
                          d["triton_version"], tuple(json.loads(d["models"])), d["created"])
    except (TypeError, ValueError) as e:
        raise RuleDBError(f"{path}: kernel rule {d.get('id')} is damaged ({e})") from None


def kernel_rules(db: RuleDB) -> list[KernelRule]:
    """Every kernel rule of ``db``, by region description then device (none without the table)."""
    if not _has_table(db):
        return []
    rows = db._sql(f"SELECT {', '.join(_COLUMNS)} FROM kernel_rules ORDER BY region, dtype, device")
    return [_from_row(r, db.path) for r in rows]


def get_kernel_rule(db: RuleDB, prefix: str) -> KernelRule:
    """The kernel rule whose id starts with ``prefix`` (``K...``), or a clear error."""
    hits = [k for k in kernel_rules(db) if k.id.startswith(prefix)]
    if not hits:
        raise RuleDBError(f"no kernel rule {prefix} in {db.path} (`superopt rules list --kernels` lists them)")
    if len(hits) > 1:
        raise RuleDBError(f"kernel rule prefix {prefix} is ambiguous in {db.path}: {', '.join(k.id for k in hits[:5])}")
    return hits[0]


def kernel_rule_line(k: KernelRule) -> str:
    """One line: id, status, measured time against Inductor's, device, the region."""
    status = k.proof.get("status", "?")
    return (f"{k.id:<16}  {status:<8}  {k.us:>8.1f}  {k.inductor_us:>9.1f}  {k.speedup:>6.2f}x  {k.dtype:<5}  "
            f"{k.device[:22]:<22}  {k.region}")


def kernel_rule_text(k: KernelRule, region_text: str) -> str:
    """The rule in full (``region_text``: the region graph as the IR prints it)."""
    p = k.proof
    ids = "; ".join(f"{name}: {how}" for name, how in p.get("identities", [])) or "none"
    lines = [f"kernel rule {k.id}: {k.region} => one fused kernel",
             f"status      {p.get('status', '?')} ({p.get('reason', '')})",
             f"proof       {'; '.join(p.get('checks', [])) or '-'}",
             f"identities  {ids}",
             f"float64     max relative error {float(p.get('max_error', 0.0)):.2g} over the checked input sets",
             f"storage     {p.get('variant', 'the program as proved')}",
             f"measured    {k.us:.2f} us on {k.device} ({k.dtype}; torch {k.torch}, Triton {k.triton_version}); "
             f"Inductor's code for the region {k.inductor_us:.2f} us ({k.speedup:.2f}x)",
             f"config      {k.config}",
             f"models      {', '.join(k.models) or 'none measured with it'}",
             f"created     {k.created}",
             "", "region (left side):", region_text,
             "", "kernel program (right side):", k.program.rstrip(),
             "", "Triton source:", k.triton.rstrip()]
    return "\n".join(lines)
