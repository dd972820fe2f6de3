"""The Taobao preprocessor's per-event steps, compiled with numba and as vectorised numpy.

Three steps touch every event (``taobao.preprocess_taobao``); each has a
compiled kernel (used when ``hotcold.jit.KERNEL == "numba"``) and a numpy
version giving the same result (the tests compare them, and the kernels'
plain-Python bodies, on random and malformed input):

- ``parse_chunk``: a chunk of ``UserBehavior.csv`` lines -> each line's reason
  code (0 good, 1 field count, 2 integer, 3 behaviour; the first failing check
  wins) and the good lines' user, item, category, timestamp and behaviour. The
  rules are ``textparse``'s: an integer is an optional ``-`` and 1..16 decimal
  digits; user, item and category must not be negative.
- ``IdIndex``: raw int64 ids -> int32 indices in order of first appearance
  (a hash table with the kernels, a sorted table with numpy), remembering each
  index's raw value and the position of its first event. The compiled read
  pass does both in one kernel per chunk (``parse_index``: parse, look the ids
  up, write the events where they are kept), tested against the two; it also
  gives a well-formed line whose timestamp lies outside the configured range
  the code ``OUTSIDE`` and keeps it out of the events.
- ``group_events``: one bucket of events (whole users, in file order) -> the
  indices of the events to keep, ordered by (user, timestamp, file order); an
  event that repeats an earlier one exactly (same user, timestamp, item,
  category and behaviour) is dropped. Compiled, a user's events are sorted by
  unique packed (time, index) keys in time bins (``_group_packed``), or, when
  times are too wide to pack, by a merge sort (``_group_kernel``).
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
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
OUTSIDE = 64                 # the code of a well-formed line whose timestamp is outside the time range (no reason)
SHORT_RUN = 8                # events at one (user, timestamp) compared pairwise; longer runs are sorted


# ---------------------------------------------------------------- parsing


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
    pos, line, g = 0, 0, 0
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


# ---------------------------------------------------------------- id index


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


@jit
def _by_bucket(user, item, cat, beh, ts, buckets, o_user, o_item, o_cat, o_beh, o_ts, bounds):  # pragma: no cover
    """Counting sort of the events by ``user % buckets`` (stable) into the ``o_*`` columns."""
    n = user.size
    bounds[:] = 0
    for i in range(n):
        bounds[user[i] % buckets + 1] += 1
    for b in range(buckets):
        bounds[b + 1] += bounds[b]
    at = bounds[:-1].copy()
    for i in range(n):
        b = user[i] % buckets
        p = at[b]
        at[b] = p + 1
        o_user[p], o_item[p], o_cat[p], o_beh[p], o_ts[p] = user[i], item[i], cat[i], beh[i], ts[i]


def by_bucket(cols: list[np.ndarray], buckets: int, out: list[np.ndarray], compiled: bool | None = None
              ) -> tuple[list[np.ndarray], np.ndarray]:
    """The events ``cols`` (user, item, cat, beh, ts; user indices non-negative) ordered by
    ``user % buckets``, file order within a bucket -> (the columns so ordered, int64 [buckets + 1] bounds).
    The compiled path writes them into ``out`` (columns at least as long)."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    n = cols[0].size
    if compiled:
        bounds = np.empty(buckets + 1, dtype=np.int64)
        _by_bucket(*cols, buckets, *(o[:n] for o in out), bounds)
        return [o[:n] for o in out], bounds
    bucket = (cols[0] % buckets).astype(np.uint16)
    order = np.argsort(bucket, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(bucket, minlength=buckets))))
    return [c[order] for c in cols], bounds


# ---------------------------------------------------------------- grouping by user


def first_occurrences(cols: list[np.ndarray]) -> np.ndarray:
    """bool [n]: the events that do not repeat an earlier one exactly (equal in every column of ``cols``)."""
    order = np.lexsort(cols[::-1])                      # stable: equal rows stay in file order
    same = np.ones(order.size - 1, dtype=bool)
    for column in cols:
        sorted_column = column[order]
        same &= sorted_column[1:] == sorted_column[:-1]
    keep = np.ones(order.size, dtype=bool)
    keep[order[1:][same]] = False
    return keep


def _group_numpy(user, ts, item, cat, beh) -> np.ndarray:
    kept = np.flatnonzero(first_occurrences([user, item, cat, ts, beh]))
    return kept[np.lexsort((ts[kept], user[kept]))]


@jit
def _drop_repeats(events, i, j, item, cat, beh, keep):  # pragma: no cover - compiled
    """Clear ``keep[x]`` for each of ``events[i:j]`` (one user's events at one time, earliest first) that
    repeats an earlier one exactly (item, category, behaviour): pairwise when few, by a stable sort else."""
    if j - i > SHORT_RUN:
        key = np.empty(j - i, dtype=np.uint64)
        for x in range(i, j):
            e = events[x]
            key[x - i] = (np.uint64(item[e]) << np.uint64(33)) | (np.uint64(cat[e]) << np.uint64(2)) \
                | np.uint64(beh[e])
        by_key = np.argsort(key, kind="mergesort")    # stable: the first of equal keys is the earliest
        for x in range(1, j - i):
            if key[by_key[x]] == key[by_key[x - 1]]:
                keep[i + by_key[x]] = False
    else:
        for x in range(i + 1, j):
            e = events[x]
            for y in range(i, x):
                f = events[y]
                if item[e] == item[f] and cat[e] == cat[f] and beh[e] == beh[f]:
                    keep[x] = False
                    break


@jit
def _group_kernel(user, ts, item, cat, beh, n_users):  # pragma: no cover - compiled
    n = user.size
    start = np.zeros(n_users + 1, dtype=np.int64)
    for i in range(n):
        start[user[i] + 1] += 1
    for u in range(n_users):
        start[u + 1] += start[u]
    fill = start[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    sts = np.empty(n, dtype=np.int64)                    # the times in ``order``'s order: sorted in place
    for i in range(n):                                   # counting sort by user: file order within a user
        u = user[i]
        order[fill[u]] = i
        sts[fill[u]] = ts[i]
        fill[u] += 1
    keep = np.ones(n, dtype=np.bool_)
    kept = 0
    for u in range(n_users):
        a, b = start[u], start[u + 1]
        if b - a > 16:
            by_time = np.argsort(sts[a:b], kind="mergesort")
            order[a:b] = order[a:b][by_time]
            sts[a:b] = sts[a:b][by_time]
        else:
            for i in range(a + 1, b):                    # insertion sort: stable
                e, t = order[i], sts[i]
                j = i - 1
                while j >= a and sts[j] > t:
                    order[j + 1], sts[j + 1] = order[j], sts[j]
                    j -= 1
                order[j + 1], sts[j + 1] = e, t
        i = a
        while i < b:
            j = i + 1
            while j < b and sts[j] == sts[i]:
                j += 1
            if j - i > 1:                                # a call per event costs more than the rest
                _drop_repeats(order, i, j, item, cat, beh, keep)
            i = j
    for x in range(n):
        if keep[x]:
            order[kept] = order[x]
            kept += 1
    return order[:kept]


@jit
def _sort_small(key, a, b):  # pragma: no cover - compiled
    """Sort ``key[a:b]`` in place: insertion sort when short, else the library sort."""
    if b - a > 16:
        key[a:b].sort()
        return
    for i in range(a + 1, b):
        k = key[i]
        j = i - 1
        while j >= a and key[j] > k:
            key[j + 1] = key[j]
            j -= 1
        key[j + 1] = k


@jit
def _group_packed(user, ts, item, cat, beh, n_users, tmin, shift):  # pragma: no cover - compiled
    """``_group_kernel`` for a bucket whose times and event indices fit one uint64 key
    ``(ts - tmin) << shift | index``: keys are unique, so sorting them orders by (time, file order). Each
    user's keys are spread over about as many bins as it has events by time (a counting sort), then each
    bin is sorted (few keys: insertion sort)."""
    n = user.size
    start = np.zeros(n_users + 1, dtype=np.int64)
    for i in range(n):
        start[user[i] + 1] += 1
    longest = 0
    for u in range(n_users):
        longest = max(longest, start[u + 1])
        start[u + 1] += start[u]
    fill = start[:-1].copy()
    key = np.empty(n, dtype=np.uint64)
    sh = np.uint64(shift)
    for i in range(n):                                   # counting sort by user: file order within a user
        u = user[i]
        key[fill[u]] = (np.uint64(ts[i] - tmin) << sh) | np.uint64(i)
        fill[u] += 1
    mask = (np.uint64(1) << sh) - np.uint64(1)
    tmp = np.empty(longest, dtype=np.uint64)
    bins = np.empty(longest, dtype=np.int64)
    bin_start = np.empty(longest + 1, dtype=np.int64)
    keep = np.ones(n, dtype=np.bool_)
    events = np.empty(n, dtype=np.int64)                 # the event index of each sorted key
    for u in range(n_users):
        a, b = start[u], start[u + 1]
        m = b - a
        if m > 16:
            lo, hi = key[a] >> sh, key[a] >> sh
            for x in range(a, b):
                t = key[x] >> sh
                lo = min(lo, t)
                hi = max(hi, t)
            scale = m / (np.float64(hi - lo) + 1.0)      # bins by a float product, not a division per key:
            bin_start[:m + 1] = 0                        # monotone in time, which is all the bins need
            for x in range(a, b):
                k = min(np.int64(np.float64((key[x] >> sh) - lo) * scale), m - 1)
                bins[x - a] = k
                bin_start[k + 1] += 1
            for k in range(m):
                bin_start[k + 1] += bin_start[k]
            for x in range(a, b):                        # stable: keys within a bin stay ascending by index
                k = bins[x - a]
                tmp[bin_start[k]] = key[x]
                bin_start[k] += 1
            lo_k = 0
            for k in range(m):                           # bin_start[k] is now the end of bin k
                hi_k = bin_start[k]
                if hi_k - lo_k > 1:
                    _sort_small(tmp, lo_k, hi_k)
                lo_k = hi_k
            key[a:b] = tmp[:m]
        else:
            _sort_small(key, a, b)
        for x in range(a, b):
            events[x] = np.int64(key[x] & mask)
        i = a
        while i < b:                                     # exact repeats among the events at one time
            t = key[i] >> sh
            j = i + 1
            while j < b and (key[j] >> sh) == t:
                j += 1
            if j - i > 1:                                # a call per event costs more than the rest
                _drop_repeats(events, i, j, item, cat, beh, keep)
            i = j
    kept = 0
    for x in range(n):
        if keep[x]:
            events[kept] = events[x]
            kept += 1
    return events[:kept]


def _packed_shift(ts: np.ndarray, n: int) -> tuple[int, int] | None:
    """(tmin, bits of an event index) when ``(ts - tmin) << bits | index`` fits 63 bits, else None."""
    if not ts.size:
        return None
    tmin, tmax = int(ts.min()), int(ts.max())
    bits = max(int(n).bit_length(), 1)
    return (tmin, bits) if (tmax - tmin).bit_length() + bits <= 63 else None


def group_events(user: np.ndarray, ts: np.ndarray, item: np.ndarray, cat: np.ndarray, beh: np.ndarray,
                 n_users: int, compiled: bool | None = None) -> np.ndarray:
    """int64 indices of the events to keep, by (user, timestamp, file order). ``user`` holds indices below
    ``n_users`` (int32), item and category non-negative int32 indices, ``beh`` int8 0..3; the arrays are in
    file order."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    if compiled:
        packed = _packed_shift(ts, user.size)
        if packed is not None:
            return _group_packed(user, ts, item, cat, beh, n_users, *packed)
        return _group_kernel(user, ts, item, cat, beh, n_users)
    return _group_numpy(user, ts, item, cat, beh)


# ---------------------------------------------------------------- histories


@jit
def _history_kernel(start, stop, items, cats, out, item_counts, cat_counts, count):  # pragma: no cover
    o = 0
    for i in range(start.size):
        for e in range(start[i], stop[i]):
            out[o, 0] = items[e]
            out[o, 1] = cats[e]
            if count:
                item_counts[items[e]] += 1
                cat_counts[cats[e]] += 1
            o += 1


def fill_history(start: np.ndarray, stop: np.ndarray, items: np.ndarray, cats: np.ndarray, out: np.ndarray,
                 item_counts: np.ndarray, cat_counts: np.ndarray, count: bool, compiled: bool | None = None) -> None:
    """Write the (item, category) of events ``[start[i], stop[i])`` of every sample ``i`` to ``out`` [H, 2]
    (one after another) and, if ``count``, add them to ``item_counts`` / ``cat_counts``."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    if compiled:
        _history_kernel(start, stop, items, cats, out, item_counts, cat_counts, count)
        return
    lengths = stop - start
    idx = np.repeat(start, lengths) + (np.arange(int(lengths.sum()), dtype=np.int64)
                                       - np.repeat(np.cumsum(lengths) - lengths, lengths))
    out[:] = np.stack([items[idx], cats[idx]], axis=1)
    if count:
        item_counts += np.bincount(items[idx], minlength=item_counts.size)
        cat_counts += np.bincount(cats[idx], minlength=cat_counts.size)


@jit
def _bucket_kernel(order, local, ts, item, cat, beh, item_cat, min_history, per_user, max_length, cnt, last,
                   item_counts, cat_counts, beh_counts, tail_item, tail_cat, filled, tail_start):  # pragma: no cover
    conflicts = 0
    dest = np.full(local.size, -2, dtype=np.int32)  # per event: -2 dropped, -1 kept, >= 0 its place in the
    first = filled                                  # tail after ``first`` (a bucket holds under 2**31 events)
    for x in range(order.size):
        dest[order[x]] = -1
    for e in range(local.size):                   # counts in file order: the columns are read in sequence
        if dest[e] == -2:
            continue
        cnt[local[e]] += 1
        item_counts[item[e]] += 1
        cat_counts[cat[e]] += 1
        beh_counts[beh[e]] += 1
        conflicts += cat[e] != item_cat[item[e]]
    end = 0
    for u in range(cnt.size):
        c = cnt[u]
        end += c
        last[u] = ts[order[end - 1]]
        k = min(max(c - min_history, 0), per_user)
        t = min(c, k + max_length) if k > 0 else 0
        tail_start[u] = filled - (c - t)
        for x in range(end - t, end):
            dest[order[x]] = filled - first
            filled += 1
    for e in range(local.size):                   # the tails copied in file order: scattered writes, not reads
        d = dest[e]
        if d >= 0:
            tail_item[first + d] = item[e]
            tail_cat[first + d] = cat[e]
    return filled, conflicts


def bucket_stats(order: np.ndarray, local: np.ndarray, ts: np.ndarray, item: np.ndarray, cat: np.ndarray,
                 beh: np.ndarray, item_cat: np.ndarray, min_history: int, per_user: int, max_length: int,
                 n_local: int, item_counts: np.ndarray, cat_counts: np.ndarray, beh_counts: np.ndarray,
                 tail_item: np.ndarray, tail_cat: np.ndarray, filled: int, compiled: bool | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Counts and tails of one bucket's kept events ``order`` (by user, time; every user has one): add to
    ``item_counts``/``cat_counts``/``beh_counts``; write the last ``min(events, k + max_length)`` events of
    each user with ``k = clip(events - min_history, 0, per_user) > 0`` (samples) to ``tail_item``/``tail_cat``
    from ``filled`` -> (events per user, last time per user, where each user's position 0 would be in the
    tail arrays, the new ``filled``, events whose category is not their item's first)."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    cnt, last, start = (np.zeros(n_local, dtype=np.int64) for _ in range(3))
    if compiled:
        filled, conflicts = _bucket_kernel(order, local, ts, item, cat, beh, item_cat, min_history, per_user,
                                           max_length, cnt, last, item_counts, cat_counts, beh_counts, tail_item,
                                           tail_cat, filled, start)
        return cnt, last, start, filled, conflicts
    item, cat, beh, ts = item[order], cat[order], beh[order], ts[order]
    cnt[:] = np.bincount(local[order], minlength=n_local)
    ends = np.cumsum(cnt)
    last[:] = ts[ends - 1]
    item_counts += np.bincount(item, minlength=item_counts.size)
    cat_counts += np.bincount(cat, minlength=cat_counts.size)
    beh_counts += np.bincount(beh, minlength=beh_counts.size)
    conflicts = int(np.count_nonzero(cat != item_cat[item]))
    k = np.clip(cnt - min_history, 0, per_user)
    t = np.where(k > 0, np.minimum(cnt, k + max_length), 0)
    idx = np.repeat(ends - t, t) + (np.arange(int(t.sum()), dtype=np.int64) - np.repeat(np.cumsum(t) - t, t))
    tail_item[filled:filled + idx.size], tail_cat[filled:filled + idx.size] = item[idx], cat[idx]
    start[:] = filled + np.cumsum(t) - t - (cnt - t)
    return cnt, last, start, filled + idx.size, conflicts
