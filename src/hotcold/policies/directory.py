"""Embedding-cache policies and the cache directory shared by the simulator and the cache stores.

One ``CacheDirectory`` (which row sits in which of C slots) serves both the
trace simulator (``hotcold.trace.cachesim``) and the ``lru``/``lfu``/
``freqcache`` stores of ``hotcold.embedding.cache``, so the simulator's
counts equal the stores' training-time counters. How a batch is served:
``CacheDirectory``; the policies' keys and tie rules: ``cache_policy``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hotcold.config import ConfigError, InfeasibleError
from hotcold.counters import StepCounters
from hotcold.policies import kernels, victims
from hotcold.options.base import warm_count

#: the eviction policies of ``CacheDirectory``
CACHE_POLICIES = ("lru", "lfu", "freqcache", "freqcache-lfu", "belady")
NEVER = np.iinfo(np.int64).max  # next use of a row that is not used again


def frequency_order(frequencies: np.ndarray, k: int | None = None) -> np.ndarray:
    """Rows by descending frequency, ties by row id: int64 [N] (the first ``k`` only, when given).

    Rows never looked up come last in row order, so only the others are
    sorted (a thin-tailed trace touches a few percent of the rows).
    """
    freq = np.asarray(frequencies, dtype=np.int64)
    k = freq.size if k is None else min(k, freq.size)
    seen = np.flatnonzero(freq)
    if seen.size and freq[seen].min() < 0:
        return np.argsort(-freq, kind="stable")[:k]
    head = seen[np.argsort(-freq[seen], kind="stable")]
    if k <= head.size:
        return head[:k].astype(np.int64)
    return np.concatenate([head, np.flatnonzero(freq == 0)[:k - head.size]]).astype(np.int64)


class Policy:
    """Eviction order of a cache: per-slot state arrays and a kernel code (``hotcold.policies.kernels``).

    A policy's key (smallest evicted first) is computed by the kernel's
    ``demand_key`` from these arrays; see ``cache_policy`` for the rules.
    """

    name = ""
    code = -1

    def bind(self, num_rows: int, capacity: int) -> None:
        self.num_rows = num_rows
        self.last = np.full(capacity, -1, dtype=np.int64)    # [C] step of last use, -1: never
        self.count = np.zeros(capacity, dtype=np.int64)      # [C] lookups since insertion (lfu), dataset count (freqcache)
        self.next = np.full(capacity, NEVER, dtype=np.int64)  # [C] next step using the row (belady)
        self.rank = np.zeros(1, dtype=np.int64)              # [N] dataset counts (freqcache's key)

    def warm(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Rows preloaded before the first step."""

    def step_next_use(self, step: int) -> np.ndarray:
        """The next use of each unique row of ``step`` (belady only)."""
        return _NO_NEXT


_NO_NEXT = np.zeros(0, dtype=np.int64)


class LRU(Policy):
    """Key: (last step used, row)."""

    name, code = "lru", victims.LRU


class LFU(Policy):
    """Key: (lookups since insertion, last step used, row). ``warm_counts`` [N]: preloaded rows' start count."""

    name, code = "lfu", victims.LFU

    def __init__(self, warm_counts: np.ndarray | None = None) -> None:
        self.warm_counts = warm_counts

    def warm(self, slots, rows):
        self.count[slots] = 0 if self.warm_counts is None else self.warm_counts[rows]


class StaticRank(Policy):
    """Evicts the resident row of worst dataset rank: fewest lookups, then highest row id.

    ``frequencies`` [N]: the rank (descending count, ties by row id) as a key
    without a rank array: (count, -row), smallest first, packed in one int64
    (``victims.static_key``).
    """

    name, code = "freqcache", victims.STATIC

    def __init__(self, frequencies: np.ndarray) -> None:
        self._freq = victims.static_ranks(frequencies)

    def bind(self, num_rows, capacity):
        super().bind(num_rows, capacity)
        self.rank = self._freq


class Belady(Policy):
    """``next_use[t]`` [U_t]: the next step using each unique row of step t (``NEVER``: none)."""

    name, code = "belady", victims.BELADY

    def __init__(self, next_use: Sequence[np.ndarray]) -> None:
        self.next_use = next_use

    def step_next_use(self, step):
        return np.asarray(self.next_use[step], dtype=np.int64)


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
        return cache_step_counters(int(self.counts.sum()), int(self.rows.size), int(self.counts[self.hit].sum()),
                                   int(self.hit.sum()), int(self.victim_rows.size), row_bytes)


def cache_step_counters(lookups: int, unique: int, hits: int, unique_hits: int, evictions: int,
                        row_bytes: int) -> StepCounters:
    """A demand cache's step: every miss fetched, every victim written back (rows of ``row_bytes``)."""
    c = StepCounters(lookups=lookups, unique_rows=unique, hits=hits, misses=lookups - hits,
                     unique_hits=unique_hits, unique_misses=unique - unique_hits, evictions=evictions)
    return c.set_param_traffic(unique - unique_hits, evictions, row_bytes)


class CacheDirectory:
    """Which row is in which of C slots; plans each batch's hits, victims and fetches.

    Slots fill from 0 upwards; a slot freed by an eviction is refilled in the
    same step, so slots ``[0, used)`` are always the occupied ones.

    Per batch:

    1. U = the batch's unique rows; hits are rows resident before this step;
    2. when the misses outnumber the free slots, the lacking number of victims
       is evicted among resident rows NOT in U (a row of the current batch is
       never evicted), smallest policy key first, and written back;
    3. the misses (ascending) are fetched into the free slots, then into the
       victims' slots (ascending): every miss is inserted.

    Initial warm-up fills are not a training step (``warm``). Write-back is
    unconditional (every evicted row, as ColossalAI), so ``rows_d2h ==
    evictions``. The store plans one step at a time (``access``), the
    simulator many (``run``); both run ``kernels.demand_steps``.
    """

    def __init__(self, num_rows: int, capacity: int, policy: Policy,
                 listed_counts: int = kernels.LISTED_COUNTS) -> None:
        if capacity < 1:
            raise ConfigError(f"a cache needs at least 1 slot, got {capacity}")
        self.num_rows, self.capacity, self.policy = num_rows, capacity, policy
        self.row_slot = np.full(num_rows, -1, dtype=np.int64)   # [N] slot of each row, -1: absent
        self.slot_row = np.full(capacity, -1, dtype=np.int64)   # [C] row in each slot, -1: free
        policy.bind(num_rows, capacity)
        self._gen = np.zeros(capacity, dtype=np.int64)          # [C] insertions into each slot
        self._mark = np.zeros(capacity, dtype=np.int64)         # [C] scratch: step + 1 of the batch holding it
        self._heap = kernels.new_heap(capacity, policy.code)     # victim candidates (lru: a queue; see kernels)
        self._aside = np.zeros((kernels.HEAP_COLS, capacity), dtype=np.int64)  # scratch of a step
        self._state = np.zeros(4, dtype=np.int64)                # used, step, heap size (queue end), queue start
        #: the fewest victims of a step chosen by one pass over the slots instead of the heap (not lru)
        self.bulk_min = victims.bulk_threshold(capacity, policy.code)
        self._victim_slots = np.zeros(capacity, dtype=np.int64)
        self._victim_rows = np.zeros(capacity, dtype=np.int64)
        #: lfu: the slots of count below ``listed_counts``, one FIFO per count (``kernels.new_lists``)
        self._link, self._bucket = kernels.new_lists(capacity, policy.code, listed_counts)

    @property
    def used(self) -> int:
        return int(self._state[0])

    @property
    def step(self) -> int:
        return int(self._state[1])

    def warm(self, rows: np.ndarray) -> np.ndarray:
        """Preload distinct ``rows`` into an empty cache; returns their slots."""
        if self.used or rows.size > self.capacity:
            raise ValueError("warm() needs an empty cache and at most C rows")
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        slots = np.arange(rows.size, dtype=np.int64)
        self.policy.warm(slots, rows)
        p = self.policy
        kernels.demand_warm(p.code, self.num_rows, rows, self.row_slot, self.slot_row, p.last, p.count, p.rank,
                            p.next, self._gen, self._heap, self._state, self._link, self._bucket)
        return slots

    def _too_small(self, unique: int, step: int) -> InfeasibleError:
        return InfeasibleError(
            f"cache of {self.capacity} rows is too small: batch {step} has {unique} unique "
            f"rows, all of which must be resident; needs a capacity of at least {unique} rows "
            f"(cache_rows >= {unique}, or cache_ratio >= {unique / self.num_rows:.3g})")

    def _run(self, rows, counts, offsets, next_use, slots, hit, out) -> None:
        p = self.policy
        done = kernels.demand_steps(p.code, rows, counts, offsets, next_use, self.num_rows, self.row_slot,
                                    self.slot_row, p.last, p.count, p.rank, p.next, self._gen, self._mark,
                                    self._heap, self._aside, self._state, out, slots, hit, self._victim_slots,
                                    self._victim_rows, self.bulk_min, self._link, self._bucket)
        if done < offsets.size - 1:
            raise self._too_small(int(offsets[done + 1] - offsets[done]), self.step)

    def access(self, rows: np.ndarray, counts: np.ndarray) -> Access:
        """Plan one step for its unique ``rows`` (ascending, int64 [U]) and ``counts`` [U]."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        slots = np.empty(rows.size, dtype=np.int64)
        hit = np.empty(rows.size, dtype=bool)
        out = np.zeros((1, 5), dtype=np.int64)
        self._run(rows, counts, np.array([0, rows.size], dtype=np.int64),
                  self.policy.step_next_use(self.step), slots, hit, out)
        e = int(out[0, kernels.EVICTIONS])
        miss = ~hit
        return Access(rows, counts, slots, hit, rows[miss], slots[miss], self._victim_rows[:e].copy(),
                      self._victim_slots[:e].copy())

    def run(self, rows: np.ndarray, counts: np.ndarray, offsets: np.ndarray,
            next_use: np.ndarray | None = None) -> np.ndarray:
        """Many steps at once: batch t is ``rows[offsets[t]:offsets[t+1]]`` (unique, ascending), ``counts`` alike.

        Returns int64 [T, 5]: lookups, unique rows, hits, unique hits and
        evictions per step (``kernels.LOOKUPS``...). ``next_use`` [as rows]:
        the next step using each row, for ``belady`` (else ignored).
        """
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        nu = _NO_NEXT if next_use is None else np.ascontiguousarray(next_use, dtype=np.int64)
        if self.policy.code == victims.BELADY and nu.size != rows.size:
            raise ValueError("belady needs the next use of every row of the steps run")
        out = np.zeros((offsets.size - 1, 5), dtype=np.int64)
        self._run(rows, counts, offsets, nu, np.empty(rows.size, dtype=np.int64), np.empty(rows.size, dtype=bool),
                  out)
        return out


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
        warm = frequency_order(freq, warm_count(capacity, warmup_ratio, num_rows))
        if name == "freqcache-lfu":
            return LFU(warm_counts=freq), warm
        return StaticRank(freq), warm
    raise ConfigError(f"unknown cache policy {name!r}; known: {list(CACHE_POLICIES)}, 'static-topk' "
                      "and 'scratchpipe-W'")
