"""Counts of the Criteo ids by (table, raw id), three ways, and the vocabulary's encoding of the spilled rows.

The first pass records each chunk's ids (``record``: what to spill for the
rows), takes back the rows that turn out not to be train (``take_back``),
then lists each table's ids with their counts (``per_table``), is told the
ids the vocabulary keeps (``set_ids``) and encodes spilled rows
(``encode``): sorted with numpy (``_SortedCounts``, the path without numba),
hashed by compiled kernels (``_HashedCounts``), or dense per (table, id)
(``_DenseCounts``, the ``modulo`` encoding).
"""
from __future__ import annotations

import numpy as np

from hotcold.data.sources import kernels
from hotcold.data.sources.criteo_parse import NUM_TABLES
from hotcold.jit import KERNEL

MERGE_MIN_KEYS = 1 << 16   # the id counter merges its buffer once it holds this many keys (or the table's size)


class _SortedCounts:
    """Counts of (table, raw id) in memory bounded by the distinct keys, with numpy: per-chunk uniques
    of uint64 ``table << 32 | value`` keys are buffered and merged into one sorted table once the
    buffer outgrows it; ids are then found by binary search. (The path without numba: the spilled
    rows are the raw ids, with the missing ones marked apart.)"""

    keeps_missing = True

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._buf: list[tuple[np.ndarray, np.ndarray]] = []
        self._buffered = 0
        self._values: list[np.ndarray] = []
        self.vocab: list[tuple[np.ndarray, np.ndarray]] = []

    def record(self, hexv: np.ndarray, missing: np.ndarray, counted: bool) -> np.ndarray:
        """Count a chunk's ids if ``counted`` -> what to spill for its rows (here the raw ids)."""
        if counted:
            self._add(hexv, missing, 1)
        return hexv

    def take_back(self, spilled: np.ndarray, missing: np.ndarray) -> None:
        """Uncount spilled rows."""
        self._add(spilled, missing, -1)

    def _add(self, hexv: np.ndarray, missing: np.ndarray, delta: int) -> None:
        k, c = np.unique(_table_keys(hexv)[~missing.ravel()], return_counts=True)
        self._buf.append((k, c.astype(np.int64) * delta))
        self._buffered += k.size
        if self._buffered > max(self.keys.size, MERGE_MIN_KEYS):
            self._merge()

    def _merge(self) -> None:
        keys = np.concatenate([self.keys] + [k for k, _ in self._buf])
        counts = np.concatenate([self.counts] + [c for _, c in self._buf])
        self._buf, self._buffered = [], 0
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        del order
        first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        self.keys = keys[first]
        self.counts = np.add.reduceat(counts, first) if first.size else counts

    def per_table(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(uint32 values ascending, int64 counts)`` of each table: the values with a positive count."""
        self._merge()
        seen = self.counts > 0
        self.keys, self.counts = self.keys[seen], self.counts[seen]
        bounds = np.searchsorted(self.keys >> np.uint64(32), np.arange(NUM_TABLES + 1, dtype=np.uint64))
        out = [((self.keys[a:b] & np.uint64(0xFFFFFFFF)).astype(np.uint32), self.counts[a:b])
               for a, b in zip(bounds[:-1], bounds[1:])]
        self._values = [v for v, _ in out]
        self.vocab = [(v, np.zeros(0, dtype=np.int32)) for v in self._values]
        self.keys, self.counts = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        return out

    def set_ids(self, table: int, keep: np.ndarray, ids: np.ndarray) -> None:
        """Table ``table``'s values of ``per_table`` where ``keep`` get ``ids``; any other value 0."""
        self.vocab[table] = (self._values[table][keep], ids)

    def encode(self, hexv: np.ndarray, missing: np.ndarray) -> np.ndarray:
        out = np.zeros(hexv.shape, dtype=np.int32)
        for t, (values, ids) in enumerate(self.vocab):
            if values.size:
                v = hexv[:, t]
                pos = np.minimum(np.searchsorted(values, v), values.size - 1)
                out[:, t] = np.where((values[pos] == v) & ~missing[:, t], ids[pos], 0)
        return out


class _HashedCounts:
    """Counts of (table, raw id) in hashed tables (compiled kernels, ``kernels.IdTables``); the spilled
    rows are each id's entry, so encoding is one gather. Memory grows with the distinct ids, never
    with the lines."""

    keeps_missing = False

    def __init__(self) -> None:
        self.tables = kernels.IdTables(NUM_TABLES)
        self._entries: list[np.ndarray] = []
        self._frozen = False

    def record(self, hexv: np.ndarray, missing: np.ndarray, counted: bool) -> np.ndarray:
        # not counted: Terabyte's last day, read after every train day, so an id not seen yet is not in train
        return self.tables.entries(hexv, missing, insert=counted)

    def _freeze(self) -> None:
        if not self._frozen:
            self.tables.freeze()
            self._frozen = True

    def take_back(self, spilled: np.ndarray, missing: None) -> None:
        self._freeze()
        self.tables.take_back(spilled)

    def per_table(self) -> list[tuple[np.ndarray, np.ndarray]]:
        self._freeze()
        out, self._entries = [], []
        for t in range(NUM_TABLES):
            entries, values, counts = self.tables.items(t)
            self._entries.append(entries)
            out.append((values, counts))
        return out

    def set_ids(self, table: int, keep: np.ndarray, ids: np.ndarray) -> None:
        self.tables.set_ids(table, self._entries[table][keep], ids)

    def encode(self, entries: np.ndarray, missing: None) -> np.ndarray:
        return self.tables.encode(entries)


class _DenseCounts:
    """Counts of ``(table, id)`` in one int64 [26, rows] array (modulo encoding: ids are bounded, so
    208 bytes per row; np.zeros pages in only the rows that occur). The spilled rows are the ids."""

    keeps_missing = False

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.counts = np.zeros((NUM_TABLES, rows), dtype=np.int64)

    def record(self, hexv: np.ndarray, missing: np.ndarray, counted: bool) -> np.ndarray:
        ids = np.where(missing, np.uint32(0), hexv % np.uint32(self.rows))
        if counted:
            self._add(ids, 1)
        return ids

    def take_back(self, spilled: np.ndarray, missing: None) -> None:
        self._add(spilled, -1)

    def _add(self, ids: np.ndarray, delta: int) -> None:
        if KERNEL == "numba":
            kernels.count_dense(self.counts, ids, np.zeros(ids.shape, dtype=bool), self.rows, delta)
        else:
            np.add.at(self.counts.reshape(-1),
                      (ids.astype(np.int64) + np.arange(NUM_TABLES, dtype=np.int64) * self.rows).ravel(), delta)

    def per_table(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(ids seen ascending, their counts)`` of each table."""
        return [(ids, c[ids]) for c in self.counts for ids in [np.flatnonzero(c)]]

    def encode(self, ids: np.ndarray, missing: None) -> np.ndarray:
        return ids.astype(np.int32)


def _table_keys(values: np.ndarray) -> np.ndarray:
    """uint64 ``table << 32 | value`` of a [G, 26] uint32 matrix, flattened."""
    return (np.arange(NUM_TABLES, dtype=np.uint64) << np.uint64(32) | values.astype(np.uint64)).ravel()

