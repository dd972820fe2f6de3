"""FAE's trace model: its hot set, schedule and hot-set syncs, without training.

FAE routes whole inputs (an input is hot when all its lookups are hot rows)
and pays a hot-set synchronisation whenever the batch kind switches, so it
cannot be simulated on the loader's batch order like a cache: the model
builds FAE's own schedule (``hotcold.policies.fae_schedule.fae_order``, the
store's scaled epoch: the same batches for the same steps and warm-up steps)
and books each batch as the ``fae`` store does. Policy name ``fae-R`` with R the
``run_length`` (``fae-epoch``, ``fae-1``...).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from hotcold.policies import row_counts
from hotcold.trace.cachesim import RowSizes, SimResult, counters_frame
from hotcold.options.base import EPOCH, check_run_length, rows_for_share
from hotcold.policies.fae_schedule import FAEPlan, HotSetSync, fae_counters, fae_order, plan

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

DEFAULT_BUDGETS = (0.062, 0.124, 0.248)     # FAE's 128/256/512 MiB as shares of full Kaggle's rows
DEFAULT_RUN_LENGTHS = (1, 16, 128, EPOCH)
_GROUP = 64   # batches read from the dataset at a time


def simulate_fae(ds: "Dataset", batch_size: int, steps: int, seed: int, budget_ratio: float,
                 run_length: int | str = EPOCH, sample_fraction: float = 1.0,
                 sizes: RowSizes = RowSizes(), fae_plan: FAEPlan | None = None,
                 warmup: int = 0) -> tuple[SimResult, float]:
    """FAE's per-step counters over ``steps`` batches of its schedule, and its hot-input share.

    ``fae_plan``: the plan of this budget and sample, when already made;
    ``warmup``: the run's untimed first steps (``train.warmup_steps``), which
    the schedule keeps apart from the timed ones as the store does.
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
    order = fae_order(np.flatnonzero(p.is_hot), np.flatnonzero(~p.is_hot), batch_size, steps, seed, run_length,
                      min(warmup, steps)).batches
    stamp = np.zeros(num_rows, dtype=np.int32)   # last batch number + 1 that saw each row
    done = 0
    while done < steps:
        group = order[done:done + _GROUP]
        ids = ds.global_ids(np.concatenate(group) + start)             # [B * G, K], -1 at padding
        real = ids >= 0
        per_batch = real.reshape(len(group), -1).sum(axis=1)           # lookups of each batch
        offsets = np.zeros(len(group) + 1, dtype=np.int64)
        np.cumsum(per_batch, out=offsets[1:])
        rows = ids[real]
        cold = np.add.reduceat(~hot[rows], offsets[:-1]) if rows.size else np.zeros(len(group), dtype=int)
        cold[per_batch == 0] = 0
        uniques = row_counts.batch_uniques(rows, offsets, stamp, done)
        for i in range(len(group)):
            is_hot = bool(cold[i] == 0)
            out.append(fae_counters(is_hot, int(per_batch[i]), int(uniques[i]), sync.enter(is_hot), sizes.dim,
                                    sizes.param))
        done += len(group)
    result = SimResult(f"fae-{run_length}", int(p.hot_rows.size), counters_frame(out), 0, 0,
                       time.perf_counter() - t0)
    return result, p.hot_fraction


def fae_sweep(ds: "Dataset", batch_size: int, steps: int, seed: int,
              budgets: Sequence[float] = DEFAULT_BUDGETS, run_lengths: Sequence[int | str] = DEFAULT_RUN_LENGTHS,
              sample_fraction: float = 1.0, sizes: RowSizes = RowSizes(), warmup: int = 0) -> pd.DataFrame:
    """One row per budget and run length: ``SimResult.summary`` plus FAE's hot shares and switches
    (``warmup``: the run's untimed first steps, as ``simulate_fae``)."""
    num_rows = sum(ds.cardinalities)
    rows = []
    for ratio in budgets:
        p = plan(ds, seed, sample_fraction, rows_for_share(ratio, num_rows))
        for run in run_lengths:
            res, hot_share = simulate_fae(ds, batch_size, steps, seed, ratio, run, sample_fraction, sizes, p,
                                          warmup)
            row = res.summary(num_rows)
            row.update(cache_ratio=ratio, hot_input_share=hot_share,
                       hot_batch_share=float(res.steps["hot_batch"].mean()) if len(res.steps) else 0.0)
            rows.append(row)
    return pd.DataFrame(rows)
