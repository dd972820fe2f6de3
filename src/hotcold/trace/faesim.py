"""FAE's trace model: its hot set, schedule and hot-set syncs, without training.

FAE routes whole inputs (an input is hot when all its lookups are hot rows)
and pays a hot-set synchronisation whenever the batch kind switches, so it
cannot be simulated on the loader's batch order like a cache: the model
builds FAE's own schedule (``hotcold.trace.fae_schedule``, the store's) and
books each batch as the ``fae`` store does. Policy name ``fae-R`` with R the
``run_length`` (``fae-epoch``, ``fae-1``...).
"""
from __future__ import annotations

import time
from itertools import islice
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from hotcold.trace.cachesim import RowSizes, SimResult, counters_frame
from hotcold.trace.policies import rows_for_share
from hotcold.trace.fae_schedule import (EPOCH, FAEPlan, HotSetSync, check_run_length, fae_counters, plan,
                                        shuffle_schedule)

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

DEFAULT_BUDGETS = (0.062, 0.124, 0.248)     # FAE's 128/256/512 MiB as shares of full Kaggle's rows
DEFAULT_RUN_LENGTHS = (1, 16, 128, EPOCH)


def simulate_fae(ds: "Dataset", batch_size: int, steps: int, seed: int, budget_ratio: float,
                 run_length: int | str = EPOCH, sample_fraction: float = 1.0,
                 sizes: RowSizes = RowSizes(), fae_plan: FAEPlan | None = None) -> tuple[SimResult, float]:
    """FAE's per-step counters over ``steps`` batches of its schedule, and its hot-input share.

    ``fae_plan``: the plan of this budget and sample, when already made.
    """
    t0 = time.perf_counter()
    run_length = check_run_length(run_length)
    num_rows = sum(ds.cardinalities)
    p = fae_plan or plan(ds, seed, sample_fraction, rows_for_share(budget_ratio, num_rows))
    hot = np.zeros(num_rows, dtype=bool)
    hot[p.hot_rows] = True
    sync = HotSetSync(p.hot_rows.size)
    start = ds.split("train")[0]
    out = []
    order = shuffle_schedule(np.flatnonzero(p.is_hot), np.flatnonzero(~p.is_hot), batch_size, seed, run_length)
    for batch in islice(order, steps):
        rows = ds.global_rows(batch + start)
        is_hot = bool(hot[rows].all())
        out.append(fae_counters(is_hot, rows.size, np.unique(rows).size, sync.enter(is_hot), sizes.dim,
                                sizes.param))
    result = SimResult(f"fae-{run_length}", int(p.hot_rows.size), counters_frame(out), 0, 0,
                       time.perf_counter() - t0)
    return result, p.hot_fraction


def fae_sweep(ds: "Dataset", batch_size: int, steps: int, seed: int,
              budgets: Sequence[float] = DEFAULT_BUDGETS, run_lengths: Sequence[int | str] = DEFAULT_RUN_LENGTHS,
              sample_fraction: float = 1.0, sizes: RowSizes = RowSizes()) -> pd.DataFrame:
    """One row per budget and run length: ``SimResult.summary`` plus FAE's hot shares and switches."""
    num_rows = sum(ds.cardinalities)
    rows = []
    for ratio in budgets:
        p = plan(ds, seed, sample_fraction, rows_for_share(ratio, num_rows))
        for run in run_lengths:
            res, hot_share = simulate_fae(ds, batch_size, steps, seed, ratio, run, sample_fraction, sizes, p)
            row = res.summary(num_rows)
            row.update(cache_ratio=ratio, hot_input_share=hot_share,
                       hot_batch_share=float(res.steps["hot_batch"].mean()) if len(res.steps) else 0.0)
            rows.append(row)
    return pd.DataFrame(rows)
