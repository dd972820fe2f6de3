"""The Taobao preprocessor's kernels and paths: compiled, plain Python and numpy agree; buckets on disk and
in memory give the same dataset; without numba the same bytes come out."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotcold.data.format import Dataset
from hotcold.data.sources import taobao_group, taobao_history, taobao_ids, taobao_parse, taobao_read
from hotcold.data.sources.taobao import preprocess_taobao
from hotcold.data.sources.taobao_config import TAOBAO_PERIOD, TaobaoConfig
from hotcold.jit import KERNEL, python

needs_numba = pytest.mark.skipif(KERNEL != "numba",
                                 reason="numba is not installed: the compiled kernels cannot be compared with their Python")
BEHAVIORS = ["pv", "buy", "cart", "fav"]
MALFORMED = ["1,2,3,pv", "1,2,3,pv,4,5", "", "a,2,3,pv,4", "1,2,3,pv,", "-1,2,3,pv,4", "1,-2,3,buy,4",
             "1,2,-3,cart,4", "-0,2,3,fav,4", "1,2,3,pv,-4", "1,2,3,pv,--4", "1,2,3,pv,-", "1,2,3,PV,4",
             "1,2,3,pvv,4", "1,2,3,p,4", "1,2,3,,4", "12345678901234567,2,3,pv,4", "1234567890123456,2,3,fav,9",
             "1,2,3,pv,12345678901234567", "1,2,3,pv,4\r", "1 ,2,3,pv,4", ",2,3,pv,4", "1,2,3,cart,4x",
             "1,2,3,buy\r,4", "1,2,3,fav,4,", "99999999,0,0,cart,-1234567890123456"]


def random_lines(n: int, seed: int, bad_share: float = 0.2) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        if rng.random() < bad_share:
            lines.append(MALFORMED[rng.integers(len(MALFORMED))])
        else:
            lines.append(f"{rng.integers(0, 50)},{rng.integers(0, 10**rng.integers(1, 12))},{rng.integers(0, 30)},"
                         f"{BEHAVIORS[rng.integers(4)]},{rng.integers(-10**6, 10**10)}")
    return lines


def plain_helpers(monkeypatch) -> None:
    """Make the kernels' plain-Python bodies call the plain-Python bodies of the kernels they use."""
    for module, name in ((taobao_parse, "_line"), (taobao_parse, "_digits"), (taobao_parse, "_behavior"),
                         (taobao_ids, "_line"), (taobao_ids, "_lookup"), (taobao_group, "sort_range"),
                         (taobao_group, "stable_argsort")):
        monkeypatch.setattr(module, name, python(getattr(module, name)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parse_paths_agree(seed: int, monkeypatch) -> None:
    lines = random_lines(400, seed)
    buf = ("\n".join(lines) + ("\n" if seed else "")).encode()      # seed 0: no newline after the last line
    if seed == 2:
        buf = buf.replace(b"\n", b"\r\n")
    want = taobao_parse.parse_chunk(buf, 1000, compiled=False)
    assert want[0].size == len(lines) and (want[0] != 0).any() and (want[0] == 0).any()
    paths = [taobao_parse.parse_chunk(buf, 1000, compiled=True)] if KERNEL == "numba" else []
    m = 1000
    codes, good, vals, beh = (np.empty(m, np.int8), np.empty(m, np.int64), np.empty((m, 4), np.int64),
                              np.empty(m, np.int8))
    data = buf if buf.endswith(b"\n") else buf + b"\n"
    plain_helpers(monkeypatch)
    n, g = python(taobao_parse.parse_taobao)(np.frombuffer(data, np.uint8), codes, vals, beh, good)
    paths.append((codes[:n], good[:g], vals[:g], beh[:g]))
    for got in paths:
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)


def test_parse_reasons() -> None:
    codes, _, vals, beh = taobao_parse.parse_chunk(
        b"7,8,9,cart,-5\n1,2,3\n1,x,3,pv,4\n1,2,3,click,4\n-0,0,0,fav,0\n", 10)
    assert codes.tolist() == [0, 1, 2, 3, 0]
    assert vals.tolist() == [[7, 8, 9, -5], [0, 0, 0, 0]] and beh.tolist() == [2, 3]


def test_parse_refuses_a_chunk_longer_than_promised() -> None:
    if KERNEL == "numba":
        with pytest.raises(ValueError, match="more than 2 lines"):
            taobao_parse.parse_chunk(b"1,2,3,pv,4\n" * 3, 2)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_id_index_is_first_appearance(compiled: bool) -> None:
    rng = np.random.default_rng(0)
    index = taobao_ids.IdIndex(compiled)
    seen: dict[int, int] = {}
    for chunk in range(12):                                  # grows past its first table
        values = rng.integers(-5, 3_000, 500) * (10**12 if chunk % 2 else 1)
        ids, first = index.index(values)
        new_before = len(seen)
        want = []
        for pos, v in enumerate(values.tolist()):
            if v not in seen:
                seen[v] = len(seen)
                want.append(pos)
        assert ids.tolist() == [seen[v] for v in values.tolist()]
        assert first.tolist() == want and index.size == len(seen) == new_before + len(want)
    assert index.raws.tolist() == list(seen)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")    # the plain hash wraps, as compiled
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_parse_index_agrees_with_parse_and_index(compiled: bool, monkeypatch) -> None:
    """The read pass's one kernel (parse, index ids, write events, from a position, at most ``codes.size``
    lines) gives what ``parse_chunk`` and ``IdIndex`` give."""
    lines = random_lines(900, 4) + ["7,8,9,pv,5\r", "7,8,9,pv,6\r\r"]
    buf = ("\r\n".join(lines) + "\n").encode()
    codes, _, vals, beh = taobao_parse.parse_chunk(buf, 2000, compiled=False)
    index = [taobao_ids.IdIndex(False) for _ in range(3)]
    ids = [ix.index(vals[:, k])[0] for k, ix in enumerate(index)]
    item_cat = ids[2][taobao_ids.IdIndex(False).index(vals[:, 1])[1]]  # the category of each item's first event
    if not compiled:
        plain_helpers(monkeypatch)
    kernel = taobao_ids.parse_index if compiled else python(taobao_ids.parse_index)
    tables = [taobao_ids.IdIndex(True) for _ in range(3)]
    raws = [t.reserve(len(lines)) for t in tables]
    sizes, got_cat = np.zeros(3, np.int64), np.full(len(lines), -1, np.int32)
    cols = [np.full(len(lines) + 5, -1, t) for t in (np.int32, np.int32, np.int32, np.int8, np.int64)]
    got_codes, pos, at = [], 0, 5                               # from row 5 of the columns, 128 lines a call
    while pos < len(buf):
        c = np.empty(128, np.int8)
        pos, n, g, out = kernel(np.frombuffer(buf, np.uint8), pos, c, np.empty((128, 3), np.int64),
                                tables[0].table, raws[0], tables[1].table, raws[1], tables[2].table, raws[2], sizes,
                                got_cat, *cols, at, -(1 << 63), (1 << 63) - 1)
        assert out == 0
        got_codes += c[:n].tolist()
        at += g
    assert got_codes == codes.tolist() and at - 5 == beh.size
    for col, want in zip(cols, [*ids, beh, vals[:, 3]]):
        assert col[5:at].tolist() == want.tolist() and (col[at:] == -1).all()
    assert sizes.tolist() == [ix.size for ix in index]
    assert got_cat[:sizes[1]].tolist() == item_cat.tolist()
    assert [r[:s].tolist() for r, s in zip(raws, sizes)] == [ix.raws.tolist() for ix in index]


def simple_group(user, ts, item, cat, beh) -> list[int]:
    """Kept events by (user, time, file order), dropping exact repeats: a plain loop."""
    seen, kept = set(), []
    for i in range(user.size):
        key = (user[i], ts[i], item[i], cat[i], beh[i])
        if key not in seen:
            seen.add(key)
            kept.append(i)
    return sorted(kept, key=lambda i: (user[i], ts[i], i))


@pytest.mark.parametrize("seed", [0, 1])
def test_group_paths_agree_with_a_plain_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, n_users = 3000, 40
    user = rng.integers(0, n_users, n).astype(np.int32)
    user[:400] = 7                                          # one long user: the merge sort
    ts = rng.integers(0, 50, n).astype(np.int64)
    ts[400:440] = 3                                         # a long run at one (user, time): sorted dedup
    user[400:440] = 5
    item = rng.integers(0, 4, n).astype(np.int32)
    cat = rng.integers(0, 2, n).astype(np.int32)
    beh = rng.integers(0, 2, n).astype(np.int8)
    want = simple_group(user, ts, item, cat, beh)
    assert len(want) < n
    got = [taobao_group.group_events(user, ts, item, cat, beh, n_users, compiled=False),
           python(taobao_group._group_kernel)(user, ts, item, cat, beh, n_users),
           python(taobao_group._group_packed)(user, ts, item, cat, beh, n_users, *taobao_group._packed_shift(ts, n))]
    if KERNEL == "numba":
        got.append(taobao_group.group_events(user, ts, item, cat, beh, n_users, compiled=True))
    for g in got:
        assert g.tolist() == want


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_group_by_time_bins_and_the_wide_time_fallback(compiled: bool) -> None:
    """Users long enough for the time bins, with skewed and equal times; times too wide to pack fall back."""
    rng = np.random.default_rng(2)
    n, n_users = 5000, 6
    user = rng.integers(0, n_users, n).astype(np.int32)
    ts = np.where(rng.random(n) < 0.9, rng.integers(0, 30, n), rng.integers(-10**6, 10**6, n)).astype(np.int64)
    ts[user == 2] = 77                                      # one user with a single time
    item, cat = rng.integers(0, 3, n).astype(np.int32), rng.integers(0, 2, n).astype(np.int32)
    beh = rng.integers(0, 2, n).astype(np.int8)
    want = simple_group(user, ts, item, cat, beh)
    assert taobao_group._packed_shift(ts, n) is not None
    group = taobao_group.group_events if compiled else (
        lambda *a: python(taobao_group._group_packed)(*a[:6], *taobao_group._packed_shift(ts, n)))
    assert group(user, ts, item, cat, beh, n_users).tolist() == want
    wide = ts.copy()
    wide[0], wide[1] = -(2**62), 2**62                      # no room for the event index: the general kernel
    assert taobao_group._packed_shift(wide, n) is None
    assert taobao_group.group_events(user, wide, item, cat, beh, n_users, compiled).tolist() == \
        simple_group(user, wide, item, cat, beh)


def test_bucket_stats_and_history_paths_agree() -> None:
    rng = np.random.default_rng(3)
    n, n_users, n_items, n_cats = 2000, 30, 50, 7
    user = rng.integers(0, n_users, n).astype(np.int32)
    user[:n_users] = np.arange(n_users)                     # every user has an event
    ts = rng.integers(0, 100, n).astype(np.int64)
    item, cat = rng.integers(0, n_items, n).astype(np.int32), rng.integers(0, n_cats, n).astype(np.int32)
    beh = rng.integers(0, 4, n).astype(np.int8)
    item_cat = rng.integers(0, n_cats, n_items).astype(np.int32)
    order = taobao_group.group_events(user, ts, item, cat, beh, n_users, compiled=False)
    results = []
    for compiled in [False] + ([True] if KERNEL == "numba" else []):
        counts = [np.zeros(n_items, np.int64), np.zeros(n_cats, np.int64), np.zeros(4, np.int64)]
        tails = [np.full(n, -1, np.int32), np.full(n, -1, np.int32)]
        out = taobao_history.bucket_stats(order, user, ts, item, cat, beh, item_cat, 2, 5, 4, n_users, *counts,
                                          *tails, 10, compiled)
        hist = np.empty((40, 2), np.int32)
        hc = [np.zeros(n_items, np.int64), np.zeros(n_cats, np.int64)]
        start = np.array([11, 15, 20], np.int64)
        taobao_history.fill_history(start, start + [4, 0, 3], tails[0], tails[1], hist[:7], *hc, True, compiled)
        results.append([*out, *counts, *tails, hist[:7], *hc])
    cnt = results[0][0]
    assert cnt.tolist() == np.bincount(user[order], minlength=n_users).tolist()
    assert results[0][3] == 10 + int(np.minimum(cnt, np.clip(cnt - 2, 0, 5) + 4)[cnt > 2].sum())
    for a, b in zip(results[0], results[-1]):
        np.testing.assert_array_equal(a, b)



def test_events_by_bucket_keep_file_order_within_a_bucket() -> None:
    rng = np.random.default_rng(4)
    n = 500
    cols = [rng.integers(0, 40, n).astype(np.int32), rng.integers(0, 9, n).astype(np.int32),
            rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 4, n).astype(np.int8), np.arange(n, dtype=np.int64)]
    for compiled in [False] + ([True] if KERNEL == "numba" else []):
        out = [np.empty(n + 3, c.dtype) for c in cols]
        got, bounds = taobao_group.by_bucket(cols, 3, out, compiled)
        assert bounds.tolist() == [0, *np.cumsum(np.bincount(cols[0] % 3, minlength=3)).tolist()]
        for b in range(3):
            mine = np.flatnonzero(cols[0] % 3 == b)             # the bucket's events, in file order
            for g, c in zip(got, cols):
                np.testing.assert_array_equal(g[bounds[b]:bounds[b + 1]], c[mine])

def write_events(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    user = rng.integers(1, 300, n)
    item = np.minimum(rng.zipf(1.3, n), 2000) * 7
    cat = np.where(rng.random(n) < 0.05, rng.integers(0, 40, n), item % 37)
    beh = np.array(BEHAVIORS)[rng.integers(0, 4, n)]
    t = 1_511_540_000 + rng.integers(0, 5_000, n)         # in the dataset's period (time_range)
    lines = [f"{u},{i},{c},{b},{s}" for u, i, c, b, s in zip(user, item, cat, beh, t)]
    lines += lines[:: 50]                                   # exact repeats
    lines.insert(17, "1,2,3,click,4")
    path.write_text("\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n")
    return path


def columns(path: Path) -> dict[str, bytes]:
    ds = Dataset.open(path)
    manifest = json.loads((path / "manifest.json").read_text())
    return {"sha256": manifest["sha256"], "meta": {k: v for k, v in manifest.items() if k not in ("name",)},
            "rows": len(ds.labels)}


def test_buckets_on_disk_and_numpy_path_give_the_same_dataset(tmp_path: Path) -> None:
    csv = write_events(tmp_path / "UserBehavior.csv", 6000, seed=5)
    cfg = TaobaoConfig(max_length=6, samples_per_user=4, negative_ratio=1.5, chunk_lines=700, max_bad_share=0.5)
    runs = {"held": dict(), "disk": dict(bucket_events=500), "numpy": dict(compiled=False),
            "numpy-disk": dict(compiled=False, bucket_events=900)}
    out = {}
    for key, kw in runs.items():
        preprocess_taobao(csv, tmp_path / key, cfg, name="tb", progress=False, **kw)
        out[key] = columns(tmp_path / key)
        assert not (tmp_path / key / "events").exists()
    assert all(o == out["held"] for o in out.values())
    assert out["held"]["meta"]["bad_lines"]["duplicates"] > 0
    assert out["held"]["meta"]["bad_lines"]["by_reason"]["behavior"] == 1


@pytest.mark.parametrize("form", ["plain", "crlf-no-final-newline", "gzip"])
def test_small_read_blocks_give_the_same_dataset(tmp_path: Path, monkeypatch, form: str) -> None:
    """Lines cut across read blocks, a line longer than the block, CRLF, no final newline, gzip: the compiled
    read pass gives the numpy path's dataset."""
    csv = write_events(tmp_path / "UserBehavior.csv", 3000, seed=9)
    text = csv.read_bytes().replace(b"\n", b"\n" + b"9" * 300 + b",1,2,pv,3\n", 1)   # one 310-byte line
    if form == "crlf-no-final-newline":
        text = text.replace(b"\n", b"\r\n")[:-2]
    if form == "gzip":
        csv = tmp_path / "UserBehavior.csv.gz"
        csv.write_bytes(gzip.compress(text, mtime=0))
    else:
        csv.write_bytes(text)
    cfg = TaobaoConfig(max_length=5, chunk_lines=300, max_bad_share=0.5)
    monkeypatch.setattr(taobao_read, "READ_BYTES", 100)
    out = {}
    for key, kw in {"numpy": dict(compiled=False), "compiled": dict()}.items():
        preprocess_taobao(csv, tmp_path / key, cfg, name="tb", progress=False, **kw)
        out[key] = columns(tmp_path / key)
    assert out["numpy"] == out["compiled"]
    assert out["numpy"]["meta"]["bad_lines"]["by_reason"]["integer"] == 1        # the long line


def test_without_numba_the_same_bytes(tmp_path: Path) -> None:
    csv = write_events(tmp_path / "UserBehavior.csv", 3000, seed=6)
    cfg = TaobaoConfig(max_length=5, chunk_lines=400, max_bad_share=0.5)
    want = preprocess_taobao(csv, tmp_path / "a", cfg, name="tb", progress=False, bucket_events=700)["sha256"]
    script = ("import sys, json; sys.modules['numba'] = None\n"
              "from pathlib import Path\n"
              "from hotcold.jit import KERNEL; assert KERNEL == 'python', KERNEL\n"
              "from hotcold.data.sources.taobao import preprocess_taobao\n"
              "from hotcold.data.sources.taobao_config import TaobaoConfig\n"
              f"cfg = TaobaoConfig.from_dict({json.dumps(cfg.to_dict())})\n"
              f"m = preprocess_taobao(Path({str(csv)!r}), Path({str(tmp_path / 'b')!r}), cfg, name='tb', "
              "progress=False, bucket_events=700)\n"
              "print(json.dumps(m['sha256']))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == want


def test_progress_bars_on_the_long_passes(tmp_path: Path, capsys) -> None:
    csv = write_events(tmp_path / "UserBehavior.csv", 2000, seed=7)
    preprocess_taobao(csv, tmp_path / "a", TaobaoConfig(max_bad_share=0.5), name="tb", progress=True)
    err = capsys.readouterr().err
    assert all(f"tb: {step}" in err for step in ("read", "group", "write"))
    preprocess_taobao(csv, tmp_path / "b", TaobaoConfig(max_bad_share=0.5), name="tb", progress=False)
    assert "tb:" not in capsys.readouterr().err


def test_bucket_events_must_be_positive(tmp_path: Path) -> None:
    csv = write_events(tmp_path / "UserBehavior.csv", 100, seed=8)
    with pytest.raises(ValueError, match="bucket_events"):
        preprocess_taobao(csv, tmp_path / "a", TaobaoConfig(max_bad_share=0.5), name="tb", progress=False,
                          bucket_events=0)


# ---------------------------------------------------------------- timestamps outside the dataset's period

PERIOD = (1_511_539_200, 1_512_316_800)   # [2017-11-25 00:00, 2017-12-04 00:00) UTC+8: the documented period
T0 = PERIOD[0]
OUT_OF_RANGE = [-5, 0, 99_999_999_999, T0 - 1, PERIOD[1]]


def period_lines(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    user, item = rng.integers(1, 120, n), np.minimum(rng.zipf(1.3, n), 800) * 7
    beh = np.array(BEHAVIORS)[rng.integers(0, 4, n)]
    t = T0 + rng.integers(0, 700_000, n)
    return [f"{u},{i},{i % 29},{b},{s}" for u, i, b, s in zip(user, item, beh, t)]


def with_bad_times(lines: list[str], k: int, seed: int) -> tuple[list[str], list[int]]:
    """``lines`` with ``k`` copies of some of their events carrying the timestamps of OUT_OF_RANGE (in turn)
    inserted -> (the lines, the 1-based line numbers of the inserted ones)."""
    rng = np.random.default_rng(seed)
    out, where = list(lines), sorted(int(x) for x in rng.choice(len(lines), k, replace=False))
    for j, at in enumerate(where):
        u, i, c, b, _ = lines[at].split(",")
        out.insert(at + j, f"{u},{i},{c},{b},{OUT_OF_RANGE[j % len(OUT_OF_RANGE)]}")
    return out, [at + j + 1 for j, at in enumerate(where)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_timestamps_outside_the_period_are_dropped_with_a_warning(tmp_path: Path, compiled: bool, caplog) -> None:
    """A few lines (0.25%) with timestamps -5, 0, 99999999999 or just outside the period: dropped, counted
    and warned about; the dataset is the one made without them (no held-out user changes)."""
    lines = period_lines(2000, seed=1)
    bad, at = with_bad_times(lines, 5, seed=2)
    cfg = TaobaoConfig(chunk_lines=300)
    clean = preprocess_taobao(write_lines(tmp_path / "clean.csv", lines), tmp_path / "a", cfg, name="a",
                              progress=False, compiled=compiled)
    with caplog.at_level("WARNING"):
        m = preprocess_taobao(write_lines(tmp_path / "UserBehavior.csv", bad), tmp_path / "b", cfg, name="b",
                              progress=False, compiled=compiled)
    assert m["sha256"] == clean["sha256"] and m["holdout"] == clean["holdout"]
    assert m["raw_lines"] == 2005 and m["bad_lines"]["total"] == 0
    rec = m["outside_time_range"]
    assert rec["range"] == list(PERIOD) == list(TAOBAO_PERIOD) and rec["outside"] == 5 and rec["share"] == 5 / 2005
    assert [e["line"] for e in rec["first"]] == at
    assert "UserBehavior.csv: 5 of 2,005 lines (0.25%) have a timestamp outside time_range" in caplog.text
    assert "dropped them" in caplog.text
    assert f"UserBehavior.csv:{at[0]}" in caplog.text and "2017-11-25 00:00 UTC+8" in caplog.text
    assert clean["outside_time_range"]["outside"] == 0


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_many_timestamps_outside_the_period_fail_naming_them(tmp_path: Path, compiled: bool) -> None:
    """5% out of range: one line naming the file and the timestamps, not an empty split or too few users."""
    lines = period_lines(400, seed=3)
    bad, _ = with_bad_times(lines, 21, seed=4)
    csv = write_lines(tmp_path / "UserBehavior.csv", bad)
    with pytest.raises(ValueError) as err:
        preprocess_taobao(csv, tmp_path / "ds", TaobaoConfig(chunk_lines=64), name="tb", progress=False,
                          compiled=compiled)
    msg = str(err.value)
    assert msg.startswith(f"{csv}: 21 of 421 lines (4.99%) have a timestamp outside time_range") and "\n" not in msg
    assert "max_out_of_range_share=0.01" in msg and "preprocess.time_range" in msg and "users" not in msg
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds*"))
    m = preprocess_taobao(csv, tmp_path / "ok", TaobaoConfig(max_out_of_range_share=0.05), name="tb",
                          progress=False, compiled=compiled)
    assert m["outside_time_range"]["outside"] == 21
    with pytest.raises(ValueError, match=r"UserBehavior\.csv: line \d+: timestamp outside time_range"):
        preprocess_taobao(csv, tmp_path / "err", TaobaoConfig(on_bad_line="error"), name="tb", progress=False,
                          compiled=compiled)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_time_range_is_configurable_and_null_keeps_every_timestamp(tmp_path: Path, compiled: bool) -> None:
    lines = period_lines(600, seed=5)
    csv = write_lines(tmp_path / "UserBehavior.csv", lines)
    times = np.array([int(ln.rsplit(",", 1)[1]) for ln in lines])
    cut = int(np.quantile(times, 0.995))
    m = preprocess_taobao(csv, tmp_path / "a", TaobaoConfig(time_range=[T0, cut]), name="a", progress=False,
                          compiled=compiled)
    assert m["outside_time_range"]["outside"] == int((times >= cut).sum()) > 0
    assert m["preprocess"]["time_range"] == [T0, cut]
    bad, _ = with_bad_times(lines, 30, seed=6)
    m = preprocess_taobao(write_lines(tmp_path / "all.csv", bad), tmp_path / "b", TaobaoConfig(time_range=None),
                          name="b", progress=False, compiled=compiled)
    assert m["outside_time_range"] is None and m["events"] == 630 - m["bad_lines"]["duplicates"]


@pytest.mark.parametrize("bad", [[5, 5], [7, 3], [1], "2017", [1.5, 9], None])
def test_time_range_validation(bad) -> None:
    if bad is None:
        assert TaobaoConfig.from_dict({"time_range": None}).time_range is None
        assert TaobaoConfig.from_dict({"time_range": [1, 2]}).time_range == (1, 2)
        return
    with pytest.raises(ValueError, match="time_range must be null or"):
        TaobaoConfig.from_dict({"time_range": bad})
    with pytest.raises(ValueError, match="max_out_of_range_share"):
        TaobaoConfig.from_dict({"max_out_of_range_share": 2})


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_numba)])
def test_bom_header_and_nul_block(tmp_path: Path, compiled: bool, caplog) -> None:
    """A BOM and a header line are skipped with a warning (the dataset is the one without them); a block of
    NUL bytes is counted as its own reason with the file and line in a warning."""
    lines = period_lines(900, seed=7)
    cfg = TaobaoConfig(chunk_lines=128)
    clean = preprocess_taobao(write_lines(tmp_path / "clean.csv", lines), tmp_path / "a", cfg, name="a",
                              progress=False, compiled=compiled)
    head = "\ufeffuser_id,item_id,category_id,behavior_type,timestamp"
    csv = write_lines(tmp_path / "UserBehavior.csv", [head] + lines)
    with caplog.at_level("WARNING"):
        m = preprocess_taobao(csv, tmp_path / "b", cfg, name="b", progress=False, compiled=compiled)
    assert m["sha256"] == clean["sha256"] and m["raw_lines"] == 900 and m["bad_lines"]["total"] == 0
    assert m["skipped"] == {"bom": ["UserBehavior.csv"], "header": ["UserBehavior.csv"]}
    assert "byte-order mark" in caplog.text and "line 1 is a header" in caplog.text
    caplog.clear()
    data = ("\n".join(lines) + "\n").encode()
    cut = len(("\n".join(lines[:300]) + "\n").encode())
    csv.write_bytes(data[:cut] + b"\0" * 5000 + data[cut:])     # zeros before line 301: merged into it
    with caplog.at_level("WARNING"):
        m = preprocess_taobao(csv, tmp_path / "c", cfg, name="c", progress=False, compiled=compiled)
    assert m["bad_lines"]["by_reason"]["nul"] == 1 and m["bad_lines"]["total"] == 1
    assert m["bad_lines"]["first"] == [{"file": "UserBehavior.csv", "line": 301, "reason": "nul"}]
    assert f"{csv}: 1 line(s) hold NUL bytes, the first at line 301" in caplog.text
