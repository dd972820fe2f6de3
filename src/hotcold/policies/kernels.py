"""Compiled kernels of the demand-paged cache directory: one definition for the store and the trace simulator.

``CacheDirectory`` (``hotcold.policies.directory``) keeps its state in numpy
arrays and plans batches with these kernels, whether a store calls them one
step at a time or the simulator many steps at once, so the two give the same
counters by construction. ``hotcold.jit.jit`` compiles them with numba when
installed (plain Python otherwise: the same numbers, slower). Each policy's
eviction key is in ``victims``, the heaps and lists that keep the keys in
order in ``heaps``; ScratchPipe's scratchpad has its own kernels
(``scratch_kernels``).

``lru`` needs no ordering structure: all rows of step t share key t, so
the resident rows by key (last step, row) form a queue of steps, each
step's rows in row order. A FIFO of (step, slot, generation) appended per
step in row order, its stale entries (the row used again later, or
evicted) skipped when they reach the front, yields the victims in order
in O(1) amortised a lookup; it is compacted in place when full.

``lfu`` and ``belady`` take victims from a binary min-heap of (primary,
secondary) int64 keys, one entry per candidate slot, so a step costs
O(U + E log C) instead of a scan of all C slots. The keys of ``lfu`` only
grow while a row stays resident, so its heap is *lazy*: an entry is a lower
bound of its slot's key, and a popped entry whose key has grown is pushed
again with the current key; the smallest entry whose key is current is then
the smallest key of all. ``freqcache``'s key never changes: its slots are
the nodes of a pairing heap (``pair_push``), which keeps the rows a step
inserts near its root, where the next pops find them. ``belady``'s
key (minus the next use) shrinks on every access, so it pushes a fresh
entry at every access and drops stale ones when popped (*eager*). A step
that needs many victims (``bulk_threshold``) takes them instead by one
pass over the slots and a partition (``bulk_victims``), O(C), and leaves
the heap to be rebuilt by the next step that uses it. All of these
reproduce the ordering of the keys exactly, ties included (the secondary
keys are unique), and so the choices of the scan they replace.

``lfu`` keeps its slots of small counts (below K, the ``bucket`` arrays'
width) out of the heap, in one FIFO per count: a row's key (count, last
step, row) changes only when the row is used, and then its last step is
the current one, so a list to which each step appends its rows' slots in
row order is sorted by key, like the lru queue. Slots are linked (``link``:
previous and next slot), so a used row leaves its list in O(1). The
victims are the fronts of the lists of count 0, 1, ... (rows of the batch
skipped), then the heap, which holds the slots of count K and more: O(1) a
victim for the rows that come and go once, the common case of a heavy
tail, instead of a pop that walks the heap's depth.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit
from hotcold.policies.heaps import heap_pop, heap_push, heapify, list_append, list_unlink, pair_pop, pair_push
from hotcold.policies.victims import BELADY, LFU, LRU, STATIC, bulk_victims, demand_key, row_bits, static_key
from hotcold.sorting import sort_range, stable_argsort

#: columns of a heap entry: primary key, secondary key, slot, slot generation
HEAP_COLS = 4
#: columns of ``demand_steps``' per-step output
LOOKUPS, UNIQUE, HITS, UNIQUE_HITS, EVICTIONS = range(5)


def new_heap(capacity: int, policy: int) -> np.ndarray:
    """Room for twice the slots (an eager heap compacts when full): int64 [2C + 2, 4]; freqcache's
    (``pair_push``): [C + 1, 2].

    Written through at once (``np.full``, not a lazily zeroed ``np.zeros``): the
    first write to each page would otherwise fault inside a training step.
    """
    if policy == STATIC:
        return np.full((capacity + 1, 2), -1, dtype=np.int64)
    return np.full((2 * capacity + 2, HEAP_COLS), 0, dtype=np.int64)


#: ``lfu``'s counts kept in FIFOs rather than the heap: 0 .. LISTED_COUNTS - 1
LISTED_COUNTS = 64


def new_lists(capacity: int, policy: int, small: int = LISTED_COUNTS) -> tuple[np.ndarray, np.ndarray]:
    """``lfu``'s per-count FIFOs: ``link`` int64 [C, 2] (previous, next slot: one cache line) and ``bucket``
    int64 [2, K].

    Counts below ``small`` (K) are listed; other policies get K = 0 (no lists).
    """
    k = small if policy == LFU else 0
    return np.full((capacity if k else 1, 2), -1, dtype=np.int64), np.full((2, k), -1, dtype=np.int64)


@jit
def demand_rebuild(policy, num_rows, slot_row, used, last, count, rank, nxt, gen, heap, small):
    """A heap of one current entry per occupied slot (``lfu``: of count ``small`` or more); returns its size."""
    if policy == STATIC:
        heap[heap.shape[0] - 1, 0] = -1
        for s in range(used):
            pair_push(heap, count, s)
        return used
    n = np.int64(0)   # not a literal 0: see hotcold.jit
    for s in range(used):
        if policy == LFU and count[s] < small:
            continue
        k1, k2 = demand_key(policy, s, slot_row[s], num_rows, last, count, rank, nxt)
        heap[n, 0], heap[n, 1], heap[n, 2], heap[n, 3] = k1, k2, s, gen[s]
        n += 1
    heapify(heap, n)
    return n


@jit
def demand_warm(policy, num_rows, rows, row_slot, slot_row, last, count, rank, nxt, gen, heap, state, link, bucket):
    """Preload distinct ``rows`` into slots 0.. of an empty cache (counts set by the caller) and index them."""
    bits = row_bits(num_rows)
    for i in range(rows.size):
        slot_row[i] = rows[i]
        row_slot[rows[i]] = i
        gen[i] += 1
        if policy == STATIC:
            count[i] = static_key(rank, rows[i], bits)
    state[0] = rows.size
    small = bucket.shape[1]
    order = np.empty(rows.size if policy == LRU or small else 0, dtype=np.int64)   # their slots in row order
    stable_argsort(rows[:order.size], order, np.empty(order.size, dtype=np.int64))
    if policy == LRU:   # the queue: warm rows share step last = -1, in row order
        for j in range(rows.size):
            s = order[j]
            heap[j, 0], heap[j, 1], heap[j, 2] = last[s], s, gen[s]
        state[2], state[3] = rows.size, 0
    else:
        for j in range(order.size):   # lfu's small counts: warm rows share step -1, each count's FIFO in row order
            s = order[j]
            if count[s] < small:
                list_append(link, bucket, count[s], s)
        state[2] = demand_rebuild(policy, num_rows, slot_row, rows.size, last, count, rank, nxt, gen, heap, small)


@jit
def lru_compact(heap, head, tail, gen, last, mark, stamp):
    """Drop the stale entries of the LRU queue ``heap[head:tail]`` and rows of the current batch; returns the new tail.

    An entry (step, slot, generation) is current while the slot holds the
    same row (generation) and that row was last used at ``step``.
    """
    n = 0
    for j in range(head, tail):
        s, g = heap[j, 1], heap[j, 2]
        if gen[s] == g and last[s] == heap[j, 0] and mark[s] != stamp:
            heap[n, 0], heap[n, 1], heap[n, 2] = heap[j, 0], s, g
            n += 1
    return n


@jit
def demand_steps(policy, rows, counts, offsets, next_use, num_rows, row_slot, slot_row, last, count, rank, nxt,
                 gen, mark, heap, aside, state, out, slots, hit, victim_slots, victim_rows, bulk_min, link, bucket):
    """Serve batches ``rows[offsets[t]:offsets[t+1]]`` (unique, ascending) in order; returns the steps done.

    Stops before a batch with more unique rows than slots (the caller raises).
    ``state``: [used, step, heap size or queue end, queue start]. Per step
    ``out[t]`` gets lookups, unique rows, hits, unique hits and evictions;
    ``slots`` and ``hit`` (as long as ``rows``) each row's slot and whether it
    was resident; ``victim_slots``/``victim_rows`` [C] the last step's
    victims, ascending by slot (their count is ``out[t, EVICTIONS]``).
    ``next_use`` [as rows]: the next step using each row (``belady`` only).
    ``mark`` [C]: scratch. ``bulk_min``: the fewest victims selected by a
    pass over the slots rather than the heap (heap size -1: to be rebuilt).

    ``lru`` keeps a FIFO of (step, slot, generation) in ``heap``, appended
    per step in row order: the current entries are in key order, so the
    victims are the first current entries not of this batch. ``lfu`` lists
    its slots of count below K = ``bucket.shape[1]`` (``new_lists``), the
    heap holds the others.
    """
    capacity = slot_row.size
    small = bucket.shape[1]
    eager = policy == BELADY
    lru = policy == LRU
    static = policy == STATIC
    bits = row_bits(num_rows)
    # freqcache: a step's misses' ranks, read in the first pass over its rows
    widest = 0
    for t in range(offsets.size - 1):
        widest = max(widest, offsets[t + 1] - offsets[t])
    fetched = np.empty(widest if static else 0, dtype=np.int64)
    for t in range(offsets.size - 1):
        a, b = offsets[t], offsets[t + 1]
        u = b - a
        if u > capacity:
            return t
        used, step, hsize, head = state[0], state[1], state[2], state[3]
        stamp = step + 1
        lookups = hits = uh = 0
        for i in range(a, b):
            c = counts[i]
            lookups += c
            s = row_slot[rows[i]]
            slots[i] = s
            if s >= 0:
                hit[i] = True
                hits += c
                uh += 1
                mark[s] = stamp
            else:
                hit[i] = False
                if static:   # read here, in a short loop: the [N] ranks' cache misses overlap
                    fetched[i - a] = static_key(rank, rows[i], bits)
        need = (u - uh) - (capacity - used)
        nv = 0
        bulk = not lru and need >= bulk_min and need > 0
        if not lru and not bulk and (hsize < 0 and need > 0 or eager and hsize >= 0 and hsize + u > heap.shape[0]):
            hsize = demand_rebuild(policy, num_rows, slot_row, used, last, count, rank, nxt, gen, heap, small)
        if need > 0:
            if lru:
                while nv < need:
                    s, g = heap[head, 1], heap[head, 2]
                    k = heap[head, 0]
                    head += 1
                    if gen[s] == g and last[s] == k and mark[s] != stamp:
                        victim_slots[nv] = s
                        nv += 1
            elif bulk:
                nv = bulk_victims(policy, num_rows, slot_row, used, last, count, rank, nxt, mark, stamp, need,
                                  aside, victim_slots)
                hsize = -1
            else:
                for c in range(small):   # lfu: the FIFOs of small counts first, in key order
                    j = bucket[0, c]
                    while j >= 0 and nv < need:
                        if mark[j] != stamp:
                            victim_slots[nv] = j
                            nv += 1
                        j = link[j, 1]
                    if nv == need:
                        break
                na = 0
                while static and nv < need:   # a node per candidate slot
                    s = pair_pop(heap, count)
                    hsize -= 1
                    if mark[s] == stamp:
                        aside[0, na] = s
                        na += 1
                    else:
                        victim_slots[nv] = s
                        nv += 1
                while nv < need:
                    k1, k2, s, g = heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 3]
                    hsize = heap_pop(heap, hsize)
                    if gen[s] != g:
                        continue
                    c1, c2 = demand_key(policy, s, slot_row[s], num_rows, last, count, rank, nxt)
                    if c1 != k1 or c2 != k2:
                        if not eager:
                            hsize = heap_push(heap, hsize, c1, c2, s, g)
                        continue
                    if mark[s] == stamp:   # a row of this batch: never a victim
                        if not eager:
                            aside[0, na], aside[1, na], aside[2, na], aside[3, na] = k1, k2, s, g
                            na += 1
                        continue
                    victim_slots[nv] = s
                    nv += 1
                for j in range(na):
                    if static:
                        pair_push(heap, count, aside[0, j])
                        hsize += 1
                    else:
                        hsize = heap_push(heap, hsize, aside[0, j], aside[1, j], aside[2, j], aside[3, j])
            sort_range(victim_slots, np.int64(0), nv)
            for j in range(nv):
                if small and count[victim_slots[j]] < small:
                    list_unlink(link, bucket, count[victim_slots[j]], victim_slots[j])
                r = slot_row[victim_slots[j]]
                victim_rows[j] = r
                row_slot[r] = -1
        j = 0
        for i in range(a, b):
            if hit[i]:
                continue
            if used < capacity:
                s = used
                used += 1
            else:
                s = victim_slots[j]
                j += 1
            r = rows[i]
            slot_row[s] = r
            row_slot[r] = s
            gen[s] += 1
            slots[i] = s
        if lru:
            if hsize + u > heap.shape[0]:
                hsize = lru_compact(heap, head, hsize, gen, last, mark, stamp)
                head = 0
            for i in range(a, b):
                s = slots[i]
                last[s] = step
                heap[hsize, 0], heap[hsize, 1], heap[hsize, 2] = step, s, gen[s]
                hsize += 1
        else:
            push = hsize >= 0
            for i in range(a, b):
                s = slots[i]
                if policy == LFU:
                    was = small   # listed before this step: the count the slot is listed under, else K
                    if not hit[i]:
                        count[s] = 0
                    elif count[s] < small:
                        was = count[s]
                        list_unlink(link, bucket, was, s)
                    count[s] += counts[i]
                    last[s] = step
                    if count[s] < small:
                        list_append(link, bucket, count[s], s)
                        continue
                    if push and hit[i] and was < small:   # leaves the lists for the heap
                        hsize = heap_push(heap, hsize, count[s], (step + 1) * num_rows + rows[i], s, gen[s])
                        continue
                elif static:
                    if not hit[i]:
                        count[s] = fetched[i - a]
                        if push:
                            pair_push(heap, count, s)
                            hsize += 1
                    continue
                elif policy == BELADY:
                    nxt[s] = next_use[i]
                if push and (eager or not hit[i]):
                    k1, k2 = demand_key(policy, s, rows[i], num_rows, last, count, rank, nxt)
                    hsize = heap_push(heap, hsize, k1, k2, s, gen[s])
        out[t, LOOKUPS], out[t, UNIQUE], out[t, HITS], out[t, UNIQUE_HITS], out[t, EVICTIONS] = \
            lookups, u, hits, uh, nv
        state[0], state[1], state[2], state[3] = used, step + 1, hsize, head
    return offsets.size - 1
