"""Parsing of a chunk of Taobao ``UserBehavior.csv`` lines, compiled with numba and as vectorised numpy.

``parse_chunk``: a chunk of lines -> each line's reason code (0 good, 1 field
count, 2 integer, 3 behaviour; the first failing check wins) and the good
lines' user, item, category, timestamp and behaviour. The rules are
``textparse``'s: an integer is an optional ``-`` and 1..16 decimal digits;
user, item and category must not be negative. The compiled kernel (used when
``hotcold.jit.KERNEL == "numba"``) and the numpy version give the same result
(the tests compare them, and the kernel's plain-Python body, on random and
malformed input). Its parser of one line (``_line``) is also the compiled
read pass's (``taobao_ids.parse_index``).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import KERNEL, jit
from hotcold.data.sources.textparse import MAX_INT_DIGITS, tokenize, parse_ints, words

NL, CR, COMMA, MINUS, ZERO = 10, 13, 44, 45, 48
BEHAVIORS = ("pv", "buy", "cart", "fav")
INT_COLUMNS = [0, 1, 2, 4]   # user, item, category, timestamp
_BEHAVIOR_CODES = [int.from_bytes(b.encode(), "little") for b in BEHAVIORS]
_BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(5)], dtype=np.uint64)  # [0..4 bytes]
OUTSIDE = 64                 # the code of a well-formed line whose timestamp is outside the time range (no reason)


def _parse_numpy(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tok = tokenize(buf, b",", 5)
    s, n = tok.starts, tok.lens
    vals, ok = parse_ints(tok.u8, s[:, INT_COLUMNS], n[:, INT_COLUMNS])
    int_ok = ok.all(1) & (n[:, INT_COLUMNS] > 0).all(1) & (vals[:, :3] >= 0).all(1)
    blen = n[:, 3]
    word = words(tok.u8)[s[:, 3]] & _BYTE_MASKS[np.minimum(blen, 4)]
    behavior = np.full(blen.size, -1, dtype=np.int8)
    for i, (name, code) in enumerate(zip(BEHAVIORS, _BEHAVIOR_CODES)):
        behavior[(blen == len(name)) & (word == np.uint64(code))] = i
    code = np.select([~int_ok, behavior < 0], [2, 3], 0).astype(np.int8)
    keep = code == 0
    return tok.line_codes(code), tok.good[keep], vals[keep], behavior[keep]


@jit
def _behavior(u8, a, b):  # pragma: no cover - compiled
    """Index in BEHAVIORS of the bytes [a, b), or -1."""
    m = b - a
    c0 = u8[a] if m > 0 else 0
    if m == 2 and c0 == 112 and u8[a + 1] == 118:                                        # pv
        return 0
    if m == 3 and c0 == 98 and u8[a + 1] == 117 and u8[a + 2] == 121:                    # buy
        return 1
    if m == 4 and c0 == 99 and u8[a + 1] == 97 and u8[a + 2] == 114 and u8[a + 3] == 116:  # cart
        return 2
    if m == 3 and c0 == 102 and u8[a + 1] == 97 and u8[a + 2] == 118:                    # fav
        return 3
    return -1


@jit
def _digits(u8, p):  # pragma: no cover - compiled
    """The decimal digits from ``p`` -> (value, position after them)."""
    v = np.int64(0)
    while True:
        c = u8[p]
        if c < ZERO or c > ZERO + 9:
            return v, p
        v = v * 10 + np.int64(c - ZERO)
        p += 1


@jit
def _line(u8, pos):  # pragma: no cover - compiled
    """Parse the line at ``pos`` (``u8`` ends with ``\\n``; a ``\\r`` before a line's ``\\n`` is not part of it)
    -> (the next line's position, reason code, user, item, category, timestamp, behaviour); the values are
    those of a good line (code 0)."""
    p = pos
    fast = False
    v0, q = _digits(u8, p)                               # the usual line first: digits, no minus sign
    if q > p and q - p <= MAX_INT_DIGITS and u8[q] == COMMA:
        p = q + 1
        v1, q = _digits(u8, p)
        if q > p and q - p <= MAX_INT_DIGITS and u8[q] == COMMA:
            p = q + 1
            v2, q = _digits(u8, p)
            if q > p and q - p <= MAX_INT_DIGITS and u8[q] == COMMA:
                p = q + 1
                fast = True
    if fast:
        c = u8[p]
        bh = -1
        if c == 112 and u8[p + 1] == 118 and u8[p + 2] == COMMA:                                     # pv
            bh, p = 0, p + 3
        elif c == 98 and u8[p + 1] == 117 and u8[p + 2] == 121 and u8[p + 3] == COMMA:                # buy
            bh, p = 1, p + 4
        elif c == 99 and u8[p + 1] == 97 and u8[p + 2] == 114 and u8[p + 3] == 116 and u8[p + 4] == COMMA:
            bh, p = 2, p + 5                                                                           # cart
        elif c == 102 and u8[p + 1] == 97 and u8[p + 2] == 118 and u8[p + 3] == COMMA:               # fav
            bh, p = 3, p + 4
        if bh >= 0:
            neg = u8[p] == MINUS
            first = p + 1 if neg else p
            x, q = _digits(u8, first)
            if q > first and q - first <= MAX_INT_DIGITS:
                if u8[q] == CR and u8[q + 1] == NL:
                    q += 1
                if u8[q] == NL:
                    return q + 1, 0, v0, v1, v2, -x if neg else x, bh
    starts = np.empty(6, dtype=np.int64)                 # the general rules, field by field
    vals = np.empty(4, dtype=np.int64)
    starts[0] = pos
    f = 0
    p = pos
    c = u8[p]
    while c != NL:
        if c == COMMA:
            f += 1
            if f <= 4:
                starts[f] = p + 1
        p += 1
        c = u8[p]
    nxt = p + 1
    if p > pos and u8[p - 1] == CR:                      # the line ends before its \r\n
        p -= 1
    if f != 4:
        return nxt, 1, 0, 0, 0, 0, 0
    starts[5] = p + 1
    for k in range(5):
        if k == 3:
            continue
        a, b = starts[k], starts[k + 1] - 1              # the field's bytes [a, b)
        neg = b > a and u8[a] == MINUS
        q = a + 1 if neg else a
        if b - q < 1 or b - q > MAX_INT_DIGITS:
            return nxt, 2, 0, 0, 0, 0, 0
        x = np.int64(0)
        for i in range(q, b):
            d = np.int64(u8[i]) - ZERO
            if d < 0 or d > 9:
                return nxt, 2, 0, 0, 0, 0, 0
            x = x * 10 + d
        if neg:
            if k < 3 and x != 0:
                return nxt, 2, 0, 0, 0, 0, 0
            x = -x
        vals[k if k < 3 else 3] = x
    bh = _behavior(u8, starts[3], starts[4] - 1)
    if bh < 0:
        return nxt, 3, 0, 0, 0, 0, 0
    return nxt, 0, vals[0], vals[1], vals[2], vals[3], np.int64(bh)


@jit
def parse_taobao(u8, codes, vals, beh, good):  # pragma: no cover - compiled
    """Parse the lines of ``u8`` (ending with ``\\n``) -> (lines, good lines); lines -1 when there are more
    lines than ``codes`` holds. Good lines are packed in order into ``vals`` (int64 [., 4] user, item,
    category, timestamp), ``beh`` and ``good`` (their index in the chunk)."""
    n = u8.size
    pos, line, g = np.int64(0), 0, 0   # pos not a literal 0: see hotcold.jit
    while pos < n:
        if line == codes.size:
            return -1, g
        pos, code, u, i, c, t, b = _line(u8, pos)
        codes[line] = code
        if code == 0:
            vals[g, 0], vals[g, 1], vals[g, 2], vals[g, 3] = u, i, c, t
            beh[g] = b
            good[g] = line
            g += 1
        line += 1
    return line, g


def _parse_compiled(buf: bytes, max_lines: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not buf.endswith(b"\n"):
        buf += b"\n"
    m = max_lines
    codes, good = np.empty(m, dtype=np.int8), np.empty(m, dtype=np.int64)
    vals, beh = np.empty((m, 4), dtype=np.int64), np.empty(m, dtype=np.int8)
    n, g = parse_taobao(np.frombuffer(buf, dtype=np.uint8), codes, vals, beh, good)
    if n < 0:
        raise ValueError(f"a chunk holds more than {max_lines} lines")
    return codes[:n], good[:g], vals[:g], beh[:g]


def parse_chunk(buf: bytes, max_lines: int, compiled: bool | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A chunk of at most ``max_lines`` whole lines -> (int8 reason code of every line, int64 indices of the
    good lines, int64 [G, 4] user/item/category/timestamp, int8 [G] behaviour)."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    return _parse_compiled(buf, max_lines) if compiled else _parse_numpy(buf)
