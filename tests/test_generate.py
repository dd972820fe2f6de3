"""Tests of the criteo-kaggle-style generator and the skew statistics."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hotcold.data.format import Dataset
from hotcold.data.generate import CRITEO_KAGGLE_CARDINALITIES, GeneratorConfig, generate
from hotcold.data.skew import coverage_curve, coverage_stats
from hotcold.metrics import roc_auc

CAP = 100_000
BIG = [t for t, c in enumerate(CRITEO_KAGGLE_CARDINALITIES) if c >= 90_000]  # tables at (or near) the cap


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("gen") / "kaggle"
    generate(GeneratorConfig(rows=200_000, max_rows_per_table=CAP, seed=0), out, progress=False)
    return Dataset.open(out, verify=True)


def top_ids(ids: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(np.bincount(ids), kind="stable")[::-1][:k].tolist())


def test_cardinalities_splits_and_manifest(ds: Dataset) -> None:
    assert ds.cardinalities == [min(c, CAP) for c in CRITEO_KAGGLE_CARDINALITIES]
    assert GeneratorConfig(max_rows_per_table=None).cardinalities == CRITEO_KAGGLE_CARDINALITIES
    assert ds.num_dense == 13 and ds.num_tables == 26
    assert [ds.split(s) for s in ("train", "val", "test")] == [(0, 180_000), (180_000, 190_000), (190_000, 200_000)]
    m = ds.manifest
    assert (m["name"], m["kind"]) == ("kaggle", "criteo-kaggle-style")
    assert m["generator"]["full_cardinalities"] == CRITEO_KAGGLE_CARDINALITIES
    assert m["generator"]["rows"] == 200_000
    assert 0.23 < m["planted_model"]["ctr"] < 0.27
    assert 0.75 < m["planted_model"]["bayes_auc"] < 0.85
    assert len(m["skew"]["tables"]) == 26 and "top_1%" in m["skew"]["overall"]


def test_ids_in_range_and_dense_features(ds: Dataset) -> None:
    sparse = np.asarray(ds.sparse)
    assert sparse.min() >= 0
    assert (sparse.max(axis=0) < np.asarray(ds.cardinalities)).all()
    dense = np.asarray(ds.dense)
    assert dense.dtype == np.float32 and dense.min() >= 0 and np.isfinite(dense).all()
    counts = np.expm1(dense.astype(np.float64))
    assert np.allclose(counts, np.round(counts), atol=1e-3 * np.maximum(1, counts))  # log(1 + integer count)
    assert (dense == 0).mean() > 0.1 and dense.max() > 8  # zeros and a heavy tail
    assert set(np.unique(ds.labels).tolist()) == {0.0, 1.0}


def test_coverage_on_capped_tables(ds: Dataset) -> None:
    stats = coverage_stats(ds.sparse, ds.cardinalities)
    assert stats == ds.manifest["skew"]
    for t in BIG:
        s = stats["tables"][t]
        assert 0.8 <= s["top_1%"] <= 0.97, s
        assert s["top_0.1%"] < s["top_1%"] < s["top_10%"] <= 1.0
        assert s["max_over_median"] >= 1000, s


def test_popular_ids_are_scattered(ds: Dataset) -> None:
    for t in BIG:
        n = ds.cardinalities[t]
        hot = np.array(sorted(top_ids(np.asarray(ds.sparse[:, t]), 100)))
        assert (hot < 100).sum() < 10
        assert 0.2 * n < np.median(hot) < 0.8 * n


def test_hot_set_drifts_slowly(tmp_path: Path) -> None:
    def first_last_overlap(drift: float) -> float:
        cfg = GeneratorConfig(rows=100_000, drift=drift, drift_segments=4, seed=3)
        generate(cfg, tmp_path / f"d{drift}", progress=False)
        d = Dataset.open(tmp_path / f"d{drift}")
        overlaps = []
        for t in BIG:
            ids = np.asarray(d.sparse[:, t])
            overlaps.append(len(top_ids(ids[:25_000], 100) & top_ids(ids[-25_000:], 100)) / 100)
        return float(np.mean(overlaps))

    drifting, static = first_last_overlap(0.05), first_last_overlap(0.0)
    assert 0.5 < drifting < static - 0.05
    assert static > 0.8


def test_deterministic_per_seed(tmp_path: Path) -> None:
    base = dict(rows=20_000, max_rows_per_table=20_000)
    a = generate(GeneratorConfig(**base), tmp_path / "a", progress=False)
    b = generate(GeneratorConfig(**base), tmp_path / "b", progress=False, chunk_rows=3000)
    c = generate(GeneratorConfig(**base, seed=1), tmp_path / "c", progress=False)
    assert a["sha256"] == b["sha256"]
    assert all(a["sha256"][f] != c["sha256"][f] for f in a["sha256"])


def test_labels_are_learnable(ds: Dataset) -> None:
    """Logistic regression on dense + one-hot of the planted tables reaches test AUC >= 0.70."""
    torch.manual_seed(0)
    tables = ds.manifest["planted_model"]["categorical_tables"]
    dense = torch.from_numpy(np.array(ds.dense))
    ids = torch.from_numpy(np.asarray(ds.sparse)[:, tables].astype(np.int64))
    offsets = torch.tensor(np.cumsum([0] + [ds.cardinalities[t] for t in tables[:-1]]))
    ids = ids + offsets                                   # one-hot columns of all planted tables together
    y = torch.from_numpy(np.array(ds.labels))
    mean, std = dense[: ds.split("train")[1]].mean(0), dense[: ds.split("train")[1]].std(0)
    x = (dense - mean) / std

    lin = torch.nn.Linear(13, 1)
    onehot = torch.nn.Embedding(int(sum(ds.cardinalities[t] for t in tables)), 1)
    torch.nn.init.zeros_(onehot.weight)
    opt = torch.optim.Adam([*lin.parameters(), *onehot.parameters()], lr=0.2)
    a, b = ds.split("train")
    for _ in range(50):
        logit = lin(x[a:b]).squeeze(1) + onehot(ids[a:b]).sum((1, 2))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y[a:b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    a, b = ds.split("test")
    with torch.no_grad():
        score = (lin(x[a:b]).squeeze(1) + onehot(ids[a:b]).sum((1, 2))).numpy()
    assert roc_auc(y[a:b].numpy(), score) >= 0.70


@pytest.mark.parametrize("bad, match", [
    ({"rowz": 10}, r"unknown key.*rowz.*allowed.*rows"),
    ({"rows": 0}, r"rows must be a positive integer"),
    ({"kind": "criteo-terabyte"}, r"unknown kind 'criteo-terabyte'.*criteo-kaggle-style"),
    ({"drift": 1.0}, r"drift must be in \[0, 1\)"),
    ({"holdout_fraction": 0.0}, r"holdout_fraction"),
    ({"exponent": -1}, r"exponent must be"),
    ({"max_rows_per_table": 0}, r"max_rows_per_table"),
    ({"rows": 5}, r"empty split"),
])
def test_bad_config_raises(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeneratorConfig.from_dict(bad)


def test_config_roundtrip() -> None:
    cfg = GeneratorConfig.from_dict({"rows": 1000, "exponent": 1, "seed": 4})
    assert cfg.exponent == 1.0 and isinstance(cfg.exponent, float)
    assert GeneratorConfig.from_dict(cfg.to_dict()) == cfg


def test_coverage_stats_hand_example() -> None:
    # table 0: 1000 rows, id 5 read 10 times, ids 100..119 once; table 1: 2 rows, 15 reads each.
    t0 = np.array([5] * 10 + list(range(100, 120)))
    t1 = np.array([0, 1] * 15)
    stats = coverage_stats(np.stack([t0, t1], axis=1), [1000, 2])
    s0, s1 = stats["tables"]
    assert (s0["rows"], s0["accessed_rows"], s0["table"]) == (1000, 21, 0)
    assert s0["top_0.1%"] == pytest.approx(10 / 30)   # top 1 row
    assert s0["top_1%"] == pytest.approx(19 / 30)     # top 10 rows
    assert s0["top_10%"] == pytest.approx(1.0)        # top 100 rows
    assert s0["max_over_median"] == pytest.approx(10.0)
    assert (s1["top_0.1%"], s1["top_1%"], s1["top_10%"], s1["max_over_median"]) == (0.5, 0.5, 0.5, 1.0)
    overall = stats["overall"]                        # 1002 rows: top 2, 11, 101 rows
    assert (overall["rows"], overall["accessed_rows"], overall["lookups"]) == (1002, 23, 60)
    assert overall["top_0.1%"] == pytest.approx(30 / 60)
    assert overall["top_1%"] == pytest.approx(48 / 60)
    assert overall["top_10%"] == pytest.approx(1.0)


def test_coverage_curve() -> None:
    assert coverage_curve(np.array([5, 0, 3, 2]), [0, 0.25, 0.5, 1.0]).tolist() == pytest.approx([0, 0.5, 0.8, 1.0])
    assert coverage_curve(np.zeros(3), [0.5]).tolist() == [0.0]
    with pytest.raises(ValueError):
        coverage_curve(np.ones(3), [1.5])
