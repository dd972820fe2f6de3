"""Compiled kernels of the cache directories: one definition for the stores and the trace simulator.

``CacheDirectory`` (``hotcold.trace.policies``) and ``ScratchpadDirectory``
(``hotcold.trace.scratchpad``) keep their state in numpy arrays and plan
batches with these kernels, whether a store calls them one step at a time
or the simulator many steps at once, so the two give the same counters by
construction. ``hotcold.jit.jit`` compiles them with numba when installed
(plain Python otherwise: the same numbers, slower).

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

from hotcold.jit import jit, jit_helper

LRU, LFU, STATIC, BELADY = 0, 1, 2, 3
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
        _sift_down(h, n, 0, h[n, 0], h[n, 1], h[n, 2], h[n, 3])
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


#: ``lfu``'s counts kept in FIFOs rather than the heap: 0 .. LISTED_COUNTS - 1
LISTED_COUNTS = 64


def new_lists(capacity: int, policy: int, small: int = LISTED_COUNTS) -> tuple[np.ndarray, np.ndarray]:
    """``lfu``'s per-count FIFOs: ``link`` int64 [C, 2] (previous, next slot: one cache line) and ``bucket``
    int64 [2, K].

    Counts below ``small`` (K) are listed; other policies get K = 0 (no lists).
    """
    k = small if policy == LFU else 0
    return np.full((capacity if k else 1, 2), -1, dtype=np.int64), np.full((2, k), -1, dtype=np.int64)


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


@jit
def demand_rebuild(policy, num_rows, slot_row, used, last, count, rank, nxt, gen, heap, small):
    """A heap of one current entry per occupied slot (``lfu``: of count ``small`` or more); returns its size."""
    if policy == STATIC:
        heap[heap.shape[0] - 1, 0] = -1
        for s in range(used):
            pair_push(heap, count, s)
        return used
    n = 0
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
    if policy == LRU:   # the queue: warm rows share step last = -1, in row order
        order = np.argsort(rows)
        for j in range(rows.size):
            s = order[j]
            heap[j, 0], heap[j, 1], heap[j, 2] = last[s], s, gen[s]
        state[2], state[3] = rows.size, 0
    else:
        small = bucket.shape[1]
        if small:   # warm rows share step -1: each count's FIFO in row order
            order = np.argsort(rows)
            for j in range(rows.size):
                s = order[j]
                if count[s] < small:
                    list_append(link, bucket, count[s], s)
        state[2] = demand_rebuild(policy, num_rows, slot_row, rows.size, last, count, rank, nxt, gen, heap, small)


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
def bulk_victims(policy, num_rows, slot_row, used, last, count, rank, nxt, mark, stamp, need, scratch, victim_slots):
    """The ``need`` smallest keys among occupied slots not marked ``stamp``, by one pass and two partitions.

    Fills ``victim_slots[:need]`` (in slot order); ``scratch`` [4, C]. Exact,
    ties included: the need-th smallest primary key splits the slots, and
    among those at it the smallest secondary keys (unique) fill the rest.
    freqcache's packed key is split back into (count, row part): in slot
    order its packed keys can come in runs that make numba's median-of-three
    selection quadratic (0.6 against 0.35 ms a step at 12.6k slots), its
    counts (many equal) do not.
    """
    k1s, k2s, ss, ties = scratch[0], scratch[1], scratch[2], scratch[3]
    bits = row_bits(num_rows)
    m = 0
    for s in range(used):
        if mark[s] != stamp:
            if policy == STATIC:
                k1, k2 = count[s] >> bits, count[s] & ((1 << bits) - 1)
            else:
                k1, k2 = demand_key(policy, s, slot_row[s], num_rows, last, count, rank, nxt)
            k1s[m], k2s[m], ss[m] = k1, k2, s
            m += 1
    p1 = np.partition(k1s[:m], need - 1)[need - 1]
    nv = nt = 0
    for j in range(m):
        if k1s[j] < p1:
            victim_slots[nv] = ss[j]
            nv += 1
        elif k1s[j] == p1:
            ties[nt] = k2s[j]
            nt += 1
    rest = need - nv   # >= 1: the tie group at p1 holds the need-th key
    p2 = np.partition(ties[:nt], rest - 1)[rest - 1]
    for j in range(m):
        if k1s[j] == p1 and k2s[j] <= p2:
            victim_slots[nv] = ss[j]
            nv += 1
    return nv


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
    fetched = np.empty(np.diff(offsets).max() if static and offsets.size > 1 else 0, dtype=np.int64)
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
            victim_slots[:nv].sort()
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


# -- ScratchPipe's scratchpad ------------------------------------------------------------------------


def scratch_queue(capacity: int) -> np.ndarray:
    """The unheld slots' queue: int64 [2C + 2, 2] (last admission, slot); every slot, never used, in slot order."""
    q = np.full((2 * capacity + 2, 2), 0, dtype=np.int64)   # written through now, as ``new_heap``
    q[:capacity, 0] = -1
    q[:capacity, 1] = np.arange(capacity)
    return q


@jit
def _scratch_compact(queue, head, tail, last_use, hold):
    """Move the current entries of ``queue[head:tail]`` to its front, in order; returns their count."""
    n = 0
    for i in range(head, tail):
        s = queue[i, 1]
        if hold[s] == 0 and last_use[s] == queue[i, 0]:
            queue[n, 0], queue[n, 1] = queue[i, 0], s
            n += 1
    return n


@jit
def scratch_admit(uniq, row_to_slot, slot_to_row, last_use, hold, queue, state, slots, hit, victim_slots,
                  victim_rows):
    """Admit a batch's distinct rows ``uniq``: hold the resident ones, give the missing ones slots.

    ``state``: [admissions so far, held slots, queue head, queue tail]. Fills
    ``slots`` and ``hit`` [U], and ``victim_slots``/``victim_rows`` with the
    evicted slots in the order they were taken. Returns (unique hits,
    victims), or (-1, slots free or evictable) without changing anything when
    the missing rows outnumber the unheld slots. Missing rows (ascending)
    take the unheld slots from the queue's front: never-used slots first (by
    slot), then by (last admission, row that admission gave the slot).

    A slot released by batch t is needed by no later admitted batch, so its
    last admission is t's: releases come in admission order, and a queue to
    which each release appends its slots (in its rows' order) is sorted by
    that key. An entry whose slot was held again since is stale (its slot's
    last admission moved on, or it is held) and skipped.
    """
    capacity = hold.size
    seq = state[0]
    uh = 0
    newly_held = 0
    for i in range(uniq.size):
        s = row_to_slot[uniq[i]]
        slots[i] = s
        if s >= 0:
            uh += 1
            if hold[s] == 0:
                newly_held += 1
    missing = uniq.size - uh
    available = capacity - state[1] - newly_held
    if missing > available:
        return -1, available
    for i in range(uniq.size):  # hold the hits first: no missing row may take their slots
        s = slots[i]
        hit[i] = s >= 0
        if s >= 0:
            if hold[s] == 0:
                state[1] += 1
            hold[s] += 1
            last_use[s] = seq
    head = state[2]
    nv = 0
    for i in range(uniq.size):
        if hit[i]:
            continue
        while True:
            lu, s = queue[head, 0], queue[head, 1]
            head += 1
            if hold[s] == 0 and last_use[s] == lu:
                break
        old = slot_to_row[s]
        if old >= 0:
            victim_slots[nv] = s
            victim_rows[nv] = old
            nv += 1
            row_to_slot[old] = -1
        slot_to_row[s] = uniq[i]
        row_to_slot[uniq[i]] = s
        hold[s] = 1
        last_use[s] = seq
        state[1] += 1
        slots[i] = s
    state[0] = seq + 1
    state[2] = head
    return uh, nv


@jit
def scratch_release(slots, last_use, hold, queue, state):
    """A batch has trained: drop its holds (``slots`` in its admission's order); a slot no batch holds
    becomes evictable again, at the queue's back."""
    head, tail = state[2], state[3]
    if tail + slots.size > queue.shape[0]:
        tail = _scratch_compact(queue, head, tail, last_use, hold)
        head = 0
    for s in slots:
        hold[s] -= 1
        if hold[s] == 0:
            state[1] -= 1
            queue[tail, 0], queue[tail, 1] = last_use[s], s
            tail += 1
    state[2], state[3] = head, tail


# -- unique rows of batches --------------------------------------------------------------------------


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
