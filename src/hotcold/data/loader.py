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
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

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


class ReadAhead:
    """``read`` of each of ``parts`` on ``threads`` threads, at most ``depth`` ahead of the consumer; in order.

    No future or work item a batch: each thread takes the next part under one
    lock, reads it and files the result under its number, and the consumer
    takes the results in order (an error is raised there, at its batch).
    """

    def __init__(self, read: Callable[[Any], Any], parts: Iterator[Any], threads: int, depth: int) -> None:
        self._read, self._parts, self._depth = read, enumerate(parts), depth
        self._cond = threading.Condition()
        self._done: dict[int, tuple[bool, Any]] = {}   # batch -> (read, result or error)
        self._taken = self._next = 0                   # batches handed out; the next to hand out
        self._last: int | None = None                  # the number of batches, once the parts ran out
        self._stop = False
        self._threads = [threading.Thread(target=self._run, name=f"hotcold-read_{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self._last is None and self._taken - self._next >= self._depth:
                    self._cond.wait()
                if self._stop or self._last is not None:
                    return
                try:
                    i, part = next(self._parts)
                except StopIteration:
                    self._last = self._taken
                    self._cond.notify_all()
                    return
                except BaseException as e:  # noqa: BLE001 - the batch order failed: raised at the batch it owed
                    self._done[self._taken] = (False, e)
                    self._last = self._taken + 1
                    self._cond.notify_all()
                    return
                self._taken += 1
            try:
                got = (True, self._read(part))
            except BaseException as e:  # noqa: BLE001 - raised where the consumer takes this batch
                got = (False, e)
            with self._cond:
                self._done[i] = got
                self._cond.notify_all()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._cond:
                while self._next not in self._done and not (self._last is not None and self._next >= self._last):
                    self._cond.wait()
                if self._next not in self._done:
                    return
                ok, got = self._done.pop(self._next)
                self._next += 1
                self._cond.notify_all()
            if not ok:
                raise got
            yield got

    def close(self) -> None:
        """Stop the threads (a read under way is finished first)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()


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
        self._offsets, self._num_rows = ds.column_offsets, int(sum(ds.cardinalities))  # what packing needs

    def _read(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        idx = rows + self.start
        if self.buffers is not None:
            packed, dense, ids, labels = pack(self.ds, idx, self.buffers, self._offsets, self._num_rows)
            return dense, ids, labels, packed
        dense = torch.from_numpy(np.asarray(self.ds.dense[idx]))
        ids = torch.from_numpy(self.ds.batch_ids(idx))
        labels = torch.from_numpy(np.asarray(self.ds.labels[idx]))
        return dense, ids, labels, None

    def _reads(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Every batch's (dense, ids, labels, packed) in order: read here, or by ``readers`` threads up to twice as
        many batches ahead (``ReadAhead``)."""
        r, p = self.part
        parts = (rows[r * (len(rows) // p):(r + 1) * (len(rows) // p)] for rows in self.rows)
        if not self.readers:
            yield from map(self._read, parts)
            return
        ahead = ReadAhead(self._read, parts, self.readers, 2 * self.readers)
        try:
            yield from ahead
        finally:
            ahead.close()

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
