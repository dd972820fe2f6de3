"""The host benchmarks of ``hotcold calibrate``: memory, row gathers and scatters, the loader, id planning.

Each times the operation the stores really run on the host, interleaved
with the others round by round (``host_rates``), and the LRU cache
directory's planning in steady state (``_directory_rates``). Ids are drawn
per table with the Criteo-style generator's power law (``_powerlaw_ids``).
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hotcold.calibrate.rates import Calibration, MiB
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.machine import CACHE_SOURCE, cores, last_level_cache_bytes
from hotcold.timing import time_ms

SMALL_TABLE_MIB = 2          # a table that fits in any server's last-level cache
DATA_BATCHES = 200           # the calibration dataset's rows, in batches (the default runs' split: ~220)


def host_rates(cal: Calibration) -> None:
    """Host rates; the benchmarks run interleaved, round by round, so a slow spell of a shared
    machine lands on all of them a little rather than on one of them wholly.

    Gathers and scatters are also timed on a table of ``SMALL_TABLE_MIB`` that
    fits in the last-level cache (the cost model uses those rates for tables that
    fit: cache slots, scratchpads, per-batch buffers), and the data phase is timed
    as the loader runs it: memory-mapped reads of a batch of sorted rows of a
    dataset written in the real format."""
    from hotcold.data.columns import to_global
    from hotcold.embedding.rows import RowGroups

    n = 64 * MiB // 4
    src, dst = torch.rand(n), torch.empty(n)
    table = torch.rand(cal.rows, cal.dim)
    row = 4 * cal.dim
    k = max(1, cal.lookups // cal.batch)
    ids = torch.from_numpy(_powerlaw_ids(cal.batch, k, cal.rows, 0))
    uniq = torch.unique(ids)
    uniq = uniq[torch.randperm(uniq.numel(), generator=cal.gen)]
    vals = torch.rand(uniq.numel(), cal.dim)
    small_rows = SMALL_TABLE_MIB * MiB // row
    small = torch.rand(small_rows, cal.dim)
    small_ids = torch.from_numpy(_powerlaw_ids(cal.batch, k, small_rows, 2))
    small_uniq = torch.unique(small_ids)
    small_uniq = small_uniq[torch.randperm(small_uniq.numel(), generator=cal.gen)]
    small_vals = torch.rand(small_uniq.numel(), cal.dim)
    col = np.random.default_rng(0).integers(0, 100_000, size=(cal.batch, k))
    offsets = np.arange(k, dtype=np.int64) * 100_000
    a = torch.ones(1)
    with tempfile.TemporaryDirectory(prefix="hotcold-calibrate-") as tmp:
        batches = _data_batches(Path(tmp), cal.batch, k, cal.repeats + 1)
        ms = _interleaved({
            "copy": lambda: dst.copy_(src),
            "gather": lambda: table.index_select(0, ids),
            "scatter": lambda: table.index_copy_(0, uniq, vals),
            "small_gather": lambda: small.index_select(0, small_ids),
            "small_scatter": lambda: small.index_copy_(0, small_uniq, small_vals),
            "data": batches.__next__,
            "plan": lambda: torch.from_numpy(to_global(col, offsets)).reshape(-1),
            "unique": lambda: RowGroups.of(ids),
            "op": lambda: [a.add(a) for _ in range(1000)],
        }, cal.repeats)
    bw = n * 4 / (ms["copy"] * 1e6)
    cal.put("host_memory_bw", bw, "copy of a 64 MiB float32 tensor, bytes copied / time")
    mib = cal.rows * row // MiB
    cal.put("host_gather_row_ns", ms["gather"] * 1e6 / cal.lookups - row / bw,
            f"index_select of a batch of {ids.numel()} ids ({k} tables, power law 1.3 as the Criteo-style "
            f"data's) from a {mib} MiB table of {cal.dim} floats, per row, less its bytes at host_memory_bw")
    cal.put("host_scatter_row_ns", ms["scatter"] * 1e6 / uniq.numel() - row / bw,
            f"index_copy_ of the {uniq.numel()} distinct rows of those ids into the same table, per row, "
            "less its bytes at host_memory_bw")
    cal.put("host_cached_gather_row_ns", ms["small_gather"] * 1e6 / small_ids.numel(),
            f"index_select of {small_ids.numel()} power-law ids from a {SMALL_TABLE_MIB} MiB table of "
            f"{cal.dim} floats (it fits in the last-level cache), per row, its bytes included")
    cal.put("host_cached_scatter_row_ns", ms["small_scatter"] * 1e6 / small_uniq.numel(),
            f"index_copy_ of their {small_uniq.numel()} distinct rows into the same table, per row, "
            "its bytes included")
    sample = (13 + k + 1) * 4
    cal.put("host_data_sample_ns", ms["data"] * 1e6 / cal.batch - sample / bw,
            f"BatchLoader reading a batch of {cal.batch} sorted random rows of a memory-mapped dataset of "
            f"{DATA_BATCHES} batches (13 float32 dense, {k} int32 ids, a float32 label: {sample} bytes a "
            "sample; pages touched before), per sample, less its bytes at host_memory_bw")
    cal.put("host_cache_mib", *_last_level_cache_mib())
    cal.put("host_cores", cores(), "the cores this process may run on (os.sched_getaffinity)")
    cal.put("host_id_plan_ns", ms["plan"] * 1e6 / col.size, f"to_global of a [{cal.batch}, {k}] id batch, per id")
    cal.put("host_unique_ns", ms["unique"] * 1e6 / cal.lookups,
            f"RowGroups.of (the stores' one stable sort grouping lookups by row) of those {ids.numel()} ids, per id")
    cal.put("host_op_us", ms["op"], "1000 additions of one-element tensors, per op")
    _directory_rates(cal)


def _directory_rates(cal: Calibration) -> None:
    """LRU cache directory in steady state at two capacities: per unique row and per slot scanned."""
    from hotcold.policies.directory import CacheDirectory, cache_policy

    rng = np.random.default_rng(1)
    u = max(1, cal.lookups // 5)
    per_cap = {}
    for cap in (4 * u, 32 * u):
        n = 64 * cap
        d = CacheDirectory(n, cap, cache_policy("lru", n, cap)[0])
        fill = cap // u + 2  # batches that fill the cache: later steps evict
        batches = [np.unique(rng.integers(0, n, size=u)) for _ in range(fill + cal.repeats)]
        for b in batches[:fill]:
            d.access(b, np.ones_like(b))
        times = [time_ms(lambda: d.access(b, np.ones_like(b))) for b in batches[fill:]]
        per_cap[cap] = (statistics.median(times), float(np.mean([b.size for b in batches[fill:]])))
    (c1, (t1, u1)), (c2, (t2, _)) = sorted(per_cap.items())
    slot_ns = max((t2 - t1) * 1e6 / (c2 - c1), 1e-3)
    cal.put("host_directory_slot_ns", slot_ns,
            f"LRU CacheDirectory.access in steady state at {c1} and {c2} slots: the time's slope per slot")
    cal.put("host_directory_row_ns", (t1 * 1e6 - slot_ns * c1) / u1,
            f"the same at {c1} slots, less the slots' share, per unique row ({u1:.0f} a step)")


def _data_batches(root: Path, batch: int, columns: int, count: int) -> Any:
    """An iterator of ``count`` training batches (``BatchLoader``, global shuffle) over a dataset of
    ``DATA_BATCHES`` batches written under ``root`` in the real format, its pages read once before."""
    from hotcold.data.format import Dataset, write_dataset
    from hotcold.data.loader import BatchLoader

    n = DATA_BATCHES * batch
    rng = np.random.default_rng(3)
    test = max(1, n // 100)
    write_dataset(root / "data", dense=rng.random((n, 13), dtype=np.float32),
                  sparse=rng.integers(0, 1000, size=(n, columns), dtype=np.int32),
                  labels=(rng.random(n) < 0.25).astype(np.float32), cardinalities=[1000] * columns,
                  splits={"train": (0, n - test), "test": (n - test, n)}, meta={"name": "calibrate"})
    ds = Dataset.open(root / "data")
    for arr in (ds.dense, ds.sparse, ds.labels):
        float(np.asarray(arr).sum())
    return iter(BatchLoader(ds, "train", batch, steps=count, seed=0))


def _last_level_cache_mib() -> tuple[float, str]:
    """(MiB, how it was found) of the largest data or unified CPU cache the kernel reports."""
    best = last_level_cache_bytes()
    if best:
        return best / MiB, CACHE_SOURCE
    return float(SMALL_TABLE_MIB), (f"not reported by the system: the {SMALL_TABLE_MIB} MiB table of the cached-row "
                                    "benchmarks is the largest known to fit")


def _interleaved(benchmarks: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall ms of each benchmark over ``repeats`` rounds; each round runs every benchmark once
    (after one warm-up round)."""
    times: dict[str, list[float]] = {k: [] for k in benchmarks}
    for r in range(repeats + 1):
        for name, fn in benchmarks.items():
            ms = time_ms(fn)
            if r:
                times[name].append(ms)
    return {k: statistics.median(v) for k, v in times.items()}


def _powerlaw_ids(batch: int, columns: int, rows: int, seed: int, exponent: float = 1.3) -> np.ndarray:
    """Global rows [batch * columns] of a batch over ``columns`` tables of ``rows // columns`` rows each,
    id rank r of each table drawn with P ~ (r+1)^-exponent (the Criteo-style generator's law, exponent 1.3)
    and ranks scattered over the table by a fixed permutation."""
    rng = np.random.default_rng(seed)
    per = max(1, rows // columns)
    ranks = draw_ranks(rng, (batch, columns), powerlaw_cdf(per, exponent))
    ids = rng.permutation(per)[ranks]
    return (ids + np.arange(columns) * per).reshape(-1).astype(np.int64)
