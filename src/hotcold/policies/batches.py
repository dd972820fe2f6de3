"""A trace of training batches as their unique rows and lookups, in memory or spooled to a temporary file.

``Trace`` keeps batch t's unique rows (ascending) and their lookup counts
as one flat array each, cut by ``offsets``. ``Trace.spool`` writes them to
an anonymous temporary file as it reads the batches (removed when the trace
is closed or collected, so nothing is left on disk when a job dies), and
``chunks`` reads them back a few thousand batches at a time: the resident
memory of a simulation is then one chunk, whatever the number of batches.
``rows[t]`` and ``counts[t]`` (also sliced) read batches singly.
"""
from __future__ import annotations

import tempfile
from typing import IO, Iterable, Iterator, Sequence

import numpy as np

from hotcold.policies import row_counts

#: batches read back at a time
CHUNK_STEPS = 256
NEVER = np.iinfo(np.int64).max


def unique_counts(batch: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's unique rows (ascending int64) and their lookups (int64); rows must lie in [0, num_rows)."""
    u, c = np.unique(np.asarray(batch, dtype=np.int64), return_counts=True)
    if u.size and (u[0] < 0 or u[-1] >= num_rows):
        raise ValueError(f"trace rows must lie in [0, {num_rows})")
    return u, c.astype(np.int64)


class _Batches(Sequence[np.ndarray]):
    """``trace.rows`` / ``trace.counts``: batch t's array, or a list of them for a slice."""

    def __init__(self, trace: "Trace", column: int) -> None:
        self.trace, self.column = trace, column

    def __len__(self) -> int:
        return len(self.trace)

    def __getitem__(self, index):
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(lo, hi, step)]
            if hi <= lo:
                return []
            block = self.trace.read(lo, hi)
            arr, off = block[self.column], block[2]
            return [arr[off[i]:off[i + 1]] for i in range(hi - lo)]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("batch index out of range")
        block = self.trace.read(index, index + 1)
        return block[self.column]


class Trace:
    """A trace prepared once for many simulations: the unique rows and lookups of each batch.

    ``rows[t]``: int64 [U_t] unique rows of batch t, ascending; ``counts[t]``
    int64 [U_t] their lookups; ``chunks()`` streams them in blocks.
    """

    def __init__(self, num_rows: int, offsets: np.ndarray, flat_rows: np.ndarray | None = None,
                 flat_counts: np.ndarray | None = None, spool: IO[bytes] | None = None,
                 dtype: np.dtype = np.dtype(np.int64), lookups: int = 0) -> None:
        self.num_rows = num_rows
        self.offsets = np.asarray(offsets, dtype=np.int64)   # [T + 1]
        self._rows, self._counts, self._spool, self._dtype = flat_rows, flat_counts, spool, np.dtype(dtype)
        self._next_use: list[np.ndarray] | None = None
        self.rows: Sequence[np.ndarray] = _Batches(self, 0)
        self.counts: Sequence[np.ndarray] = _Batches(self, 1)
        sizes = np.diff(self.offsets)
        self.max_unique = int(sizes.max()) if sizes.size else 0   # the smallest feasible cache
        self.lookups = lookups                                   # all lookups of the trace

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_batches(cls, batches: Iterable[np.ndarray], num_rows: int) -> "Trace":
        """``batches``: global rows of each batch's lookups (int, padding removed); held in memory."""
        rows, counts, sizes = [], [], [0]
        for b in batches:
            u, c = unique_counts(b, num_rows)
            rows.append(u)
            counts.append(c)
            sizes.append(u.size)
        flat = np.concatenate(rows) if rows else np.empty(0, np.int64)
        flat_c = np.concatenate(counts) if counts else np.empty(0, np.int64)
        return cls(num_rows, np.cumsum(sizes), flat, flat_c, lookups=int(flat_c.sum()))

    @classmethod
    def spool(cls, batches: Iterable[np.ndarray], num_rows: int) -> "Trace":
        """Like ``from_batches``, but kept in an anonymous temporary file: memory independent of the batches."""
        dtype = np.dtype(np.int32) if num_rows < 2**31 else np.dtype(np.int64)
        f = tempfile.TemporaryFile(prefix="hotcold-trace-")
        sizes = [0]
        try:
            pending_r, pending_c, pending, lookups = [], [], 0, 0
            for b in batches:
                u, c = unique_counts(b, num_rows)
                pending_r.append(u.astype(dtype))
                pending_c.append(np.minimum(c, np.iinfo(dtype).max).astype(dtype))
                sizes.append(u.size)
                lookups += int(c.sum())
                pending += u.size
                if pending >= 1 << 22:
                    cls._write(f, pending_r, pending_c)
                    pending_r, pending_c, pending = [], [], 0
            cls._write(f, pending_r, pending_c)
        except BaseException:
            f.close()
            raise
        return cls(num_rows, np.cumsum(sizes), spool=f, dtype=dtype, lookups=lookups)

    @staticmethod
    def _write(f: IO[bytes], rows: list[np.ndarray], counts: list[np.ndarray]) -> None:
        """Append pairs (row, count) interleaved per block: a block is its rows, then its counts."""
        if rows:
            f.write(np.concatenate(rows).tobytes())
            f.write(np.concatenate(counts).tobytes())

    def close(self) -> None:
        """Remove the spool file (a spooled trace reads nothing after this)."""
        if self._spool is not None:
            self._spool.close()

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.offsets.size - 1

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batches ``[lo, hi)``: flat rows, flat counts (int64) and offsets from 0 (int64 [hi - lo + 1])."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        off = self.offsets[lo:hi + 1] - a
        if self._spool is None:
            return self._rows[a:b], self._counts[a:b], off
        rows = np.empty(b - a, dtype=np.int64)
        counts = np.empty(b - a, dtype=np.int64)
        # the file holds blocks written by _write: find the blocks overlapping [a, b)
        for (blo, bhi, pos) in self._blocks():
            s, e = max(a, blo), min(b, bhi)
            if s >= e:
                continue
            n, w = bhi - blo, self._dtype.itemsize
            rows[s - a:e - a] = self._pread(pos + (s - blo) * w, e - s)
            counts[s - a:e - a] = self._pread(pos + (n + s - blo) * w, e - s)
        return rows, counts, off

    def _pread(self, pos: int, n: int) -> np.ndarray:
        self._spool.seek(pos)
        return np.frombuffer(self._spool.read(n * self._dtype.itemsize), dtype=self._dtype)

    def _blocks(self) -> list[tuple[int, int, int]]:
        """(first unique access, end, file position) of each block the spool was written in."""
        if getattr(self, "_block_index", None) is None:
            out, start, pos, pending = [], 0, 0, 0
            sizes = np.diff(self.offsets)
            for s in sizes.tolist():
                pending += s
                if pending >= 1 << 22:
                    out.append((start, start + pending, pos))
                    pos += 2 * pending * self._dtype.itemsize
                    start, pending = start + pending, 0
            if pending:
                out.append((start, start + pending, pos))
            self._block_index = out
        return self._block_index

    def chunks(self, steps: int = CHUNK_STEPS, lo: int = 0, hi: int | None = None
               ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(first step, flat rows, flat counts, offsets) of batches ``[lo, hi)``, ``steps`` at a time."""
        hi = len(self) if hi is None else hi
        for t in range(lo, hi, steps):
            yield (t, *self.read(t, min(t + steps, hi)))

    def frequencies(self) -> np.ndarray:
        """Lookups of every row over the trace: int64 [N]."""
        out = np.zeros(self.num_rows, dtype=np.int64)
        for _, r, c, _ in self.chunks():
            row_counts.add_counts(out, r, c)
        return out

    def next_use(self) -> list[np.ndarray]:
        """For each step, the next step using each of its unique rows (``NEVER``: none). Held in memory."""
        if self._next_use is None:
            nxt = self.flat_next_use()
            self._next_use = np.split(nxt, self.offsets[1:-1]) if len(self) else []
        return self._next_use

    def flat_next_use(self) -> np.ndarray:
        """``next_use`` as one array aligned with the flat rows: int64 [sum U_t] (the whole trace in memory)."""
        flat, _, _ = self.read(0, len(self))
        steps = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.offsets))
        order = np.argsort(flat, kind="stable")  # by row, then step
        srow, sstep = flat[order], steps[order]
        same = srow[1:] == srow[:-1]
        nxt_sorted = np.full(flat.size, NEVER, dtype=np.int64)
        nxt_sorted[:-1][same] = sstep[1:][same]
        nxt = np.empty_like(nxt_sorted)
        nxt[order] = nxt_sorted
        return nxt
