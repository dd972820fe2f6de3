"""Compiled ordering structures of the cache directories' victim candidates: a binary min-heap, a pairing heap
and per-count FIFO lists of slots.

``heap_push``, ``heap_pop`` and ``heapify`` keep a binary min-heap of int64
entries (primary key, secondary key, slot, slot generation), ordered by
(primary, secondary). ``pair_push`` and ``pair_pop`` keep a pairing heap whose
nodes are the slots themselves, ordered by one int64 key per slot.
``list_append`` and ``list_unlink`` keep doubly linked FIFOs of slots, one per
count. None of them allocates (``hotcold.jit.jit_helper``): ``kernels`` sizes
the arrays (``new_heap``, ``new_lists``) and calls these from its per-row loops.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit_helper


@jit_helper
def heap_push(h, n, k1, k2, slot, gen):
    """Insert (k1, k2, slot, gen) into the min-heap ``h[:n]``; returns the new size."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if h[p, 0] < k1 or (h[p, 0] == k1 and h[p, 1] < k2):
            break
        h[i, 0], h[i, 1], h[i, 2], h[i, 3] = h[p, 0], h[p, 1], h[p, 2], h[p, 3]
        i = p
    h[i, 0], h[i, 1], h[i, 2], h[i, 3] = k1, k2, slot, gen
    return n + 1


@jit_helper
def _sift_down(h, n, i, k1, k2, slot, gen):
    """Place the entry (k1, k2, slot, gen) at ``i`` of ``h[:n]`` and move it down to where it belongs."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (h[c + 1, 0] < h[c, 0] or (h[c + 1, 0] == h[c, 0] and h[c + 1, 1] < h[c, 1])):
            c += 1
        if k1 < h[c, 0] or (k1 == h[c, 0] and k2 < h[c, 1]):
            break
        h[i, 0], h[i, 1], h[i, 2], h[i, 3] = h[c, 0], h[c, 1], h[c, 2], h[c, 3]
        i = c
    h[i, 0], h[i, 1], h[i, 2], h[i, 3] = k1, k2, slot, gen


@jit_helper
def heap_pop(h, n):
    """Remove the root of ``h[:n]`` (read it first); returns the new size."""
    n -= 1
    if n > 0:
        _sift_down(h, n, np.int64(0), h[n, 0], h[n, 1], h[n, 2], h[n, 3])
    return n


@jit_helper
def heapify(h, n):
    """Make ``h[:n]`` a heap in place."""
    for start in range((n - 2) // 2, -1, -1):
        _sift_down(h, n, start, h[start, 0], h[start, 1], h[start, 2], h[start, 3])


# -- freqcache's heap: a pairing heap over the slots --------------------------------------------------------
#
# freqcache's key never changes while a row stays resident, and its two parts
# pack into one int64 (``static_key``), unique per row; so each candidate
# slot is one node, and the heap needs no entries of its own: ``h[s]`` holds
# slot s's first child and next sibling, ``h[C, 0]`` the root (-1: empty).
# A push links the new node with the root: O(1), and the rows a step inserts
# (mostly the tail's, of the smallest keys) stay near the root, where the
# next steps' pops find them; the mass of rows that are never evicted sits in
# a few subtrees that a pop only compares at their roots. A binary heap
# instead moved its last entry from the bottom of all C to the top and back
# at every pop: its steps grew with the cache.


@jit_helper
def _pair_link(h, key, a, b):
    """Join the heaps rooted at ``a`` and ``b``; returns the new root (the loser becomes its first child)."""
    if key[b] < key[a]:
        a, b = b, a
    h[b, 1] = h[a, 0]
    h[a, 0] = b
    return a


@jit_helper
def pair_push(h, key, s):
    """Add slot ``s`` (its key set) to the pairing heap ``h``."""
    root = h[h.shape[0] - 1, 0]
    h[s, 0], h[s, 1] = -1, -1
    h[h.shape[0] - 1, 0] = s if root < 0 else _pair_link(h, key, root, s)


@jit_helper
def pair_pop(h, key):
    """Remove and return the root of the non-empty pairing heap ``h``: its children are joined in pairs from
    the first, then the pairs from the last."""
    top = h.shape[0] - 1
    root = h[top, 0]
    c = h[root, 0]
    paired = -1   # the pairs' roots, last first, chained by their sibling field
    while c >= 0:
        b = h[c, 1]
        if b < 0:
            h[c, 1] = paired
            paired = c
            break
        rest = h[b, 1]
        r = _pair_link(h, key, c, b)
        h[r, 1] = paired
        paired = r
        c = rest
    r = paired
    if r >= 0:
        paired = h[r, 1]
        while paired >= 0:
            rest = h[paired, 1]
            r = _pair_link(h, key, r, paired)
            paired = rest
        h[r, 1] = -1
    h[top, 0] = r
    return root


@jit_helper
def list_unlink(link, bucket, c, s):
    """Take slot ``s`` out of the FIFO of count ``c`` (``bucket[0, c]`` its first slot, ``bucket[1, c]`` its last)."""
    p, n = link[s, 0], link[s, 1]
    if p >= 0:
        link[p, 1] = n
    else:
        bucket[0, c] = n
    if n >= 0:
        link[n, 0] = p
    else:
        bucket[1, c] = p


@jit_helper
def list_append(link, bucket, c, s):
    """Put slot ``s`` at the back of the FIFO of count ``c``."""
    t = bucket[1, c]
    link[s, 0], link[s, 1] = t, -1
    if t >= 0:
        link[t, 1] = s
    else:
        bucket[0, c] = s
    bucket[1, c] = s
