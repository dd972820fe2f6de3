"""The dataset directory refuses what training cannot use, and swaps in a new dataset without a gap."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hotcold.data.format import Dataset, DatasetError, write_dataset
from hotcold.data.loader import eval_batches


def tiny(out: Path, splits: dict, rows: int = 10, label: float = 0.0) -> dict:
    return write_dataset(out, dense=np.zeros((rows, 1), np.float32), sparse=np.zeros((rows, 2), np.int32),
                         labels=np.full(rows, label, np.float32), cardinalities=[3, 4], splits=splits,
                         meta={"name": out.name})


def test_empty_split_is_refused_when_written_and_opened(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="split 'val' is empty"):
        tiny(tmp_path / "ds", {"train": (0, 10), "val": (10, 10), "test": (10, 10)})
    assert not (tmp_path / "ds").exists()
    tiny(tmp_path / "ds", {"train": (0, 8), "val": (8, 9), "test": (9, 10)})
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["splits"]["test"] = [10, 10]     # a dataset written before empty splits were refused
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=r"ds: split 'test' is empty"):
        Dataset.open(tmp_path / "ds")


def test_eval_batches_on_an_empty_split_fail_clearly(tmp_path: Path) -> None:
    tiny(tmp_path / "ds", {"train": (0, 8), "test": (8, 10)})
    ds = Dataset.open(tmp_path / "ds")
    object.__setattr__(ds, "manifest", {**ds.manifest, "splits": {"train": [0, 10], "test": [10, 10]}})
    with pytest.raises(ValueError, match="split 'test' is empty"):
        next(eval_batches(ds, "test", 4))
