"""Sorting and selection written out for the compiled kernels.

numba compiles its own ``np.sort``, ``np.argsort``, ``np.partition`` and
``np.diff`` from generic code (checks, copies, error messages formatted at
run time) for each signature: a few seconds each. With them the cache
directory's kernels took 27 s to compile cold, with these loops 10.5 s (the
2-core machine of ``docs/measurements.md``); the results are the same. Each
runs as plain Python where numba is absent (the tests compare both with
numpy).

- ``sort_range(a, lo, hi)``: sorts ``a[lo:hi]`` in place (values; not stable,
  which values never need);
- ``kth_smallest(a, n, k)``: the k-th smallest (from 0) of ``a[:n]``,
  reordering it;
- ``stable_argsort(key, order, tmp)``: the stable ascending order of ``key``
  into ``order`` (``tmp`` as long: scratch);
- ``search_right(a, x)``: where ``x`` goes in the ascending ``a``, after its
  equals (``np.searchsorted(a, x, side="right")``).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit, jit_helper

SHORT = 16   # ranges up to this long are sorted by insertion


@jit_helper
def _insertion(a, lo, hi):
    for i in range(lo + 1, hi):
        x = a[i]
        j = i - 1
        while j >= lo and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


@jit_helper
def _partition(a, lo, hi):
    """Hoare's partition of ``a[lo:hi]`` (at least 3 long) around the median of its first, middle and last
    values -> p: ``a[lo:p] <= pivot <= a[p:hi]``, lo < p < hi. Equal values stop both scans, so a range of
    many equal values splits near its middle."""
    h = hi - 1
    mid = (lo + h) >> 1
    if a[mid] < a[lo]:
        a[lo], a[mid] = a[mid], a[lo]
    if a[h] < a[mid]:
        a[h], a[mid] = a[mid], a[h]
        if a[mid] < a[lo]:
            a[lo], a[mid] = a[mid], a[lo]
    pivot = a[mid]
    i, j = lo, h
    while True:
        while a[i] < pivot:
            i += 1
        while pivot < a[j]:
            j -= 1
        if i >= j:
            return j + 1
        a[i], a[j] = a[j], a[i]
        i += 1
        j -= 1


@jit
def sort_range(a, lo, hi):
    """Sort ``a[lo:hi]`` in place, ascending: quicksort, the shorter side first (at most 64 ranges wait)."""
    stack = np.empty(128, dtype=np.int64)
    n = 0
    while True:
        if hi - lo <= SHORT:
            _insertion(a, lo, hi)
            if n == 0:
                return
            n -= 2
            lo, hi = stack[n], stack[n + 1]
            continue
        p = _partition(a, lo, hi)
        if p - lo < hi - p:
            stack[n], stack[n + 1] = p, hi
            hi = p
        else:
            stack[n], stack[n + 1] = lo, p
            lo = p
        n += 2


@jit_helper
def kth_smallest(a, n, k):
    """The ``k``-th smallest value (``k`` from 0) of ``a[:n]`` (non-empty), which it reorders."""
    lo, hi = np.int64(0), n   # not a literal 0: see hotcold.jit
    while hi - lo > SHORT:
        p = _partition(a, lo, hi)
        if k < p:
            hi = p
        else:
            lo = p
    _insertion(a, lo, hi)
    return a[k]


@jit_helper
def stable_argsort(key, order, tmp):
    """``order`` := the indices of ``key`` in ascending key order, equal keys in index order (``np.argsort``
    with ``kind="stable"``); ``order`` and ``tmp`` as long as ``key``. Runs of ``SHORT`` by insertion, then
    merged bottom-up."""
    n = key.size
    for i in range(n):
        order[i] = i
    for lo in range(0, n, SHORT):
        hi = min(lo + SHORT, n)
        for i in range(lo + 1, hi):
            x = order[i]
            j = i - 1
            while j >= lo and key[order[j]] > key[x]:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = x
    width = SHORT
    src, dst = order, tmp
    in_tmp = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for o in range(lo, hi):
                if j >= hi or (i < mid and key[src[i]] <= key[src[j]]):
                    dst[o] = src[i]
                    i += 1
                else:
                    dst[o] = src[j]
                    j += 1
        src, dst = dst, src
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for i in range(n):
            order[i] = tmp[i]


@jit_helper
def search_right(a, x):
    """The number of values of the ascending ``a`` that are at most ``x`` (``np.searchsorted`` on the right)."""
    lo, hi = 0, a.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo
