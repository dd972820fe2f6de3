"""Deterministic batches from a dataset split, with a look-ahead window.

The order is a fixed function of (seed, epoch): a permutation of the split
per epoch (``shuffle="global"``) or the stored order (``"none"``). Stores
that look ahead (ScratchPipe) see the ids of the next ``lookahead`` batches;
the loader materialises those batches early, so the cost of reading them is
still charged to the data phase of some step.
"""
from __future__ import annotations

import mmap
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import torch

from hotcold.data.format import Dataset
from hotcold.data.order import batch_rows


@dataclass
class Batch:
    step: int
    dense: torch.Tensor    # float32 [B, num_dense]
    ids: torch.Tensor      # int64 [B, K], ids of table ds.column_tables[k], -1 = padding
    labels: torch.Tensor   # float32 [B]
    upcoming: list[torch.Tensor]  # ids [B, K] of the next batches (look-ahead window)


class BatchLoader:
    """Iterates ``steps`` training batches of a split, showing ``lookahead`` batches ahead."""

    def __init__(
        self,
        ds: Dataset,
        split: str,
        batch_size: int,
        steps: int,
        seed: int,
        shuffle: str = "global",
        lookahead: int = 0,
        pin_memory: bool = False,
        rows: Iterable[np.ndarray] | None = None,
        part: tuple[int, int] = (0, 1),
    ) -> None:
        """``rows`` replaces the default batch order (row indices relative to the split). ``part`` (r, P): read
        only the r-th of P contiguous slices of every global batch (a rank's; the batch size divides by P)."""
        self.ds = ds
        self.part = part
        self.start, stop = ds.split(split)
        self.rows = rows if rows is not None else batch_rows(stop - self.start, batch_size, steps, seed, shuffle)
        self.lookahead = lookahead
        self.pin = pin_memory

    def _read(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = rows + self.start
        dense = torch.from_numpy(np.asarray(self.ds.dense[idx]))
        ids = torch.from_numpy(self.ds.batch_ids(idx))
        labels = torch.from_numpy(np.asarray(self.ds.labels[idx]))
        if self.pin:
            dense, ids, labels = dense.pin_memory(), ids.pin_memory(), labels.pin_memory()
        return dense, ids, labels

    def __iter__(self) -> Iterator[Batch]:
        window: deque = deque()
        step = 0
        r, p = self.part
        for rows in self.rows:
            n = len(rows) // p
            window.append(self._read(rows[r * n:(r + 1) * n]))
            if len(window) <= self.lookahead:
                continue  # fill the window before the first batch
            yield self._batch(step, window)
            window.popleft()
            step += 1
        while window:
            yield self._batch(step, window)
            window.popleft()
            step += 1

    @staticmethod
    def _batch(step: int, window: deque) -> Batch:
        dense, ids, labels = window[0]
        return Batch(step, dense, ids, labels, [w[1] for w in list(window)[1:]])


def eval_batches(ds: Dataset, split: str, batch_size: int, limit: int = 0) -> Iterator[tuple[torch.Tensor, ...]]:
    """Sequential (dense, ids, labels) batches over a split, the last one partial."""
    start, stop = ds.split(split)
    if stop <= start:
        raise ValueError(f"{ds.path}: split {split!r} is empty, nothing to evaluate on")
    if limit:
        stop = min(stop, start + limit)
    for a in range(start, stop, batch_size):
        b = min(a + batch_size, stop)
        yield (
            torch.from_numpy(np.array(ds.dense[a:b])),
            torch.from_numpy(ds.batch_ids(np.arange(a, b))),
            torch.from_numpy(np.array(ds.labels[a:b])),
        )


def release_pages(ds: Dataset) -> int:
    """Unmap the pages of ``ds``'s memory-mapped columns from this process; the number of columns released.

    Reading random batches maps the whole files in time (the kernel maps the
    cached pages around each one it faults in), and mapped file pages count
    in the resident set although they are the kernel's page cache. Called
    once training is over, so that evaluation and the run's record do not
    sit on top of them; later reads map pages again as needed. Values never
    change: the pages stay in the page cache, and a column that is not a
    plain memory map is left alone.
    """
    released = 0
    for arr in vars(ds).values():
        mm = getattr(arr, "_mmap", None) if isinstance(arr, np.memmap) else None
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mm.madvise(mmap.MADV_DONTNEED)
                released += 1
            except (OSError, ValueError):
                pass
    return released
