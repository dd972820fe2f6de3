"""Deterministic batches from a dataset split, with a look-ahead window.

The order is a fixed function of (seed, epoch): a permutation of the split
per epoch (``shuffle="global"``) or the stored order (``"none"``). Stores
that look ahead (ScratchPipe) see the ids of the next ``lookahead`` batches;
the loader materialises those batches early, so the cost of reading them is
still charged to the data phase of some step. With ``readers`` > 0, reader
threads read the batches ahead, in order, so that whoever takes the next
batch finds it read; with ``buffers`` they pack each batch for one copy to
the device (``hotcold.data.packed``).
"""
from __future__ import annotations

import mmap
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import torch

from hotcold.data.format import Dataset
from hotcold.data.order import batch_rows
from hotcold.data.packed import PackedBuffers, pack


@dataclass
class Batch:
    step: int
    dense: torch.Tensor    # float32 [B, num_dense]
    ids: torch.Tensor      # int64 [B, K], ids of table ds.column_tables[k], -1 = padding
    labels: torch.Tensor   # float32 [B]
    upcoming: list[torch.Tensor]  # ids [B, K] of the next batches (look-ahead window)
    #: the batch packed for one copy to the device (``hotcold.data.packed``; ``dense`` and ``labels`` are views
    #: of it), and the pool to give it back to once copied; None unless the loader packs
    packed: torch.Tensor | None = None
    buffers: PackedBuffers | None = None


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
        rows: Iterable[np.ndarray] | None = None,
        part: tuple[int, int] = (0, 1),
        readers: int = 0,
        buffers: PackedBuffers | None = None,
    ) -> None:
        """``rows`` replaces the default batch order (row indices relative to the split). ``part`` (r, P): read
        only the r-th of P contiguous slices of every global batch (a rank's; the batch size divides by P).
        ``readers``: threads reading ahead (0: each batch is read when it is asked for); ``buffers``: pack each
        batch into one of them."""
        self.ds = ds
        self.part = part
        self.start, stop = ds.split(split)
        self.rows = rows if rows is not None else batch_rows(stop - self.start, batch_size, steps, seed, shuffle)
        self.lookahead = lookahead
        self.readers = readers
        self.buffers = buffers

    def _read(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        idx = rows + self.start
        if self.buffers is not None:
            packed, dense, ids, labels = pack(self.ds, idx, self.buffers)
            return dense, ids, labels, packed
        dense = torch.from_numpy(np.asarray(self.ds.dense[idx]))
        ids = torch.from_numpy(self.ds.batch_ids(idx))
        labels = torch.from_numpy(np.asarray(self.ds.labels[idx]))
        return dense, ids, labels, None

    def _reads(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Every batch's (dense, ids, labels, packed) in order: read here, or by ``readers`` threads up to twice as
        many batches ahead."""
        r, p = self.part
        parts = (rows[r * (len(rows) // p):(r + 1) * (len(rows) // p)] for rows in self.rows)
        if not self.readers:
            yield from map(self._read, parts)
            return
        with ThreadPoolExecutor(self.readers, thread_name_prefix="hotcold-read") as pool:
            reading: deque = deque()
            try:
                for rows in parts:
                    reading.append(pool.submit(self._read, rows))
                    if len(reading) > 2 * self.readers:
                        yield reading.popleft().result()
                while reading:
                    yield reading.popleft().result()
            finally:
                for f in reading:
                    f.cancel()

    def __iter__(self) -> Iterator[Batch]:
        window: deque = deque()
        step = 0
        for read in self._reads():
            window.append(read)
            if len(window) <= self.lookahead:
                continue  # fill the window before the first batch
            yield self._batch(step, window)
            window.popleft()
            step += 1
        while window:
            yield self._batch(step, window)
            window.popleft()
            step += 1

    def _batch(self, step: int, window: deque) -> Batch:
        dense, ids, labels, packed = window[0]
        return Batch(step, dense, ids, labels, [w[1] for w in list(window)[1:]], packed,
                     self.buffers if packed is not None else None)


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
