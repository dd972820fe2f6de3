"""The cache directories and simulator loops as they were before the compiled kernels (the benchmark's "old").

Kept verbatim (scan of all slots per eviction, per-step Python) so
``test_bench_cachesim`` can time old and new on the same trace.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hotcold.config import ConfigError, InfeasibleError
from hotcold.counters import StepCounters, all_resident
from hotcold.trace.policies import frequency_order, warm_count

NEVER = np.iinfo(np.int64).max


def smallest(primary: np.ndarray, secondary: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k smallest (primary, secondary) pairs; secondary keys are unique. O(n)."""
    n = primary.size
    if k >= n:
        return np.arange(n)
    v = np.partition(primary, k - 1)[k - 1]
    below = np.flatnonzero(primary < v)
    tied = np.flatnonzero(primary == v)
    need = k - below.size
    if need < tied.size:
        tied = tied[np.argpartition(secondary[tied], need - 1)[:need]]
    return np.concatenate([below, tied])


class Policy:
    """Eviction order of a cache: per-slot state and the keys of candidate victims."""

    name = ""

    def bind(self, num_rows: int, capacity: int) -> None:
        self.num_rows = num_rows

    def keys(self, slots: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(primary, unique secondary) int64 keys of candidate victims; smallest is evicted first."""
        raise NotImplementedError

    def touch(self, step: int, slots: np.ndarray, rows: np.ndarray, counts: np.ndarray,
              inserted: np.ndarray) -> None:
        """After step ``step`` accessed ``rows`` (in ``slots``, ``counts`` lookups each; ``inserted`` new)."""

    def warm(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Rows preloaded before the first step."""

    def victims(self, slots: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
        """Indices into ``slots`` of the k victims."""
        primary, secondary = self.keys(slots, rows)
        return smallest(primary, secondary, k)


class LRU(Policy):
    name = "lru"

    def bind(self, num_rows: int, capacity: int) -> None:
        super().bind(num_rows, capacity)
        self.last = np.full(capacity, -1, dtype=np.int64)  # [C] step of last use, -1: never

    def keys(self, slots, rows):
        return self.last[slots], rows

    def touch(self, step, slots, rows, counts, inserted):
        self.last[slots] = step


class LFU(Policy):
    """``warm_counts`` [N]: the starting count of preloaded rows (``freqcache-lfu``: dataset counts)."""

    name = "lfu"

    def __init__(self, warm_counts: np.ndarray | None = None) -> None:
        self.warm_counts = warm_counts

    def bind(self, num_rows: int, capacity: int) -> None:
        super().bind(num_rows, capacity)
        self.count = np.zeros(capacity, dtype=np.int64)     # [C] lookups since insertion
        self.last = np.full(capacity, -1, dtype=np.int64)   # [C] step of last use

    def keys(self, slots, rows):
        return self.count[slots], (self.last[slots] + 1) * self.num_rows + rows

    def touch(self, step, slots, rows, counts, inserted):
        self.count[slots[inserted]] = 0
        self.count[slots] += counts
        self.last[slots] = step

    def warm(self, slots, rows):
        self.count[slots] = 0 if self.warm_counts is None else self.warm_counts[rows]


class StaticRank(Policy):
    """Evicts the resident row of worst dataset rank (``rank`` [N], 0 = most frequent)."""

    name = "freqcache"

    def __init__(self, rank: np.ndarray) -> None:
        self.rank = rank

    def keys(self, slots, rows):
        return -self.rank[rows], rows


class Belady(Policy):
    """``next_use[t]`` [U_t]: the next step using each unique row of step t (``NEVER``: none)."""

    name = "belady"

    def __init__(self, next_use: Sequence[np.ndarray]) -> None:
        self.next_use = next_use

    def bind(self, num_rows: int, capacity: int) -> None:
        super().bind(num_rows, capacity)
        self.next = np.full(capacity, NEVER, dtype=np.int64)  # [C]

    def keys(self, slots, rows):
        return -self.next[slots], rows

    def touch(self, step, slots, rows, counts, inserted):
        self.next[slots] = self.next_use[step]


@dataclass
class Access:
    """What one batch does to the cache, planned on the host."""

    rows: np.ndarray          # int64 [U] the batch's unique rows, ascending
    counts: np.ndarray        # int64 [U] their lookups
    slots: np.ndarray         # int64 [U] their slots once fetched
    hit: np.ndarray           # bool [U] resident before this step
    miss_rows: np.ndarray     # int64 [M] rows to fetch
    miss_slots: np.ndarray    # int64 [M] their slots
    victim_rows: np.ndarray   # int64 [E] rows to write back and drop
    victim_slots: np.ndarray  # int64 [E] their slots

    def counters(self, row_bytes: int) -> StepCounters:
        """The step's counters; a parameter row (weights + state) is ``row_bytes``."""
        lookups, hits = int(self.counts.sum()), int(self.counts[self.hit].sum())
        u, uh = int(self.rows.size), int(self.hit.sum())
        e = int(self.victim_rows.size)
        c = StepCounters(lookups=lookups, unique_rows=u, hits=hits, misses=lookups - hits,
                         unique_hits=uh, unique_misses=u - uh, evictions=e)
        return c.set_param_traffic(u - uh, e, row_bytes)


class CacheDirectory:
    """Which row is in which of C slots; plans each batch's hits, victims and fetches.

    Slots fill from 0 upwards; a slot freed by an eviction is refilled in the
    same step, so slots ``[0, used)`` are always the occupied ones.

    Per batch:

    1. U = the batch's unique rows; hits are rows resident before this step;
    2. when the misses outnumber the free slots, the lacking number of victims
       is evicted among resident rows NOT in U (a row of the current batch is
       never evicted), smallest policy key first, and written back;
    3. the misses are fetched into the free slots (every miss is inserted).

    Initial warm-up fills are not a training step (``warm``). Write-back is
    unconditional (every evicted row, as ColossalAI), so ``rows_d2h ==
    evictions``.
    """

    def __init__(self, num_rows: int, capacity: int, policy: Policy) -> None:
        if capacity < 1:
            raise ConfigError(f"a cache needs at least 1 slot, got {capacity}")
        self.num_rows, self.capacity, self.policy = num_rows, capacity, policy
        self.row_slot = np.full(num_rows, -1, dtype=np.int64)   # [N] slot of each row, -1: absent
        self.slot_row = np.full(capacity, -1, dtype=np.int64)   # [C] row in each slot, -1: free
        self.used = 0
        self.step = 0
        policy.bind(num_rows, capacity)

    def warm(self, rows: np.ndarray) -> np.ndarray:
        """Preload distinct ``rows`` into an empty cache; returns their slots."""
        if self.used or rows.size > self.capacity:
            raise ValueError("warm() needs an empty cache and at most C rows")
        slots = np.arange(rows.size, dtype=np.int64)
        self.slot_row[slots], self.row_slot[rows] = rows, slots
        self.used = rows.size
        self.policy.warm(slots, rows)
        return slots

    def access(self, rows: np.ndarray, counts: np.ndarray) -> Access:
        """Plan one step for its unique ``rows`` (ascending, int64 [U]) and ``counts`` [U]."""
        if rows.size > self.capacity:
            raise InfeasibleError(
                f"cache of {self.capacity} rows is too small: batch {self.step} has {rows.size} unique "
                f"rows, all of which must be resident; needs a capacity of at least {rows.size} rows "
                f"(cache_rows >= {rows.size}, or cache_ratio >= {rows.size / self.num_rows:.3g})")
        slots = self.row_slot[rows]
        hit = slots >= 0
        miss_rows = rows[~hit]
        free = self.capacity - self.used
        need = miss_rows.size - free
        if need > 0:
            mask = np.ones(self.used, dtype=bool)
            mask[slots[hit]] = False
            cand = np.flatnonzero(mask)   # occupied slots outside the batch
            victim_slots = np.sort(cand[self.policy.victims(cand, self.slot_row[cand], need)])
            victim_rows = self.slot_row[victim_slots]
            self.row_slot[victim_rows] = -1
            miss_slots = np.concatenate([np.arange(self.used, self.capacity, dtype=np.int64), victim_slots])
            self.used = self.capacity
        else:
            victim_slots = victim_rows = np.empty(0, dtype=np.int64)
            miss_slots = np.arange(self.used, self.used + miss_rows.size, dtype=np.int64)
            self.used += miss_rows.size
        self.slot_row[miss_slots], self.row_slot[miss_rows] = miss_rows, miss_slots
        slots[~hit] = miss_slots
        self.policy.touch(self.step, slots, rows, counts, ~hit)
        self.step += 1
        return Access(rows, counts, slots, hit, miss_rows, miss_slots, victim_rows, victim_slots)


def legacy_cache_policy(name: str, num_rows: int, capacity: int, frequencies: np.ndarray | None = None,
                 warmup_ratio: float = 0.7, next_use: Sequence[np.ndarray] | None = None
                 ) -> tuple[Policy, np.ndarray]:
    """The policy ``name`` and the rows to preload (int64, empty but for ``freqcache*``).

    Policies (keys, evicted smallest first; ties broken as listed, so every
    choice is deterministic):

    - ``lru``: last step used, then row id.
    - ``lfu``: lookups since the row entered the cache (ColossalAI's LFU: the
      count restarts at 0 on insertion and adds the row's lookups each step),
      then last step used, then row id.
    - ``freqcache``: ColossalAI's frequency-aware cache (arXiv 2208.05321): rows
      ranked by dataset frequency (descending, ties by row id); the cache starts
      warm with the top ``ceil(C * warmup_ratio)`` rows; victims are the
      resident rows of worst rank. ``freqcache-lfu`` warms the same way and
      evicts by LFU, warm rows starting at their dataset count (as ColossalAI).
    - ``belady``: the next step that uses the row, farthest first (never again
      = infinity), then row id. Optimal only among caches that must admit every
      missed row (demand fetch); a placement that may bypass can beat it.
    """
    none = np.empty(0, dtype=np.int64)
    if name == "lru":
        return LRU(), none
    if name == "lfu":
        return LFU(), none
    if name == "belady":
        if next_use is None:
            raise ValueError("belady needs the next use of every row (Trace.next_use())")
        return Belady(next_use), none
    if name in ("freqcache", "freqcache-lfu"):
        if frequencies is None or len(frequencies) != num_rows:
            raise ConfigError(f"{name} needs the access count of each of the {num_rows} rows")
        freq = np.asarray(frequencies, dtype=np.int64)
        order = frequency_order(freq)
        warm = order[: warm_count(capacity, warmup_ratio, num_rows)]
        if name == "freqcache-lfu":
            return LFU(warm_counts=freq), warm
        rank = np.empty(num_rows, dtype=np.int64)
        rank[order] = np.arange(num_rows)
        return StaticRank(rank), warm
    raise ConfigError(f"unknown cache policy {name!r}; known: {list(CACHE_POLICIES)}, 'static-topk' "
                      "and 'scratchpipe-W'")


@dataclass
class Admission:
    """What admitting one batch does to the scratchpad."""

    seq: int                   # admission number, also the LRU stamp of its slots
    slots: np.ndarray          # int64 [U] slots of the batch's unique rows (ascending rows), held
    hits: int                  # unique rows already resident
    missing: np.ndarray        # int64 [M] rows to fetch
    new_slots: np.ndarray      # int64 [M] their slots
    victim_rows: np.ndarray    # int64 [V] rows evicted (to write back)
    victim_slots: np.ndarray   # int64 [V] their slots

    def book(self, c: StepCounters, batch: int, row_bytes: int) -> None:
        """Add this admission's fetch and write-back to a step's counters (the step it happens in)."""
        c.prefetch_batch = batch
        c.prefetch_unique_hits += self.hits
        c.prefetch_unique_misses += self.missing.size
        c.evictions += self.victim_rows.size
        c.set_param_traffic(c.param_rows_h2d + self.missing.size, c.param_rows_d2h + self.victim_rows.size,
                            row_bytes)


class ScratchpadDirectory:
    """Which row sits in which of C slots, which slots are held, and when each was last needed.

    Evicted rows stay resident until their slot is needed, unlike a window
    that drops rows as soon as no batch in it needs them.

    Admission order: the first step admits batches 0..W in order; step i >= 1
    admits batch i+W (when there is one); batch i's holds are released after it
    trains.
    """

    def __init__(self, num_rows: int, capacity: int) -> None:
        self.capacity = capacity
        self.row_to_slot = np.full(num_rows, -1, dtype=np.int64)   # [N] slot of each resident row, -1 if none
        self.slot_to_row = np.full(capacity, -1, dtype=np.int64)   # [C] row in each slot, -1 if free
        self.last_use = np.full(capacity, -1, dtype=np.int64)      # [C] admission that last needed the slot
        self.hold = np.zeros(capacity, dtype=np.int32)             # [C] admitted, untrained batches needing it
        self.seq = 0

    def admit(self, uniq: np.ndarray) -> Admission:
        """Hold the distinct rows ``uniq`` [U] of a batch; give the missing ones slots."""
        slots = self.row_to_slot[uniq]          # [U], -1 where missing
        hit = slots >= 0
        self.hold[slots[hit]] += 1
        missing = uniq[~hit]                    # [M]
        seq, self.seq = self.seq, self.seq + 1
        none = np.empty(0, dtype=np.int64)
        new_slots, victim_slots, victim_rows = none, none, none
        if missing.size:
            new_slots = self._allocate(missing.size)
            victim_slots = new_slots[self.slot_to_row[new_slots] >= 0]   # [V]
            victim_rows = self.slot_to_row[victim_slots]                  # [V]
            self.row_to_slot[victim_rows] = -1
            self.slot_to_row[new_slots] = missing
            self.row_to_slot[missing] = new_slots
            self.hold[new_slots] += 1
            slots[~hit] = new_slots
        self.last_use[slots] = seq
        return Admission(seq, slots, int(hit.sum()), missing, new_slots, victim_rows, victim_slots)

    def release(self, slots: np.ndarray) -> None:
        """A batch has trained: drop its holds."""
        self.hold[slots] -= 1

    def _allocate(self, n: int) -> np.ndarray:
        """``n`` unheld slots, free ones first, then least recently needed: int64 [n]."""
        cand = np.flatnonzero(self.hold == 0)
        if cand.size < n:
            raise InfeasibleError(
                f"scratchpipe: a batch needs {n} more slots but only {cand.size} of {self.capacity} are "
                f"free or evictable; the scratchpad is smaller than the look-ahead working set")
        key = self.last_use[cand] * self.capacity + cand  # unique: LRU stamp, then slot
        if n < cand.size:
            pick = np.argpartition(key, n - 1)[:n]
            cand, key = cand[pick], key[pick]
        return cand[np.argsort(key)]


def simulate_demand(trace, policy: str, capacity: int, frequencies=None, param_bytes: int = 20) -> list[StepCounters]:
    """The old per-size loop of a demand cache: one ``access`` and one ``StepCounters`` per step."""
    if frequencies is None and policy.startswith("freqcache"):
        frequencies = trace.frequencies()
    pol, warm = legacy_cache_policy(policy, trace.num_rows, capacity, frequencies)
    d = CacheDirectory(trace.num_rows, capacity, pol)
    if warm.size:
        d.warm(warm)
    return [d.access(rows, counts).counters(param_bytes) for rows, counts in zip(trace.rows, trace.counts)]


def simulate_scratchpipe(trace, window: int, capacity: int, param_bytes: int = 20) -> list[StepCounters]:
    """The old scratchpipe loop."""
    d = ScratchpadDirectory(trace.num_rows, capacity)
    rows = list(trace.rows)
    counts = list(trace.counts)
    held = {}
    out = []
    for t in range(len(rows)):
        c = all_resident(int(counts[t].sum()), rows[t].size)
        admit = range(0, min(window, len(rows) - 1) + 1) if t == 0 else \
            ([t + window] if t + window < len(rows) else [])
        for j in admit:
            adm = d.admit(rows[j])
            held[j] = adm.slots
            adm.book(c, j, param_bytes)
        d.release(held.pop(t))
        out.append(c)
    return out
