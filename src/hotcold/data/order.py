"""The training order: which rows of a split each batch holds, a fixed function of (seed, epoch).

The loader reads these rows; the simulators (cache, profile, shard) replay the same order without torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from hotcold.config import Sections
from hotcold.data.columns import to_global

if TYPE_CHECKING:
    from hotcold.data.format import Dataset


def batch_rows(n_rows: int, batch_size: int, steps: int, seed: int, shuffle: str) -> Iterator[np.ndarray]:
    """Row indices (relative to the split) of each training batch, sorted within the batch.

    Epochs repeat as needed, each with its own permutation; the last partial
    batch of an epoch is dropped.
    """
    per_epoch = n_rows // batch_size
    if per_epoch == 0:
        raise ValueError(f"split has {n_rows} rows, fewer than one batch of {batch_size}")
    epoch, order = -1, None
    for step in range(steps):
        e, k = divmod(step, per_epoch)
        if e != epoch:
            epoch = e
            if shuffle == "global":
                order = np.random.default_rng([seed, epoch]).permutation(n_rows)
            else:
                order = np.arange(n_rows)
        # Sorting inside a batch keeps memory-mapped reads local; the batch is a set.
        yield np.sort(order[k * batch_size:(k + 1) * batch_size])


def global_batches(ds: Dataset, cfg: Sections, batch_size: int | None = None) -> Iterator[np.ndarray]:
    """Global rows [B, K] (-1 at padding) of every training batch, in the loader's order: ``table_batches``'
    ids moved to their tables' rows (``columns.to_global``); one batch in memory at a time."""
    offsets = ds.column_offsets
    for ids in table_batches(ds, cfg, batch_size):
        yield to_global(ids, offsets)


def table_batches(ds: Dataset, cfg: Sections, batch_size: int | None = None) -> Iterator[np.ndarray]:
    """Table ids [B, K] (-1 at padding) of every training batch, in the loader's order: ``cfg.train.steps``
    batches of ``batch_size`` samples (default ``cfg.train.batch_size``), epochs repeating as the loader's
    (``batch_rows``); the stored integer type where the dataset has no histories."""
    start, stop = ds.split("train")
    t = cfg.train
    for rows in batch_rows(stop - start, batch_size or t.batch_size, t.steps, cfg.seed, t.shuffle):
        yield ds.batch_ids(rows + start) if ds.sequence else np.take(ds.sparse, rows + start, axis=0)
