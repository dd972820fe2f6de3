"""The full-size model of the Criteo kinds (``generators.occurrences``) and the tail statistics (``skew.tail_stats``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotcold.data.format import Dataset
from hotcold.data.generators import GeneratorConfig, generate
from hotcold.data.generators.config import CRITEO_KAGGLE_CARDINALITIES, REAL_SAMPLES
from hotcold.data.generators.occurrences import (KAGGLE_ROWS_SEEN_OVER_10, PositionShuffle, TableOccurrences,
                                                 expected_touched, table_counts)
from hotcold.data.skew import tail_stats
from hotcold.trace.profile import dataset_stats, profile_dataset, save_profile

SCALE = 1e-3                                     # Kaggle's tables and its 45.8M samples, each times 1/1000
FULL = round(REAL_SAMPLES["criteo-kaggle-style"] * SCALE)
PREFIX = 6_000


def small(rows: int, **kw) -> GeneratorConfig:
    return GeneratorConfig(rows=rows, max_rows_per_table=None, scale=SCALE, **kw)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("full") / "kaggle"
    generate(small(FULL), out, progress=False)
    return Dataset.open(out, verify=True)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("full") / "prefix"
    generate(small(PREFIX), out, progress=False)
    return Dataset.open(out, verify=True)


def test_table_counts_are_exact_and_at_least_one() -> None:
    for n, total, a in [(1, 1, 1.1), (1, 9, 1.1), (7, 7, 2.0), (1000, 45_000, 1.14), (10_132, 45_841, 0.8)]:
        c = table_counts(n, total, a)
        assert c.sum() == total and c.min() >= 1 and (np.diff(c) <= 0).all() and c.size == n
    with pytest.raises(ValueError, match="1 <= rows <= lookups"):
        table_counts(10, 9, 1.1)


def test_position_shuffle_is_a_bijection() -> None:
    rng = np.random.default_rng(3)
    for size in (1, 2, 3, 17, 1000, 4097):
        out = PositionShuffle(size, rng)(np.arange(size))
        assert np.array_equal(np.sort(out), np.arange(size))
    s = PositionShuffle(10_000, np.random.default_rng(4))
    assert np.array_equal(s(np.arange(10_000))[5_000:], s(np.arange(5_000, 10_000)))   # any positions alone


def test_occurrences_of_a_table_match_its_counts() -> None:
    """Without drift, the ids over the full dataset are the rank counts moved to ids by the permutation."""
    t = TableOccurrences(500, 20_000, 1.14, 0.0, 4, np.random.default_rng(0))
    ids = np.concatenate([t.ids(a, b) for a, b in zip(t.boundaries[:-1], t.boundaries[1:])])
    counts = np.bincount(ids, minlength=500)
    assert np.array_equal(counts[t.perm], t.counts)
    with pytest.raises(ValueError, match="time order"):
        t.ids(0, 10)
    with pytest.raises(ValueError, match="straddle"):
        TableOccurrences(500, 20_000, 1.14, 0.0, 4, np.random.default_rng(0)).ids(4_000, 6_000)


def test_every_row_is_seen_over_the_full_dataset(full: Dataset) -> None:
    sparse = np.asarray(full.sparse)
    for t, n in enumerate(full.cardinalities):
        assert np.bincount(sparse[:, t], minlength=n).min() >= 1, t
    tail = full.manifest["tail"]
    assert tail["overall"]["touched"] == 1.0
    assert full.manifest["generator"]["full_size_model"]["touched_expected"] == [1.0] * 26


def test_a_prefix_is_the_full_process_cut_short(full: Dataset, prefix: Dataset) -> None:
    """The first rows are the same samples; each table touches the share the model predicts."""
    assert np.array_equal(np.asarray(prefix.sparse), np.asarray(full.sparse[:PREFIX]))
    assert np.array_equal(np.asarray(prefix.dense), np.asarray(full.dense[:PREFIX]))
    expected = prefix.manifest["generator"]["full_size_model"]["touched_expected"]
    sparse = np.asarray(prefix.sparse)
    big = [t for t, n in enumerate(prefix.cardinalities) if n > 1000]
    assert len(big) >= 5
    for t in big:
        touched = np.unique(sparse[:, t]).size / prefix.cardinalities[t]
        assert abs(touched - expected[t]) < 0.02, (t, touched, expected[t])
        assert touched < 0.9                      # a prefix leaves rows unseen


def test_expected_touched_by_simulation() -> None:
    counts = np.array([50, 5, 3, 1, 1, 1, 2, 1], dtype=np.int64)
    total, prefix = int(counts.sum()), 20
    rng = np.random.default_rng(0)
    elems = np.repeat(np.arange(counts.size), counts)
    seen = np.mean([np.unique(rng.permutation(elems)[:prefix]).size / counts.size for _ in range(4000)])
    assert expected_touched(counts, prefix, total) == pytest.approx(seen, abs=0.01)
    assert expected_touched(np.ones(100, dtype=np.int64), 25, 100) == pytest.approx(0.25)
    assert expected_touched(counts, total, total) == 1.0


def test_tail_shares_equal_an_independent_count(full: Dataset, prefix: Dataset) -> None:
    for ds in (full, prefix):
        sparse = np.asarray(ds.sparse)
        tail = ds.manifest["tail"]
        rare_all = {k: 0 for k in (2, 8, 64)}
        for t, n in enumerate(ds.cardinalities):
            ids, seen = np.unique(sparse[:, t], return_counts=True)
            s = tail["tables"][t]
            assert s["touched"] == ids.size / n
            for k in (2, 8, 64):
                assert s[f"lookups_seen_lt{k}"] == pytest.approx(seen[seen < k].sum() / len(sparse))
                rare_all[k] += int(seen[seen < k].sum())
        for k in (2, 8, 64):
            assert tail["overall"][f"lookups_seen_lt{k}"] == pytest.approx(rare_all[k] / sparse.size)
    assert full.manifest["tail"]["overall"]["lookups_seen_lt2"] > 0.01   # a tail of rows seen once


def test_dataset_stats_report_the_tail_of_the_train_split(prefix: Dataset, tmp_path: Path) -> None:
    save_profile(profile_dataset(prefix, batch_size=256, window=2, batches=4, seed=0), tmp_path / "p")
    frame = dataset_stats([tmp_path / "p"])
    a, b = prefix.split("train")
    sparse = np.asarray(prefix.sparse[a:b])
    for t, n in enumerate(prefix.cardinalities):
        row = frame[frame["table"] == str(t)].iloc[0]
        _, seen = np.unique(sparse[:, t], return_counts=True)
        assert row["touched"] == pytest.approx(seen.size / n)
        for k in (2, 8, 64):
            assert row[f"lookups_seen_lt{k}"] == pytest.approx(seen[seen < k].sum() / (b - a))
    overall = frame[frame["table"] == "overall"].iloc[0]
    assert overall["touched"] == pytest.approx(frame["accessed_rows"].iloc[:-1].sum() / sum(prefix.cardinalities))


def test_tail_stats_hand_example() -> None:
    s = tail_stats([np.array([0, 1, 1, 5, 100]), np.array([3, 0])])
    t0, t1, o = s["tables"][0], s["tables"][1], s["overall"]
    assert (t0["rows"], t0["touched_rows"], t0["touched"], t0["lookups"]) == (5, 4, 0.8, 107)
    assert (t0["lookups_seen_lt2"], t0["lookups_seen_lt8"], t0["lookups_seen_lt64"]) == (2 / 107, 7 / 107, 7 / 107)
    assert (t1["lookups_seen_lt2"], t1["lookups_seen_lt8"]) == (0.0, 1.0)
    assert (o["rows"], o["touched_rows"], o["lookups"], o["lookups_seen_lt8"]) == (7, 5, 110, 10 / 110)
    with pytest.raises(ValueError, match="integers >= 1"):
        tail_stats([np.ones(3)], thresholds=(0,))


def test_full_size_is_deterministic_and_chunk_free(tmp_path: Path) -> None:
    a = generate(small(9_000), tmp_path / "a", progress=False)
    b = generate(small(9_000), tmp_path / "b", progress=False, chunk_rows=1_000)
    c = generate(small(9_000, seed=1), tmp_path / "c", progress=False)
    assert a["sha256"] == b["sha256"]
    assert all(a["sha256"][f] != c["sha256"][f] for f in ("sparse.npy", "dense.npy"))


def test_kaggle_counts_match_the_measured_tail() -> None:
    """Over the real 45.8M samples, the rows seen more than 10 times number what AutoInt's preprocessing found."""
    cfg = GeneratorConfig(max_rows_per_table=None)
    over_10 = sum(int((table_counts(n, cfg.full_samples, cfg.exponent) > 10).sum())
                  for n in CRITEO_KAGGLE_CARDINALITIES)
    assert abs(over_10 / KAGGLE_ROWS_SEEN_OVER_10 - 1) < 0.03, over_10


def test_capped_output_is_unchanged(tmp_path: Path) -> None:
    """The capped model's ids are the bytes the generator wrote before the full-size model existed."""
    m = generate(GeneratorConfig(rows=20_000, max_rows_per_table=5_000), tmp_path / "k", progress=False)
    assert m["sha256"]["sparse.npy"] == "0e07d9f6760839e6d4a4745774000b21c8e5d66f83be1f8dc008c459ce1112f0"
    assert "full_samples" not in m["generator"] and "tail" not in m


@pytest.mark.parametrize("bad, match", [
    ({"full_samples": 1000}, r"apply only at the real table sizes"),
    ({"kind": "taobao-style", "max_rows_per_table": 400_000, "scale": 0.5}, r"apply only"),
    ({"max_rows_per_table": None, "scale": 0.0}, r"scale must be in \(0, 1\]"),
    ({"max_rows_per_table": None, "scale": 1e-3, "rows": 50_000}, r"rows=50000 exceeds the full dataset's 45841"),
    ({"max_rows_per_table": None, "scale": 1e-3, "full_samples": 5_000, "rows": 1000}, r"full_samples must be"),
])
def test_bad_full_size_config_raises(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeneratorConfig.from_dict(bad)


def test_full_size_config_defaults() -> None:
    cfg = GeneratorConfig(max_rows_per_table=None)
    assert (cfg.full_samples, cfg.scale, cfg.exponent) == (45_840_617, 1.0, 1.146)
    assert cfg.cardinalities == CRITEO_KAGGLE_CARDINALITIES
    tb = GeneratorConfig(kind="criteo-terabyte-style", max_rows_per_table=None)
    assert tb.full_samples == 4_373_472_329
    assert GeneratorConfig.from_dict(cfg.to_dict()) == cfg
    assert small(100).cardinalities[2] == 10_132 and min(small(100).cardinalities) == 1   # scaled up to whole rows
