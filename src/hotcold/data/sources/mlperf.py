"""MLPerf's materialized multi-hot Criteo 1TB (Training's ``recommendation_v2``) read into the dataset format.

MLPerf's script ``materialize_synthetic_multihot_dataset.py`` writes, per day d of the 24:

- ``day_{d}_dense.npy``: float32 [N, 13], torchrec's ``log(x + 3)`` of the counts;
- ``day_{d}_labels.npy``: int32 [N, 1];
- ``day_{d}_sparse_multi_hot.npz``: an uncompressed zip of ``0.npy`` ... ``25.npy``, table t's bags as int32
  [N, k_t] (k_t its multi-hot size).

``read_mlperf`` reads the days given (the last is halved into val then test, the first half rounded up, as
MLPerf's reader splits day 23; the others train) into one dataset: the 26 bags side by side (``Dataset``'s
multi-hot layout), each id taken modulo its table's rows as MLPerf's reader does, streamed in chunks from
memory-mapped members, so memory does not grow with the days. A missing or malformed file stops it in one
line naming the file.
"""
from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from hotcold.data.columns import DatasetError
from hotcold.data.format import DatasetWriter

TABLES = 26
NUM_DENSE = 13
CHUNK_ROWS = 1 << 16


def npz_member(path: Path, name: str) -> np.ndarray:
    """The array ``name`` of the uncompressed ``.npz`` at ``path``, memory-mapped (not read)."""
    with zipfile.ZipFile(path) as zf:
        try:
            info = zf.getinfo(name)
        except KeyError:
            raise DatasetError(f"{path}: no {name} in it (table {name.split('.')[0]}'s bags)") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise DatasetError(f"{path}: {name} is compressed; MLPerf writes its bags uncompressed (np.savez)")
    with open(path, "rb") as f:  # the member's local header: 30 bytes, then its name and extra field, then the .npy
        f.seek(info.header_offset)
        header = f.read(30)
        start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + \
            int.from_bytes(header[28:30], "little")
        f.seek(start)
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
    if fortran or len(shape) != 2:
        raise DatasetError(f"{path}: {name} must be a C-ordered [N, k] array, got shape {list(shape)}")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _day(src: Path, day: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """A day's dense, bags (per table) and labels, memory-mapped and checked."""
    files = _day_files(src, day)
    dense = np.load(files["dense.npy"], mmap_mode="r")
    labels = np.load(files["labels.npy"], mmap_mode="r")
    bags = [npz_member(files["sparse_multi_hot.npz"], f"{t}.npy") for t in range(TABLES)]
    n = len(dense)
    if dense.dtype != np.float32 or dense.shape != (n, NUM_DENSE):
        raise DatasetError(f"{files['dense.npy']}: expected float32 [N, {NUM_DENSE}], got {dense.dtype} "
                           f"{list(dense.shape)}")
    if labels.shape not in ((n, 1), (n,)):
        raise DatasetError(f"{files['labels.npy']}: expected [{n}, 1] labels, got {list(labels.shape)}")
    for t, bag in enumerate(bags):
        if bag.dtype != np.int32 or len(bag) != n:
            raise DatasetError(f"{files['sparse_multi_hot.npz']}: {t}.npy must be int32 [{n}, k], got {bag.dtype} "
                               f"{list(bag.shape)}")
    return dense, bags, labels


def _day_files(src: Path, day: int) -> dict[str, Path]:
    """A day's three files, each checked to be there."""
    files = {k: src / f"day_{day}_{k}" for k in ("dense.npy", "sparse_multi_hot.npz", "labels.npy")}
    for path in files.values():
        if not path.is_file():
            raise DatasetError(f"{path}: missing (MLPerf's materialized day {day})")
    return files


def describe_mlperf(src: Path, days: Sequence[int]) -> dict[str, Any]:
    """The provenance of MLPerf's materialized days (``source.json``): each file's name and size, checked to be
    there; not hashed (about 1 TB)."""
    src = Path(src).resolve()
    if not src.is_dir():
        raise DatasetError(f"{src}: not a directory (source.path: MLPerf's materialized day files)")
    files = [{"name": path.name, "day": int(day), "bytes": path.stat().st_size}
             for day in days for path in _day_files(src, day).values()]
    return {"dataset": None, "url": src.as_uri(), "sha256": None, "bytes": sum(f["bytes"] for f in files),
            "files": files}


def read_mlperf(src: Path | str, out: Path | str, days: Sequence[int], rows: Sequence[int], name: str = "mlperf",
                progress: bool = True, chunk_rows: int = CHUNK_ROWS) -> dict[str, Any]:
    """Write the dataset of MLPerf's materialized ``days`` under ``src`` to ``out`` (ids modulo ``rows``); its
    manifest."""
    src, days = Path(src), list(days)
    if len(days) < 2:
        raise DatasetError(f"{src}: give at least two days (the last is halved into val and test), got {days}")
    if len(rows) != TABLES:
        raise DatasetError(f"{src}: rows must give each of the {TABLES} tables' rows, got {len(rows)}")
    parts = [_day(src, d) for d in days]
    bags = [b.shape[1] for b in parts[0][1]]
    for d, (_, day_bags, _) in zip(days, parts):
        if [b.shape[1] for b in day_bags] != bags:
            raise DatasetError(f"{src / f'day_{d}_sparse_multi_hot.npz'}: bag sizes "
                               f"{[b.shape[1] for b in day_bags]} differ from day {days[0]}'s {bags}")
    sizes = [len(p[0]) for p in parts]
    total, train = sum(sizes), sum(sizes[:-1])
    val = math.ceil(sizes[-1] / 2)
    starts = np.cumsum([0] + bags)
    modulo = np.asarray(rows, dtype=np.int64)
    with DatasetWriter(out) as w, tqdm(total=total, unit="rows", desc=f"read {name}", disable=not progress) as bar:
        dense_out = w.column("dense", np.float32, (total, NUM_DENSE))
        sparse_out = w.column("sparse", np.int32, (total, int(starts[-1])))
        labels_out = w.column("labels", np.float32, (total,))
        at = 0
        for dense, day_bags, labels in parts:
            for lo in range(0, len(dense), chunk_rows):
                hi = min(lo + chunk_rows, len(dense))
                dense_out[at + lo:at + hi] = dense[lo:hi]
                labels_out[at + lo:at + hi] = np.asarray(labels[lo:hi]).reshape(-1)
                for t, bag in enumerate(day_bags):
                    sparse_out[at + lo:at + hi, starts[t]:starts[t + 1]] = np.asarray(bag[lo:hi]) % modulo[t]
                bar.update(hi - lo)
            at += len(dense)
        meta = {"name": name, "kind": "mlperf-multihot",
                "source": {"path": str(src.resolve()), "days": days, "samples_per_day": sizes,
                           "dense_transform": "log(x + 3) (torchrec's, as MLPerf stores it)",
                           "ids": "MLPerf's materialized bags, each id modulo its table's rows"}}
        splits = {"train": (0, train), "val": (train, train + val), "test": (train + val, total)}
        return w.commit(cardinalities=[int(r) for r in rows], splits=splits, meta=meta, bags=bags)
