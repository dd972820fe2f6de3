"""A damaged or edited dataset is refused at open with one line naming the dataset, the file and the fault.

Each damage is one trial of issue 21 (group 1), made in a copy of a small
generated dataset: before these checks, each trained to status ``ok`` or
ended in a traceback or a message naming no file.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from hotcold.cli import main
from hotcold.data import integrity
from hotcold.data.columns import DatasetError
from hotcold.data.format import Dataset
from hotcold.jit import python

# ---------------------------------------------------------------- damages of a copy


def copy_of(ds: Dataset, tmp_path: Path, name: str = "copy") -> Path:
    out = tmp_path / name
    shutil.copytree(ds.path, out)
    return out


def edit_column(path: Path, file: str, edit: Callable[[np.ndarray], None]) -> None:
    arr = np.load(path / file, mmap_mode="r+")
    edit(arr)
    arr.flush()
    del arr


def edit_manifest(path: Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def set_id(row: int, col: int, value: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        edit_column(path, "sparse.npy", lambda a: a.__setitem__((row, col), value))
    return damage


def truncate(path: Path) -> None:
    with open(path / "sparse.npy", "r+b") as f:
        f.truncate((path / "sparse.npy").stat().st_size - 1000)


def bad_json(path: Path) -> None:
    (path / "manifest.json").write_text((path / "manifest.json").read_text()[:-20])


def label_seven(path: Path) -> None:
    edit_column(path, "labels.npy", lambda a: a.__setitem__(11, 7.0))


def cardinality_10(path: Path) -> None:   # table 3 holds ids up to 999 (the trial: 10 for Criteo's 1,460)
    edit_manifest(path, lambda m: m["cardinalities"].__setitem__(3, 10))


def overlapping_splits(path: Path) -> None:  # the trial: a train split reaching into the test split
    edit_manifest(path, lambda m: m["splits"].__setitem__("train", [0, m["splits"]["test"][0] + 500]))


def one_table_fewer(path: Path) -> None:
    edit_manifest(path, lambda m: m["cardinalities"].pop())


def nan_dense(path: Path) -> None:
    edit_column(path, "dense.npy", lambda a: a.__setitem__((3, 2), np.nan))


#: (damage, the file the message must name, what it must say)
DAMAGES = {
    "truncated sparse.npy": (truncate, "sparse.npy", "truncated"),
    "invalid JSON manifest": (bad_json, "manifest.json", "invalid JSON"),
    "id 2**30": (set_id(17, 2, 2**30), "sparse.npy", f"id {2**30} at row 17, column 2 is outside \\[0, 300\\)"),
    "id == cardinality": (set_id(9, 1, 7), "sparse.npy", "id 7 at row 9, column 1 is outside \\[0, 7\\)"),
    "id -1 (padding)": (set_id(4, 0, -1), "sparse.npy", "id -1 \\(padding\\) at row 4"),
    "label 7.0": (label_seven, "labels.npy", "label 7.0 at row 11: labels must be 0 or 1"),
    "cardinality 10 instead of 1000": (cardinality_10, "sparse.npy", "is outside \\[0, 10\\) of table 3"),
    "overlapping splits": (overlapping_splits, "manifest.json", "'train' = .* and 'test' = .* overlap"),
    "cardinalities against sparse.npy": (one_table_fewer, "sparse.npy", "does not match the manifest"),
    "non-finite dense feature": (nan_dense, "dense.npy", "non-finite dense feature nan at row 3, column 2"),
}


def train_cli(path: Path, out: Path) -> int:
    run = {"dataset": "small", "method": "device", "train": {"batch_size": 64, "steps": 3, "warmup_steps": 1,
                                                            "eval_batch_size": 512}}
    return main(["train", "--dataset", str(path), "--run-config", json.dumps(run), "--out", str(out),
                 "--threads", "1", "--device", "cpu", "--no-progress"])


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_dataset_is_refused_at_open_naming_dataset_and_file(small_dataset: Dataset, tmp_path: Path,
                                                                      damage: str) -> None:
    make, file, what = DAMAGES[damage]
    path = copy_of(small_dataset, tmp_path)
    make(path)
    with pytest.raises(DatasetError, match=f"^dataset (small|copy) \\({path}\\): {file}: .*{what}") as exc:
        Dataset.open(path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_training_on_a_damaged_dataset_ends_with_one_line_and_no_record(
        small_dataset: Dataset, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    make, file, what = DAMAGES[damage]
    path = copy_of(small_dataset, tmp_path)
    make(path)
    rc = train_cli(path, tmp_path / "run")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not (tmp_path / "run" / "record.json").exists()
    assert len([line for line in err if line.startswith("hotcold train: error:")]) == 1
    assert re.match(f"hotcold train: error: dataset (small|copy) \\({path}\\): {file}: .*{what}", err[-1])
    assert not [line for line in err if "Traceback" in line]


# ---------------------------------------------------------------- histories (the only padding is in batches)


@pytest.mark.parametrize("value, what", [(-1, "id -1 \\(padding\\) at row 5, column 1 \\(table 2\\)"),
                                         (30, "id 30 at row 5, column 1 is outside \\[0, 30\\) of table 2")])
def test_a_history_id_outside_its_table_is_refused(sequence_dataset: Dataset, tmp_path: Path, value: int,
                                                   what: str) -> None:
    path = copy_of(sequence_dataset, tmp_path)
    edit_column(path, "history.npy", lambda a: a.__setitem__((5, 1), value))
    with pytest.raises(DatasetError, match=f"history.npy: history {what}"):
        Dataset.open(path)
    ds = Dataset.open(sequence_dataset.path)                     # the batches pad; the files never do
    assert (ds.batch_ids(np.arange(64))[:, ds.num_tables:] == -1).any()


def test_history_offsets_longer_than_max_length_are_refused(sequence_dataset: Dataset, tmp_path: Path) -> None:
    path = copy_of(sequence_dataset, tmp_path)
    edit_manifest(path, lambda m: m["sequence"].__setitem__("max_length", 2))
    with pytest.raises(DatasetError, match="history_offsets.npy: sample .* events, outside \\[0, max_length=2\\]"):
        Dataset.open(path)


# ---------------------------------------------------------------- the recorded sha256


def swap_two_ids(path: Path) -> None:
    """A damage every range check passes: two valid ids of one column trade places."""
    def swap(a: np.ndarray) -> None:
        col = np.asarray(a[:, 3])
        r = int(np.flatnonzero(col != col[0])[0])
        a[0, 3], a[r, 3] = col[r], col[0]
    edit_column(path, "sparse.npy", swap)


def test_the_recorded_sha256_is_verified_when_a_run_uses_the_dataset(small_dataset: Dataset, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = copy_of(small_dataset, tmp_path)
    swap_two_ids(path)
    Dataset.open(path)                                           # in range: only the hash can tell
    assert train_cli(path, tmp_path / "run") == 2 and not (tmp_path / "run" / "record.json").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"hotcold train: error: dataset small ({path}): sparse.npy: sha256 ")
    with pytest.raises(DatasetError, match=f"^dataset small \\({path}\\): sparse.npy: sha256 .* differs from the "
                                           f"manifest's"):
        Dataset.open(path, verify=True)


def test_verified_hashes_are_cached_by_size_and_mtime(small_dataset: Dataset, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = copy_of(small_dataset, tmp_path)
    hashed: list[str] = []
    real = integrity._sha256
    monkeypatch.setattr(integrity, "_sha256", lambda p, bar: hashed.append(p.name) or real(p, bar))
    manifest = json.loads((path / "manifest.json").read_text())
    assert Dataset.open(path, verify=True).column_sha256 == manifest["sha256"]
    assert sorted(hashed) == ["dense.npy", "labels.npy", "sparse.npy"]
    cache = json.loads((path / integrity.CACHE).read_text())
    assert {f: e["sha256"] for f, e in cache["files"].items()} == manifest["sha256"]
    assert not [p for p in path.iterdir() if ".tmp" in p.name]     # written atomically
    hashed.clear()
    assert Dataset.open(path, verify=True).column_sha256 == manifest["sha256"] and hashed == []
    os.utime(path / "labels.npy", ns=(0, 1_000_000_000))            # a file changed: hashed again, alone
    assert Dataset.open(path, verify=True).column_sha256 == manifest["sha256"] and hashed == ["labels.npy"]
    swap_two_ids(path)                                              # a damage after a verified run
    with pytest.raises(DatasetError, match="sparse.npy: sha256 .* differs"):
        Dataset.open(path, verify=True)
    edit_manifest(path, lambda m: m["sha256"].__setitem__("dense.npy", "0" * 64))  # the manifest edited
    with pytest.raises(DatasetError, match="dense.npy: sha256 .* differs"):
        Dataset.open(path, verify=True)


def test_a_dataset_that_cannot_hold_the_cache_is_verified_each_time(small_dataset: Dataset, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = copy_of(small_dataset, tmp_path)
    (path / integrity.CACHE).unlink(missing_ok=True)

    def read_only(*args, **kw):
        raise PermissionError("read-only file system")
    monkeypatch.setattr(integrity, "atomic_write_json", read_only)
    assert Dataset.open(path, verify=True).column_sha256 == json.loads((path / "manifest.json").read_text())["sha256"]
    assert not (path / integrity.CACHE).exists()


def test_the_record_carries_the_verified_column_hashes(small_dataset: Dataset, tmp_path: Path) -> None:
    path = copy_of(small_dataset, tmp_path)
    assert train_cli(path, tmp_path / "run") == 0
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    manifest = json.loads((path / "manifest.json").read_text())
    assert record["dataset_column_sha256"] == manifest["sha256"]
    assert record["dataset_manifest_sha256"] == small_dataset.manifest_sha256


# ---------------------------------------------------------------- the checks themselves


def test_the_range_kernel_agrees_with_numpy() -> None:
    rng = np.random.default_rng(3)
    block = rng.integers(-5, 1000, (257, 7)).astype(np.int32)
    for kernel in (integrity.column_bounds, python(integrity.column_bounds)):
        lo = np.full(7, np.iinfo(np.int64).max)
        hi = np.full(7, np.iinfo(np.int64).min)
        kernel(block, lo, hi)
        assert (lo == block.min(axis=0)).all() and (hi == block.max(axis=0)).all()


@pytest.mark.parametrize("numpy_ids", [0, integrity.NUMPY_IDS], ids=["compiled", "numpy"])
@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_the_first_id_out_of_range_is_found_in_any_chunking(chunk: int, numpy_ids: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Either pass: the compiled one over a large dataset's ids, numpy's over a small one's."""
    monkeypatch.setattr(integrity, "NUMPY_IDS", numpy_ids)
    rng = np.random.default_rng(4)
    card = np.array([5, 50, 500])
    ids = (rng.random((300, 3)) * card).astype(np.int32)
    assert integrity.first_out_of_range(ids, card, chunk) is None
    ids[123, 1], ids[200, 0] = 50, -1
    assert integrity.first_out_of_range(ids, card, chunk) == (123, 1, 50)


def test_a_clean_dataset_opens_unchanged(small_dataset: Dataset, sequence_dataset: Dataset) -> None:
    for ds in (small_dataset, sequence_dataset):
        again = Dataset.open(ds.path, verify=True)
        assert again.manifest == ds.manifest and again.manifest_sha256 == ds.manifest_sha256
        assert (np.asarray(again.sparse) == np.asarray(ds.sparse)).all()


def test_without_numba_the_numpy_pass_finds_the_same_fault(small_dataset: Dataset, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(integrity, "KERNEL", "python")
    path = copy_of(small_dataset, tmp_path)
    Dataset.open(path)
    set_id(1000, 3, 1000)(path)
    with pytest.raises(DatasetError, match="sparse.npy: sparse id 1000 at row 1000, column 3 is outside"):
        Dataset.open(path)


def test_a_column_is_read_in_chunks_exactly(small_dataset: Dataset) -> None:
    for arr in (small_dataset.sparse, small_dataset.labels, np.asarray(small_dataset.dense)):
        got = np.concatenate([block.copy() for _, block in integrity.chunks(arr, 1000)])
        assert got.dtype == arr.dtype and (got == np.asarray(arr)).all()
        assert [a for a, _ in integrity.chunks(arr, 1000)] == list(range(0, len(arr), 1000))
