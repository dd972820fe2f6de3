"""On-disk dataset format: ``manifest.json`` plus memory-mapped column files.

Every dataset, generated or preprocessed from the real files, is one
directory in this one format, so everything downstream reads it the same
way. The files are listed in ``Dataset``, a batch's id matrix is described
in ``Dataset.batch_ids``. ``write_dataset`` writes into a temporary sibling
directory and swaps it in (``dirswap``), so the name always holds a complete
dataset with its manifest.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hotcold.data.columns import COLUMNS, DTYPES, PAD, SEQUENCE_COLUMNS, DatasetError, sparse_tables, to_global
from hotcold.data.dirswap import remove_stale, swap_in, temp_dir
from hotcold.files import file_sha256, fsync_file

FORMAT_VERSION = 1


class DatasetWriter:
    """Builds a dataset directory in a temporary sibling, then swaps it into place.

    Columns are memory-mapped ``.npy`` files (``column``), so a streaming
    preprocessor can fill them chunk by chunk in bounded memory. Entering
    removes what killed writers left behind; ``commit`` validates the
    columns, hashes them, writes the manifest and swaps the directory in
    atomically (``dirswap``); leaving the ``with`` block without a commit
    removes it all.
    """

    def __init__(self, out: Path | str) -> None:
        self.out = Path(out)
        self.tmp = temp_dir(self.out)
        self._columns: dict[str, np.ndarray] = {}

    def __enter__(self) -> "DatasetWriter":
        remove_stale(self.out)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self

    def __exit__(self, *exc) -> None:
        self._columns.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def column(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A writable memory-mapped column ``<name>.npy``."""
        if name not in COLUMNS + SEQUENCE_COLUMNS:
            raise DatasetError(f"unknown column {name!r}")
        arr = np.lib.format.open_memmap(self.tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
        self._columns[name] = arr
        return arr

    def commit(
        self,
        *,
        cardinalities: list[int],
        splits: dict[str, tuple[int, int]],
        meta: dict[str, Any],
        sequence: dict[str, Any] | None = None,
        bags: list[int] | None = None,
    ) -> dict[str, Any]:
        """Check the columns, write ``manifest.json`` and move the directory into place.

        ``bags``: multi-hot features, ``bags[t]`` ids of table t a sample (``Dataset``).

        The column files go to disk (fsync) in a thread while they are checked
        and hashed here: the wait for the disk overlaps the work.
        """
        mapped = list(self._columns.values())
        self._columns.clear()
        files = {name: self.tmp / f"{name}.npy" for name in COLUMNS + (SEQUENCE_COLUMNS if sequence else ())
                 if (self.tmp / f"{name}.npy").exists()}
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(_to_disk, mapped, list(files.values()))
            cols = {name: np.load(path, mmap_mode="r") for name, path in files.items()}
            try:
                _check_columns(cols, cardinalities, splits, sequence, bags)
                digests = {path.name: file_sha256(path) for path in files.values()}
            finally:
                synced.result()
        manifest = {
            "format_version": FORMAT_VERSION,
            **meta,
            "rows": int(len(cols["labels"])),
            "num_dense": int(cols["dense"].shape[1]),
            "cardinalities": [int(c) for c in cardinalities],
            "splits": {k: [int(a), int(b)] for k, (a, b) in splits.items()},
            **({"sequence": {"tables": [int(t) for t in sequence["tables"]],
                             "max_length": int(sequence["max_length"])}} if sequence else {}),
            **({"bags": [int(k) for k in bags]} if bags is not None else {}),
            "columns": {n: {"file": f"{n}.npy", "dtype": str(a.dtype), "shape": list(a.shape)}
                        for n, a in cols.items()},
            "sha256": digests,
        }
        del cols
        (self.tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        swap_in(self.tmp, self.out)
        return manifest


def _to_disk(mapped: list[np.ndarray], files: list[Path]) -> None:
    """Write memory-mapped columns back and fsync the column files."""
    for arr in mapped:
        arr.flush()
    for path in files:
        fsync_file(path)


def write_dataset(
    out: Path | str,
    *,
    dense: np.ndarray,
    sparse: np.ndarray,
    labels: np.ndarray,
    cardinalities: list[int],
    splits: dict[str, tuple[int, int]],
    meta: dict[str, Any],
    history: np.ndarray | None = None,
    history_offsets: np.ndarray | None = None,
    sequence: dict[str, Any] | None = None,
    bags: list[int] | None = None,
) -> dict[str, Any]:
    """Write in-memory columns as a complete dataset directory; return its manifest.

    ``meta`` is merged into the manifest (name, kind, generator or source
    parameters, skew statistics...). Sequence datasets also pass
    ``history`` [H, S], ``history_offsets`` [N+1] and
    ``sequence={"tables": [table of each history column], "max_length": L}``;
    multi-hot datasets ``bags`` (``sparse`` then holds ``sum(bags)`` columns).
    """
    arrays = {"dense": dense, "sparse": sparse, "labels": labels}
    if history is not None:
        arrays.update(history=history, history_offsets=history_offsets)
    with DatasetWriter(out) as w:
        for name, arr in arrays.items():
            arr = np.asarray(arr)
            w.column(name, DTYPES[name], arr.shape)[...] = arr
        return w.commit(cardinalities=cardinalities, splits=splits, meta=meta, sequence=sequence, bags=bags)


def _check_columns(cols: dict[str, np.ndarray], cardinalities: list[int],
                   splits: dict[str, tuple[int, int]], sequence: dict[str, Any] | None,
                   bags: list[int] | None = None, chunk: int = 1 << 20) -> None:
    """Shapes, dtypes, id ranges and splits, read in chunks to keep memory bounded."""
    missing = [c for c in COLUMNS + (SEQUENCE_COLUMNS if sequence else ()) if c not in cols]
    if missing:
        raise DatasetError(f"missing column(s) {missing}")
    for name, arr in cols.items():
        if arr.dtype != DTYPES[name]:
            raise DatasetError(f"column {name} must be {np.dtype(DTYPES[name])}, got {arr.dtype}")
    n = len(cols["labels"])
    dense, sparse = cols["dense"], cols["sparse"]
    if dense.ndim != 2 or dense.shape[0] != n:
        raise DatasetError(f"dense must be [N, F] with N={n}, got {dense.shape}")
    if bags is not None and (sequence or len(bags) != len(cardinalities)
                             or not all(isinstance(k, (int, np.integer)) and k >= 1 for k in bags)):
        raise DatasetError(f"bags must give every table's ids a sample (each >= 1; not with histories), "
                           f"got {bags}")
    tables = sparse_tables(len(cardinalities), bags)
    if sparse.ndim != 2 or sparse.shape != (n, len(tables)):
        raise DatasetError(f"sparse must be [N, {len(tables)}], got {sparse.shape}")
    if _out_of_range(sparse, np.asarray(cardinalities)[tables], chunk):
        raise DatasetError("sparse ids must lie in [0, cardinality) per table")
    _check_splits(splits, n)
    if sequence:
        _check_history(cols["history"], cols["history_offsets"], sequence, cardinalities, n, chunk)


def _out_of_range(ids: np.ndarray, card: np.ndarray, chunk: int) -> bool:
    """Whether a column of the [rows, columns] ``ids`` holds an id outside [0, card[column]) (chunk by chunk)."""
    from hotcold.data.integrity import first_out_of_range

    return first_out_of_range(ids, card, chunk) is not None


def _check_history(history, offsets, sequence, cardinalities, n, chunk) -> None:
    tables, max_length = sequence["tables"], sequence["max_length"]
    if history.ndim != 2 or history.shape[1] != len(tables):
        raise DatasetError(f"history must be [H, {len(tables)}] (one column per sequence table), got {history.shape}")
    if offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != len(history):
        raise DatasetError(f"history_offsets must be [N+1] from 0 to {len(history)}")
    lengths = np.diff(offsets)
    if (lengths < 0).any() or (n and lengths.max() > max_length):
        raise DatasetError(f"history lengths must lie in [0, max_length={max_length}]")
    if not all(0 <= t < len(cardinalities) for t in tables):
        raise DatasetError(f"sequence tables {tables} do not all exist")
    if _out_of_range(history, np.asarray(cardinalities)[tables], chunk):
        raise DatasetError("history ids must lie in [0, cardinality) of their tables")


def _check_splits(splits: dict[str, tuple[int, int]], n: int) -> None:
    """Known names, train and test present, each non-empty inside [0, n), no two overlapping (``integrity``)."""
    from hotcold.data.integrity import check_splits

    check_splits(None, splits, n)


@dataclass(frozen=True)
class Dataset:
    """A dataset directory opened read-only with memory-mapped columns.

    A dataset directory holds

    - ``dense.npy``   float32 [N, num_dense]   dense features, already transformed
    - ``sparse.npy``  int32   [N, num_tables]  one id per table, in [0, cardinality); multi-hot
      (``bags: [k_0, ...]`` in the manifest): [N, sum(k)], table t's bag of k_t ids a sample, tables in order
    - ``labels.npy``  float32 [N]              click labels in {0, 1}
    - ``manifest.json`` schema, cardinalities, splits (row ranges), sha256 of each
      column file, the generator or source parameters and measured skew.

    Sequence datasets (Taobao) add per-sample histories as values + offsets:

    - ``history.npy``          int32 [H, S]  S ids per past event (e.g. item, category)
    - ``history_offsets.npy``  int64 [N+1]   sample n owns history rows [off[n], off[n+1])

    with ``sequence: {"tables": [...], "max_length": L}`` in the manifest: column
    s of a history row is an id of table ``tables[s]`` (histories share their
    tables with the target), oldest event first, at most L events per sample.
    """

    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    dense: np.ndarray   # float32 [N, num_dense], memory-mapped
    sparse: np.ndarray  # int32 [N, num_tables] (multi-hot: [N, sum(bags)]), memory-mapped
    labels: np.ndarray  # float32 [N], memory-mapped
    history: np.ndarray | None = None          # int32 [H, S], memory-mapped
    history_offsets: np.ndarray | None = None  # int64 [N+1], memory-mapped
    column_sha256: dict[str, str] | None = None  # {file: sha256} verified against the manifest (``verify``)

    @classmethod
    def open(cls, path: Path | str, verify: bool = False, progress: bool = False) -> "Dataset":
        """Open a dataset, refusing a damaged or inconsistent one with one line naming the file (``integrity``).

        Always checked: the manifest, each file's length, shape and dtype, and
        the contents (ids within their tables, labels in {0, 1}, disjoint
        splits...). ``verify`` also checks the column files' sha256 against the
        manifest (cached while a file is unchanged) and keeps them in
        ``column_sha256``: a run verifies the dataset it trains on.
        """
        from hotcold.data import integrity

        path = Path(path)
        manifest, raw = integrity.read_manifest(path)
        where = integrity.Where(path, manifest.get("name") if isinstance(manifest.get("name"), str) else None)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise where.error("manifest.json", f"format_version {manifest.get('format_version')!r}, "
                                               f"expected {FORMAT_VERSION}")
        integrity.check_manifest(where, manifest)
        names = COLUMNS + (SEQUENCE_COLUMNS if "sequence" in manifest else ())
        arrays = {name: integrity.open_column(where, path, manifest["columns"][name]) for name in names}
        integrity.check_shapes(where, manifest, arrays)
        integrity.check_contents(where, manifest, arrays)  # first: it names the fault, a hash only that one exists
        digests = integrity.verify_sha256(where, path, manifest, progress) if verify else None
        return cls(path, manifest, hashlib.sha256(raw).hexdigest(), **arrays, column_sha256=digests)

    def verified_sha256(self, progress: bool = False) -> dict[str, str]:
        """{file: sha256} of the column files, verified against the manifest (now, unless ``open`` did)."""
        if self.column_sha256 is None:
            from hotcold.data import integrity

            where = integrity.Where(self.path, self.manifest.get("name"))
            object.__setattr__(self, "column_sha256",
                               integrity.verify_sha256(where, self.path, self.manifest, progress))
        return dict(self.column_sha256)

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.path.name)

    @property
    def cardinalities(self) -> list[int]:
        return list(self.manifest["cardinalities"])

    @property
    def num_dense(self) -> int:
        return int(self.manifest["num_dense"])

    @property
    def num_tables(self) -> int:
        return len(self.manifest["cardinalities"])

    @property
    def sequence(self) -> dict[str, Any] | None:
        """``{"tables": [...], "max_length": L}`` for sequence datasets, else None."""
        return self.manifest.get("sequence")

    @property
    def bags(self) -> list[int] | None:
        """Multi-hot datasets: ids a sample of each table (a sum-pooled bag), else None (one id per table)."""
        bags = self.manifest.get("bags")
        return None if bags is None else [int(k) for k in bags]

    @property
    def column_tables(self) -> list[int]:
        """The table of each column of ``batch_ids``."""
        cols = sparse_tables(self.num_tables, self.bags)
        if self.sequence:
            cols += list(self.sequence["tables"]) * self.sequence["max_length"]
        return cols

    @property
    def table_bounds(self) -> np.ndarray:
        """int64 [T+1]: the global row of id 0 of each table, then the number of rows N.

        All tables share one global row space: table t holds rows
        ``[bounds[t], bounds[t+1])``, in table order.
        """
        return np.concatenate([[0], np.cumsum(self.cardinalities)]).astype(np.int64)

    @property
    def column_offsets(self) -> np.ndarray:
        """Global row of id 0 of each ``batch_ids`` column's table: int64 [K] (``StoreSpec.column_offsets``)."""
        return self.table_bounds[np.asarray(self.column_tables, dtype=np.int64)]

    def global_ids(self, rows: np.ndarray) -> np.ndarray:
        """int64 [B, K] global rows looked up by the samples at ``rows``, -1 at padding."""
        return to_global(self.batch_ids(rows), self.column_offsets)

    def global_rows(self, rows: np.ndarray) -> np.ndarray:
        """int64 [L] global rows of the non-padding lookups of the samples at ``rows``, sample by sample."""
        g = self.global_ids(rows)
        return g[g >= 0]

    def batch_ids(self, rows: np.ndarray) -> np.ndarray:
        """int64 [B, K] ids of the samples at ``rows``.

        A batch's ids are one int64 [B, K] matrix: the K ``sparse`` columns,
        then, for sequence datasets, L events of S ids each, most recent last
        and left-padded with -1. ``column_tables`` gives the table of each of
        the K columns, ``column_offsets`` the global row of its id 0 (tables
        share one row space in table order), and ``global_rows`` the global
        rows of a batch's non-padding lookups.
        """
        ids = np.asarray(self.sparse[rows]).astype(np.int64)
        if not self.sequence:
            return ids
        tables, length = self.sequence["tables"], self.sequence["max_length"]
        rows = np.asarray(rows)
        starts = self.history_offsets[rows]
        lengths = self.history_offsets[rows + 1] - starts
        hist = np.full((len(rows), length, len(tables)), PAD, dtype=np.int64)  # [B, L, S]
        sample = np.repeat(np.arange(len(rows)), lengths)
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        hist[sample, length - np.repeat(lengths, lengths) + within] = \
            self.history[np.repeat(starts, lengths) + within]
        return np.concatenate([ids, hist.reshape(len(rows), -1)], axis=1)

    def split(self, name: str) -> tuple[int, int]:
        """Row range ``[start, stop)`` of a split."""
        splits = self.manifest["splits"]
        if name not in splits:
            raise DatasetError(f"{self.path}: no split {name!r} (have {sorted(splits)})")
        a, b = splits[name]
        return int(a), int(b)
