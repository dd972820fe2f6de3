"""Rows kept on disk between two passes, written and read by plain file I/O.

A preprocessor that reads its text once appends each chunk's parsed rows to
disk: the final columns as ``.npy`` files whose row count is written last
(``NpyColumn``; raw ids can be rewritten in place once the vocabulary is
known), other fixed-width fields to a ``Spill`` (one raw file per field).
Both live in the dataset writer's temporary directory, so nothing is left
behind when a run dies. They use file reads and writes rather than memory
maps, so resident memory stays at one chunk whatever the row count (pages
of a mapped file count as resident once touched).
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


class NpyColumn:
    """A ``.npy`` file written block by block before its row count is known.

    Rows go after a reserved header of ``HEADER`` bytes; ``finish`` writes the
    header (``np.lib.format``, version 1.0) for the rows written. Blocks can be
    read back and rewritten in place (``read``, ``write_at``: a preprocessor
    spills raw ids into the column and encodes them there).
    """

    HEADER = 128    # np.lib.format pads a 1.0 header to a multiple of 64; any [rows, <= 2 dims] shape takes 128

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.path = Path(path)
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.width = self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))
        self.rows = 0
        self._file = open(self.path, "w+b")
        self._file.write(bytes(self.HEADER))

    def append(self, rows: np.ndarray) -> None:
        rows = self._check(rows)
        self._file.seek(self.HEADER + self.rows * self.width)
        self._file.write(memoryview(rows).cast("B"))
        self.rows += len(rows)

    def read(self, start: int, stop: int) -> np.ndarray:
        count = max(min(stop, self.rows) - start, 0)
        self._file.seek(self.HEADER + start * self.width)
        data = np.fromfile(self._file, dtype=self.dtype, count=count * (self.width // self.dtype.itemsize))
        return data.reshape((count,) + self.shape)

    def write_at(self, start: int, rows: np.ndarray) -> None:
        rows = self._check(rows)
        if start + len(rows) > self.rows:
            raise ValueError(f"{self.path}: rows [{start}, {start + len(rows)}) are past the {self.rows} written")
        self._file.seek(self.HEADER + start * self.width)
        self._file.write(memoryview(rows).cast("B"))

    def retype(self, dtype: np.dtype) -> None:
        """Read and write the rows as ``dtype`` from now on (the same item size: ids rewritten in place)."""
        if np.dtype(dtype).itemsize != self.dtype.itemsize:
            raise ValueError(f"{self.path}: cannot retype {self.dtype} rows as {np.dtype(dtype)}")
        self.dtype = np.dtype(dtype)

    def _check(self, rows: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.shape:
            raise ValueError(f"{self.path}: rows must be {self.shape}, got {rows.shape[1:]}")
        return rows

    def finish(self) -> None:
        """Write the header for the rows written and close the file."""
        self._file.seek(0)
        np.lib.format.write_array_header_1_0(self._file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                          "fortran_order": False,
                                                          "shape": (self.rows,) + self.shape})
        if self._file.tell() != self.HEADER:
            raise ValueError(f"{self.path}: the .npy header takes {self._file.tell()} bytes, not {self.HEADER}")
        self._file.close()

    def close(self) -> None:
        self._file.close()
