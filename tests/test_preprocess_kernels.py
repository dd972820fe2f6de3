"""The compiled preprocessing kernels agree with the vectorised numpy path (and plain Python) they replace."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hotcold.data.sources import criteo, criteo_counts, criteo_parse, kernels
from hotcold.data.sources.criteo import preprocess_criteo
from hotcold.data.sources.criteo_config import CriteoConfig
from hotcold.jit import python
from test_preprocess import random_lines, write

FIELDS = ["codes", "lines", "labels", "ints", "hexv", "missing"]


def odd_lines() -> list[bytes]:
    """Lines the fast path must hand to the general rules, good and bad ones."""
    good = random_lines(1, seed=3)[0].rstrip("\n").split("\t")

    def edit(i: int, value: str) -> bytes:
        f = list(good)
        f[i] = value
        return ("\t".join(f) + "\n").encode()
    return [edit(1, "-0"), edit(1, "-"), edit(2, "1234567890123456"), edit(2, "12345678901234567"),
            edit(3, "+5"), edit(3, "1.5"), edit(3, "-12"), edit(14, "DEADbeef"), edit(14, "deadbee"),
            edit(14, "deadbeef0"), edit(15, "0123456g"), edit(39, ""), edit(39, "ffffffff"), edit(0, "2"),
            edit(0, "01"), edit(0, ""), edit(20, "d\xe9adbeef"), edit(5, "\r"), b"\n", b"\t" * 39 + b"\n",
            b"\t" * 40 + b"\n", ("\t".join(good[:-1]) + "\n").encode(), ("\t".join(good) + "\tx\n").encode(),
            ("\t".join(good) + "\r\n").encode()]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # plain Python: intended wrap-around
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "plain"])
def test_parse_kernel_matches_numpy(compiled: bool) -> None:
    lines = [ln.encode() for ln in random_lines(200, seed=5)] + odd_lines()
    rng = np.random.default_rng(0)
    buf = b"".join(lines[i] for i in rng.permutation(len(lines)))
    ref = criteo_parse._parse_criteo_numpy(buf + b"tail\t1")       # a last line without its newline
    if compiled:
        got = criteo_parse._parse_criteo_compiled(buf + b"tail\t1", len(lines) + 1)
    else:
        original = kernels.parse_criteo
        try:
            kernels.parse_criteo = python(original)
            got = criteo_parse._parse_criteo_compiled(buf + b"tail\t1", len(lines) + 1)
        finally:
            kernels.parse_criteo = original
    for f in FIELDS:
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f
    assert (ref.codes != 0).sum() >= 15 and set(ref.codes.tolist()) == {0, 1, 2, 3, 4}


def test_parse_kernel_refuses_too_many_lines() -> None:
    with pytest.raises(ValueError, match="more than 2 lines"):
        criteo_parse._parse_criteo_compiled(b"".join(ln.encode() for ln in random_lines(3)), 2)


def test_id_tables_count_and_encode() -> None:
    rng = np.random.default_rng(1)
    values = rng.integers(0, 5000, (3000, 3)).astype(np.uint32)   # > MIN_SLOTS distinct: the tables grow
    skip = rng.random(values.shape) < 0.1
    tables = kernels.IdTables(3)
    e1 = tables.entries(values[:2000], skip[:2000])
    e2 = tables.entries(values[2000:], skip[2000:], insert=False)   # unseen values -> 0, nothing counted
    tables.freeze()
    tables.take_back(e1[1500:])                                      # uncount rows 1500-1999
    for t in range(3):
        want = Counter(values[:1500, t][~skip[:1500, t]].tolist())
        entries, vals, counts = tables.items(t)
        assert vals.tolist() == sorted(want) and counts.tolist() == [want[v] for v in sorted(want)]
        tables.set_ids(t, entries, np.arange(1, entries.size + 1, dtype=np.int32))
    ids = tables.encode(np.concatenate([e1, e2]))
    for t in range(3):
        _, vals, _ = tables.items(t)
        rank = {v: i + 1 for i, v in enumerate(vals.tolist())}
        want = [0 if s else rank.get(v, 0) for v, s in zip(values[:, t].tolist(), skip[:, t].tolist())]
        assert ids[:, t].tolist() == want
    assert (e1[skip[:2000]] == 0).all() and (e1[~skip[:2000]] > 0).all()


@pytest.mark.parametrize("encoding", ["frequency", "modulo"])
def test_numpy_path_gives_the_same_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str) -> None:
    """Without numba the preprocessor takes the numpy path: the same bytes, Kaggle and Terabyte."""
    lines = random_lines(3000, seed=9, pool=2000)
    lines[7] = "1\t2\n"
    kaggle = write(tmp_path / "train.txt", lines)
    days = [write(tmp_path / f"day_{d}.gz", random_lines(700, seed=d, pool=900)) for d in range(3)]
    cfg = {"encoding": encoding, "max_ind_range": 1000, "min_frequency": 2, "chunk_lines": 256}

    def both(inputs, kind):
        out = []
        for kernel in ("numba", "python"):
            for module in (criteo, criteo_parse, criteo_counts):
                monkeypatch.setattr(module, "KERNEL", kernel)
            out.append(preprocess_criteo(inputs, tmp_path / f"{kind}-{kernel}", CriteoConfig(kind=kind, **cfg),
                                         name="x", progress=False))
        return out
    for inputs, kind in (([kaggle], "criteo-kaggle"), (days, "criteo-terabyte")):
        a, b = both(inputs, kind)
        assert a["sha256"] == b["sha256"] and a == b
    assert a["bad_lines"]["total"] == 0


def test_read_chunks_cuts_whole_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of exactly ``chunk_lines`` lines whatever the read block, progress counting every file byte."""
    import gzip
    import random

    from hotcold.data.sources import inputs

    rng = random.Random(0)
    for trial in range(60):
        data = b"".join(bytes(rng.choice(b"ab\t\r") for _ in range(rng.randint(0, 30))) + b"\n"
                        for _ in range(rng.randint(0, 120)))
        data += b"tail" if trial % 2 else b""
        path = tmp_path / f"f{trial}.txt{'.gz' if trial % 3 == 0 else ''}"
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        k = rng.randint(1, 40)
        monkeypatch.setattr(inputs, "READ_BLOCK", rng.choice([1, 3, 64, 1 << 20]))
        told: list[int] = []
        got = list(inputs.read_chunks(path, k, progress=told.append))
        lines = [ln + b"\n" for ln in data.split(b"\n")[:-1]] + ([b"tail"] if data.endswith(b"tail") else [])
        want = [(i, b"".join(lines[i:i + k])) for i in range(0, len(lines), k)]
        assert got == want and sum(told) == path.stat().st_size
        assert b"".join(c for _, c in got) == data
