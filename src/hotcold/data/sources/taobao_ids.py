"""The Taobao preprocessor's id index: raw int64 ids -> int32 indices in order of first appearance.

``IdIndex`` keeps a hash table with the compiled kernels, a sorted table with
numpy (the same indices), remembering each index's raw value and the
position of its first event. The compiled read pass parses and indexes in
one kernel per chunk (``parse_index``: parse, look the ids up, write the
events where they are kept), tested against ``taobao_parse.parse_chunk`` and
``IdIndex``; it also gives a well-formed line whose timestamp lies outside
the configured range the code ``OUTSIDE`` and keeps it out of the events.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import KERNEL, jit
from hotcold.data.sources.taobao_parse import OUTSIDE, _line

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@jit
def _lookup(table, raws, size, v):  # pragma: no cover - compiled
    """The index of raw id ``v`` in the open-addressing ``table`` (int64 [2 * slots]: key, index; index -1:
    free; slots a power of two, at most half full) -> (index, new size); a new value gets index ``size``
    and its raw value in ``raws``."""
    mask = (table.size >> 1) - 1
    h = np.int64((np.uint64(v) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)) & mask
    while True:
        s = table[2 * h + 1]
        if s < 0:
            table[2 * h] = v
            table[2 * h + 1] = size
            raws[size] = v
            return size, size + 1
        if table[2 * h] == v:
            return s, size
        h = (h + 1) & mask


@jit
def _hash_insert(table, values, out, raws, first, size):  # pragma: no cover - compiled
    """Index ``values`` (int64) in ``table`` -> the new size; a value not seen before gets the next index,
    its raw value in ``raws`` and its position in ``values`` in ``first[index - size]``."""
    start = size
    for i in range(values.size):
        out[i], n = _lookup(table, raws, size, values[i])
        if n > size:
            first[size - start] = i
            size = n
    return size


class IdIndex:
    """Raw int64 ids -> int32 indices 0, 1, ... in order of first appearance; memory grows with the distinct
    ids (hashed: about 40 bytes each; sorted: 24), never with the events."""

    def __init__(self, compiled: bool | None = None) -> None:
        self.compiled = KERNEL == "numba" if compiled is None else compiled
        self.size = 0
        self._raws = np.zeros(1 << 10, dtype=np.int64)
        if self.compiled:
            self.table = _empty_table(1 << 10)
        else:
            self._keys = np.zeros(0, dtype=np.int64)     # ascending
            self._ids = np.zeros(0, dtype=np.int32)

    @property
    def raws(self) -> np.ndarray:
        """int64 [size]: the raw value of each index."""
        return self._raws[:self.size]

    def reserve(self, new: int) -> np.ndarray:
        """Room for ``new`` more ids -> the raw values' array (for a kernel that indexes ids itself)."""
        need = self.size + new
        if need > self._raws.size:
            self._raws = np.concatenate([self._raws, np.zeros(max(need, 2 * self._raws.size) - self._raws.size,
                                                              dtype=np.int64)])
        if self.compiled and 2 * need > self.table.size // 2:
            slots = self.table.size // 2
            while slots < 2 * need:
                slots *= 2
            self.table = _empty_table(slots)
            out = np.empty(self.size, dtype=np.int32)
            _hash_insert(self.table, self._raws[:self.size].copy(), out, np.zeros(self.size, dtype=np.int64),
                         np.zeros(self.size, dtype=np.int64), 0)
        return self._raws

    def index(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """-> (int32 index of each value, positions in ``values`` of the first event of each new index)."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        self.reserve(values.size)
        out = np.empty(values.size, dtype=np.int32)
        if self.compiled:
            first = np.empty(values.size, dtype=np.int64)
            old = self.size
            self.size = _hash_insert(self.table, values, out, self._raws, first, self.size)
            return out, first[:self.size - old]
        uniq, first_at, inverse = np.unique(values, return_index=True, return_inverse=True)
        at = np.searchsorted(self._keys, uniq)
        found = at < self._keys.size
        found[found] = self._keys[at[found]] == uniq[found]
        ids = np.empty(uniq.size, dtype=np.int32)
        ids[found] = self._ids[at[found]]
        new = np.flatnonzero(~found)
        new = new[np.argsort(first_at[new], kind="stable")]          # new ids in order of first appearance
        ids[new] = np.arange(self.size, self.size + new.size, dtype=np.int32)
        self._raws[self.size:self.size + new.size] = uniq[new]
        self.size += new.size
        self._keys = np.insert(self._keys, at[~found], uniq[~found])
        self._ids = np.insert(self._ids, at[~found], ids[~found])
        out[:] = ids[inverse.reshape(-1)]
        return out, first_at[new]


def _empty_table(slots: int) -> np.ndarray:
    table = np.empty(2 * slots, dtype=np.int64)
    table[1::2] = -1
    return table


@jit
def parse_index(u8, pos, codes, vals, users, user_raws, items, item_raws, cats, cat_raws, sizes, item_cat,
                user, item, cat, beh, ts, at, t_lo, t_hi):  # pragma: no cover - compiled
    """Parse lines of ``u8`` (ending with ``\\n``) from ``pos``, at most ``codes.size`` of them, their reason
    codes into ``codes``; index the good lines' users, items and categories in the hash tables ``users``,
    ``items``, ``cats`` (``_lookup``; ``sizes`` [3] their sizes, updated; a new item's category index goes
    to ``item_cat``) and write their events to ``user``/``item``/``cat``/``beh``/``ts`` from row ``at``
    -> (position after the last line parsed, lines, good lines, lines outside the time range). A
    well-formed line whose timestamp is outside ``[t_lo, t_hi)`` gets code ``OUTSIDE`` and is not an
    event. ``vals`` (int64 [codes.size, 3]) is scratch; the tables must have room for ``codes.size`` new
    ids. The ids are looked up after the chunk is parsed, table by table (independent lookups: their
    cache misses overlap)."""
    n = u8.size
    line, g, outside = 0, 0, 0
    while pos < n and line < codes.size:
        pos, code, u, i, c, t, b = _line(u8, pos)
        if code == 0 and (t < t_lo or t >= t_hi):
            code = OUTSIDE
            outside += 1
        codes[line] = code
        line += 1
        if code == 0:
            vals[g, 0], vals[g, 1], vals[g, 2] = u, i, c
            ts[at + g] = t
            beh[at + g] = b
            g += 1
    size = sizes[0]
    for x in range(g):
        user[at + x], size = _lookup(users, user_raws, size, vals[x, 0])
    sizes[0] = size
    size = sizes[2]
    for x in range(g):
        cat[at + x], size = _lookup(cats, cat_raws, size, vals[x, 2])
    sizes[2] = size
    size = sizes[1]
    for x in range(g):
        i, new = _lookup(items, item_raws, size, vals[x, 1])
        if new > size:
            item_cat[i] = cat[at + x]
            size = new
        item[at + x] = i
    sizes[1] = size
    return pos, line, g, outside
