"""A batch packed for one copy to the device: dense features, global rows (int32) and labels in one host buffer.

On a GPU a step's inputs cross in one copy, out of memory the GPU copies
from without blocking (pinned). The loader's reader threads gather each
batch straight into such a buffer (``pack``: one compiled loop without the
interpreter's lock for the one-id-per-column datasets), taken from a pool
(``PackedBuffers``) and given back once the copy out of it is done, so no
buffer is pinned or allocated a step.

Layout of a packed batch of B samples, F dense features and K id columns,
in 4-byte words: dense float32 [B, F], rows int32 [B, K], labels float32
[B]. The rows are the ids' global rows (``format.to_global``), with the
number of rows N at padding: the device reads them as they are.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np
import torch

from hotcold.accel import Runtime
from hotcold.jit import jit


def words(b: int, f: int, k: int) -> int:
    """4-byte words of a packed batch."""
    return b * (f + k + 1)


def views(packed: torch.Tensor, b: int, f: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed batch's dense float32 [B, F], rows int32 [B, K] and labels float32 [B], on its device."""
    return (packed[:b * f].view(torch.float32).view(b, f), packed[b * f:b * (f + k)].view(b, k),
            packed[b * (f + k):].view(torch.float32))


@jit
def gather_rows(dense, sparse, labels, samples, offsets, num_rows, out_dense, out_rows, out_labels,
                ids64):  # pragma: no cover - compiled
    """``samples`` of the (memory-mapped) columns into a packed batch's views (ids as global rows, N at
    padding), and their ids as int64."""
    for i in range(samples.size):
        r = samples[i]
        for j in range(dense.shape[1]):
            out_dense[i, j] = dense[r, j]
        for j in range(sparse.shape[1]):
            v = sparse[r, j]
            out_rows[i, j] = v + offsets[j] if v >= 0 else num_rows
            ids64[i, j] = v
        out_labels[i] = labels[r]


class PackedBuffers:
    """Host buffers for packed batches, reused: pinned on CUDA, taken by the readers, given back after their copy.

    ``take`` hands out a buffer whose last copy is done (an event the
    consumer gave back with it), or a new one while fewer than ``most``
    exist; past that it waits for the oldest copy, a wait it counts
    (``Runtime.wait``).
    """

    def __init__(self, rt: Runtime, most: int = 12) -> None:
        self.rt, self.most = rt, most
        self._free: deque[tuple[torch.Tensor, Any]] = deque()  # (buffer, event after its last copy)
        self._made = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> torch.Tensor:
        """A buffer of at least ``n`` int32 words, no copy out of it pending."""
        with self._lock:
            for i, (buf, done) in enumerate(self._free):
                if buf.numel() >= n and (done is None or done.query()):
                    del self._free[i]
                    return buf[:n]
            if self._made < self.most or not self._free:
                self._made += 1
                return self.rt.empty_host(n, dtype=torch.int32)
            buf, done = self._free.popleft()
        self.rt.wait(done, "input buffers")
        return buf[:n] if buf.numel() >= n else self.rt.empty_host(n, dtype=torch.int32)

    def give_back(self, buf: torch.Tensor, done: Any) -> None:
        """``buf`` may be reused once ``done`` (an event after the copy out of it) has happened."""
        with self._lock:
            self._free.append((buf, done))


def global_rows(ids: np.ndarray, offsets: np.ndarray, num_rows: int) -> np.ndarray:
    """ids [B, K] (-1 at padding) -> their global rows, ``num_rows`` at padding (a packed batch's rows)."""
    return np.where(ids >= 0, ids + offsets, num_rows)


def pack(ds: Any, samples: np.ndarray, buffers: PackedBuffers, offsets: np.ndarray, n: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The samples of ``ds`` packed into a buffer of ``buffers``: (packed, dense, ids int64, labels).

    ``offsets`` [K]: ``ds.column_offsets``; ``n``: its number of rows.
    ``dense`` and ``labels`` are views of the packed buffer; ``ids`` [B, K]
    int64 is the host's own copy, for the stores that plan on the host.
    """
    b, f = samples.size, ds.dense.shape[1]
    if ds.sequence:
        ids = ds.batch_ids(samples)
        packed = buffers.take(words(b, f, ids.shape[1]))
        dense, rows, labels = views(packed, b, f, ids.shape[1])
        dense.numpy()[:] = ds.dense[samples]
        rows.numpy()[:] = global_rows(ids, offsets, n)
        labels.numpy()[:] = ds.labels[samples]
        return packed, dense, torch.from_numpy(ids), labels
    k = ds.sparse.shape[1]
    packed = buffers.take(words(b, f, k))
    dense, rows, labels = views(packed, b, f, k)
    ids = np.empty((b, k), dtype=np.int64)
    gather_rows(ds.dense, ds.sparse, ds.labels, np.ascontiguousarray(samples, dtype=np.int64), offsets, n,
                dense.numpy(), rows.numpy(), labels.numpy(), ids)
    return packed, dense, torch.from_numpy(ids), labels
