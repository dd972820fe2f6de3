"""Throughput of the streaming preprocessors on generated files in the real formats (``make bench``).

Each benchmark records rows (or events) per second in ``extra_info``.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hotcold.data.sources.criteo import CriteoConfig, preprocess_criteo
from hotcold.data.sources.taobao import TaobaoConfig, preprocess_taobao

CRITEO_LINES = 500_000
TAOBAO_EVENTS = 1_000_000


def criteo_file(path: Path, n: int, seed: int = 0) -> Path:
    """Criteo TSV: label, 13 integers (some empty or negative), 26 hex ids from skewed pools."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n).astype(str)
    ints = rng.integers(-2, 10_000, (n, 13)).astype(str)
    ints[rng.random((n, 13)) < 0.1] = ""
    pool = rng.integers(0, 2**32, (26, 100_000))
    hexes = np.char.mod("%08x", pool[np.arange(26), np.minimum(rng.zipf(1.2, (n, 26)) - 1, 99_999)])
    hexes[rng.random((n, 26)) < 0.05] = ""
    table = np.concatenate([labels[:, None], ints, hexes], axis=1)
    path.write_text("\n".join("\t".join(row) for row in table) + "\n")
    return path


def taobao_file(path: Path, n: int, seed: int = 0) -> Path:
    """UserBehavior.csv: user, item, category, behaviour, timestamp."""
    rng = np.random.default_rng(seed)
    items = np.minimum(rng.zipf(1.1, n), 400_000)
    rows = np.stack([rng.integers(1, 50_000, n), items, items % 5_000, np.full(n, 0),
                     1_511_500_000 + rng.integers(0, 800_000, n)], axis=1).astype(str)
    rows[:, 3] = np.array(["pv", "buy", "cart", "fav"])[rng.integers(0, 4, n)]
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return path


def _timed(benchmark, fn, count: int) -> None:
    times = []

    def run():
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)

    benchmark.pedantic(run, rounds=2, iterations=1)
    benchmark.extra_info["rows_per_s"] = count / min(times)


@pytest.mark.parametrize("encoding", ["frequency", "modulo"])
def test_criteo_kaggle_throughput(benchmark, tmp_path, encoding):
    src = criteo_file(tmp_path / "train.txt", CRITEO_LINES)
    cfg = CriteoConfig.from_dict({"kind": "criteo-kaggle", "encoding": encoding, "max_ind_range": 1_000_000})
    _timed(benchmark, lambda: preprocess_criteo([src], tmp_path / "out", cfg, name="k", progress=False),
           CRITEO_LINES)


def test_taobao_throughput(benchmark, tmp_path):
    src = taobao_file(tmp_path / "UserBehavior.csv", TAOBAO_EVENTS)
    cfg = TaobaoConfig.from_dict({})
    _timed(benchmark, lambda: preprocess_taobao(src, tmp_path / "out", cfg, name="t", progress=False),
           TAOBAO_EVENTS)
