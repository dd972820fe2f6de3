"""Tests of the access profiles (``hotcold.trace.profile``) and the power-law fit."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hotcold.data.format import Dataset, write_dataset
from hotcold.data.order import batch_rows
from hotcold.data.skew import count_lookups, coverage_from_counts, powerlaw_exponent
from hotcold.trace.profile import (
    coverage_figure,
    dataset_stats,
    load_profile,
    profile_dataset,
    save_profile,
    write_dataset_stats,
)
from hotcold.trace.profile import STATS_COLUMNS

KW = dict(batch_size=256, window=3, batches=7, seed=5)


@pytest.fixture(scope="module")
def seq_ds(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """600 samples of (user, item, category) with 0..4 history events of (item, category)."""
    rng = np.random.default_rng(1)
    n, cards = 600, [40, 500, 30]
    sparse = np.stack([rng.integers(0, c, n) for c in cards], axis=1)
    lengths = rng.integers(0, 5, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    history = np.stack([np.minimum(rng.zipf(1.5, offsets[-1]) - 1, 499), rng.integers(0, 30, offsets[-1])], axis=1)
    path = tmp_path_factory.mktemp("prof") / "seq"
    write_dataset(path, dense=np.zeros((n, 0), np.float32), sparse=sparse, labels=(rng.random(n) < 0.5),
                  cardinalities=cards, splits={"train": (0, 500), "test": (500, n)}, meta={"name": "seq"},
                  history=history, history_offsets=offsets, sequence={"tables": [1, 2], "max_length": 4})
    return Dataset.open(path)


def test_counts_equal_bincount(small_dataset: Dataset) -> None:
    p = profile_dataset(small_dataset, **KW)
    a, b = small_dataset.split("train")
    sparse = np.asarray(small_dataset.sparse[a:b])
    for t, card in enumerate(small_dataset.cardinalities):
        assert p.counts[t].dtype == np.int64
        assert (p.counts[t] == np.bincount(sparse[:, t], minlength=card)).all()
    assert p.params["profiled_rows"] == b - a and p.params["train_rows"] == b - a
    assert p.stats == coverage_from_counts(p.counts)
    assert p.coverage.shape == (small_dataset.num_tables + 1, len(p.fractions))
    assert p.fractions[0] == pytest.approx(1e-4) and p.fractions[-1] == 1.0
    assert np.allclose(p.coverage[:, -1], 1.0) and (np.diff(p.coverage, axis=1) >= 0).all()


def test_counts_include_histories_and_skip_padding(seq_ds: Dataset) -> None:
    p = profile_dataset(seq_ds, **KW)
    off = np.asarray(seq_ds.history_offsets)
    sparse, hist = np.asarray(seq_ds.sparse[:500]), np.asarray(seq_ds.history[: off[500]])
    assert (p.counts[0] == np.bincount(sparse[:, 0], minlength=40)).all()
    assert (p.counts[1] == np.bincount(sparse[:, 1], minlength=500) + np.bincount(hist[:, 0], minlength=500)).all()
    assert (p.counts[2] == np.bincount(sparse[:, 2], minlength=30) + np.bincount(hist[:, 1], minlength=30)).all()


def test_sample_fraction_is_deterministic(small_dataset: Dataset) -> None:
    n = small_dataset.split("train")[1]
    p = profile_dataset(small_dataset, sample_fraction=0.25, **KW)
    assert abs(p.params["profiled_rows"] - 0.25 * n) < 0.04 * n     # 4 standard deviations
    assert p.counts[0].sum() == p.params["profiled_rows"]          # one lookup per sample and table
    again = profile_dataset(small_dataset, sample_fraction=0.25, **KW)
    other = profile_dataset(small_dataset, sample_fraction=0.25, **{**KW, "seed": 6})
    assert all((x == y).all() for x, y in zip(p.counts, again.counts))
    assert any((x != y).any() for x, y in zip(p.counts, other.counts))
    with pytest.raises(ValueError, match="sample_fraction"):
        profile_dataset(small_dataset, sample_fraction=0.0, **KW)


def test_unique_rows_per_batch_and_window(seq_ds: Dataset) -> None:
    p = profile_dataset(seq_ds, batch_size=64, window=2, batches=5, seed=3)
    batches = list(batch_rows(500, 64, 5, 3, "global"))
    tables = np.asarray(seq_ds.column_tables)

    def unique(rows: np.ndarray) -> list[int]:
        ids = seq_ds.batch_ids(rows)
        per = [len(np.unique(ids[:, tables == t][ids[:, tables == t] >= 0])) for t in range(3)]
        return per + [sum(per)]

    assert p.unique_per_batch.tolist() == [unique(b) for b in batches]
    assert p.unique_per_window.tolist() == [unique(np.concatenate(batches[i:i + 2])) for i in (0, 2)]
    lookups = [(seq_ds.batch_ids(b)[:, tables == 1] >= 0).sum() for b in batches]
    assert p.lookups_per_batch[:, 1].tolist() == lookups
    assert (p.lookups_per_batch[:, 0] == 64).all()


def test_count_lookups_dense_and_sparse_paths() -> None:
    counts = [np.zeros(4, dtype=np.int64), np.zeros(1000, dtype=np.int64)]   # table 1 takes the sorting path
    ids = np.array([[0, 5, -1], [3, 5, 999], [0, -1, -1]])
    count_lookups(counts, ids, [0, 1, 1])
    assert counts[0].tolist() == [2, 0, 0, 1]
    assert counts[1].sum() == 3 and counts[1][5] == 2 and counts[1][999] == 1
    with pytest.raises(ValueError, match=r"ids must be \[B, 2\]"):
        count_lookups(counts, ids, [0, 1])
    with pytest.raises(ValueError, match=r"table 0: ids must lie in \[0, 4\)"):
        count_lookups(counts, np.array([[4]]), [0])


@pytest.mark.parametrize("exponent", [0.9, 1.2, 1.5])
def test_exponent_recovered_on_zipf_counts(exponent: float) -> None:
    rng = np.random.default_rng(0)
    p = np.arange(1, 50_001, dtype=np.float64) ** -exponent
    ids = rng.choice(50_000, size=300_000, p=p / p.sum())
    counts = np.bincount(rng.permutation(50_000)[ids], minlength=50_000)   # scattered ids
    assert powerlaw_exponent(counts) == pytest.approx(exponent, abs=0.1)
    assert np.isnan(powerlaw_exponent(np.array([50, 20, 0, 1])))


def test_profile_exponents_are_per_table_fits(small_dataset: Dataset) -> None:
    p = profile_dataset(small_dataset, **KW)
    expected = [powerlaw_exponent(c) for c in p.counts]
    assert np.allclose(p.exponents[:-1], expected, equal_nan=True)
    assert np.isfinite(p.exponents[-1])


def test_save_load_roundtrip(seq_ds: Dataset, tmp_path: Path) -> None:
    p = profile_dataset(seq_ds, **KW)
    written = save_profile(p, tmp_path / "prof")
    assert sorted(f.name for f in (tmp_path / "prof").iterdir()) == ["counts.npz", "profile.json"]
    assert [w.name for w in written] == ["counts.npz", "profile.json"]
    with np.load(tmp_path / "prof" / "counts.npz") as z:
        assert list(z.keys()) == ["table_0", "table_1", "table_2"] and z["table_1"].dtype == np.int64
    q = load_profile(tmp_path / "prof")
    assert (q.dataset, q.cardinalities, q.params) == (p.dataset, p.cardinalities, p.params)
    for name in ("fractions", "coverage", "exponents", "unique_per_batch", "unique_per_window", "lookups_per_batch"):
        assert np.array_equal(getattr(q, name), getattr(p, name), equal_nan=True), name
    assert all((x == y).all() for x, y in zip(p.counts, q.counts))
    doc = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert doc["stats"] == p.stats and doc["params"]["sample_fraction"] == 1.0
    np.savez(tmp_path / "prof" / "counts.npz", **{f"table_{t}": c + 1 for t, c in enumerate(p.counts)})
    with pytest.raises(ValueError, match="sha256"):
        load_profile(tmp_path / "prof")


def test_dataset_stats_and_figure(small_dataset: Dataset, seq_ds: Dataset, tmp_path: Path) -> None:
    dirs = []
    for ds in (small_dataset, seq_ds):
        save_profile(profile_dataset(ds, **KW), tmp_path / ds.name)
        dirs.append(tmp_path / ds.name)
    frame = dataset_stats(dirs)
    assert list(frame.columns) == list(STATS_COLUMNS)
    assert len(frame) == (4 + 1) + (3 + 1)
    assert frame["table"].tolist() == ["0", "1", "2", "3", "overall", "0", "1", "2", "overall"]
    overall = frame[(frame.dataset == "seq") & (frame.table == "overall")].iloc[0]
    p = load_profile(tmp_path / "seq")
    assert overall["top_1%"] == pytest.approx(p.stats["overall"]["top_1%"])
    assert overall["unique_per_batch_mean"] == pytest.approx(p.unique_per_batch[:, -1].mean())
    assert overall["rows"] == 570
    csv = write_dataset_stats(frame, tmp_path / "stats" / "datasets.csv")
    assert pd.read_csv(csv, dtype={"table": str}).shape == frame.shape

    paths = coverage_figure(dirs, tmp_path / "fig")
    assert [x.name for x in paths] == ["coverage.png", "coverage.pdf"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[1].read_bytes()[:4] == b"%PDF"
    assert sorted(x.name for x in (tmp_path / "fig").iterdir()) == ["coverage.pdf", "coverage.png"]
