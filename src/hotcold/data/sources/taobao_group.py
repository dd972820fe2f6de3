"""Grouping of the Taobao events by user, compiled with numba and as vectorised numpy.

``by_bucket`` orders a chunk's events by ``user % buckets`` (file order
within a bucket), so that a spill bucket holds whole users.
``group_events``: one bucket of events (whole users, in file order) -> the
indices of the events to keep, ordered by (user, timestamp, file order); an
event that repeats an earlier one exactly (same user, timestamp, item,
category and behaviour) is dropped. Compiled, a user's events are sorted by
unique packed (time, index) keys in time bins (``_group_packed``), or, when
times are too wide to pack, by a merge sort (``_group_kernel``). Each
compiled kernel (used when ``hotcold.jit.KERNEL == "numba"``) and its numpy
version give the same result (the tests compare them, and the kernels'
plain-Python bodies).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import KERNEL, jit
from hotcold.sorting import sort_range, stable_argsort

SHORT_RUN = 8                # events at one (user, timestamp) compared pairwise; longer runs are sorted


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
        by_key = np.empty(j - i, dtype=np.int64)        # stable: the first of equal keys is the earliest
        stable_argsort(key, by_key, np.empty(j - i, dtype=np.int64))
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
    by_time, tmp = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    kept = 0
    for u in range(n_users):
        a, b = start[u], start[u + 1]
        if b - a > 16:
            stable_argsort(sts[a:b], by_time[:b - a], tmp[:b - a])
            for x in range(b - a):
                tmp[x] = order[a + by_time[x]]
            for x in range(b - a):
                order[a + x] = tmp[x]
                tmp[x] = sts[a + by_time[x]]
            for x in range(b - a):
                sts[a + x] = tmp[x]
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
            lo_k = np.int64(0)   # not a literal 0: see hotcold.jit
            for k in range(m):                           # bin_start[k] is now the end of bin k
                hi_k = bin_start[k]
                if hi_k - lo_k > 1:
                    sort_range(tmp, lo_k, hi_k)
                lo_k = hi_k
            for x in range(m):
                key[a + x] = tmp[x]
        else:
            sort_range(key, a, b)
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
