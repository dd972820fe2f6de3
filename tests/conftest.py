"""Shared fixtures: small datasets written in the real on-disk format."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotcold.data.format import Dataset, write_dataset


def make_dataset(path: Path, rows: int = 4096, sizes=(50, 7, 300, 1000), seed: int = 0) -> Dataset:
    """Skewed ids, a learnable label; deliberately independent of the generator."""
    rng = np.random.default_rng(seed)
    sizes = list(sizes)
    dense = rng.lognormal(0.0, 1.0, size=(rows, 13)).astype(np.float32)
    sparse = np.stack([np.minimum(rng.zipf(1.3, rows) - 1, n - 1) for n in sizes], axis=1)
    logit = dense[:, 0] - dense[:, 1] + (sparse[:, 0] % 3 == 0) - 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    n_train = rows * 3 // 4
    write_dataset(path, dense=np.log1p(dense), sparse=sparse, labels=labels, cardinalities=sizes,
                  splits={"train": (0, n_train), "test": (n_train, rows)}, meta={"name": path.name})
    return Dataset.open(path)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("data") / "small")
