"""On-disk dataset format: ``manifest.json`` plus memory-mapped column files.

A dataset directory holds

- ``dense.npy``   float32 [N, num_dense]   dense features, already transformed
- ``sparse.npy``  int32   [N, num_tables]  one id per table, in [0, cardinality)
- ``labels.npy``  float32 [N]              click labels in {0, 1}
- ``manifest.json`` schema, cardinalities, splits (row ranges), sha256 of each
  column file, the generator or source parameters and measured skew.

``write_dataset`` writes into a temporary sibling directory and renames it, so
a directory with a manifest is always complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
COLUMNS = ("dense", "sparse", "labels")
SPLITS = ("train", "val", "test")


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete or inconsistent."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_dataset(
    out: Path | str,
    *,
    dense: np.ndarray,
    sparse: np.ndarray,
    labels: np.ndarray,
    cardinalities: list[int],
    splits: dict[str, tuple[int, int]],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Write a complete dataset directory atomically and return its manifest.

    ``meta`` is merged into the manifest (name, kind, generator or source
    parameters, skew statistics...).
    """
    out = Path(out)
    n = len(labels)
    if dense.ndim != 2 or dense.shape[0] != n:
        raise DatasetError(f"dense must be [N, F] with N={n}, got {dense.shape}")
    if sparse.ndim != 2 or sparse.shape != (n, len(cardinalities)):
        raise DatasetError(f"sparse must be [N, {len(cardinalities)}], got {sparse.shape}")
    _check_splits(splits, n)
    if n and ((sparse.min(axis=0) < 0).any() or (sparse.max(axis=0) >= np.asarray(cardinalities)).any()):
        raise DatasetError("sparse ids must lie in [0, cardinality) per table")

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        arrays = {
            "dense": np.ascontiguousarray(dense, dtype=np.float32),
            "sparse": np.ascontiguousarray(sparse, dtype=np.int32),
            "labels": np.ascontiguousarray(labels, dtype=np.float32),
        }
        columns, digests = {}, {}
        for name, arr in arrays.items():
            fname = f"{name}.npy"
            np.save(tmp / fname, arr)
            columns[name] = {"file": fname, "dtype": str(arr.dtype), "shape": list(arr.shape)}
            digests[fname] = sha256_file(tmp / fname)
        manifest = {
            "format_version": FORMAT_VERSION,
            **meta,
            "rows": int(n),
            "num_dense": int(dense.shape[1]),
            "cardinalities": [int(c) for c in cardinalities],
            "splits": {k: [int(a), int(b)] for k, (a, b) in splits.items()},
            "columns": columns,
            "sha256": digests,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _check_splits(splits: dict[str, tuple[int, int]], n: int) -> None:
    if "train" not in splits or "test" not in splits:
        raise DatasetError(f"splits need at least 'train' and 'test', got {sorted(splits)}")
    for name, (a, b) in splits.items():
        if name not in SPLITS:
            raise DatasetError(f"unknown split {name!r}; expected one of {SPLITS}")
        if not 0 <= a <= b <= n:
            raise DatasetError(f"split {name!r} = [{a}, {b}) is outside [0, {n})")


@dataclass(frozen=True)
class Dataset:
    """A dataset directory opened read-only with memory-mapped columns."""

    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    dense: np.ndarray   # float32 [N, num_dense], memory-mapped
    sparse: np.ndarray  # int32 [N, num_tables], memory-mapped
    labels: np.ndarray  # float32 [N], memory-mapped

    @classmethod
    def open(cls, path: Path | str, verify: bool = False) -> "Dataset":
        """Open a dataset; ``verify`` re-hashes the column files against the manifest."""
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise DatasetError(f"{path} is not a dataset directory (no manifest.json)")
        raw = mpath.read_bytes()
        manifest = json.loads(raw)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise DatasetError(
                f"{mpath}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"
            )
        arrays = {}
        for name in COLUMNS:
            col = manifest["columns"][name]
            fpath = path / col["file"]
            if not fpath.is_file():
                raise DatasetError(f"{path}: column file {col['file']} is missing")
            if verify and sha256_file(fpath) != manifest["sha256"][col["file"]]:
                raise DatasetError(f"{fpath}: sha256 does not match the manifest (corrupted?)")
            arr = np.load(fpath, mmap_mode="r")
            if list(arr.shape) != col["shape"] or str(arr.dtype) != col["dtype"]:
                raise DatasetError(f"{fpath}: shape/dtype {arr.shape}/{arr.dtype} differ from the manifest")
            arrays[name] = arr
        return cls(path, manifest, hashlib.sha256(raw).hexdigest(), **arrays)

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

    def split(self, name: str) -> tuple[int, int]:
        """Row range ``[start, stop)`` of a split."""
        splits = self.manifest["splits"]
        if name not in splits:
            raise DatasetError(f"{self.path}: no split {name!r} (have {sorted(splits)})")
        a, b = splits[name]
        return int(a), int(b)
