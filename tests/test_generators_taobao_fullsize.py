"""The full-size model of ``taobao-style`` (``generators.taobao_fullsize``): every user, item and category occurs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotcold.data.format import Dataset
from hotcold.data.generators import GeneratorConfig, generate, taobao_fullsize
from hotcold.data.generators.config import REAL_SAMPLES, TAOBAO_CARDINALITIES
from hotcold.data.generators.occurrences import expected_touched, miss_probability
from hotcold.metrics import roc_auc

SCALE = 1e-3                      # Taobao's tables and its 100.2M behaviours, each times 1/1000
PREFIX = 20_001                   # odd: the last negative is dropped


def small(rows: int | None = None, **kw) -> GeneratorConfig:
    cfg = GeneratorConfig(kind="taobao-style", rows=1_000, max_rows_per_table=None, scale=SCALE, **kw)
    return cfg if rows is None else GeneratorConfig.from_dict({**cfg.to_dict(), "rows": rows})


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("taobao") / "full"
    generate(small(small().full_rows), out, progress=False)
    return Dataset.open(out, verify=True)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out = tmp_path_factory.mktemp("taobao") / "prefix"
    generate(small(PREFIX), out, progress=False)
    return Dataset.open(out, verify=True)


def lookups(ds: Dataset) -> list[np.ndarray]:
    """Per table, every id a sample looks up (targets and histories)."""
    sparse, history = np.asarray(ds.sparse), np.asarray(ds.history)
    return [sparse[:, 0], np.concatenate([sparse[:, 1], history[:, 0]]),
            np.concatenate([sparse[:, 2], history[:, 1]])]


def test_every_user_item_and_category_occurs_over_the_full_dataset(full: Dataset) -> None:
    cfg = small()
    clicks = round(REAL_SAMPLES["taobao-style"] * SCALE)
    assert full.manifest["rows"] == cfg.full_rows == 2 * (clicks - cfg.cardinalities[0])
    for t, (ids, n) in enumerate(zip(lookups(full), full.cardinalities)):
        assert np.bincount(ids, minlength=n).min() >= 1, t
    assert full.manifest["tail"]["overall"]["touched"] == 1.0
    assert full.manifest["generator"]["full_size_model"]["touched_expected"] == [1.0, 1.0, 1.0]


def test_samples_follow_the_click_stream(full: Dataset) -> None:
    """Each user's samples are its clicks after the first, in time order; a history is the user's previous L clicks;
    a negative repeats its positive's user and history with another item of its own category."""
    L = full.sequence["max_length"]
    sparse, labels = np.asarray(full.sparse), np.asarray(full.labels)
    off, hist = np.asarray(full.history_offsets), np.asarray(full.history)
    assert (labels[0::2] == 1).all() and (labels[1::2] == 0).all()
    pos, neg = sparse[0::2], sparse[1::2]
    assert (pos[:, 0] == neg[:, 0]).all() and (pos[:, 1] != neg[:, 1]).all()
    assert np.array_equal(off[1:-1:2] - off[0:-1:2], off[2::2] - off[1:-1:2])         # same history lengths
    item_cat = np.full(full.cardinalities[1], -1)
    item_cat[np.concatenate([sparse[:, 1], hist[:, 0]])] = np.concatenate([sparse[:, 2], hist[:, 1]])
    assert (item_cat[sparse[:, 1]] == sparse[:, 2]).all() and (item_cat[hist[:, 0]] == hist[:, 1]).all()
    model = taobao_fullsize._Model(small())
    assert np.array_equal(np.bincount(pos[:, 0], minlength=full.cardinalities[0]), model.user_clicks - 1)
    rows_of = np.argsort(pos[:, 0], kind="stable")                    # time order within each user (one split each)
    users, starts = np.unique(pos[rows_of, 0], return_index=True)
    for u, a, b in zip(users[:200], starts[:200], np.append(starts[1:], rows_of.size)[:200]):
        r = 2 * rows_of[a:b]
        first = hist[off[r[0]]:off[r[0] + 1], 0]
        assert first.size == 1                                            # the user's first click
        clicks = np.concatenate([first, pos[r // 2, 1]])
        for i, row in enumerate(r):
            assert np.array_equal(hist[off[row]:off[row + 1], 0], clicks[max(0, i + 1 - L):i + 1]), (u, i)


def test_a_prefix_is_the_full_stream_cut_short(full: Dataset, prefix: Dataset) -> None:
    """Each split of a prefix is the start of the full dataset's same split (an odd prefix lacks its last negative)."""
    assert prefix.manifest["rows"] == PREFIX
    for name in ("train", "val", "test"):
        a, b = prefix.split(name)
        fa, _ = full.split(name)
        assert b > a
        assert np.array_equal(prefix.batch_ids(np.arange(a, b)), full.batch_ids(np.arange(fa, fa + b - a))), name
        assert np.array_equal(np.asarray(prefix.labels[a:b]), np.asarray(full.labels[fa:fa + b - a])), name
    assert prefix.labels[-1] == 1


def test_prefix_touches_the_share_the_model_predicts(prefix: Dataset) -> None:
    expected = prefix.manifest["generator"]["full_size_model"]["touched_expected"]
    for t, (ids, n) in enumerate(zip(lookups(prefix), prefix.cardinalities)):
        touched = np.unique(ids).size / n
        assert prefix.manifest["tail"]["tables"][t]["touched"] == touched
        assert abs(touched - expected[t]) < 0.02, (t, touched, expected[t])
    assert expected[0] < 0.95 and expected[1] < 0.8                 # a prefix leaves users and items unseen


def test_miss_probability_by_simulation() -> None:
    counts = np.array([9, 5, 3, 2, 1, 1], dtype=np.int64)
    total, prefix = 30, 12
    rng = np.random.default_rng(0)
    elems = np.repeat(np.arange(counts.size), counts)
    elems = np.concatenate([elems, np.full(total - elems.size, -1)])   # positions holding no lookup
    hits = np.zeros((4000, counts.size))
    for i in range(4000):
        first = rng.permutation(elems)[:prefix]
        hits[i] = np.bincount(first[first >= 0], minlength=counts.size)
    for at_least in (1, 2, 3):
        assert miss_probability(counts, prefix, total, at_least) == pytest.approx((hits < at_least).mean(0), abs=0.03)
    assert 1 - miss_probability(counts, prefix, counts.sum()).mean() == pytest.approx(
        expected_touched(counts, prefix, int(counts.sum())))


def test_deterministic_and_chunk_free(tmp_path: Path) -> None:
    a = generate(small(6_000), tmp_path / "a", progress=False)
    b = generate(small(6_000), tmp_path / "b", progress=False, chunk_rows=777)
    c = generate(small(6_000, seed=1), tmp_path / "c", progress=False)
    assert a["sha256"] == b["sha256"]
    assert all(a["sha256"][f] != c["sha256"][f] for f in ("sparse.npy", "history.npy"))


@pytest.mark.parametrize("stats_samples", [1 << 22, 5_000])
def test_label_model_equals_an_independent_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 stats_samples: int) -> None:
    """Match rates over every row; the test AUC of the history's share in the target's category, past
    STATS_SAMPLES rows on every stride-th (positive, negative) pair, so both labels stay in it."""
    monkeypatch.setattr(taobao_fullsize, "STATS_SAMPLES", stats_samples)
    out = tmp_path / "a"
    lm = generate(small(20_000), out, progress=False)["label_model"]
    ds = Dataset.open(out)
    sparse, labels = np.asarray(ds.sparse), np.asarray(ds.labels)
    off, hist = np.asarray(ds.history_offsets), np.asarray(ds.history)
    lens = np.diff(off)
    matches = np.bincount(np.repeat(np.arange(len(labels)), lens), minlength=len(labels),
                          weights=hist[:, 1] == np.repeat(sparse[:, 2], lens))
    assert lm["category_match_rate_positive"] == (matches[labels == 1] > 0).mean()
    assert lm["category_match_rate_negative"] == (matches[labels == 0] > 0).mean()
    stride = lm.get("statistics_sample_stride", 1)
    assert stride == (1 if stats_samples > 20_000 else 4)
    a, b = ds.split("test")
    rows = np.arange(a, b)
    rows = rows[(rows // 2) % stride == 0]
    share = matches[rows] / np.maximum(lens[rows], 1)
    assert lm["category_match_auc_test"] == pytest.approx(roc_auc(labels[rows], share))


def test_capped_taobao_is_unchanged(tmp_path: Path) -> None:
    """The capped model writes the bytes it wrote before the full-size model existed."""
    m = generate(GeneratorConfig(kind="taobao-style", rows=20_000, max_rows_per_table=5_000), tmp_path / "t",
                 progress=False)
    assert m["sha256"]["sparse.npy"] == "d7605ab47ddfd24a3474ee3a3b0771a6cd168bb6de6831fc6120eb421420280e"
    assert m["sha256"]["history.npy"] == "9d759c3fce16dc7cc17c247e90065b6f205696e92f86ef416cabbb36abbb5d33"
    assert "full_samples" not in m["generator"] and "tail" not in m


def test_full_size_taobao_config() -> None:
    cfg = GeneratorConfig(kind="taobao-style", max_rows_per_table=None)
    assert (cfg.full_samples, cfg.scale, cfg.exponent) == (100_150_807, 1.0, 1.0)
    assert cfg.cardinalities == TAOBAO_CARDINALITIES
    assert cfg.full_rows == 2 * (100_150_807 - 987_994)
    assert GeneratorConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("bad, match", [
    ({"full_samples": 1_900}, r"full_samples must be an integer >= 4163 .*every user clicks twice"),
    ({"rows": 300_000}, r"rows=300000 exceeds the full dataset's 198326 samples"),
    ({"scale": 2.0}, r"scale must be in \(0, 1\]"),
])
def test_bad_full_size_taobao_config_raises(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GeneratorConfig.from_dict({**small().to_dict(), **bad})


def test_a_prefix_too_short_for_every_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="leaves a split without samples"):
        generate(small(30), tmp_path / "x", progress=False)   # 15 clicks, all of train users
    assert not (tmp_path / "x").exists()
