"""Embedding-cache policies and a trace simulator that runs them without training.

A trace is the sequence of training batches as global rows (int64 arrays,
padding removed). One ``CacheDirectory`` (which row sits in which of C
slots) serves both this simulator and the ``lru``/``lfu``/``freqcache``
stores of ``hotcold.embedding.cache``, so the simulator's counts equal the
stores' training-time counters. Per batch:

1. U = the batch's unique rows; hits are rows resident before this step;
2. when the misses outnumber the free slots, the lacking number of victims
   is evicted among resident rows NOT in U (a row of the current batch is
   never evicted), smallest policy key first, and written back;
3. the misses are fetched into the free slots (every miss is inserted).

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
  = infinity), then row id. Optimal among demand-fetch policies.

Two reference placements are simulated without a directory:

- ``static``: FAE-like top-k: the C most frequent rows are fixed in the
  cache; misses are served from the host and not inserted, each missed
  unique row counting once each way (fetched, and its update written back).
- ``lookahead-W``: ScratchPipe-like: at step t the cache holds exactly the
  rows of batches t..t+W; rows are fetched when their first batch enters
  the window and written back when no batch of the window needs them. The
  capacity it needs (``capacity_needed``) is the largest such union.

Initial warm-up fills are not a training step: they are reported as
``warm_rows``, never in a step's ``rows_h2d``. Write-back is unconditional
(every evicted row, as ColossalAI), so ``rows_d2h == evictions``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from hotcold.config import ConfigError
from hotcold.data.format import Dataset
from hotcold.data.loader import batch_rows

#: per-step counters, the same keys as the cache stores' ``step_counters`` (less bytes)
COUNTERS = ("lookups", "unique_rows", "hits", "misses", "unique_hits", "unique_misses",
            "rows_h2d", "rows_d2h", "evictions")
POLICIES = ("lru", "lfu", "freqcache", "freqcache-lfu", "belady", "static")
#: cache sizes of a default sweep, as shares of all rows (0.1% .. 10%)
DEFAULT_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1)
NEVER = np.iinfo(np.int64).max  # next use of a row that is not used again


def capacity_from_ratio(ratio: float, num_rows: int) -> int:
    """Cache slots for a share of all rows: ``max(1, floor(ratio * N))``."""
    return max(1, int(ratio * num_rows))


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

    def counters(self) -> dict[str, int]:
        """The step's counters (``COUNTERS``)."""
        lookups, hits = int(self.counts.sum()), int(self.counts[self.hit].sum())
        u, uh = int(self.rows.size), int(self.hit.sum())
        e = int(self.victim_rows.size)
        return {"lookups": lookups, "unique_rows": u, "hits": hits, "misses": lookups - hits,
                "unique_hits": uh, "unique_misses": u - uh, "rows_h2d": u - uh, "rows_d2h": e,
                "evictions": e}


class CacheDirectory:
    """Which row is in which of C slots; plans each batch's hits, victims and fetches.

    Slots fill from 0 upwards; a slot freed by an eviction is refilled in the
    same step, so slots ``[0, used)`` are always the occupied ones.
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
            raise ConfigError(
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
    """The policy ``name`` and the rows to preload (int64, empty but for ``freqcache*``)."""
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
    raise ConfigError(f"unknown cache policy {name!r}; known: {list(POLICIES)} and 'lookahead-W'")


@dataclass
class Trace:
    """A trace prepared once for many simulations: the unique rows and lookups of each batch."""

    rows: list[np.ndarray]     # int64 [U_t] unique rows of batch t, ascending
    counts: list[np.ndarray]   # int64 [U_t] their lookups
    num_rows: int
    _next_use: list[np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def from_batches(cls, batches: Iterable[np.ndarray], num_rows: int) -> "Trace":
        """``batches``: global rows of each batch's lookups (int, padding removed)."""
        rows, counts = [], []
        for b in batches:
            u, c = np.unique(np.asarray(b, dtype=np.int64), return_counts=True)
            if u.size and (u[0] < 0 or u[-1] >= num_rows):
                raise ValueError(f"trace rows must lie in [0, {num_rows})")
            rows.append(u)
            counts.append(c.astype(np.int64))
        return cls(rows, counts, num_rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lookups(self) -> int:
        return int(sum(int(c.sum()) for c in self.counts))

    @property
    def max_unique(self) -> int:
        """The most unique rows of one batch: the smallest feasible cache."""
        return max((r.size for r in self.rows), default=0)

    def frequencies(self) -> np.ndarray:
        """Lookups of every row over the trace: int64 [N]."""
        out = np.zeros(self.num_rows, dtype=np.int64)
        for r, c in zip(self.rows, self.counts):
            out[r] += c
        return out

    def next_use(self) -> list[np.ndarray]:
        """For each step, the next step using each of its unique rows (``NEVER``: none)."""
        if self._next_use is None:
            sizes = [r.size for r in self.rows]
            flat = np.concatenate(self.rows) if self.rows else np.empty(0, np.int64)
            steps = np.repeat(np.arange(len(self.rows), dtype=np.int64), sizes)
            order = np.argsort(flat, kind="stable")  # by row, then step
            srow, sstep = flat[order], steps[order]
            same = srow[1:] == srow[:-1]
            nxt_sorted = np.full(flat.size, NEVER, dtype=np.int64)
            nxt_sorted[:-1][same] = sstep[1:][same]
            nxt = np.empty_like(nxt_sorted)
            nxt[order] = nxt_sorted
            self._next_use = np.split(nxt, np.cumsum(sizes)[:-1]) if sizes else []
        return self._next_use


@dataclass
class SimResult:
    """One simulated policy and capacity: per-step counters and the warm-up fill."""

    policy: str
    capacity: int
    steps: pd.DataFrame        # one row per step: "step" and ``COUNTERS``
    warm_rows: int = 0
    capacity_needed: int = 0   # smallest feasible capacity: the most unique rows of a batch, or
                               # lookahead-W's largest resident set; 0: any (static)
    seconds: float = 0.0

    def summary(self, num_rows: int) -> dict[str, float | int | str]:
        """Totals, hit rates by lookups and by unique rows, rows moved per batch."""
        tot = {c: int(self.steps[c].sum()) for c in COUNTERS}
        n = max(len(self.steps), 1)
        return {
            "policy": self.policy, "capacity": self.capacity, "cache_ratio": self.capacity / num_rows,
            "feasible": True, "steps": len(self.steps), **tot,
            "hit_rate": tot["hits"] / max(tot["lookups"], 1),
            "unique_hit_rate": tot["unique_hits"] / max(tot["unique_rows"], 1),
            "rows_h2d_per_batch": tot["rows_h2d"] / n, "rows_d2h_per_batch": tot["rows_d2h"] / n,
            "evictions_per_batch": tot["evictions"] / n, "warm_rows": self.warm_rows,
            "capacity_needed": self.capacity_needed, "seconds": self.seconds,
        }


def _frame(table: np.ndarray) -> pd.DataFrame:
    """[T, len(COUNTERS)] int64 -> a per-step DataFrame."""
    df = pd.DataFrame(table, columns=list(COUNTERS))
    df.insert(0, "step", np.arange(len(df)))
    return df


def simulate(trace: Trace, policy: str, capacity: int = 0, frequencies: np.ndarray | None = None,
             warmup_ratio: float = 0.7) -> SimResult:
    """Run one policy (``POLICIES`` or ``lookahead-W``) at ``capacity`` slots over ``trace``.

    ``frequencies`` ([N] access counts) rank rows for ``freqcache*`` and
    ``static``; by default they are counted over the trace itself. A cache
    smaller than a batch's unique rows raises ``ConfigError`` (but for
    ``static`` and ``lookahead-W``, which ignores ``capacity``).
    """
    t0 = time.perf_counter()
    if policy.startswith("lookahead-"):
        window = int(policy.split("-", 1)[1])
        table, needed = _lookahead(trace, window)
        return SimResult(policy, needed, _frame(table), 0, needed, time.perf_counter() - t0)
    if policy in ("freqcache", "freqcache-lfu", "static") and frequencies is None:
        frequencies = trace.frequencies()
    if policy == "static":
        table, warm = _static(trace, capacity, frequencies)
        return SimResult(policy, capacity, _frame(table), warm, 0, time.perf_counter() - t0)
    pol, warm = cache_policy(policy, trace.num_rows, capacity, frequencies, warmup_ratio,
                             trace.next_use() if policy == "belady" else None)
    d = CacheDirectory(trace.num_rows, capacity, pol)
    if warm.size:
        d.warm(warm)
    table = np.zeros((len(trace), len(COUNTERS)), dtype=np.int64)
    for t, (rows, counts) in enumerate(zip(trace.rows, trace.counts)):
        acc = d.access(rows, counts)
        lookups, hits = counts.sum(), counts[acc.hit].sum()
        uh, e = acc.hit.sum(), acc.victim_rows.size
        table[t] = (lookups, rows.size, hits, lookups - hits, uh, rows.size - uh, rows.size - uh, e, e)
    return SimResult(policy, capacity, _frame(table), int(warm.size), trace.max_unique, time.perf_counter() - t0)


def _static(trace: Trace, capacity: int, frequencies: np.ndarray) -> tuple[np.ndarray, int]:
    """FAE-like fixed top-k placement; misses are served from the host, never inserted."""
    k = min(capacity, trace.num_rows)
    top = np.zeros(trace.num_rows, dtype=bool)
    top[frequency_order(frequencies)[:k]] = True
    table = np.zeros((len(trace), len(COUNTERS)), dtype=np.int64)
    for t, (rows, counts) in enumerate(zip(trace.rows, trace.counts)):
        hit = top[rows]
        lookups, hits = counts.sum(), counts[hit].sum()
        uh = hit.sum()
        um = rows.size - uh
        table[t] = (lookups, rows.size, hits, lookups - hits, uh, um, um, um, 0)
    return table, k


def _lookahead(trace: Trace, window: int) -> tuple[np.ndarray, int]:
    """ScratchPipe-like window: at step t exactly the rows of batches t..t+W are resident."""
    if window < 0:
        raise ConfigError(f"look-ahead window must be >= 0, got {window}")
    refs = np.zeros(trace.num_rows, dtype=np.int32)  # batches of the window using each row
    table = np.zeros((len(trace), len(COUNTERS)), dtype=np.int64)
    resident = needed = 0
    for t, (rows, counts) in enumerate(zip(trace.rows, trace.counts)):
        hit = refs[rows] > 0
        first = 0 if t == 0 else t + window  # batches entering the window at this step
        entering = range(first, min(t + window, len(trace) - 1) + 1)
        fetched = 0
        for j in entering:
            new = trace.rows[j]
            fetched += int((refs[new] == 0).sum())
            refs[new] += 1
        back = 0
        if t > 0:
            old = trace.rows[t - 1]
            refs[old] -= 1
            back = int((refs[old] == 0).sum())
        resident += fetched - back
        needed = max(needed, resident)
        lookups, hits = counts.sum(), counts[hit].sum()
        uh = hit.sum()
        table[t] = (lookups, rows.size, hits, lookups - hits, uh, rows.size - uh, fetched, back, back)
    return table, needed


def sweep(trace: Trace, ratios: Sequence[float] = DEFAULT_RATIOS, policies: Sequence[str] = POLICIES,
          frequencies: np.ndarray | None = None, warmup_ratio: float = 0.7,
          windows: Sequence[int] = (1,), capacities: Sequence[int] | None = None) -> pd.DataFrame:
    """One summary row per policy and cache size (``capacities`` replaces ``ratios``).

    Sizes below ``trace.max_unique`` are infeasible for the demand caches and
    reported with ``feasible=False``; ``lookahead-W`` rows report the
    capacity they need.
    """
    if frequencies is None:
        frequencies = trace.frequencies()
    sizes = list(capacities) if capacities is not None else \
        [capacity_from_ratio(r, trace.num_rows) for r in ratios]
    out = []
    for policy in policies:
        for c in sizes:
            if policy != "static" and c < trace.max_unique:
                out.append({"policy": policy, "capacity": c, "cache_ratio": c / trace.num_rows,
                            "feasible": False, "steps": len(trace), "capacity_needed": trace.max_unique})
                continue
            out.append(simulate(trace, policy, c, frequencies, warmup_ratio).summary(trace.num_rows))
    for w in windows:
        out.append(simulate(trace, f"lookahead-{w}").summary(trace.num_rows))
    return pd.DataFrame(out)


def column_offsets(ds: Dataset) -> np.ndarray:
    """Global row of id 0 of each id column's table, int64 [K] (as ``StoreSpec.column_offsets``)."""
    starts = np.concatenate([[0], np.cumsum(ds.cardinalities)[:-1]]).astype(np.int64)
    return starts[np.asarray(ds.column_tables, dtype=np.int64)]


def batch_trace(ds: Dataset, order: Iterable[np.ndarray], split: str = "train") -> list[np.ndarray]:
    """Global rows looked up by each batch of ``order`` (row indices relative to ``split``)."""
    start, _ = ds.split(split)
    offsets = column_offsets(ds)
    out = []
    for rows in order:
        ids = ds.batch_ids(np.asarray(rows) + start)  # [B, K]
        out.append((ids + offsets)[ids >= 0])
    return out


def dataset_trace(ds: Dataset, batch_size: int, steps: int, seed: int = 0, shuffle: str = "global",
                  order: Iterable[np.ndarray] | None = None) -> Trace:
    """The training trace in the loader's order (or ``order``, e.g. a run's ``RunResult.order``)."""
    if order is None:
        start, stop = ds.split("train")
        order = batch_rows(stop - start, batch_size, steps, seed, shuffle)
    return Trace.from_batches(batch_trace(ds, order), sum(ds.cardinalities))


def split_frequencies(ds: Dataset, split: str = "train", chunk: int = 1 << 18) -> np.ndarray:
    """Access count of every global row over a split: int64 [N] (``StoreSpec.frequencies``)."""
    start, stop = ds.split(split)
    counts = np.zeros(sum(ds.cardinalities), dtype=np.int64)
    for a in range(0, stop - start, chunk):
        for rows in batch_trace(ds, [np.arange(a, min(a + chunk, stop - start))], split):
            counts += np.bincount(rows, minlength=counts.size)
    return counts
