"""Embedding-cache policies and the cache directory shared by the simulator and the cache stores.

One ``CacheDirectory`` (which row sits in which of C slots) serves both the
trace simulator (``hotcold.trace.cachesim``) and the ``lru``/``lfu``/
``freqcache`` stores of ``hotcold.embedding.cache``, so the simulator's
counts equal the stores' training-time counters. How a batch is served:
``CacheDirectory``; the policies' keys and tie rules: ``cache_policy``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hotcold.config import ConfigError, InfeasibleError
from hotcold.counters import StepCounters

#: the eviction policies of ``CacheDirectory``
CACHE_POLICIES = ("lru", "lfu", "freqcache", "freqcache-lfu", "belady")
NEVER = np.iinfo(np.int64).max  # next use of a row that is not used again


def rows_for_share(ratio: float, num_rows: int) -> int:
    """Rows of a share of all rows, ``floor(ratio * N)`` at most N (the epsilon keeps ratio = k / N at k)."""
    return min(int(ratio * num_rows + 1e-9), num_rows)


def capacity_from_ratio(ratio: float, num_rows: int) -> int:
    """Cache slots for a share of all rows: at least 1."""
    return max(1, rows_for_share(ratio, num_rows))


def frequency_order(frequencies: np.ndarray) -> np.ndarray:
    """Rows by descending frequency, ties by row id: int64 [N]."""
    return np.argsort(-np.asarray(frequencies, dtype=np.int64), kind="stable")


def warm_count(capacity: int, warmup_ratio: float, num_rows: int) -> int:
    """Rows preloaded by ``freqcache``: ``ceil(C * warmup_ratio)``, as ColossalAI, at most N."""
    return min(math.ceil(capacity * warmup_ratio), num_rows, capacity)


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


def cache_policy(name: str, num_rows: int, capacity: int, frequencies: np.ndarray | None = None,
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
