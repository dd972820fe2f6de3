"""The Taobao preprocessor's spill of the parsed events: in buckets by user, in memory or in files.

A bucket holds whole users (``user % buckets``) in file order, so the
grouping pass can take one bucket at a time; how many buckets a file gets is
estimated from its size and first chunk (``_buckets``), and changes memory
only, never the output.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from hotcold.config import is_int
from hotcold.data.sources.taobao_group import by_bucket

FIELDS = (("user", np.int32), ("item", np.int32), ("cat", np.int32), ("beh", np.int8), ("ts", np.int64))
BUCKET_EVENTS = 1 << 23      # events per spill bucket aimed at (bounds the grouping pass's memory)
MAX_BUCKETS = 128            # spill files stay few (5 per bucket); past this buckets grow instead


def _buckets(file_bytes: int, first_chunk: tuple[int, int], bucket_events: int | None) -> int:
    """Spill buckets for a file of ``file_bytes`` whose first chunk had ``(lines, bytes)``: enough that none
    should exceed ``bucket_events`` events (for a gzipped file, ``file_bytes`` is a guess of its text
    size, so the estimate may be rough: it only changes memory, never the output)."""
    per = BUCKET_EVENTS if bucket_events is None else bucket_events
    if not (is_int(per) and per >= 1):
        raise ValueError(f"bucket_events must be a positive integer, got {per!r}")
    lines, size = first_chunk
    estimate = file_bytes * lines / max(size, 1)
    return int(min(max(1, math.ceil(estimate / per)), MAX_BUCKETS))


class _EventSpill:
    """Events by user index (bucket: user % buckets), so a bucket holds whole users in file order. One bucket
    stays in memory (at most about ``BUCKET_EVENTS`` events); more go to files, one per bucket and field,
    by plain writes, so resident memory stays at one chunk."""

    def __init__(self, directory: Path, buckets: int, expected: int = 1 << 16, compiled: bool | None = None) -> None:
        self.directory, self.buckets, self.compiled = Path(directory), buckets, compiled
        self.events = 0
        self._held = [np.empty(expected if buckets == 1 else 0, dtype=t) for _, t in FIELDS]
        self._scratch = [np.empty(0, dtype=t) for _, t in FIELDS]
        self._sorted = [np.empty(0, dtype=t) for _, t in FIELDS]    # a chunk's events by bucket
        self._files: list[list[Any]] = []
        if buckets > 1:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._files = [[open(self._path(b, f), "wb") for f, _ in FIELDS] for b in range(buckets)]

    def _path(self, b: int, field: str) -> Path:
        return self.directory / f"bucket{b:04d}.{field}.bin"

    def _grow(self, end: int) -> None:
        if end > self._held[0].size:
            self._held = [np.concatenate([h[:self.events], np.empty(max(end, 2 * h.size) - self.events, dtype=h.dtype)])
                          for h in self._held]

    def append(self, user: np.ndarray, item: np.ndarray, cat: np.ndarray, beh: np.ndarray, ts: np.ndarray) -> None:
        cols = [np.ascontiguousarray(c, dtype=t) for c, (_, t) in zip((user, item, cat, beh, ts), FIELDS)]
        if self.buckets == 1:
            self._grow(self.events + user.size)
            for h, c in zip(self._held, cols):
                h[self.events:self.events + user.size] = c
            self.events += user.size
            return
        self.events += user.size
        if self._sorted[0].size < user.size:
            self._sorted = [np.empty(user.size, dtype=t) for _, t in FIELDS]
        cols, bounds = by_bucket(cols, self.buckets, self._sorted, self.compiled)
        for c, col in enumerate(cols):
            for b in np.flatnonzero(np.diff(bounds)):
                self._files[b][c].write(memoryview(col[bounds[b]:bounds[b + 1]]).cast("B"))

    def room(self, n: int) -> tuple[list[np.ndarray], int]:
        """Columns (user, item, cat, beh, ts) and the row from which a kernel may write up to ``n`` events;
        ``commit`` the ones written."""
        if self.buckets == 1:
            self._grow(self.events + n)
            return self._held, self.events
        if self._scratch[0].size < n:
            self._scratch = [np.empty(n, dtype=t) for _, t in FIELDS]
        return self._scratch, 0

    def commit(self, n: int) -> None:
        """Take the ``n`` events written to ``room``'s columns."""
        if self.buckets == 1:
            self.events += n
        else:
            self.append(*(c[:n] for c in self._scratch))

    def close(self) -> None:
        for files in self._files:
            for f in files:
                f.close()

    def read(self, b: int) -> list[np.ndarray]:
        """Bucket ``b``'s user, item, cat, beh, ts columns (the held bucket is handed over once)."""
        if self.buckets == 1:
            held, self._held = self._held, []
            return [h[:self.events] for h in held]
        return [np.fromfile(self._path(b, f), dtype=t) for f, t in FIELDS]

    def remove(self) -> None:
        self.close()
        self._held = []
        for b in range(len(self._files)):
            for f, _ in FIELDS:
                self._path(b, f).unlink(missing_ok=True)
        if self._files:
            self.directory.rmdir()
