"""A trace simulator that runs the placement policies without training.

A trace is the sequence of training batches as global rows (int64 arrays,
padding removed). Every policy fills the same per-step ``StepCounters``
(``hotcold.counters``) that the stores report when training, so a simulated
run and a trained one compare column by column. The policies: ``simulate``.
Initial warm-up fills are not a training step: they are reported as
``warm_rows``. Byte counters take the row sizes of a model (``RowSizes``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from hotcold.config import ConfigError
from hotcold.counters import FIELDS, StepCounters, all_resident, row_bytes, vector_bytes
from hotcold.data.format import Dataset
from hotcold.data.loader import batch_rows
from hotcold.trace.policies import (CACHE_POLICIES, NEVER, CacheDirectory, cache_policy, capacity_from_ratio,
                                    frequency_order)
from hotcold.trace.scratchpad import ScratchpadDirectory, working_set_peak

#: cache sizes of a default sweep, as shares of all rows (0.1% .. 10%)
DEFAULT_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1)
STATIC = "static-topk"
SCRATCHPIPE = "scratchpipe-"
#: the policies a sweep runs at every cache size (``scratchpipe-W`` comes from ``windows``)
POLICIES = (*CACHE_POLICIES, STATIC)


@dataclass(frozen=True)
class RowSizes:
    """The model's row sizes: embedding dimension and floats of optimizer state a row."""

    dim: int = 16
    state_width: int = 1   # row-wise Adagrad

    @property
    def param(self) -> int:
        """Bytes of a parameter row (weights + optimizer state)."""
        return row_bytes(self.dim, self.state_width)

    @property
    def vector(self) -> int:
        """Bytes of a looked-up vector (or its gradient)."""
        return vector_bytes(self.dim)


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
    steps: pd.DataFrame        # one row per step: "step" and every ``StepCounters`` field
    warm_rows: int = 0
    capacity_needed: int = 0   # smallest feasible capacity: the most unique rows of a batch, or
                               # scratchpipe-W's largest working set; 0: any (static-topk)
    seconds: float = 0.0

    def summary(self, num_rows: int) -> dict[str, float | int | str]:
        """Totals, hit rates by lookups and by unique rows, bytes moved per batch."""
        return summary_row(self.policy, self.capacity, num_rows, self.steps, warm_rows=self.warm_rows,
                           capacity_needed=self.capacity_needed, seconds=self.seconds)


def summary_row(policy: str, capacity: int, num_rows: int, steps: pd.DataFrame, **extra) -> dict:
    """One sweep row from per-step counters: totals, hit rates, traffic per batch."""
    tot = {c: int(steps[c].sum()) for c in FIELDS if c != "prefetch_batch"}
    n = max(len(steps), 1)
    param = tot["param_bytes_h2d"] + tot["param_bytes_d2h"]
    activation = tot["vector_bytes_h2d"] + tot["grad_bytes_d2h"]
    return {
        "policy": policy, "capacity": capacity, "cache_ratio": capacity / num_rows,
        "feasible": True, "steps": len(steps), **tot,
        "hit_rate": tot["hits"] / max(tot["lookups"], 1),
        "unique_hit_rate": tot["unique_hits"] / max(tot["unique_rows"], 1),
        "param_bytes_per_batch": param / n, "activation_bytes_per_batch": activation / n,
        "bytes_per_batch": (param + activation) / n, "param_rows_h2d_per_batch": tot["param_rows_h2d"] / n,
        "evictions_per_batch": tot["evictions"] / n, **extra,
    }


def counters_frame(steps: Sequence[StepCounters]) -> pd.DataFrame:
    """Per-step counters -> a DataFrame with "step" and every field."""
    df = pd.DataFrame([c.as_dict() for c in steps], columns=list(FIELDS)).astype("int64")
    df.insert(0, "step", np.arange(len(df)))
    return df


def simulate(trace: Trace, policy: str, capacity: int = 0, frequencies: np.ndarray | None = None,
             warmup_ratio: float = 0.7, sizes: RowSizes = RowSizes()) -> SimResult:
    """Run one policy (``POLICIES`` or ``scratchpipe-W``) at ``capacity`` slots over ``trace``.

    ``frequencies`` ([N] access counts) rank rows for ``freqcache*`` and
    ``static-topk``; by default they are counted over the trace itself. A
    capacity that cannot serve the trace raises ``InfeasibleError`` (any
    capacity serves ``static-topk``; ``scratchpipe-W`` at capacity 0 takes
    its minimum).

    - demand caches ``lru``, ``lfu``, ``freqcache``, ``freqcache-lfu`` and
      ``belady`` run on ``hotcold.trace.policies``' ``CacheDirectory``, the one
      the cache stores use. ``belady`` is optimal only among caches that must
      admit every missed row; a placement that may bypass (``static-topk``) can
      beat it;
    - ``static-topk``: the C most frequent rows pinned in device memory, misses
      served from the host per lookup (their vectors sent to the device and the
      gradients back, as ``hybrid``), never inserted. This is static top-k
      placement, not FAE, which routes whole inputs (see ``fae-R`` in
      ``hotcold.trace.faesim``);
    - ``scratchpipe-W``: the ``scratchpipe`` store's own scratchpad directory
      (``hotcold.trace.scratchpad``) at a capacity, look-ahead window W: every
      lookup of the trained batch hits; a step books the fetch and write-back
      of the batch it admits. Its ``capacity_needed`` is the window's largest
      working set.
    """
    t0 = time.perf_counter()
    if policy.startswith(SCRATCHPIPE):
        window = _window(policy)
        needed = working_set_peak(trace.rows, trace.num_rows, window)[0]
        capacity = capacity or needed
        steps = _scratchpipe(trace, window, capacity, sizes)
        return SimResult(policy, capacity, counters_frame(steps), 0, needed, time.perf_counter() - t0)
    if policy in ("freqcache", "freqcache-lfu", STATIC) and frequencies is None:
        frequencies = trace.frequencies()
    if policy == STATIC:
        steps, warm = _static(trace, capacity, frequencies, sizes)
        return SimResult(policy, capacity, counters_frame(steps), warm, 0, time.perf_counter() - t0)
    pol, warm = cache_policy(policy, trace.num_rows, capacity, frequencies, warmup_ratio,
                             trace.next_use() if policy == "belady" else None)
    d = CacheDirectory(trace.num_rows, capacity, pol)
    if warm.size:
        d.warm(warm)
    steps = [d.access(rows, counts).counters(sizes.param) for rows, counts in zip(trace.rows, trace.counts)]
    return SimResult(policy, capacity, counters_frame(steps), int(warm.size), trace.max_unique,
                     time.perf_counter() - t0)


def _window(policy: str) -> int:
    try:
        window = int(policy[len(SCRATCHPIPE):])
    except ValueError:
        raise ConfigError(f"unknown policy {policy!r}: scratchpipe-W takes an integer window W") from None
    if window < 0:
        raise ConfigError(f"look-ahead window must be >= 0, got {window}")
    return window


def _static(trace: Trace, capacity: int, frequencies: np.ndarray, sizes: RowSizes) -> tuple[list[StepCounters], int]:
    """Static top-k placement; misses are served from the host per lookup, never inserted."""
    k = min(capacity, trace.num_rows)
    top = np.zeros(trace.num_rows, dtype=bool)
    top[frequency_order(frequencies)[:k]] = True
    out = []
    for rows, counts in zip(trace.rows, trace.counts):
        hit = top[rows]
        lookups, hits = int(counts.sum()), int(counts[hit].sum())
        uh = int(hit.sum())
        moved = (lookups - hits) * sizes.vector
        out.append(StepCounters(lookups=lookups, unique_rows=rows.size, hits=hits, misses=lookups - hits,
                                unique_hits=uh, unique_misses=rows.size - uh, vector_bytes_h2d=moved,
                                grad_bytes_d2h=moved))
    return out, k


def _scratchpipe(trace: Trace, window: int, capacity: int, sizes: RowSizes) -> list[StepCounters]:
    """The ``scratchpipe`` store's admissions, without training (see ``hotcold.trace.scratchpad``)."""
    d = ScratchpadDirectory(trace.num_rows, capacity)
    held: dict[int, np.ndarray] = {}
    out = []
    for t, (rows, counts) in enumerate(zip(trace.rows, trace.counts)):
        c = all_resident(int(counts.sum()), rows.size)
        admit = range(0, min(window, len(trace) - 1) + 1) if t == 0 else \
            ([t + window] if t + window < len(trace) else [])
        for j in admit:
            adm = d.admit(trace.rows[j])
            held[j] = adm.slots
            adm.book(c, j, sizes.param)
        d.release(held.pop(t))
        out.append(c)
    return out


def sweep(trace: Trace, ratios: Sequence[float] = DEFAULT_RATIOS, policies: Sequence[str] = POLICIES,
          frequencies: np.ndarray | None = None, warmup_ratio: float = 0.7,
          windows: Sequence[int] = (1,), capacities: Sequence[int] | None = None,
          sizes: RowSizes = RowSizes()) -> pd.DataFrame:
    """One summary row per policy and cache size (``capacities`` replaces ``ratios``).

    ``scratchpipe-W`` runs for each of ``windows`` at every size and at its
    minimum (``capacity_needed``). Sizes that cannot serve the trace are
    reported with ``feasible=False`` and the capacity they would need.
    """
    if frequencies is None:
        frequencies = trace.frequencies()
    sizes_ = list(capacities) if capacities is not None else \
        [capacity_from_ratio(r, trace.num_rows) for r in ratios]
    needed = {p: 0 if p == STATIC else trace.max_unique for p in policies}
    for w in windows:
        needed[f"{SCRATCHPIPE}{w}"] = working_set_peak(trace.rows, trace.num_rows, w)[0]
    runs = [(p, c) for p in policies for c in sizes_]
    runs += [(p, c) for p in needed if p.startswith(SCRATCHPIPE) for c in sorted({*sizes_, needed[p]})]
    out = []
    for policy, c in runs:
        if c < needed[policy]:
            out.append({"policy": policy, "capacity": c, "cache_ratio": c / trace.num_rows,
                        "feasible": False, "steps": len(trace), "capacity_needed": needed[policy]})
            continue
        out.append(simulate(trace, policy, c, frequencies, warmup_ratio, sizes).summary(trace.num_rows))
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
