"""Tests of the generators (Criteo Kaggle, Criteo Terabyte and Taobao styles) and the skew statistics."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hotcold.data.format import Dataset
from hotcold.data.generators import KINDS, GeneratorConfig, generate
from hotcold.data.generators.config import (CRITEO_KAGGLE_CARDINALITIES, CRITEO_TERABYTE_CARDINALITIES,
                                            TAOBAO_CARDINALITIES)
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.data.skew import count_lookups, coverage_curve, coverage_from_counts, coverage_stats
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


# --- criteo-terabyte-style -------------------------------------------------------------------------

TB_BIG = [t for t, c in enumerate(CRITEO_TERABYTE_CARDINALITIES) if c >= CAP]


@pytest.fixture(scope="module")
def tb(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("gen") / "terabyte"
    generate(GeneratorConfig(kind="criteo-terabyte-style", rows=120_000, seed=0), out, progress=False)
    return Dataset.open(out, verify=True)


def test_terabyte_cardinalities_splits_and_coverage(tb: Dataset) -> None:
    assert tb.cardinalities == [min(c, CAP) for c in CRITEO_TERABYTE_CARDINALITIES]
    assert len(TB_BIG) == 8 and tb.num_dense == 13
    full = GeneratorConfig(kind="criteo-terabyte-style", max_rows_per_table=None)
    assert full.cardinalities == CRITEO_TERABYTE_CARDINALITIES and full.name == "terabyte"
    assert [tb.split(s) for s in ("train", "val", "test")] == [(0, 115_000), (115_000, 117_500), (117_500, 120_000)]
    m = tb.manifest
    assert (m["name"], m["kind"]) == ("terabyte", "criteo-terabyte-style")
    assert m["generator"]["full_cardinalities"] == CRITEO_TERABYTE_CARDINALITIES
    assert m["generator"]["holdout_fraction"] == pytest.approx(1 / 24)
    assert 0.75 < m["planted_model"]["bayes_auc"] < 0.85 and 0.23 < m["planted_model"]["ctr"] < 0.27
    sparse = np.asarray(tb.sparse)
    assert sparse.min() >= 0 and (sparse.max(axis=0) < np.asarray(tb.cardinalities)).all()
    stats = coverage_stats(sparse, tb.cardinalities)
    assert stats == m["skew"]
    for t in TB_BIG:
        assert 0.8 <= stats["tables"][t]["top_1%"] <= 0.97, stats["tables"][t]


def test_terabyte_deterministic(tmp_path: Path) -> None:
    base = dict(kind="criteo-terabyte-style", rows=10_000, max_rows_per_table=10_000)
    a = generate(GeneratorConfig(**base), tmp_path / "a", progress=False)
    b = generate(GeneratorConfig(**base), tmp_path / "b", progress=False, chunk_rows=1234)
    c = generate(GeneratorConfig(**base, seed=1), tmp_path / "c", progress=False)
    assert a["sha256"] == b["sha256"]
    assert a["sha256"]["sparse.npy"] != c["sha256"]["sparse.npy"]


# --- taobao-style --------------------------------------------------------------------------------

TB_ROWS, TB_CAP = 150_000, 50_000


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("gen") / "taobao"
    generate(GeneratorConfig(kind="taobao-style", rows=TB_ROWS, max_rows_per_table=TB_CAP), out, progress=False)
    return Dataset.open(out, verify=True)


def history_features(ds: Dataset) -> np.ndarray:
    """float32 [N, 3]: target category in history, share of history in it, target item in history."""
    ids = ds.batch_ids(np.arange(len(ds.labels)))                 # [N, 3 + 2L]
    hist = ids[:, 3:].reshape(len(ids), -1, 2)                     # [N, L, 2]
    valid = hist[:, :, 0] >= 0
    cat = (hist[:, :, 1] == ids[:, 2:3]) & valid
    item = (hist[:, :, 0] == ids[:, 1:2]) & valid
    return np.stack([cat.any(1), cat.sum(1) / valid.sum(1).clip(1), item.any(1)], axis=1).astype(np.float32)


def test_taobao_layout(taobao: Dataset) -> None:
    m = taobao.manifest
    assert (m["name"], m["kind"]) == ("taobao", "taobao-style")
    assert taobao.cardinalities == [TB_CAP, TB_CAP, 9439]
    assert m["generator"]["full_cardinalities"] == TAOBAO_CARDINALITIES == [987994, 4162024, 9439]
    assert taobao.sequence == {"tables": [1, 2], "max_length": 20}
    assert taobao.column_tables == [0, 1, 2] + [1, 2] * 20
    assert taobao.dense.shape == (TB_ROWS, 0) and taobao.sparse.shape == (TB_ROWS, 3)
    assert (np.asarray(taobao.labels) == np.tile([1, 0], TB_ROWS // 2)).all()  # each positive, then its negative
    lengths = np.diff(taobao.history_offsets)
    assert lengths.min() >= 1 and lengths.max() == 20 and lengths.mean() > 10
    rows = np.array([0, 7, TB_ROWS - 1])
    ids = taobao.batch_ids(rows)
    assert ids.shape == (3, 43)
    for i, r in enumerate(rows):
        a, b = taobao.history_offsets[r], taobao.history_offsets[r + 1]
        assert (ids[i, 3 + 2 * (20 - (b - a)):] == np.asarray(taobao.history[a:b]).ravel()).all()
        assert (ids[i, 3:3 + 2 * (20 - (b - a))] == -1).all()


def test_taobao_splits_hold_out_users(taobao: Dataset) -> None:
    (a, b), (c, d), (e, f) = (taobao.split(s) for s in ("train", "val", "test"))
    assert a == 0 and b == c and d == e and f == TB_ROWS
    assert abs(b / TB_ROWS - 0.9) < 0.01 and abs((d - c) - (f - e)) < 0.02 * TB_ROWS
    users = np.asarray(taobao.sparse[:, 0])
    train, val, test = set(users[a:b]), set(users[c:d]), set(users[e:f])
    assert not (train & val or train & test or val & test)
    assert len(val) > 100 and len(test) > 100
    assert taobao.manifest["generator"]["split_users"] == {"train": len(train), "val": len(val), "test": len(test)}


def test_taobao_items_have_one_category_and_histories_are_past_clicks(taobao: Dataset) -> None:
    sparse, hist = np.asarray(taobao.sparse), np.asarray(taobao.history)
    both = np.concatenate([sparse[:, 1:], hist]).astype(np.int64)
    pairs = np.unique(both[:, 0] * 10_000 + both[:, 1])             # distinct (item, category)
    assert len(np.unique(pairs // 10_000)) == len(pairs)           # item -> one category
    assert len(np.unique(pairs % 10_000)) > 5000                   # most categories in use
    off = np.asarray(taobao.history_offsets)
    pos, neg = np.arange(0, TB_ROWS, 2), np.arange(1, TB_ROWS, 2)
    assert (sparse[pos, 0] == sparse[neg, 0]).all() and (sparse[pos, 1] != sparse[neg, 1]).all()
    assert (np.diff(off)[pos] == np.diff(off)[neg]).all()
    assert (hist[off[pos[-1]]:off[pos[-1] + 1]] == hist[off[neg[-1]]:off[neg[-1] + 1]]).all()
    # consecutive clicks of a user: the later history ends with the earlier click (a positive's target)
    order = pos[np.argsort(sparse[pos, 0], kind="stable")]         # positives by user, then time
    first, second = order[:-1], order[1:]
    same = sparse[first, 0] == sparse[second, 0]
    assert same.sum() > 10_000
    assert (hist[off[second[same] + 1] - 1] == sparse[first[same], 1:]).all()


def test_taobao_skew(taobao: Dataset) -> None:
    counts = [np.zeros(c, dtype=np.int64) for c in taobao.cardinalities]
    count_lookups(counts, taobao.batch_ids(np.arange(TB_ROWS)), taobao.column_tables)
    stats = coverage_from_counts(counts)
    assert stats == taobao.manifest["skew"]
    users, items, cats = stats["tables"]
    assert 0.45 <= items["top_1%"] <= 0.65 and items["top_0.1%"] >= 0.25 and items["top_10%"] >= 0.7, items
    assert cats["top_10%"] >= 0.75 and users["top_1%"] <= 0.2
    hot = np.argsort(counts[1])[::-1][:100]                        # popular items are scattered
    assert 0.2 * TB_CAP < np.median(hot) < 0.8 * TB_CAP


def test_taobao_labels_are_learnable(taobao: Dataset) -> None:
    """Logistic regression on history-match features of the target reaches test AUC >= 0.65."""
    x = torch.from_numpy(history_features(taobao))
    y = torch.from_numpy(np.array(taobao.labels))
    lin = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=30)
    a, b = taobao.split("train")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(lin(x[a:b]).squeeze(1), y[a:b])
        loss.backward()
        return loss

    opt.step(closure)
    a, b = taobao.split("test")
    with torch.no_grad():
        score = lin(x[a:b]).squeeze(1).numpy()
    assert roc_auc(y[a:b].numpy(), score) >= 0.65
    assert taobao.manifest["label_model"]["category_match_auc_test"] >= 0.65


def test_taobao_interests_drift(tmp_path: Path) -> None:
    def overlap(interest_drift: float) -> float:
        """Mean share of a user's last history categories already in their first history."""
        cfg = GeneratorConfig(kind="taobao-style", rows=30_000, max_rows_per_table=2_000, drift=0.0,
                              interest_drift=interest_drift, seed=2)
        generate(cfg, tmp_path / f"i{interest_drift}", progress=False)
        ds = Dataset.open(tmp_path / f"i{interest_drift}")
        users, off, cats = np.asarray(ds.sparse[:, 0]), np.asarray(ds.history_offsets), np.asarray(ds.history[:, 1])
        shares = []
        for u in np.unique(users)[:500]:
            rows = np.flatnonzero(users == u)[::2]                # positives: one per click
            if len(rows) >= 10:
                a, b = set(cats[off[rows[0]]:off[rows[0] + 1]]), cats[off[rows[-1]]:off[rows[-1] + 1]]
                shares.append(np.isin(b, list(a)).mean())
        return float(np.mean(shares))

    static, drifting = overlap(0.0), overlap(0.2)
    assert static > 0.6 and drifting < static - 0.15


def test_taobao_deterministic(tmp_path: Path) -> None:
    base = dict(kind="taobao-style", rows=8_000, max_rows_per_table=3_000)
    a = generate(GeneratorConfig(**base), tmp_path / "a", progress=False)
    b = generate(GeneratorConfig(**base), tmp_path / "b", progress=False)
    c = generate(GeneratorConfig(**base, seed=1), tmp_path / "c", progress=False)
    assert a["sha256"] == b["sha256"]
    assert all(a["sha256"][f] != c["sha256"][f] for f in ("sparse.npy", "history.npy", "history_offsets.npy"))


def test_taobao_odd_rows_and_too_few_users(tmp_path: Path) -> None:
    generate(GeneratorConfig(kind="taobao-style", rows=1_001, max_rows_per_table=300), tmp_path / "odd", progress=False)
    ds = Dataset.open(tmp_path / "odd", verify=True)
    assert len(ds.labels) == 1_001 and ds.labels[-1] == 1 and ds.split("test")[1] == 1_001
    with pytest.raises(ValueError, match="active user"):
        generate(GeneratorConfig(kind="taobao-style", rows=40, max_rows_per_table=2), tmp_path / "few", progress=False)


def test_kind_defaults_and_roundtrip() -> None:
    kaggle = GeneratorConfig()
    assert (kaggle.name, kaggle.exponent, kaggle.holdout_fraction, kaggle.max_length) == ("kaggle", 1.3, 0.1, None)
    tao = GeneratorConfig(kind="taobao-style")
    assert (tao.name, tao.exponent, tao.max_length, tao.interest_drift) == ("taobao", 1.0, 20, 0.02)
    assert tao.cardinalities == [100_000, 100_000, 9439]
    for kind in KINDS:
        cfg = GeneratorConfig(kind=kind, rows=1000)
        assert GeneratorConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("bad, match", [
    ({"kind": "taobao-style", "max_length": 0}, r"max_length must be an integer >= 1"),
    ({"kind": "taobao-style", "interest_drift": 1.5}, r"interest_drift must be in \[0, 1\]"),
    ({"kind": "taobao-style", "max_rows_per_table": 1}, r"max_rows_per_table >= 2"),
    ({"kind": "criteo-terabyte-style", "max_length": 20}, r"\['max_length'\] only apply to kind 'taobao-style'"),
    ({"interest_drift": 0.1}, r"only apply to kind 'taobao-style'"),
    ({"kind": "taobao"}, r"unknown kind 'taobao'.*taobao-style"),
])
def test_bad_kind_config_raises(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeneratorConfig.from_dict(bad)


def test_power_law_draws_invert_the_cdf_from_one_uniform_each() -> None:
    """A rank is the first whose cumulative weight exceeds the uniform; a prefix of a CDF is the smaller table's."""
    big, small = powerlaw_cdf(1000, 1.3), powerlaw_cdf(50, 1.3)
    assert np.array_equal(big[:50], small)
    u = np.random.default_rng(5).random(4000)
    ranks = draw_ranks(np.random.default_rng(5), 4000, big, 50)
    assert np.array_equal(ranks, draw_ranks(np.random.default_rng(5), 4000, small))
    expected = [min(int(np.sum(small <= x * small[-1])), 49) for x in u]
    assert ranks.tolist() == expected and ranks.dtype == np.int64
    counts = np.bincount(ranks, minlength=50)
    assert counts[0] > counts[5] > counts[40]  # rank 0 the most popular
    shaped = draw_ranks(np.random.default_rng(5), (8, 3), small)
    assert shaped.shape == (8, 3) and shaped.reshape(-1).tolist() == expected[:24]
