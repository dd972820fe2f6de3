"""A trace simulator that runs the cache policies without training.

A trace is the sequence of training batches as global rows (int64 arrays,
padding removed). The demand caches (``lru``, ``lfu``, ``freqcache``,
``freqcache-lfu``, ``belady``) run on ``hotcold.trace.policies``'
``CacheDirectory``, the one the cache stores use, so the simulator's counts
equal the stores' training-time counters; the policies and their tie rules
are documented there.

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

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from hotcold.config import ConfigError
from hotcold.data.format import Dataset
from hotcold.data.loader import batch_rows
from hotcold.trace.policies import (COUNTERS, NEVER, POLICIES, CacheDirectory, cache_policy, capacity_from_ratio,
                                    frequency_order)

#: cache sizes of a default sweep, as shares of all rows (0.1% .. 10%)
DEFAULT_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1)


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


def batch_trace(ds: Dataset, order: Iterable[np.ndarray], split: str = "train") -> list[np.ndarray]:
    """Global rows looked up by each batch of ``order`` (row indices relative to ``split``)."""
    start, _ = ds.split(split)
    return [ds.global_rows(np.asarray(rows) + start) for rows in order]


def dataset_trace(ds: Dataset, batch_size: int, steps: int, seed: int = 0, shuffle: str = "global",
                  order: Iterable[np.ndarray] | None = None) -> Trace:
    """The training trace in the loader's order (or ``order``, e.g. a run's ``RunResult.order``)."""
    if order is None:
        start, stop = ds.split("train")
        order = batch_rows(stop - start, batch_size, steps, seed, shuffle)
    return Trace.from_batches(batch_trace(ds, order), sum(ds.cardinalities))
