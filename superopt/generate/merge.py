"""Merging one level's children: representatives, fingerprint classes, candidate pairs.

Two tables survive from level to level, both sorted numpy arrays, so memory grows with the
number of distinct values and classes, not with the number of graphs:

- *values*: for every value hash, the smallest node computing it, as ``(cone size, Merkle
  hash)``. A node is a *representative* when it is that smallest node for each of its outputs.
  Only graphs whose every node is a representative are extended (Quartz's RepGen: a graph that
  contains a value computed the long way can be rewritten to a smaller one, so it adds no rule
  that a smaller graph does not). A graph is kept at all only if every node is a
  representative except, possibly, its one sink (the ``x`` of ``tr(tr(x)) => x``): this
  property does not depend on the order the graph was built in, so the enumerated set is
  canonical. Entries are final once written: a later level never claims a value an earlier
  level settled.
- *classes*: for every graph fingerprint, its representative graph (fewest operators, then
  smallest key) as a locator ``(level, row)``. Every other member becomes a candidate pair
  ``member -> representative``.

Everything here is a pure function of the records in chunk order, so the result does not
depend on how many workers produced them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Tables", "LevelMerge", "merge_level", "initial_tables"]


@dataclass
class Tables:
    """The value and class tables (see the module docstring)."""

    value_vh: np.ndarray
    value_size: np.ndarray
    value_merkle: np.ndarray
    class_fp: np.ndarray
    class_level: np.ndarray
    class_row: np.ndarray


@dataclass
class LevelMerge:
    """One level merged: which children extend, and the candidate pairs it found."""

    level: int
    extend: np.ndarray          # bool per record: its every node is a representative
    kept: np.ndarray            # bool per record: representative but for its single sink
    pairs: np.ndarray           # int64 [n, 4]: member (level, row) -> representative (level, row)
    hashed: int                 # children with few enough outputs to be fingerprinted
    new_classes: int


def _sorted_merge(keys_old, cols_old, keys_new, cols_new):
    keys = np.concatenate([keys_old, keys_new])
    order = np.argsort(keys, kind="stable")
    return keys[order], [np.concatenate([a, b])[order] for a, b in zip(cols_old, cols_new)]


def _lookup(sorted_keys, keys):
    """Positions of ``keys`` in ``sorted_keys`` and whether each is there."""
    pos = np.searchsorted(sorted_keys, keys)
    pos_c = np.minimum(pos, max(len(sorted_keys) - 1, 0))
    found = (sorted_keys[pos_c] == keys) if len(sorted_keys) else np.zeros(len(keys), bool)
    return pos_c, found


def initial_tables(src_vh, src_merkle, level0_fps) -> Tables:
    """Tables before level 1: the inputs as values of size 0, and the operator-free graphs."""
    vh = np.asarray(src_vh, dtype=np.uint64)
    order = np.argsort(vh, kind="stable")
    fps = np.asarray(level0_fps, dtype=np.uint64)
    uniq, first = np.unique(fps, return_index=True)
    return Tables(vh[order], np.zeros(len(vh), np.int8), np.asarray(src_merkle, np.uint64)[order],
                  uniq, np.zeros(len(uniq), np.int8), first.astype(np.int64))


def _representatives(t: Tables, rec) -> tuple[Tables, np.ndarray]:
    """Settle the values new at this level; flag records whose new node is representative."""
    two = rec["vh"][:, 1] != 0
    e_vh = np.concatenate([rec["vh"][:, 0], rec["vh"][two, 1]])
    e_size = np.concatenate([rec["size"], rec["size"][two]])
    e_merkle = np.concatenate([rec["merkle"], rec["merkle"][two]])
    _, known = _lookup(t.value_vh, e_vh)
    n_vh, n_size, n_merkle = e_vh[~known], e_size[~known], e_merkle[~known]
    del e_vh, e_size, e_merkle, known  # the last level of a big run holds tens of millions
    order = np.lexsort((n_merkle, n_size, n_vh))
    n_vh, n_size, n_merkle = n_vh[order], n_size[order], n_merkle[order]
    first = np.ones(len(n_vh), bool)
    first[1:] = n_vh[1:] != n_vh[:-1]
    vh, (size, merkle) = _sorted_merge(t.value_vh, [t.value_size, t.value_merkle],
                                       n_vh[first], [n_size[first], n_merkle[first]])
    t = Tables(vh, size, merkle, t.class_fp, t.class_level, t.class_row)

    def is_best(col):
        pos, found = _lookup(vh, col)
        return found & (size[pos] == rec["size"]) & (merkle[pos] == rec["merkle"])

    rep = is_best(rec["vh"][:, 0]) & (~two | is_best(rec["vh"][:, 1]))
    return t, rep


def _classes(t: Tables, rec, level: int, kept) -> tuple[Tables, np.ndarray, int, int]:
    rows = np.flatnonzero((rec["fp"] != 0) & kept)
    fp, key = rec["fp"][rows], rec["key"][rows]
    pos, old = _lookup(t.class_fp, fp)
    pairs = [np.stack([np.full(old.sum(), level), rows[old], t.class_level[pos[old]], t.class_row[pos[old]]], 1)]
    n_rows, n_fp, n_key = rows[~old], fp[~old], key[~old]
    order = np.lexsort((n_rows, n_key, n_fp))
    n_rows, n_fp = n_rows[order], n_fp[order]
    first = np.ones(len(n_fp), bool)
    first[1:] = n_fp[1:] != n_fp[:-1]
    rep_row = n_rows[first][np.cumsum(first) - 1]
    rest = ~first
    pairs.append(np.stack([np.full(rest.sum(), level), n_rows[rest], np.full(rest.sum(), level), rep_row[rest]], 1))
    cfp, (clevel, crow) = _sorted_merge(t.class_fp, [t.class_level, t.class_row],
                                        n_fp[first], [np.full(first.sum(), level, np.int8), n_rows[first]])
    t = Tables(t.value_vh, t.value_size, t.value_merkle, cfp, clevel, crow)
    return t, np.concatenate(pairs).astype(np.int64), len(rows), int(first.sum())


def merge_level(t: Tables, rec: np.ndarray, level: int, representatives: bool) -> tuple[Tables, LevelMerge]:
    """Merge the records of one level (in chunk order); see the module docstring."""
    t, rep = _representatives(t, rec)
    if not representatives:
        rep = np.ones(len(rec), bool)
    kept = rep | (rec["nsinks"] == 1)
    t, pairs, hashed, new = _classes(t, rec, level, kept)
    return t, LevelMerge(level, rep, kept, pairs, hashed, new)
