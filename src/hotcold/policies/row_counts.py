"""Compiled counts of rows over batches: the distinct rows of each batch, the lookups of each row, and the
distinct rows of a sliding window of batches.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit


@jit
def batch_uniques(rows, offsets, stamp, first):
    """Distinct rows of each batch ``rows[offsets[t]:offsets[t+1]]``: int64 [T].

    ``stamp`` [N] (int64, kept between calls): the last batch number + 1 that
    saw each row; batch t of this call is number ``first + t``.
    """
    out = np.zeros(offsets.size - 1, dtype=np.int64)
    for t in range(offsets.size - 1):
        mark = first + t + 1
        u = 0
        for i in range(offsets[t], offsets[t + 1]):
            r = rows[i]
            if stamp[r] != mark:
                stamp[r] = mark
                u += 1
        out[t] = u
    return out


@jit
def add_counts(out, rows, counts):
    """``out[rows[i]] += counts[i]`` for every i (rows may repeat)."""
    for i in range(rows.size):
        out[rows[i]] += counts[i]


@jit
def window_add(live, rows, delta):
    """``live[rows] += delta`` (rows distinct); returns the change in rows with ``live > 0``."""
    change = 0
    for r in rows:
        before = live[r]
        live[r] = before + delta
        if before == 0 and delta > 0:
            change += 1
        elif before + delta == 0 and delta < 0:
            change -= 1
    return change
