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
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from hotcold.config import ConfigError
from hotcold.counters import FIELDS, StepCounters, row_bytes, vector_bytes
from hotcold.data.format import Dataset
from hotcold.data.order import batch_rows
from hotcold.policies import kernels
from hotcold.policies.batches import Trace
from hotcold.options.base import capacity_from_ratio
from hotcold.policies.directory import CACHE_POLICIES, CacheDirectory, cache_policy, frequency_order
from hotcold.policies.scratchpad import ScratchpadDirectory, working_set_peak

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
      ``belady`` run on ``hotcold.policies.directory``' ``CacheDirectory``, the one
      the cache stores use. ``belady`` is optimal only among caches that must
      admit every missed row; a placement that may bypass (``static-topk``) can
      beat it;
    - ``static-topk``: the C most frequent rows pinned in device memory, misses
      served from the host per lookup (their vectors sent to the device and the
      gradients back, as ``hybrid``), never inserted. This is static top-k
      placement, not FAE, which routes whole inputs (see ``fae-R`` in
      ``hotcold.trace.faesim``);
    - ``scratchpipe-W``: the ``scratchpipe`` store's own scratchpad directory
      (``hotcold.policies.scratchpad``) at a capacity, look-ahead window W: every
      lookup of the trained batch hits; a step books the fetch and write-back
      of the batch it admits. Its ``capacity_needed`` is the window's largest
      working set.
    """
    t0 = time.perf_counter()
    if policy.startswith(SCRATCHPIPE):
        window = _window(policy)
        if not capacity:
            capacity = working_set_peak((r for r, _ in _batches(trace)), trace.num_rows, window)[0]
        frame, needed = _scratchpipe(trace, window, capacity, sizes)
        return SimResult(policy, capacity, frame, 0, needed, time.perf_counter() - t0)
    if policy in ("freqcache", "freqcache-lfu", STATIC) and frequencies is None:
        frequencies = trace.frequencies()
    if policy == STATIC:
        frame, warm = _static(trace, capacity, frequencies, sizes)
        return SimResult(policy, capacity, frame, warm, 0, time.perf_counter() - t0)
    pol, warm = cache_policy(policy, trace.num_rows, capacity, frequencies, warmup_ratio,
                             trace.next_use() if policy == "belady" else None)
    d = CacheDirectory(trace.num_rows, capacity, pol)
    if warm.size:
        d.warm(warm)
    nxt = trace.flat_next_use() if policy == "belady" else None
    parts = [d.run(rows, counts, off, None if nxt is None else nxt[trace.offsets[t]:trace.offsets[t] + rows.size])
             for t, rows, counts, off in trace.chunks()]
    return SimResult(policy, capacity, demand_frame(parts, sizes.param), int(warm.size), trace.max_unique,
                     time.perf_counter() - t0)


def demand_frame(parts: Sequence[np.ndarray], param_bytes: int) -> pd.DataFrame:
    """Per-step counters of a demand cache from ``CacheDirectory.run``'s blocks ([T, 5] each)."""
    k = np.concatenate(parts) if parts else np.zeros((0, 5), dtype=np.int64)
    df = pd.DataFrame(0, index=np.arange(len(k)), columns=list(FIELDS), dtype=np.int64)
    lookups, unique, hits, uh, ev = (k[:, i] for i in (kernels.LOOKUPS, kernels.UNIQUE, kernels.HITS,
                                                       kernels.UNIQUE_HITS, kernels.EVICTIONS))
    df["lookups"], df["unique_rows"], df["hits"], df["misses"] = lookups, unique, hits, lookups - hits
    df["unique_hits"], df["unique_misses"], df["evictions"] = uh, unique - uh, ev
    df["param_rows_h2d"], df["param_bytes_h2d"] = unique - uh, (unique - uh) * param_bytes
    df["param_rows_d2h"], df["param_bytes_d2h"] = ev, ev * param_bytes
    df["prefetch_batch"] = -1
    df.insert(0, "step", np.arange(len(df)))
    return df


def _window(policy: str) -> int:
    try:
        window = int(policy[len(SCRATCHPIPE):])
    except ValueError:
        raise ConfigError(f"unknown policy {policy!r}: scratchpipe-W takes an integer window W") from None
    if window < 0:
        raise ConfigError(f"look-ahead window must be >= 0, got {window}")
    return window


def _static(trace: Trace, capacity: int, frequencies: np.ndarray, sizes: RowSizes) -> tuple[pd.DataFrame, int]:
    """Static top-k placement; misses are served from the host per lookup, never inserted."""
    k = min(capacity, trace.num_rows)
    top = np.zeros(trace.num_rows, dtype=bool)
    top[frequency_order(frequencies, k)] = True
    parts = []
    for _, rows, counts, off in trace.chunks():
        hit = top[rows]
        step = np.repeat(np.arange(off.size - 1), np.diff(off))
        n = off.size - 1
        parts.append(np.stack([np.bincount(step, counts, n), np.diff(off), np.bincount(step, counts * hit, n),
                               np.bincount(step, hit, n)], axis=1).astype(np.int64))
    k4 = np.concatenate(parts) if parts else np.zeros((0, 4), dtype=np.int64)
    df = pd.DataFrame(0, index=np.arange(len(k4)), columns=list(FIELDS), dtype=np.int64)
    lookups, unique, hits, uh = k4.T
    moved = (lookups - hits) * sizes.vector
    df["lookups"], df["unique_rows"], df["hits"], df["misses"] = lookups, unique, hits, lookups - hits
    df["unique_hits"], df["unique_misses"], df["vector_bytes_h2d"], df["grad_bytes_d2h"] = uh, unique - uh, moved, moved
    df["prefetch_batch"] = -1
    df.insert(0, "step", np.arange(len(df)))
    return df, k


def _batches(trace: Trace) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(unique rows, counts) of each batch in order, read a chunk at a time."""
    for _, rows, counts, off in trace.chunks():
        for i in range(off.size - 1):
            yield rows[off[i]:off[i + 1]], counts[off[i]:off[i + 1]]


def _scratchpipe(trace: Trace, window: int, capacity: int, sizes: RowSizes) -> tuple[pd.DataFrame, int]:
    """The ``scratchpipe`` store's admissions, without training (see ``hotcold.policies.scratchpad``), and
    the most slots held at once: the window's largest working set (``working_set_peak``).

    Streams the trace: only the batches between the one training and the one
    admitted (W + 1) are held.
    """
    d = ScratchpadDirectory(trace.num_rows, capacity)
    ahead = _batches(trace)   # admissions take the batches in order
    held: dict[int, np.ndarray] = {}
    out = []
    n = len(trace)
    peak = 0
    for t in range(n):
        admit = range(0, min(window, n - 1) + 1) if t == 0 else ([t + window] if t + window < n else [])
        for j in admit:
            adm = d.admit(next(ahead)[0])
            held[j] = adm.slots
            out.append((t, j, adm.hits, adm.missing.size, adm.victim_rows.size))
            peak = max(peak, d.held)
        d.release(held.pop(t))
    return _scratch_frame(trace, out, sizes.param), peak


def _scratch_frame(trace: Trace, admissions: list[tuple[int, int, int, int, int]], param_bytes: int) -> pd.DataFrame:
    """Per-step counters: every lookup of the trained batch hits; a step books the admissions it made."""
    n = len(trace)
    df = pd.DataFrame(0, index=np.arange(n), columns=list(FIELDS), dtype=np.int64)
    lookups = np.zeros(n, dtype=np.int64)
    for t, _, counts, off in trace.chunks():
        steps = np.repeat(np.arange(off.size - 1), np.diff(off))
        lookups[t:t + off.size - 1] = np.bincount(steps, counts, off.size - 1)
    unique = np.diff(trace.offsets)
    df["lookups"], df["unique_rows"], df["hits"], df["unique_hits"] = lookups, unique, lookups, unique
    df["prefetch_batch"] = -1
    if admissions:
        a = np.asarray(admissions, dtype=np.int64)  # [A, 5] step, batch, hits, fetched, evicted
        t = a[:, 0]
        last = np.r_[t[1:] != t[:-1], True]
        df.loc[t[last], "prefetch_batch"] = a[last, 1]
        for col, i in (("prefetch_unique_hits", 2), ("prefetch_unique_misses", 3), ("evictions", 4)):
            df[col] = np.bincount(t, a[:, i], n).astype(np.int64)
        df["param_rows_h2d"], df["param_rows_d2h"] = df["prefetch_unique_misses"], df["evictions"]
        df["param_bytes_h2d"] = df["param_rows_h2d"] * param_bytes
        df["param_bytes_d2h"] = df["param_rows_d2h"] * param_bytes
    df.insert(0, "step", np.arange(n))
    return df


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
        needed[f"{SCRATCHPIPE}{w}"] = working_set_peak((r for r, _ in _batches(trace)), trace.num_rows, w)[0]
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


def batch_trace_iter(ds: Dataset, order: Iterable[np.ndarray], split: str = "train") -> Iterator[np.ndarray]:
    """``batch_trace`` one batch at a time."""
    start, _ = ds.split(split)
    for rows in order:
        yield ds.global_rows(np.asarray(rows) + start)


def dataset_trace(ds: Dataset, batch_size: int, steps: int, seed: int = 0, shuffle: str = "global",
                  order: Iterable[np.ndarray] | None = None, spool: bool = False) -> Trace:
    """The training trace in the loader's order (or ``order``, e.g. a run's ``RunResult.order``).

    ``spool``: keep it in a temporary file (``Trace.spool``), so memory does
    not grow with ``steps``.
    """
    if order is None:
        start, stop = ds.split("train")
        order = batch_rows(stop - start, batch_size, steps, seed, shuffle)
    make = Trace.spool if spool else Trace.from_batches
    return make(batch_trace_iter(ds, order), sum(ds.cardinalities))
