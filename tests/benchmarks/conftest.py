"""The benchmarks' shared data: a Criteo-Kaggle-style dataset at the real table sizes (33.8M rows)."""
from __future__ import annotations

import os

import pytest

from hotcold.data.format import Dataset

FULL_SIZE_SAMPLES = 1_000_000


@pytest.fixture(scope="session")
def kaggle(tmp_path_factory) -> Dataset:
    """The dataset named by ``HOTCOLD_BENCH_KAGGLE`` (a ``hotcold generate`` output), else 1M samples
    generated here once for every benchmark file."""
    path = os.environ.get("HOTCOLD_BENCH_KAGGLE")
    if path:
        return Dataset.open(path)
    from hotcold.data.generators.config import GeneratorConfig
    from hotcold.data.generators.run import generate

    out = tmp_path_factory.mktemp("bench") / "kaggle"
    generate(GeneratorConfig(kind="criteo-kaggle-style", rows=FULL_SIZE_SAMPLES, max_rows_per_table=None, seed=0),
             out, progress=False)
    return Dataset.open(out)
