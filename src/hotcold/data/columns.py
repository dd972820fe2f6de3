"""The dataset format's vocabulary, shared by its writer (``format``), its checks (``integrity``) and its readers.

The column files and their dtypes, the table of each ``sparse`` column, ids made global rows, the splits, the
padding id, the error a bad dataset raises, and dropping a mapped column's pages from a process.
"""
from __future__ import annotations

import mmap

import numpy as np

COLUMNS = ("dense", "sparse", "labels")
SEQUENCE_COLUMNS = ("history", "history_offsets")
PAD = -1
SPLITS = ("train", "val", "test")
DTYPES = {"dense": np.float32, "sparse": np.int32, "labels": np.float32,
          "history": np.int32, "history_offsets": np.int64}


def sparse_tables(num_tables: int, bags: list[int] | None) -> list[int]:
    """The table of each ``sparse`` column: one column per table, or (multi-hot) ``bags[t]`` columns of table t,
    the tables in order."""
    if bags is None:
        return list(range(num_tables))
    return [t for t, k in enumerate(bags) for _ in range(k)]


def to_global(ids: np.ndarray, column_offsets: np.ndarray) -> np.ndarray:
    """Ids [B, K] of the columns' tables -> global rows [B, K] (``offsets[table] + id``); padding stays -1.

    The one place ids become rows: the stores' ``plan``, the loader's traces
    and FAE's classification all go through it.
    """
    return np.where(ids >= 0, ids + column_offsets, -1)


def release_pages(arr: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process (they stay in the file and the page cache).

    Streaming over a column through its mapping would otherwise keep every page
    read or written resident in the process, up to the whole file; written
    pages are flushed first. No-op for arrays that are not memory-mapped.
    """
    base = arr
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    m = getattr(base, "_mmap", None)
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if base.flags.writeable:
        base.flush()
    m.madvise(mmap.MADV_DONTNEED)


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete or inconsistent."""
