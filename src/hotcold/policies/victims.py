"""The demand policies' eviction order: their codes, the key of each resident row (smallest evicted first), and
the choice of many victims by one pass over the slots.

``demand_key`` gives a row's (primary, secondary) key under ``lru``, ``lfu``,
freqcache (``STATIC``: ``static_key``, the row's dataset count and id packed
into one int64) and ``belady``; the secondary keys are unique, so the order
has no ties. ``bulk_victims`` takes the smallest keys of the occupied slots
by one pass and two partitions, the same victims as the heaps (``heaps``)
give; ``bulk_threshold`` says from how many victims a step does so.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit, jit_helper
from hotcold.sorting import kth_smallest

LRU, LFU, STATIC, BELADY = 0, 1, 2, 3


@jit_helper
def row_bits(num_rows):
    """B: the bits of a row id below ``num_rows`` (at least 1)."""
    b = 1
    while (1 << b) < num_rows:
        b += 1
    return b


@jit_helper
def static_key(rank, row, bits):
    """freqcache's key of ``row``: ``rank[row] << B | (2**B - 1 - row)``, smallest evicted first; so ordered
    as (dataset count, minus row id), unique per row."""
    return (rank[row] << bits) | (((1 << bits) - 1) - row)


def static_ranks(frequencies: np.ndarray) -> np.ndarray:
    """freqcache's ``rank`` [N] for ``static_key``: the dataset counts (int64, not copied when they are), or
    where a count does not fit the key beside a row id, the counts' dense ranks (the same order)."""
    freq = np.ascontiguousarray(frequencies, dtype=np.int64)
    n = freq.size
    if n == 0:
        return freq
    if freq.min() < 0:
        raise ValueError("dataset counts must not be negative")
    bits = row_bits(n)
    if int(freq.max()) >> (63 - bits):
        if 2 * bits > 63:
            raise ValueError(f"freqcache's keys cannot hold {n} rows")
        freq = np.unique(freq, return_inverse=True)[1].astype(np.int64).reshape(-1)   # below N
    return freq


@jit_helper
def demand_key(policy, slot, row, num_rows, last, count, rank, nxt):
    """The eviction key (primary, secondary) of a resident row in ``slot``; smallest goes first.

    ``count`` [C] holds lfu's lookups since insertion, and for freqcache
    (``STATIC``) the row's key (``static_key``, set on insertion): unique, so
    its secondary key is 0.
    """
    if policy == LRU:
        return last[slot], row
    if policy == LFU:
        return count[slot], (last[slot] + 1) * num_rows + row
    if policy == STATIC:   # worst dataset rank first: fewest lookups, then highest row id
        return count[slot], 0
    return -nxt[slot], row


def bulk_threshold(capacity: int, policy: int) -> int:
    """The fewest victims of a step chosen by one pass over the slots (``bulk_victims``) rather than the heap.

    A heap pop costs about ``log2 C`` sift steps (and lfu's lazy re-pushes
    more), a pass a few operations per slot: measured on Zipf traces at
    15k and 50k slots, the pass wins above about C / log2 C victims for
    belady. ``lfu`` takes most victims from its per-count lists in O(1)
    each: at 12.6k slots and 2.6k victims a step (C / 5) the pass was slower
    than the lists, so lfu passes only from C / 4 victims. freqcache's
    pairing heap pops its inserted rows near the root: on the directory
    benchmark's Kaggle-style stream at 840k rows, 2.1k-2.8k victims a step,
    the pass won at C / 5 victims (0.32-0.36 against 0.40-0.54 ms) and lost
    from C / 10 (0.48 against 0.40-0.52 at 25k slots, 1.05-1.09 against
    0.41-0.42 at 100k), so freqcache passes from C / 8 victims. Either way
    the victims are the same.
    """
    if policy == LFU:
        return max(1, capacity // 4)
    if policy == STATIC:
        return max(1, capacity // 8)
    return max(1, capacity // max(1, int(capacity).bit_length()))


@jit
def bulk_victims(policy, num_rows, slot_row, used, last, count, rank, nxt, mark, stamp, need, scratch, victim_slots):
    """The ``need`` smallest keys among occupied slots not marked ``stamp``, by one pass and two partitions.

    Fills ``victim_slots[:need]`` (in slot order); ``scratch`` [4, C]. Exact,
    ties included: the need-th smallest primary key splits the slots, and
    among those at it the smallest secondary keys (unique) fill the rest.
    freqcache's packed key is split back into (count, row part): in slot
    order its packed keys can come in runs that make a median-of-three
    selection quadratic (0.6 against 0.35 ms a step at 12.6k slots), its
    counts (many equal) do not.
    """
    k1s, k2s, ss, ties = scratch[0], scratch[1], scratch[2], scratch[3]
    bits = row_bits(num_rows)
    m = np.int64(0)   # not a literal 0: see hotcold.jit
    for s in range(used):
        if mark[s] != stamp:
            if policy == STATIC:
                k1, k2 = count[s] >> bits, count[s] & ((1 << bits) - 1)
            else:
                k1, k2 = demand_key(policy, s, slot_row[s], num_rows, last, count, rank, nxt)
            k1s[m], k2s[m], ss[m] = k1, k2, s
            m += 1
    for j in range(m):   # ties is free until the split: select on a copy of the primary keys
        ties[j] = k1s[j]
    p1 = kth_smallest(ties, m, need - 1)
    nv = nt = np.int64(0)
    for j in range(m):
        if k1s[j] < p1:
            victim_slots[nv] = ss[j]
            nv += 1
        elif k1s[j] == p1:
            ties[nt] = k2s[j]
            nt += 1
    rest = need - nv   # >= 1: the tie group at p1 holds the need-th key
    p2 = kth_smallest(ties, nt, rest - 1)
    for j in range(m):
        if k1s[j] == p1 and k2s[j] <= p2:
            victim_slots[nv] = ss[j]
            nv += 1
    return nv
