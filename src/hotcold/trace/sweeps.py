"""``hotcold simulate``'s table: every placement policy at every cache size on a dataset's training trace.

The trace is the batches a run of the given config would train on (its
batch size, steps, seed and shuffle); the table joins the per-size cache and
scratchpad sweep (``cachesim.sweep``) with FAE's trace model at its budgets
and run lengths (``faesim.fae_sweep``). The returned ``Sweep`` keeps the
trace, the cache rows and the row counts, so the hit-rate curves
(``trace.curves``) reuse them instead of reading the dataset again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from hotcold.config import row_state_width
from hotcold.data.format import Dataset
from hotcold.data.skew import row_counts
from hotcold.trace.cachesim import POLICIES, RowSizes, Trace, dataset_trace, sweep
from hotcold.trace.faesim import fae_sweep

if TYPE_CHECKING:  # the sections of a run config it reads
    from hotcold.config import Sections


@dataclass
class Sweep:
    """The simulated table and what it was computed from."""

    frame: pd.DataFrame         # one row per policy x size (FAE: budget x run length), ``dataset`` first
    swept: pd.DataFrame         # the cache and scratchpad rows alone (``cachesim.sweep``)
    trace: Trace
    frequencies: np.ndarray     # lookups of every global row over the training split, int64 [N]
    dataset: str
    steps: int                  # batches in the trace
    from_step: int              # the trained runs' first timed step (``train.warmup_steps``)


def placement_sweep(ds: Dataset, cfg: Sections, ratios: Sequence[float], policies: Sequence[str] | None = None,
                    windows: Sequence[int] = (), fae_budgets: Sequence[float] = (),
                    fae_run_lengths: Sequence[int | str] = (), fae_sample_fraction: float = 1.0) -> Sweep:
    """Simulate ``policies`` (default: all) at cache sizes ``ratios`` (shares of all rows) on ``cfg``'s trace.

    ``windows``: ScratchPipe look-ahead windows (none: skip); ``fae_budgets``
    (none: skip FAE), ``fae_run_lengths`` and ``fae_sample_fraction``: FAE's
    trace model.
    """
    t = cfg.train
    sizes = RowSizes(cfg.model.embedding_dim, row_state_width(t.row_optimizer, cfg.model.embedding_dim))
    trace = dataset_trace(ds, t.batch_size, t.steps, cfg.seed, t.shuffle, spool=True)
    freq = row_counts(ds, "train")
    frames = [sweep(trace, ratios, policies or POLICIES, freq, windows=windows, sizes=sizes)]
    if fae_budgets:
        frames.append(fae_sweep(ds, t.batch_size, t.steps, cfg.seed, fae_budgets, fae_run_lengths,
                                fae_sample_fraction, sizes, t.warmup_steps))
    frame = pd.concat(frames, ignore_index=True)
    frame.insert(0, "dataset", ds.name)
    return Sweep(frame, frames[0], trace, freq, ds.name, t.steps, t.warmup_steps)
