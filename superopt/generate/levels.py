"""The enumeration, level by level: graphs of k operators from the extendable graphs of k - 1.

Each level splits the previous frontier into at most ``MAX_CHUNKS`` chunks (the split depends
only on the frontier's size, never on the number of workers), expands the chunks on the runner,
stores each chunk's records as soon as it arrives, then merges them in chunk order
(:func:`superopt.generate.merge.merge_level`). A level already merged in the checkpoint is
skipped; a level half done redoes only its missing chunks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from .checkpoint import Store
from .expand import RECORD, Expander, expand_chunk
from .graphs import level0_fingerprints, node_of_record
from .merge import initial_tables, merge_level
from .parallel import Runner
from .settings import Settings

__all__ = ["MAX_CHUNKS", "LevelStat", "run_levels", "chunk_bounds", "load_records", "load_rows", "instances_of"]

MAX_CHUNKS = 256


@dataclass
class LevelStat:
    """What one level did: sizes, and where the time went."""

    level: int
    parents: int
    tried: int
    children: int
    kept: int
    extended: int
    hashed: int
    new_classes: int
    pairs: int
    seconds: float
    worker_seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def chunk_bounds(n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each chunk of ``n`` parents: at most ``MAX_CHUNKS``, sizes within one."""
    k = max(1, min(n, MAX_CHUNKS))
    edges = [n * i // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]


def _part(level: int, chunk: int) -> str:
    return f"level-{level}/part-{chunk:05d}"


#: the record fields the merge reads (a copy of each, so the chunk files can be let go)
_MERGE_FIELDS = ("vh", "size", "merkle", "nsinks", "fp", "key")


def _chunks(store: Store, level: int):
    """The stored chunk results of a level, one at a time, in chunk order."""
    for c in range(store.get(f"level-{level}/merged")["chunks"] if store.has(f"level-{level}/merged") else 0):
        yield store.get(_part(level, c))


def load_records(store: Store, level: int) -> tuple[np.ndarray, dict]:
    """All records of a merged level in chunk order, and the instances they use (small levels:
    tests and scripts; the generator itself streams the chunks)."""
    parts = list(_chunks(store, level))
    recs = np.concatenate([p.records for p in parts]) if parts else np.zeros(0, RECORD)
    return recs, instances_of(parts)


def load_rows(store: Store, level: int, rows) -> tuple[dict, dict]:
    """``row -> (parent, inst, inputs)`` for the given rows of a merged level, reading one
    chunk at a time (memory grows with the rows asked for, not with the level)."""
    want = np.unique(np.asarray(list(rows), dtype=np.int64))
    out, instances, offset = {}, {}, 0
    for part in _chunks(store, level):
        n = len(part.records)
        lo, hi = np.searchsorted(want, [offset, offset + n])
        for row in want[lo:hi]:
            r = part.records[int(row) - offset]
            out[int(row)] = (int(r["parent"]), int(r["inst"]), tuple(int(v) for v in r["ins"] if v >= 0))
        if hi > lo:
            instances.update(part.instances)
        offset += n
    return out, instances


def instances_of(parts) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p.instances)
    return out


def _level0(settings: Settings, store: Store) -> None:
    ex = Expander(settings)
    tables = initial_tables(ex.src_vh, ex.src_vm, level0_fingerprints(ex))
    store.put("level-0/frontier", [()])
    store.put("level-0/tables", tables)
    store.put("level-0/merged", {"stat": None, "pairs": np.zeros((0, 4), np.int64), "chunks": 0})


def _expand(settings, store, runner, level, frontier, progress) -> int:
    """Expand the missing chunks of a level, storing each as it arrives; returns the chunk count."""
    bounds = chunk_bounds(len(frontier))
    todo = [c for c in range(len(bounds)) if not store.has(_part(level, c))]
    args = [(settings, level, c, bounds[c][0], frontier[bounds[c][0]:bounds[c][1]]) for c in todo]
    bar = tqdm(total=len(bounds), initial=len(bounds) - len(todo), desc=f"enumerate {level}/{settings.max_ops}",
               unit="chunk", disable=not progress, leave=False)
    try:
        for res in runner.map(expand_chunk, args):
            store.put(_part(level, res.chunk), res)
            bar.update(1)
    finally:
        bar.close()
    return len(bounds)


def _columns(store, level, n_chunks):
    """The merge's fields of every record of a level (copied out chunk by chunk), chunk sizes,
    and totals of the chunks' counters."""
    cols = {f: [] for f in _MERGE_FIELDS}
    sizes, tried, seconds = [], 0, 0.0
    for c in range(n_chunks):
        part = store.get(_part(level, c))
        for f in _MERGE_FIELDS:
            cols[f].append(part.records[f].copy())
        sizes.append(len(part.records))
        tried, seconds = tried + part.tried, seconds + part.seconds
    if not n_chunks:
        return np.zeros(0, RECORD), sizes, tried, seconds
    rec = np.zeros(sum(sizes), dtype=np.dtype([(f, RECORD[f]) for f in _MERGE_FIELDS]))
    for f in _MERGE_FIELDS:
        rec[f] = np.concatenate(cols.pop(f))
    return rec, sizes, tried, seconds


def _next_frontier(store, level, n_chunks, frontier, extend) -> list:
    nxt, offset = [], 0
    for c in range(n_chunks):
        part = store.get(_part(level, c))
        n = len(part.records)
        for r in part.records[extend[offset:offset + n]]:
            nxt.append(frontier[int(r["parent"])] + (node_of_record(r, part.instances),))
        offset += n
    return nxt


def _merge(settings, store, level, frontier, n_chunks, seconds0) -> LevelStat:
    rec, sizes, tried, worker_seconds = _columns(store, level, n_chunks)
    tables = store.get(f"level-{level - 1}/tables")
    tables, m = merge_level(tables, rec, level, settings.representatives)
    del rec
    nxt = _next_frontier(store, level, n_chunks, frontier, m.extend) if level < settings.max_ops else []
    stat = LevelStat(level, len(frontier), tried, sum(sizes), int(m.kept.sum()), len(nxt), m.hashed,
                     m.new_classes, len(m.pairs), time.perf_counter() - seconds0, worker_seconds)
    store.put(f"level-{level}/frontier", nxt)
    store.put(f"level-{level}/tables", tables)
    store.put(f"level-{level}/merged", {"stat": stat, "pairs": m.pairs, "chunks": n_chunks})
    return stat


def run_levels(settings: Settings, store: Store, runner: Runner, progress: bool = True) -> list[LevelStat]:
    """Enumerate levels 1..N (resuming from ``store``); returns each level's statistics."""
    if not store.has("level-0/merged"):
        _level0(settings, store)
    stats = []
    for level in range(1, settings.max_ops + 1):
        name = f"level-{level}/merged"
        if store.has(name):
            stats.append(store.get(name)["stat"])
            continue
        t0 = time.perf_counter()
        frontier = store.get(f"level-{level - 1}/frontier")
        n_chunks = _expand(settings, store, runner, level, frontier, progress)
        stats.append(_merge(settings, store, level, frontier, n_chunks, t0))
    return stats
