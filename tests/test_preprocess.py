"""Tests of the streaming Criteo and Taobao preprocessors on tiny files in the real formats."""
from __future__ import annotations

import gzip
import hashlib
import math
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hotcold.config import ConfigError
from hotcold.files import file_sha256
from hotcold.data.sources import criteo, criteo_counts, criteo_parse, textparse
from hotcold.data.sources.criteo import preprocess_criteo
from hotcold.data.sources.criteo_config import CriteoConfig
from hotcold.data.format import Dataset
from hotcold.data.skew import coverage_stats
from hotcold.data.sources.taobao import preprocess_taobao
from hotcold.data.sources.taobao_config import TaobaoConfig

# ---------------------------------------------------------------- Criteo fixtures


def line(label, ints, cats) -> str:
    """One Criteo TSV line; None is an empty (missing) field."""
    fields = [str(label)] + ["" if v is None else str(v) for v in ints] + ["" if c is None else c for c in cats]
    return "\t".join(fields) + "\n"


def random_lines(n: int, seed: int = 0, pool: int = 50) -> list[str]:
    """Lines with negative/empty integers and skewed hex ids drawn from ``pool`` values per table."""
    rng = np.random.default_rng(seed)
    pools = [[f"{v:08x}" for v in rng.integers(0, 2**32, pool)] for _ in range(26)]
    ints = rng.integers(-3, 5000, (n, 13))
    empty_int = rng.random((n, 13)) < 0.1
    picks = np.minimum(rng.zipf(1.5, (n, 26)) - 1, pool - 1)
    empty_cat = rng.random((n, 26)) < 0.1
    labels = rng.integers(0, 2, n)
    return [line(labels[i], [None if empty_int[i, j] else ints[i, j] for j in range(13)],
                 [None if empty_cat[i, t] else pools[t][picks[i, t]] for t in range(26)]) for i in range(n)]


def write(path: Path, lines: list[str]) -> Path:
    data = "".join(lines).encode()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def parse_reference(lines: list[str]) -> tuple[list[float], list[list[int]], list[list[str | None]]]:
    """Plain-Python parse: labels, integers (missing -> 0), hex strings (missing -> None)."""
    labels, ints, cats = [], [], []
    for ln in lines:
        f = ln.rstrip("\n").split("\t")
        labels.append(float(f[0]))
        ints.append([int(v) if v else 0 for v in f[1:14]])
        cats.append([v or None for v in f[14:]])
    return labels, ints, cats


def frequency_vocab(cats: list[list[str | None]], min_frequency: int = 1) -> list[dict[str, int]]:
    """Per table: hex -> id, 1..n by descending count, ties by raw value (the documented layout)."""
    out = []
    for t in range(26):
        counts = Counter(c[t] for c in cats if c[t] is not None)
        kept = sorted((v for v in counts if counts[v] >= min_frequency), key=lambda v: (-counts[v], int(v, 16)))
        out.append({v: i + 1 for i, v in enumerate(kept)})
    return out


def run(inputs, out, progress=False, **cfg):
    return preprocess_criteo(list(inputs), out, CriteoConfig(**cfg), name=out.name, progress=progress)


# ---------------------------------------------------------------- Criteo


def test_values_and_frequency_ids(tmp_path: Path) -> None:
    lines = random_lines(700, seed=1)
    m = run([write(tmp_path / "train.txt", lines)], tmp_path / "ds", kind="criteo-kaggle")
    ds = Dataset.open(tmp_path / "ds", verify=True)
    labels, ints, cats = parse_reference(lines)
    assert np.array_equal(ds.labels, labels)
    assert np.allclose(ds.dense, np.log1p(np.maximum(np.array(ints, dtype=np.float64), 0)), rtol=1e-6)
    train_end = ds.split("train")[1]
    assert train_end == 600   # 7 days of 100 lines, days 0-5 train
    vocab = frequency_vocab(cats[:train_end])
    expect = np.array([[vocab[t].get(c[t], 0) if c[t] else 0 for t in range(26)] for c in cats])
    assert np.array_equal(ds.sparse, expect)
    assert ds.cardinalities == [len(v) + 1 for v in vocab]
    assert m["full_cardinalities"] == [len(v) for v in vocab]
    assert m["bad_lines"]["total"] == 0 and m["raw_lines"] == 700


def test_hand_made_ranks_rare_bucket_and_unseen(tmp_path: Path) -> None:
    zeros = [0] * 13
    col = ["aaaaaaaa"] * 5 + ["bbbbbbbb"] * 3 + ["0000000c"] * 3 + [None] + ["0000000d", "aaaaaaaa"]  # 12 train + 2
    lines = [line(1, zeros, [c] * 26) for c in col]
    for mf, expect, card in [(1, [1] * 5 + [3] * 3 + [2] * 3 + [0, 0, 1], 4), (4, [1] * 5 + [0] * 7 + [0, 1], 2)]:
        run([write(tmp_path / "train.txt", lines)], tmp_path / f"mf{mf}", kind="criteo-kaggle", min_frequency=mf)
        ds = Dataset.open(tmp_path / f"mf{mf}")
        assert ds.sparse[:, 0].tolist() == expect   # ties by raw value: 0x0c before 0xbb...; unseen 0x0d -> 0
        assert ds.cardinalities == [card] * 26


def test_modulo_convention(tmp_path: Path) -> None:
    lines = random_lines(300, seed=2)
    run([write(tmp_path / "train.txt", lines)], tmp_path / "ds", kind="criteo-kaggle", encoding="modulo",
        max_ind_range=1000)
    ds = Dataset.open(tmp_path / "ds")
    _, _, cats = parse_reference(lines)
    assert np.array_equal(ds.sparse, [[int(c or "0", 16) % 1000 for c in row] for row in cats])
    assert ds.cardinalities == [1000] * 26


@pytest.mark.parametrize("encoding", ["frequency", "modulo"])
def test_skew_from_counts_matches_coverage_stats(tmp_path: Path, encoding: str) -> None:
    m = run([write(tmp_path / "train.txt", random_lines(500, seed=3))], tmp_path / "ds", kind="criteo-kaggle",
            encoding=encoding, max_ind_range=5000, chunk_lines=64)
    ds = Dataset.open(tmp_path / "ds")
    a, b = ds.split("train")
    assert m["skew"] == coverage_stats(np.asarray(ds.sparse[a:b]), ds.cardinalities)


def test_kaggle_day_split_rounding(tmp_path: Path) -> None:
    # 107 lines: divmod(107, 7) = (15, 2) -> days [16, 16, 15, 15, 15, 15, 15]; last day 15 -> val 8, test 7
    run([write(tmp_path / "train.txt", random_lines(107))], tmp_path / "ds", kind="criteo-kaggle", chunk_lines=10)
    ds = Dataset.open(tmp_path / "ds")
    assert [ds.split(s) for s in ("train", "val", "test")] == [(0, 92), (92, 100), (100, 107)]


def test_terabyte_days_gzip_and_train_only_vocabulary(tmp_path: Path) -> None:
    lines = random_lines(20, seed=4)
    days = [write(tmp_path / "day_0.gz", lines[:5]), write(tmp_path / "day_1.gz", lines[5:11]),
            write(tmp_path / "day_2", lines[11:])]
    m = run(days, tmp_path / "ds", kind="criteo-terabyte", chunk_lines=4)
    ds = Dataset.open(tmp_path / "ds")
    assert [ds.split(s) for s in ("train", "val", "test")] == [(0, 11), (11, 16), (16, 20)]  # last day 9 -> 5 + 4
    _, _, cats = parse_reference(lines)
    vocab = frequency_vocab(cats[:11])
    assert np.array_equal(ds.sparse, [[vocab[t].get(c[t], 0) if c[t] else 0 for t in range(26)] for c in cats])
    assert [s["file"] for s in m["source"]] == ["day_0.gz", "day_1.gz", "day_2"]
    with pytest.raises(ValueError, match="at least two day files"):
        run(days[:1], tmp_path / "one", kind="criteo-terabyte")


def bad_fixture() -> tuple[list[str], dict[int, str]]:
    """Good random lines with malformed ones at known 1-based line numbers."""
    lines = random_lines(40, seed=5)
    good = lines[0].rstrip("\n").split("\t")

    def edit(i: int, v: str) -> str:
        return "\t".join(good[:i] + [v] + good[i + 1:]) + "\n"
    bad = {3: "\t".join(good[:-1]) + "\n",          # 39 fields
           7: lines[6].rstrip("\n") + "\t\n",        # 41 fields
           9: "\n",                                  # empty line
           12: edit(0, "2"), 13: edit(0, ""),       # labels
           20: edit(3, "1.5"), 21: edit(5, "-"), 22: edit(1, "12a"),
           30: edit(14, "zzzzzzzz"), 31: edit(20, "abc"), 32: edit(39, "123456789")}
    for n, text in bad.items():
        lines[n - 1] = text
    reasons = {3: "fields", 7: "fields", 9: "fields", 12: "label", 13: "label", 20: "integer", 21: "integer",
               22: "integer", 30: "hex", 31: "hex", 32: "hex"}
    return lines, reasons


def test_malformed_lines_counted_and_skipped(tmp_path: Path) -> None:
    lines, reasons = bad_fixture()
    m = run([write(tmp_path / "train.txt", lines)], tmp_path / "ds", kind="criteo-kaggle", chunk_lines=8,
            max_bad_share=0.5)
    assert m["bad_lines"]["total"] == len(reasons) and m["raw_lines"] == 40
    assert m["bad_lines"]["by_reason"] == {**dict.fromkeys(criteo.REASONS, 0), **Counter(reasons.values())}
    assert [(e["file"], e["line"], e["reason"]) for e in m["bad_lines"]["first"]] == \
        [("train.txt", n, r) for n, r in sorted(reasons.items())][:textparse.MAX_BAD_EXAMPLES]
    ds = Dataset.open(tmp_path / "ds")
    kept = [ln for i, ln in enumerate(lines, 1) if i not in reasons]
    labels, ints, _ = parse_reference(kept)
    assert ds.manifest["rows"] == len(kept) and np.array_equal(ds.labels, labels)
    assert np.allclose(ds.dense, np.log1p(np.maximum(np.array(ints, dtype=np.float64), 0)), rtol=1e-6)
    # day boundaries stay on raw lines: 40 lines -> days [6, 6, 6, 6, 6, 5, 5]; train = lines 1-35
    assert ds.split("train") == (0, 35 - len(reasons))


def test_bad_line_error_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, _ = bad_fixture()
    src = write(tmp_path / "train.txt", lines)
    with pytest.raises(ValueError, match=r"train\.txt: line 3: wrong number of fields"):
        run([src], tmp_path / "ds", kind="criteo-kaggle", on_bad_line="error")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]

    def boom(*args):
        raise RuntimeError("encode failed")
    monkeypatch.setattr(criteo._Encoder, "encode", boom)   # a failure while the columns are half written
    with pytest.raises(RuntimeError, match="encode failed"):
        run([write(src, random_lines(30))], tmp_path / "ds", kind="criteo-kaggle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_row_count_check(tmp_path: Path) -> None:
    src = write(tmp_path / "train.txt", random_lines(14))
    with pytest.raises(ValueError, match=r"expected 45,840,617 lines for the full input, found 14"):
        run([src], tmp_path / "ds", kind="criteo-kaggle", check_rows=True)
    with pytest.raises(ValueError, match=r"expected 45,840,617 lines.*found 14"):
        preprocess_criteo([src], tmp_path / "ds", CriteoConfig(kind="criteo-kaggle"), name="k", progress=False,
                          full=True)
    with pytest.raises(ValueError, match=r"expected 15 lines.*found 14"):
        run([src], tmp_path / "ds", kind="criteo-kaggle", expected_rows=15)
    days = [write(tmp_path / f"day_{d}.gz", random_lines(5, seed=d)) for d in range(24)]
    with pytest.raises(ValueError, match=r"expected 4,373,472,329 lines.*found 120"):
        run(days, tmp_path / "ds", kind="criteo-terabyte", check_rows=True)
    with pytest.raises(ValueError, match="full criteo-terabyte input is 24 day files, got 2"):
        run(days[:2], tmp_path / "ds", kind="criteo-terabyte", check_rows=True)
    with pytest.raises(ValueError, match=r"expected 11 lines.*found 10"):
        run(days[:2], tmp_path / "ds", kind="criteo-terabyte", expected_rows=11)
    assert not (tmp_path / "ds").exists()
    assert run([src], tmp_path / "ds", kind="criteo-kaggle", expected_rows=14)["rows"] == 14


def test_determinism_and_provenance(tmp_path: Path) -> None:
    src = write(tmp_path / "train.txt", random_lines(300, seed=6))
    prov = {"train.txt": {"sha256": "ab" * 32, "url": "https://example.org/train.txt"}}
    m1 = preprocess_criteo([src], tmp_path / "a", CriteoConfig(kind="criteo-kaggle", chunk_lines=7), name="a",
                           provenance=prov, progress=False)
    m2 = run([src], tmp_path / "b", kind="criteo-kaggle", chunk_lines=1000, progress=True)
    assert m1["sha256"] == m2["sha256"]   # independent of the chunk size too
    assert m1["source"] == [{"file": "train.txt", "bytes": src.stat().st_size, "sha256": file_sha256(src),
                             "url": prov["train.txt"]["url"], "fetched_sha256": "ab" * 32}]
    assert m1["preprocess"]["kind"] == "criteo-kaggle" and m1["preprocess"]["chunk_lines"] == 7
    with pytest.raises(ValueError, match="not inputs.*other.txt"):
        preprocess_criteo([src], tmp_path / "c", CriteoConfig(kind="criteo-kaggle"), name="c",
                          provenance={"other.txt": "00"}, progress=False)


def test_config_validation() -> None:
    cfg = CriteoConfig.from_dict({"kind": "criteo-terabyte", "encoding": "modulo", "max_ind_range": 40_000_000})
    assert cfg.to_dict()["max_ind_range"] == 40_000_000 and cfg.min_frequency == 1
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['min_freq'\]"):
        CriteoConfig.from_dict({"kind": "criteo-kaggle", "min_freq": 3})
    with pytest.raises(ConfigError, match="unknown kind"):
        CriteoConfig.from_dict({"kind": "avazu"})
    for bad in ({"min_frequency": 0}, {"encoding": "hash"}, {"on_bad_line": "warn"}, {"max_ind_range": 2**31},
                {"chunk_lines": 0}, {"check_rows": "yes"}, {"max_bad_share": 1.5}, {"warn_bad_share": -0.1},
                {"warn_bad_share": 0.2, "max_bad_share": 0.1}, {"max_bad_share": "1%"}):
        with pytest.raises(ConfigError):
            CriteoConfig.from_dict({"kind": "criteo-kaggle", **bad})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['length'\]"):
        TaobaoConfig.from_dict({"length": 3})
    with pytest.raises(ConfigError, match="holdout_quantile"):
        TaobaoConfig.from_dict({"holdout_quantile": 1.0})


def traced_peak(src: Path, out: Path, chunk: int) -> int:
    """tracemalloc peak (numpy allocations included) of one preprocessing run."""
    tracemalloc.start()
    try:
        run([src], out, kind="criteo-kaggle", chunk_lines=chunk)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bounded_memory(tmp_path: Path) -> None:
    base = random_lines(2000, seed=7, pool=300)   # a bounded vocabulary, as memory is bounded by it
    idx = np.random.default_rng(8).integers(0, len(base), 200_000)
    small = write(tmp_path / "small.txt", [base[i] for i in idx[:50_000]])
    big = write(tmp_path / "train.txt", [base[i] for i in idx])
    peak_small = traced_peak(small, tmp_path / "small", chunk=4096)
    peak = traced_peak(big, tmp_path / "ds", chunk=4096)
    assert Dataset.open(tmp_path / "ds").manifest["rows"] == idx.size
    columns = idx.size * (13 * 4 + 26 * 4 + 4)   # dense + sparse + labels bytes
    assert peak < columns / 2, f"peak {peak / 2**20:.1f} MiB vs columns {columns / 2**20:.1f} MiB"
    assert peak < 1.25 * peak_small, f"peak grew with the input: {peak_small / 2**20:.1f} -> {peak / 2**20:.1f} MiB"


def test_parsers_on_edge_values() -> None:
    tok = textparse.tokenize(b"0,-12,,123456789012345,-,1.5,99999999,100000000,1234567890123456,12345678901234567",
                             b",", 10)
    vals, ok = textparse.parse_ints(tok.u8, tok.starts, tok.lens)
    assert vals[0, [0, 1, 2, 3, 6, 7, 8]].tolist() == [0, -12, 0, 123456789012345, 99999999, 100000000,
                                                      1234567890123456]
    assert ok[0].tolist() == [True] * 4 + [False, False] + [True] * 3 + [False]
    tok = textparse.tokenize(b"deadBEEF,,00000000,ffffffff,abc,deadbeef0,0123456g\r\n", b",", 7)
    vals, ok, missing = textparse.parse_hex8(tok.u8, tok.starts, tok.lens)
    assert vals[0, :4].tolist() == [0xDEADBEEF, 0, 0, 0xFFFFFFFF]
    assert ok[0].tolist() == [True] * 4 + [False] * 3 and missing[0].tolist() == [False, True] + [False] * 5


# ---------------------------------------------------------------- Taobao


def taobao_csv(path: Path, events: list[tuple[int, int, int, str, int]], extra: dict[int, str] | None = None) -> Path:
    rows = [f"{u},{i},{c},{b},{t}\n" for u, i, c, b, t in events]
    for pos, text in sorted((extra or {}).items()):
        rows.insert(pos - 1, text)
    path.write_text("".join(rows))
    return path


def renumber(values) -> dict[int, int]:
    counts = Counter(values)
    return {v: i for i, v in enumerate(sorted(counts, key=lambda v: (-counts[v], v)))}


T0 = 1_511_539_200    # 2017-11-25 00:00 UTC+8: the start of the dataset's period (TaobaoConfig.time_range)


def user_events(n_users: int = 10, seed: int = 0) -> list[tuple[int, int, int, str, int]]:
    """User u (1..n) has 3 + 2u events with unique items (1000u + k), last event at time T0 + 1000 + u, shuffled."""
    rng = np.random.default_rng(seed)
    ev = [(u, 1000 * u + k, (1000 * u + k) % 7, ["pv", "buy", "cart", "fav"][k % 4],
           T0 + 1000 + u - 3 * (3 + 2 * u - 1 - k))
          for u in range(1, n_users + 1) for k in range(3 + 2 * u)]
    return [ev[i] for i in rng.permutation(len(ev))]


def test_taobao_history_order_truncation_and_holdout(tmp_path: Path) -> None:
    events = user_events()
    cfg = TaobaoConfig(max_length=4, min_history=2, samples_per_user=6, negative_ratio=0.0, chunk_lines=16)
    m = preprocess_taobao(taobao_csv(tmp_path / "UserBehavior.csv", events), tmp_path / "ds", cfg, name="tb",
                          progress=False)
    ds = Dataset.open(tmp_path / "ds", verify=True)
    users, items = renumber(e[0] for e in events), renumber(e[1] for e in events)
    cats = renumber(e[2] for e in events)
    assert ds.cardinalities == [len(users), len(items), len(cats)] and m["events"] == len(events)
    # the reference: per user, time-ordered; the last 6 positions with >= 2 earlier events
    by_user: dict[int, list] = {}
    for e in sorted(events, key=lambda e: e[4]):
        by_user.setdefault(e[0], []).append(e)
    expect = {}
    for u, evs in by_user.items():
        for p in range(max(2, len(evs) - 6), len(evs)):
            expect[(users[u], items[evs[p][1]])] = [(items[e[1]], cats[e[2]]) for e in evs[max(0, p - 4):p]]
    ids = ds.batch_ids(np.arange(ds.manifest["rows"]))
    assert ids.shape == (len(expect), 3 + 2 * 4) and ds.column_tables == [0, 1, 2] + [1, 2] * 4
    got = {}
    for row in ids:
        hist = row[3:].reshape(4, 2)
        n_pad = int((hist[:, 0] < 0).sum())
        assert (hist[:n_pad] == -1).all() and (hist[n_pad:] >= 0).all()   # left-padded, oldest first
        got[(int(row[0]), int(row[1]))] = [tuple(int(x) for x in h) for h in hist[n_pad:]]
    assert got == expect and (ds.labels[:] == 1).all()
    # holdout: last events at T0 + 1001..1010; the 0.7 quantile is T0 + 1007.3, so users 8, 9 (val) and 10 (test)
    split_users = {s: set(np.unique(ds.sparse[slice(*ds.split(s)), 0]).tolist()) for s in ("train", "val", "test")}
    assert split_users == {"train": {users[u] for u in range(1, 8)}, "val": {users[8], users[9]}, "test": {users[10]}}
    assert m["holdout"]["users"] == {"train": 7, "val": 2, "test": 1}


def zipf_events(n: int, seed: int) -> list[tuple[int, int, int, str, int]]:
    rng = np.random.default_rng(seed)
    items = np.minimum(rng.zipf(1.3, n), 500)
    return [(int(u), int(i) * 3, int(i) % 11, "pv", int(t))
            for u, i, t in zip(rng.integers(0, 200, n), items, T0 + rng.integers(0, 7 * 10**5, n))]


def test_taobao_negatives_and_determinism(tmp_path: Path) -> None:
    csv = taobao_csv(tmp_path / "UserBehavior.csv", zipf_events(6000, seed=1))
    cfg = TaobaoConfig(seed=3, chunk_lines=500)
    m1 = preprocess_taobao(csv, tmp_path / "a", cfg, name="a", progress=False)
    m2 = preprocess_taobao(csv, tmp_path / "b", cfg, name="b", progress=False)
    assert m1["sha256"] == m2["sha256"]
    m3 = preprocess_taobao(csv, tmp_path / "c", TaobaoConfig(seed=4), name="c", progress=False)
    assert m3["sha256"]["sparse.npy"] != m1["sha256"]["sparse.npy"]
    ds = Dataset.open(tmp_path / "a")
    labels = np.asarray(ds.labels)
    assert labels.mean() == 0.5 and (labels[0::2] == 1).all() and (labels[1::2] == 0).all()
    ids = ds.batch_ids(np.arange(labels.size))
    pos, neg = ids[0::2], ids[1::2]
    assert (neg[:, 0] == pos[:, 0]).all() and (neg[:, 3:] == pos[:, 3:]).all()   # same user and history
    assert (neg[:, 1] != pos[:, 1]).all()                                         # never the target
    events = zipf_events(6000, seed=1)
    items, cats = renumber(e[1] for e in events), renumber(e[2] for e in events)
    item_cat = {}
    for e in events:
        item_cat.setdefault(items[e[1]], cats[e[2]])
    assert all(item_cat[int(i)] == int(c) for i, c in neg[:, 1:3])
    assert len(np.unique(neg[:, 1])) > 50                                         # spread over the items
    for split in ("train", "val", "test"):
        a, b = ds.split(split)
        assert b > a and (a - b) % 2 == 0
    a, b = ds.split("train")
    assert m1["skew"] == coverage_stats(np.asarray(ds.sparse[a:b]), ds.cardinalities)
    m4 = preprocess_taobao(csv, tmp_path / "d", TaobaoConfig(negative_ratio=0.5), name="d", progress=False)
    share = 1 - float(np.load(tmp_path / "d" / "labels.npy").mean())
    assert abs(share - 1 / 3) < 0.05 and m4["rows"] < m1["rows"]


def test_taobao_bad_lines(tmp_path: Path) -> None:
    events = user_events(n_users=10)   # 4 users would leave the test split empty
    extra = {1: "user_id,item_id,category_id,behavior_type,timestamp\n", 5: "1,2,3,click,100\n",
             8: "1,2,3,pv\n", 9: "-1,2,3,pv,100\n", 10: "1,2,3,pv,1.5e9\n", 11: "\n"}
    csv = taobao_csv(tmp_path / "UserBehavior.csv", events, extra)
    m = preprocess_taobao(csv, tmp_path / "ds", TaobaoConfig(chunk_lines=4, max_bad_share=0.5), name="tb",
                          progress=False)
    assert m["bad_lines"]["by_reason"] == {"fields": 2, "integer": 2, "behavior": 1, "nul": 0}   # line 1: header
    assert [e["line"] for e in m["bad_lines"]["first"]] == [5, 8, 9, 10, 11]
    assert m["events"] == len(events) and m["raw_lines"] == len(events) + len(extra) - 1
    assert m["skipped"] == {"bom": [], "header": ["UserBehavior.csv"]}
    with pytest.raises(ValueError, match=r"UserBehavior\.csv: line 5: behavior_type"):
        preprocess_taobao(csv, tmp_path / "err", TaobaoConfig(on_bad_line="error"), name="tb", progress=False)
    assert not (tmp_path / "err").exists() and not list(tmp_path.glob(".err*"))
    assert math.isclose(m["holdout"]["threshold_timestamp"], float(np.quantile(T0 + np.arange(1001, 1011), 0.7)))


# ---------------------------------------------------------------- bad input must fail clearly


def test_mostly_bad_criteo_fails_and_a_few_bad_lines_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = random_lines(200, seed=9)
    junk = ["<html><body>not criteo</body></html>\n"] * 199
    with pytest.raises(ValueError, match=r"train\.txt: 199 of 200 lines \(99\.50%\) are malformed.*max_bad_share"):
        run([write(tmp_path / "train.txt", good[:1] + junk)], tmp_path / "ds", kind="criteo-kaggle")
    assert not (tmp_path / "ds").exists()
    lines = list(good)
    lines[50] = "1\tx\n"
    with caplog.at_level("WARNING"):
        m = run([write(tmp_path / "train.txt", lines)], tmp_path / "ds", kind="criteo-kaggle")   # 0.5%: warn only
    assert m["bad_lines"]["total"] == 1 and "1 of 200 lines (0.50%) are malformed" in caplog.text
    assert "train.txt:51" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        run([write(tmp_path / "train.txt", lines)], tmp_path / "quiet", kind="criteo-kaggle", warn_bad_share=0.01)
    assert "malformed" not in caplog.text
    with pytest.raises(ValueError, match="max_bad_share=0.001"):
        run([write(tmp_path / "train.txt", lines)], tmp_path / "strict", kind="criteo-kaggle", max_bad_share=0.001)


def test_mostly_bad_taobao_fails(tmp_path: Path) -> None:
    events = user_events(n_users=4)
    csv = taobao_csv(tmp_path / "UserBehavior.csv", events, {k: "1;2;3;pv;100\n" for k in range(1, 40)})
    with pytest.raises(ValueError, match=r"UserBehavior\.csv: 39 of .* are malformed.*max_bad_share=0.01"):
        preprocess_taobao(csv, tmp_path / "ds", TaobaoConfig(), name="tb", progress=False)


def test_criteo_empty_val_or_test_split_is_refused(tmp_path: Path) -> None:
    six = write(tmp_path / "train.txt", random_lines(6))   # 7 days of [1, 1, 1, 1, 1, 1, 0] lines
    with pytest.raises(ValueError, match=r"train\.txt: the val and test split\(s\) would be empty"):
        run([six], tmp_path / "ds", kind="criteo-kaggle")
    days = [write(tmp_path / "day_0", random_lines(5)), write(tmp_path / "day_1", random_lines(1))]
    with pytest.raises(ValueError, match=r"the test split\(s\) would be empty"):
        run(days, tmp_path / "ds", kind="criteo-terabyte")
    lines = random_lines(8)   # last day: lines 8 (val) and 9 (test); the test line is malformed
    days = [write(tmp_path / "day_0", lines[:6]), write(tmp_path / "day_1", lines[6:] + ["1\tbad\n"])]
    with pytest.raises(ValueError, match=r"test split\(s\) would be empty .* well-formed lines"):
        run(days, tmp_path / "ds", kind="criteo-terabyte", max_bad_share=0.5)
    assert not (tmp_path / "ds").exists()


def test_taobao_empty_split_is_refused(tmp_path: Path) -> None:
    events = [(u, 100 + k, 1, "pv", T0 + 1000 + k) for u in (1, 2, 3) for k in range(4)]   # the same last time
    csv = taobao_csv(tmp_path / "UserBehavior.csv", events)
    with pytest.raises(ValueError, match=r"UserBehavior\.csv: the val and test split\(s\) would be empty"):
        preprocess_taobao(csv, tmp_path / "ds", TaobaoConfig(), name="tb", progress=False)


def test_taobao_duplicate_events_are_dropped_and_counted(tmp_path: Path) -> None:
    events = user_events()
    rng = np.random.default_rng(7)
    repeated = [events[i] for i in rng.choice(len(events), 12, replace=False)]
    with_dups = events + repeated + repeated[:3]       # 15 repeats of 12 events, some twice
    cfg = TaobaoConfig(max_length=4, min_history=1, negative_ratio=0.0)
    clean = preprocess_taobao(taobao_csv(tmp_path / "a.csv", events), tmp_path / "a", cfg, name="a", progress=False)
    m = preprocess_taobao(taobao_csv(tmp_path / "b.csv", [with_dups[i] for i in rng.permutation(len(with_dups))]),
                          tmp_path / "b", cfg, name="b", progress=False)
    assert m["bad_lines"]["duplicates"] == 15 and clean["bad_lines"]["duplicates"] == 0
    assert m["events"] == len(events) and m["raw_lines"] == len(with_dups)
    assert m["sha256"] == clean["sha256"]
    ids = Dataset.open(tmp_path / "b").batch_ids(np.arange(m["rows"]))
    assert not (ids[:, 3::2] == ids[:, [1]]).any()     # no target item is in its own history


def test_provenance_is_what_was_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from hotcold.data.sources.prepare import fetch, preprocess
    from hotcold.data.sources.source_config import SourceConfig

    csv = taobao_csv(tmp_path / "UserBehavior.csv", user_events())
    cfg = SourceConfig.from_dict({"kind": "taobao", "path": str(csv)})
    fetched = fetch(cfg, tmp_path / "raw", name="tb", progress=False)
    taobao_csv(csv, user_events(seed=1))            # the user's file changes after `hotcold download`
    with caplog.at_level("WARNING"):
        m = preprocess(cfg, tmp_path / "raw", tmp_path / "ds", name="tb", progress=False)
    assert m["source"][0]["sha256"] == file_sha256(csv) != fetched["sha256"]
    assert m["source"][0]["fetched_sha256"] == fetched["sha256"] and "changed since it was fetched" in caplog.text


def test_criteo_reads_its_input_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The text is parsed once (pass 2 works on the spilled rows): a file edited after pass 1 does not
    reach the dataset, and the manifest records the bytes that were read."""
    src = write(tmp_path / "train.txt", random_lines(70))
    before = src.read_bytes()
    reference = run([src], tmp_path / "ref", kind="criteo-kaggle")
    original = criteo._Encoder.__init__

    def edit_then_init(self, *args, **kw):          # runs between pass 1 and pass 2
        data = bytearray(before)
        data[-2:-1] = b"0" if data[-2:-1] != b"0" else b"1"
        src.write_bytes(bytes(data))
        original(self, *args, **kw)
    monkeypatch.setattr(criteo._Encoder, "__init__", edit_then_init)
    m = run([src], tmp_path / "ds", kind="criteo-kaggle")
    assert src.read_bytes() != before
    assert m["sha256"] == reference["sha256"] and m["source"] == reference["source"]
    assert m["source"][0]["sha256"] == hashlib.sha256(before).hexdigest()


# ---------------------------------------------------------------- BOM, header line, NUL block

HEADER = "\t".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]) + "\n"


def both_kernels(monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    from hotcold.jit import KERNEL
    if kernel == "numba" and KERNEL != "numba":
        pytest.skip("numba is not installed: only the plain-Python parser runs here")
    for module in (criteo, criteo_parse, criteo_counts):
        monkeypatch.setattr(module, "KERNEL", kernel)


@pytest.mark.parametrize("kernel", ["numba", "numpy"])
@pytest.mark.parametrize("prefix", ["bom", "header", "bom+header"])
def test_bom_and_header_line_are_skipped_with_a_warning(tmp_path: Path, monkeypatch, caplog, kernel: str,
                                                        prefix: str) -> None:
    both_kernels(monkeypatch, kernel)
    lines = random_lines(60, seed=4)
    lines[40] = "1\tx\n"                                         # one malformed line: reported at its file line
    clean = run([write(tmp_path / "clean.txt", lines)], tmp_path / "a", kind="criteo-kaggle", chunk_lines=16,
                max_bad_share=0.5)
    head = ("\ufeff" if "bom" in prefix else "") + (HEADER if "header" in prefix else "")
    src = write(tmp_path / "train.txt", [head + lines[0]] + lines[1:])
    with caplog.at_level("WARNING"):
        m = run([src], tmp_path / "b", kind="criteo-kaggle", chunk_lines=16, max_bad_share=0.5)
    assert m["sha256"] == clean["sha256"] and m["raw_lines"] == 60
    assert m["bad_lines"]["total"] == 1
    assert m["bad_lines"]["first"][0]["line"] == 41 + ("header" in prefix)
    assert ("byte-order mark" in caplog.text) == ("bom" in prefix)
    assert ("line 1 is a header" in caplog.text) == ("header" in prefix) and str(src) in caplog.text
    assert m["skipped"] == {"bom": ["train.txt"] * ("bom" in prefix), "header": ["train.txt"] * ("header" in prefix)}


def test_terabyte_day_files_with_header_lines(tmp_path: Path, caplog) -> None:
    lines = random_lines(30, seed=5)
    clean = run([write(tmp_path / "c0", lines[:20]), write(tmp_path / "c1", lines[20:])], tmp_path / "a",
                kind="criteo-terabyte")
    days = [write(tmp_path / "day_0.gz", [HEADER] + lines[:20]), write(tmp_path / "day_1.gz", [HEADER] + lines[20:])]
    with caplog.at_level("WARNING"):
        m = run(days, tmp_path / "b", kind="criteo-terabyte")
    assert m["sha256"] == clean["sha256"] and m["bad_lines"]["total"] == 0 and m["raw_lines"] == 30
    assert m["skipped"]["header"] == ["day_0.gz", "day_1.gz"] and caplog.text.count("is a header") == 2


@pytest.mark.parametrize("kernel", ["numba", "numpy"])
def test_nul_block_is_counted_and_named(tmp_path: Path, monkeypatch, caplog, kernel: str) -> None:
    both_kernels(monkeypatch, kernel)
    lines = random_lines(80, seed=6)
    data = "".join(lines).encode()
    at = len("".join(lines[:50]))
    damaged = data[:at] + b"\0" * 4096 + data[at:]               # zeros before line 51: merged into it
    src = tmp_path / "train.txt"
    src.write_bytes(damaged)
    with caplog.at_level("WARNING"):
        m = run([src], tmp_path / "ds", kind="criteo-kaggle", chunk_lines=16, max_bad_share=0.5)
    assert m["bad_lines"]["by_reason"]["nul"] == 1 and m["bad_lines"]["total"] == 1
    assert m["bad_lines"]["first"] == [{"file": "train.txt", "line": 51, "reason": "nul"}]
    assert f"{src}: 1 line(s) hold NUL bytes, the first at line 51" in caplog.text
    assert m["raw_lines"] == 80 and m["rows"] == 79
