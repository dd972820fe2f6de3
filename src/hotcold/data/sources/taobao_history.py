"""The Taobao preprocessor's per-user counts, tails and sample histories, compiled with numba and as
vectorised numpy.

``bucket_stats`` counts one grouped bucket's kept events (per user, item,
category and behaviour) and copies the last events of each user that gives
samples to the tail arrays; ``fill_history`` writes each sample's history,
the (item, category) of its earlier events, from those tails. Each compiled
kernel (used when ``hotcold.jit.KERNEL == "numba"``) and its numpy version
give the same result (the tests compare them).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import KERNEL, jit


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
