"""The training order: which rows of a split each batch holds, a fixed function of (seed, epoch).

The loader reads these rows; the simulators (cache, profile, shard) replay the same order without torch.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np


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
