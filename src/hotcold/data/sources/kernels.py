"""Compiled kernels of the text preprocessors: one pass over a chunk's bytes, and hashed id counts.

Used when numba is installed (``hotcold.jit.KERNEL == "numba"``); without it
the preprocessors keep their vectorised numpy path (``textparse``, sorted
counts), which gives the same output more slowly. Each kernel follows that
numpy path's rules exactly (the tests compare the two on random and malformed
input):

- ``parse_criteo``: lines end at ``\\n`` (the caller turns ``\\r\\n`` into
  ``\\n`` and ends the chunk with one), fields at ``\\t``; a line's reason code
  is 1 (field count), 2 (label), 3 (integer), 4 (hex), first failing check wins.
  Integers: an optional ``-`` and 1..16 decimal digits, or empty (0). Hex ids:
  8 hex digits of either case, or empty (missing).
- ``IdTable``: per table, open addressing with linear probing over uint32 raw
  values; a slot is free while its count is 0. It counts the train split's ids
  in memory proportional to the distinct values (never to the lines), then maps
  values to the ids the vocabulary gives them (``lookup``).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit

TAB, NL, MINUS, ZERO = 9, 10, 45, 48
MAX_INT_DIGITS = 16
MAX_LOAD = 0.5              # an id table grows (doubles) before more than this share of its slots is used
MIN_SLOTS = 1 << 10
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@jit
def _criteo_line_fast(u8, pos, labels, ints, hexv, missing, g):  # pragma: no cover - compiled
    """Parse the line at ``pos`` field by field into row ``g`` if it is well formed in the usual way ->
    the next line's position, or -1 when anything is unusual (the caller then uses the general rules)."""
    n = u8.size
    n_dense, n_cat = ints.shape[1], hexv.shape[1]
    c0 = u8[pos]
    if (c0 != ZERO and c0 != ZERO + 1) or u8[pos + 1] != TAB:
        return -1
    p = pos + 2
    for k in range(n_dense):
        neg = u8[p] == MINUS
        q = p + neg
        v = np.int64(0)
        while True:
            digit = np.uint64(u8[q]) - np.uint64(ZERO)
            if digit > np.uint64(9):
                break
            v = v * 10 + np.int64(digit)
            q += 1
        digits = q - p - neg
        if u8[q] != TAB or digits > MAX_INT_DIGITS or (neg and digits == 0):
            return -1
        ints[g, k] = -v if neg else v
        p = q + 1
    for t in range(n_cat):
        sep = TAB if t < n_cat - 1 else NL
        if u8[p] == sep:
            missing[g, t] = True
            hexv[g, t] = 0
            p += 1
            continue
        if p + 8 >= n or u8[p + 8] != sep:
            return -1
        ok = True
        v = np.uint32(0)
        for i in range(p, p + 8):
            ch = np.uint32(u8[i])
            digit = ch - np.uint32(ZERO)
            letter = (ch | np.uint32(0x20)) - np.uint32(97)     # 'a'-'f' and 'A'-'F' -> 0..5
            is_digit = digit <= np.uint32(9)
            ok &= is_digit | (letter <= np.uint32(5))
            v = (v << np.uint32(4)) | (digit if is_digit else letter + np.uint32(10))
        if not ok:
            return -1
        missing[g, t] = False
        hexv[g, t] = v
        p += 9
    labels[g] = 1.0 if c0 == ZERO + 1 else 0.0
    return p


@jit
def parse_criteo(u8, codes, labels, ints, hexv, missing, good):  # pragma: no cover - compiled
    """Parse the lines of ``u8`` (ending with ``\\n``) -> (lines, good lines); lines -1 when there are
    more lines than ``codes`` holds.

    ``codes[line]`` gets every line's reason code (0: good); the good lines are
    packed in order into ``labels``/``ints``/``hexv``/``missing``/``good`` (their
    index in the chunk). The arrays must hold as many rows as ``u8`` has lines.
    A line is first read field by field in one go (``_criteo_line_fast``); one
    with anything unusual is split at its tabs and judged by the general rules.
    """
    n_dense, n_cat = ints.shape[1], hexv.shape[1]
    n_fields = 1 + n_dense + n_cat
    starts = np.empty(n_fields + 2, dtype=np.int64)   # starts[k]: first byte of field k; one spare slot
    n = u8.size
    pos, line, g = np.int64(0), 0, 0   # pos not a literal 0: see hotcold.jit
    while pos < n:
        if line == codes.size:
            return -1, g
        nxt = _criteo_line_fast(u8, pos, labels, ints, hexv, missing, g)
        if nxt >= 0:
            codes[line] = 0
            good[g] = line
            g += 1
            line += 1
            pos = nxt
            continue
        starts[0] = pos
        f = 0
        c = u8[pos]
        while c != NL:
            starts[min(f + 1, n_fields + 1)] = pos + 1   # kept only when c is a tab (f moves on)
            f += c == TAB
            pos += 1
            c = u8[pos]
        pos += 1
        if f + 1 != n_fields:
            codes[line] = 1
            line += 1
            continue
        starts[n_fields] = pos                  # one past the newline: field k ends at starts[k + 1] - 1
        s0 = starts[0]
        label_ok = starts[1] - 1 - s0 == 1 and (u8[s0] == ZERO or u8[s0] == ZERO + 1)
        int_ok = True
        for k in range(n_dense):
            a, b = starts[1 + k], starts[2 + k] - 1
            v = np.int64(0)
            if b > a:
                neg = u8[a] == MINUS
                d = a + neg
                int_ok &= 1 <= b - d <= MAX_INT_DIGITS
                for i in range(d, b):
                    digit = np.uint64(u8[i]) - np.uint64(ZERO)
                    int_ok &= digit <= np.uint64(9)
                    v = v * 10 + np.int64(digit)
                if neg:
                    v = -v
            ints[g, k] = v
        hex_ok = True
        for t in range(n_cat):
            a, b = starts[1 + n_dense + t], starts[2 + n_dense + t] - 1
            v = np.uint32(0)
            if b - a == 8:
                for i in range(a, b):
                    ch = np.uint32(u8[i])
                    digit = ch - np.uint32(ZERO)
                    letter = (ch | np.uint32(0x20)) - np.uint32(97)
                    is_digit = digit <= np.uint32(9)
                    hex_ok &= is_digit | (letter <= np.uint32(5))
                    v = (v << np.uint32(4)) | (digit if is_digit else letter + np.uint32(10))
            else:
                hex_ok &= b == a
            missing[g, t] = b == a
            hexv[g, t] = v
        code = 0 if label_ok else 2
        if code == 0 and not int_ok:
            code = 3
        if code == 0 and not hex_ok:
            code = 4
        codes[line] = code
        if code == 0:
            labels[g] = 1.0 if u8[s0] == ZERO + 1 else 0.0
            good[g] = line
            g += 1
        line += 1
    return line, g


EMPTY = -1                  # a free slot of an id table
LOW32 = 0xFFFFFFFF


@jit
def _slot(value, bits):
    return np.int64((np.uint64(value) * _GOLDEN) >> np.uint64(64 - bits))


@jit
def _entries(slots, bits, counts, values, skip, col, out, insert, next_entry, start, room):  # pragma: no cover
    """``out[r, col]`` = the entry of ``values[r, col]`` for rows ``r >= start`` (0 where ``skip``ped, or absent
    and not ``insert``);
    with ``insert`` absent values get entries from ``next_entry`` on, at most ``room`` of them, and every
    entry's count goes up by one -> (entries given, the row it stopped at: ``len(values)`` when done).

    A slot is one int64: ``entry << 32 | value``, or ``EMPTY``.
    """
    mask = (1 << bits) - 1
    new = 0
    for r in range(start, values.shape[0]):
        if skip[r, col]:
            out[r, col] = 0
            continue
        v = np.int64(values[r, col])
        s = _slot(v, bits)
        while slots[s] != EMPTY and (slots[s] & LOW32) != v:
            s = (s + 1) & mask
        if slots[s] == EMPTY:
            if not insert:
                out[r, col] = 0
                continue
            if new == room:
                return new, r
            slots[s] = ((next_entry + new) << 32) | v
            new += 1
        e = slots[s] >> 32
        out[r, col] = e
        if insert:
            counts[e] += 1
    return new, values.shape[0]


@jit
def _rehash(slots, new_slots, bits):  # pragma: no cover - compiled
    mask = (1 << bits) - 1
    for i in range(slots.size):
        if slots[i] != EMPTY:
            s = _slot(slots[i] & LOW32, bits)
            while new_slots[s] != EMPTY:
                s = (s + 1) & mask
            new_slots[s] = slots[i]


@jit
def take_back(counts, offsets, entries):  # pragma: no cover - compiled
    """``counts[offsets[t] + e] -= 1`` for every entry ``e = entries[r, t]`` but 0 (missing)."""
    for r in range(entries.shape[0]):
        for t in range(entries.shape[1]):
            if entries[r, t] != 0:
                counts[offsets[t] + entries[r, t]] -= 1


@jit
def gather(ids, offsets, entries, out):  # pragma: no cover - compiled
    """``out[r, t] = ids[offsets[t] + entries[r, t]]``."""
    for r in range(entries.shape[0]):
        for t in range(entries.shape[1]):
            out[r, t] = ids[offsets[t] + entries[r, t]]


@jit
def count_dense(counts, values, skip, modulo, delta):  # pragma: no cover - compiled
    """``counts[t, values[r, t] % modulo] += delta`` for every row; a skipped (missing) id counts as 0."""
    for r in range(values.shape[0]):
        for t in range(values.shape[1]):
            counts[t, 0 if skip[r, t] else values[r, t] % modulo] += delta


class IdTables:
    """Counts of the uint32 raw ids of each of ``tables`` columns, hashed per column.

    Every distinct value of a column gets an *entry* of that column (1, 2, ... in
    order of first appearance, 0 standing for "missing"); ``entries`` maps a
    chunk of raw ids to their entries, counting them, so a spilled chunk of
    entries is later encoded by one gather (``encode``). Memory grows with the
    distinct values, never with the rows: per value one 8-byte slot at a load
    of at most ``MAX_LOAD`` (the slots double when full, briefly holding both)
    and an 8-byte count (arrays that double too).
    """

    def __init__(self, tables: int) -> None:
        self.bits = [MIN_SLOTS.bit_length() - 1] * tables
        self.slots = [np.full(MIN_SLOTS, EMPTY, dtype=np.int64) for _ in range(tables)]
        self.counts = [np.zeros(MIN_SLOTS, dtype=np.int64) for _ in range(tables)]
        self.used = [0] * tables
        self.offsets = np.zeros(tables + 1, dtype=np.int64)   # set by ``freeze``
        self.all_counts = np.zeros(0, dtype=np.int64)
        self.ids = np.zeros(0, dtype=np.int32)

    def entries(self, values: np.ndarray, skip: np.ndarray, insert: bool = True) -> np.ndarray:
        """uint32 entries of ``values`` [rows, tables] (0 where ``skip``); with ``insert``, count each one
        and give new values new entries, else map values never counted to 0."""
        out = np.empty(values.shape, dtype=np.uint32)
        rows = values.shape[0]
        for t in range(values.shape[1]):
            start = 0
            while True:
                if self.counts[t].size < self.used[t] + 1 + rows:
                    grown = np.zeros(max(2 * self.counts[t].size, self.used[t] + 1 + rows), dtype=np.int64)
                    grown[:self.counts[t].size] = self.counts[t]
                    self.counts[t] = grown
                room = int(MAX_LOAD * self.slots[t].size) - self.used[t]
                new, start = _entries(self.slots[t], self.bits[t], self.counts[t], values, skip, t, out, insert,
                                      self.used[t] + 1, start, room)
                self.used[t] += new
                if start == rows:
                    break
                self._grow(t)
        return out

    def _grow(self, t: int) -> None:
        slots = np.full(2 * self.slots[t].size, EMPTY, dtype=np.int64)
        _rehash(self.slots[t], slots, self.bits[t] + 1)
        self.slots[t], self.bits[t] = slots, self.bits[t] + 1

    def freeze(self) -> None:
        """Counting is done: the counts go into one array (column ``t``'s entry ``e`` at ``offsets[t] + e``)."""
        sizes = np.array([u + 1 for u in self.used], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(sizes)))
        self.all_counts = np.concatenate([c[:n] for c, n in zip(self.counts, sizes)])
        self.counts = []

    def take_back(self, entries: np.ndarray) -> None:
        """Uncount spilled entries (after ``freeze``)."""
        take_back(self.all_counts, self.offsets, entries)

    def items(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entries, uint32 values, counts) of column ``t``'s values with a positive count, by ascending value
        (after ``freeze``)."""
        used = self.slots[t][self.slots[t] != EMPTY]
        entries, values = used >> 32, (used & LOW32).astype(np.uint32)
        counts = self.all_counts[self.offsets[t] + entries]
        seen = np.flatnonzero(counts > 0)
        seen = seen[np.argsort(values[seen], kind="stable")]
        return entries[seen], values[seen], counts[seen]

    def set_ids(self, t: int, entries: np.ndarray, ids: np.ndarray) -> None:
        """Column ``t``'s ``entries`` get ``ids``; every other entry (missing, rare, unseen) 0."""
        if self.ids.size != self.all_counts.size:
            self.ids = np.zeros(self.all_counts.size, dtype=np.int32)
        self.ids[self.offsets[t] + entries] = ids

    def encode(self, entries: np.ndarray) -> np.ndarray:
        """int32 ids of spilled entries [rows, tables]."""
        out = np.empty(entries.shape, dtype=np.int32)
        gather(self.ids, self.offsets, entries, out)
        return out
