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
    pos, line, g = 0, 0, 0
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


EMPTY = -1                  # count (second word) of a free slot of an id table


@jit
def _slot(value, bits):
    return np.int64((np.uint64(value) * _GOLDEN) >> np.uint64(64 - bits))


@jit
def _count(slots, bits, values, skip, delta, start, room):  # pragma: no cover - compiled
    """Add ``delta`` to the count of ``values[r]`` for each row ``r >= start`` not ``skip``ped, taking at most
    ``room`` free slots -> (slots taken, the row it stopped at: ``len(values)`` when done)."""
    mask = (1 << bits) - 1
    new = 0
    for r in range(start, values.size):
        if skip[r]:
            continue
        v = np.int64(values[r])
        s = _slot(v, bits)
        while slots[s, 1] != EMPTY and slots[s, 0] != v:
            s = (s + 1) & mask
        if slots[s, 1] == EMPTY:
            if new == room:
                return new, r
            slots[s, 0] = v
            slots[s, 1] = 0
            new += 1
        slots[s, 1] += delta
    return new, values.size


@jit
def _rehash(slots, new_slots, bits):  # pragma: no cover - compiled
    mask = (1 << bits) - 1
    for i in range(slots.shape[0]):
        if slots[i, 1] != EMPTY:
            s = _slot(slots[i, 0], bits)
            while new_slots[s, 1] != EMPTY:
                s = (s + 1) & mask
            new_slots[s, 0] = slots[i, 0]
            new_slots[s, 1] = slots[i, 1]


@jit
def _lookup(slots, bits, values, skip, out):  # pragma: no cover - compiled
    """``out[r]`` = the id (second word) of ``values[r]``: 0 when skipped or absent."""
    mask = (1 << bits) - 1
    for r in range(values.size):
        if skip[r]:
            out[r] = 0
            continue
        v = np.int64(values[r])
        s = _slot(v, bits)
        while slots[s, 1] != EMPTY and slots[s, 0] != v:
            s = (s + 1) & mask
        out[r] = slots[s, 1] if slots[s, 1] != EMPTY else 0


@jit
def count_dense(counts, values, skip, modulo, delta):  # pragma: no cover - compiled
    """``counts[t, values[r, t] % modulo] += delta`` for every row; a skipped (missing) id counts as 0."""
    for r in range(values.shape[0]):
        for t in range(values.shape[1]):
            counts[t, 0 if skip[r, t] else values[r, t] % modulo] += delta


class IdTable:
    """Counts of the uint32 values of one table column, hashed; then the id of each value (``set_ids``).

    A slot is two int64 words, (value, count), so a probe touches one cache line; once the ids are
    set the count word holds the id. Memory: 16 bytes per slot, at least twice as many slots as
    values seen (four times just after growing; growing holds the old and the new slots).
    """

    def __init__(self) -> None:
        self.bits = MIN_SLOTS.bit_length() - 1
        self.slots = np.full((MIN_SLOTS, 2), EMPTY, dtype=np.int64)
        self.used = 0

    def add(self, values: np.ndarray, skip: np.ndarray, delta: int = 1) -> None:
        """Add ``delta`` to the count of each of ``values`` (1-D) where not ``skip``.

        A negative ``delta`` must only take back counts added before (a count reaching 0 keeps its slot).
        """
        start = 0
        while True:
            room = int(MAX_LOAD * len(self.slots)) - self.used
            new, start = _count(self.slots, self.bits, values, skip, delta, start, room)
            self.used += new
            if start == len(values):
                return
            self._grow()

    def _grow(self) -> None:
        slots = np.full((2 * len(self.slots), 2), EMPTY, dtype=np.int64)
        _rehash(self.slots, slots, self.bits + 1)
        self.slots, self.bits = slots, self.bits + 1

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, uint32 values, counts) of the values with a positive count, by ascending value."""
        at = np.flatnonzero(self.slots[:, 1] > 0)
        at = at[np.argsort(self.slots[at, 0], kind="stable")]
        return at, self.slots[at, 0].astype(np.uint32), self.slots[at, 1]

    def set_ids(self, at: np.ndarray, ids: np.ndarray) -> None:
        """The value in slot ``at[i]`` maps to ``ids[i]``, every other value to 0 (counts are gone)."""
        used = self.slots[:, 1] != EMPTY
        self.slots[used, 1] = 0
        self.slots[at, 1] = ids

    def lookup(self, values: np.ndarray, skip: np.ndarray, out: np.ndarray) -> None:
        """``out`` = the id of each of ``values`` (0 where ``skip``, unknown or not kept)."""
        _lookup(self.slots, self.bits, values, skip, out)
