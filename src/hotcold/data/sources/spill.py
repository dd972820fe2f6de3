"""Fixed-width rows kept on disk between two passes, and columns written without mapping them.

A preprocessor that reads its text once parses each chunk into fixed-width
fields and appends them to a ``Spill`` (one raw file per field, in a
directory that dies with the dataset writer's temporary one); once the whole
input is read it knows the row count and the id vocabulary, creates the
columns and fills them from the spill chunk by chunk (``read``,
``ColumnFile``). Both sides use plain file reads and writes rather than
memory maps, so resident memory stays at one chunk whatever the row count
(pages of a mapped file count as resident once touched).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np


class Spill:
    """Rows of named fixed-width fields (``{name: (dtype, per-row shape)}``) appended to files in ``directory``."""

    def __init__(self, directory: Path, fields: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fields = {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in fields.items()}
        self.rows = 0
        self._files = {name: open(self._path(name), "wb") for name in self.fields}

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.bin"

    def append(self, **arrays: np.ndarray) -> None:
        """One block of rows: every field, with the same number of rows."""
        n = {name: len(a) for name, a in arrays.items()}
        if set(n) != set(self.fields) or len(set(n.values())) > 1:
            raise ValueError(f"spill: append needs {sorted(self.fields)} with one row count, got {n}")
        for name, a in arrays.items():
            dtype, shape = self.fields[name]
            a = np.ascontiguousarray(a, dtype=dtype)
            if a.shape[1:] != shape:
                raise ValueError(f"spill: field {name} rows must be {shape}, got {a.shape[1:]}")
            self._files[name].write(memoryview(a).cast("B"))
        self.rows += next(iter(n.values()), 0)

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of field ``name`` (after ``close``)."""
        dtype, shape = self.fields[name]
        width = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        count = max(min(stop, self.rows) - start, 0)
        with open(self._path(name), "rb") as f:
            f.seek(start * width)
            data = np.fromfile(f, dtype=dtype, count=count * int(np.prod(shape, dtype=np.int64)))
        return data.reshape((count,) + shape)

    def remove(self) -> None:
        self.close()
        for name in self.fields:
            self._path(name).unlink(missing_ok=True)


class ColumnFile:
    """Sequential writes into a column a ``DatasetWriter`` created (a ``.npy`` memmap), by file writes."""

    def __init__(self, column: np.memmap) -> None:
        self.dtype, self.shape = column.dtype, column.shape
        self._file = open(column.filename, "r+b")
        self._file.seek(column.offset)
        self.at = 0

    def write(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.shape[1:] or self.at + len(rows) > self.shape[0]:
            raise ValueError(f"column {self._file.name}: rows {rows.shape} do not fit at row {self.at} of {self.shape}")
        self._file.write(memoryview(rows).cast("B"))
        self.at += len(rows)

    def close(self) -> None:
        self._file.close()
