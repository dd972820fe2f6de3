"""Throughput of the streaming preprocessors on generated files in the real formats (``make bench``).

Each benchmark times a one-thread ``pyarrow.csv.read_csv`` of the same file,
interleaved with hotcold's runs, and records both lines/s, their ratio (issue
target: hotcold at >= 0.5 of pyarrow's speed) and the same from CPU time (less
disturbed by other jobs on a shared machine) in ``extra_info``. The first call
compiles the numba kernels, so it is run once before timing. Taobao runs with
its events held in memory (one bucket: the default below 8M events) and spilled
to bucket files on disk (as a file of over 8M events is).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from hotcold.data.sources.criteo import preprocess_criteo
from hotcold.data.sources.criteo_config import CriteoConfig
from hotcold.data.sources.taobao import preprocess_taobao
from hotcold.data.sources.taobao_config import TaobaoConfig

CRITEO_LINES = int(os.environ.get("HOTCOLD_BENCH_CRITEO_LINES", 1_000_000))
TAOBAO_EVENTS = int(os.environ.get("HOTCOLD_BENCH_TAOBAO_EVENTS", 4_000_000))
ROUNDS = 3
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex8(values: np.ndarray) -> np.ndarray:
    """uint32 [n] -> 'S8' lowercase hex strings, vectorised."""
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    digits = _HEX[(values[:, None] >> shifts) & np.uint32(15)]
    return digits.reshape(-1).view("S8")


def criteo_file(path: Path, n: int, seed: int = 0, block: int = 250_000) -> Path:
    """Criteo Kaggle TSV: label, 13 integers (10% empty, a few negative), 26 8-hex-digit ids (5% empty)
    drawn from skewed pools of 100,000 values per table. Written in blocks by pyarrow (seconds per million)."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2**32, (26, 100_000), dtype=np.uint32)
    opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    schema = pa.schema([pa.field(f"c{i}", pa.int64() if i < 14 else pa.binary()) for i in range(40)])
    with pacsv.CSVWriter(str(path), schema, write_options=opts) as w:
        for a in range(0, n, block):
            m = min(block, n - a)
            cols = [pa.array(rng.integers(0, 2, m))]
            for _ in range(13):
                cols.append(pa.array(rng.integers(-2, 10_000, m), mask=rng.random(m) < 0.1))
            for t in range(26):
                picks = pool[t, np.minimum(rng.zipf(1.2, m) - 1, 99_999)]
                cols.append(pa.array(_hex8(picks), type=pa.binary(), mask=rng.random(m) < 0.05))
            w.write_table(pa.Table.from_arrays(cols, schema=schema))
    return path


TAOBAO_TIMES = (1_511_539_200, 1_512_316_800)   # 2017-11-25 .. 2017-12-03 (UTC), the real file's range
TAOBAO_BEHAVIORS = (("pv", 0.895), ("cart", 0.055), ("fav", 0.029), ("buy", 0.021))


def taobao_file(path: Path, n: int, seed: int = 0, block: int = 1_000_000) -> Path:
    """UserBehavior.csv: ``user,item,category,behavior,timestamp``, ``n`` lines in random order.

    Shaped like the real file (100M events, ~1M users, ~4M items, ~9.4k categories): n/100 users drawn
    skewed (a few heavy users), n/25 items drawn Zipf(1.1) from scattered raw ids, each item with one
    category (Zipf over n/10,000 categories; 1% of events name another), the real behaviour mix, timestamps
    uniform over the real 9 days with 0.1% outside them, and 0.2% exact repeats of a line of the same block
    (the real file has some: they are dropped and counted). Written in blocks by pyarrow (about a second per
    million)."""
    rng = np.random.default_rng(seed)
    n_users, n_items = max(100, n // 100), max(1_000, n // 25)
    n_cats = max(20, n // 10_000)
    user_ids = rng.choice(1_018_011, n_users, replace=False) + 1 if n_users < 1_018_011 else np.arange(1, n_users + 1)
    item_ids = rng.choice(5_163_070, n_items, replace=False) + 1 if n_items < 5_163_070 else np.arange(1, n_items + 1)
    cat_ids = rng.choice(5_162_429, n_cats, replace=False) + 1
    item_cat = cat_ids[np.minimum(rng.zipf(1.2, n_items), n_cats) - 1]
    names = np.array([b for b, _ in TAOBAO_BEHAVIORS])
    share = np.array([p for _, p in TAOBAO_BEHAVIORS])
    with open(path, "wb") as f:
        for a in range(0, n, block):
            m = min(block, n - a)
            user = user_ids[(n_users * rng.random(m) ** 2).astype(np.int64)]
            item = np.minimum(rng.zipf(1.1, m), n_items) - 1
            cat = np.where(rng.random(m) < 0.01, cat_ids[rng.integers(0, n_cats, m)], item_cat[item])
            t = rng.integers(*TAOBAO_TIMES, m)
            out = rng.random(m) < 0.001
            t[out] += rng.integers(-30 * 86_400, 30 * 86_400, int(out.sum()))
            table = pa.table({"u": user, "i": item_ids[item], "c": cat,
                              "b": names[rng.choice(len(names), m, p=share / share.sum())], "t": t})
            rep = np.flatnonzero(rng.random(m) < 0.002)
            rows = np.arange(m)
            rows[rep] = rng.integers(0, m, rep.size)            # a line repeated exactly elsewhere in the block
            buf = pa.BufferOutputStream()
            pacsv.write_csv(table.take(rows), buf, pacsv.WriteOptions(include_header=False, quoting_style="none"))
            f.write(buf.getvalue().to_pybytes())
    return path


def arrow_parse(path: Path, delimiter: str) -> None:
    """The reference: pyarrow's CSV reader on one thread (types inferred)."""
    pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False, autogenerate_column_names=True),
                   parse_options=pacsv.ParseOptions(delimiter=delimiter))


def _interleaved(benchmark, ours, reference, count: int, cleanup=None) -> None:
    """Time ``ours`` (the benchmark) and ``reference`` alternately; record lines/s of both and the ratio.
    ``cleanup`` (untimed) runs after each of ours."""
    ours()                                   # compile the kernels, warm the page cache
    if cleanup is not None:
        cleanup()
    ref_times, times, ref_cpu, cpu = [], [], [], []

    def timed(fn, wall, used):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        used.append(time.process_time() - c0)

    def run():
        timed(reference, ref_times, ref_cpu)
        timed(ours, times, cpu)
        if cleanup is not None:
            cleanup()

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    ours_rate, ref_rate = count / min(times), count / min(ref_times)
    cpu_ratio = min(ref_cpu) / min(cpu)
    benchmark.extra_info.update(lines=count, rows_per_s=ours_rate, pyarrow_rows_per_s=ref_rate,
                                ratio_to_pyarrow=ours_rate / ref_rate, cpu_ratio_to_pyarrow=cpu_ratio,
                                load_average=os.getloadavg()[0])
    print(f"\n{count:,} lines: hotcold {ours_rate:,.0f} lines/s, pyarrow (1 thread) {ref_rate:,.0f} lines/s, "
          f"ratio {ours_rate / ref_rate:.2f}; CPU time ratio {cpu_ratio:.2f} (load average {os.getloadavg()[0]:.2f})")


@pytest.fixture(scope="module")
def criteo_src(tmp_path_factory) -> Path:
    return criteo_file(tmp_path_factory.mktemp("criteo") / "train.txt", CRITEO_LINES)


@pytest.mark.parametrize("encoding", ["frequency", "modulo"])
def test_criteo_kaggle_throughput(benchmark, tmp_path, criteo_src, encoding):
    cfg = CriteoConfig.from_dict({"kind": "criteo-kaggle", "encoding": encoding, "max_ind_range": 1_000_000})
    _interleaved(benchmark, lambda: preprocess_criteo([criteo_src], tmp_path / "out", cfg, name="k", progress=False),
                 lambda: arrow_parse(criteo_src, "\t"), CRITEO_LINES)


@pytest.fixture(scope="module")
def taobao_src(tmp_path_factory) -> Path:
    return taobao_file(tmp_path_factory.mktemp("taobao") / "UserBehavior.csv", TAOBAO_EVENTS)


@pytest.mark.parametrize("events", ["held", "spilled"])
def test_taobao_throughput(benchmark, tmp_path, taobao_src, events):
    """Each run writes a new dataset (deleting the previous one is not timed: a first run has none to
    replace; a run over an existing dataset also pays its deletion, about 0.03 s at 4M lines)."""
    cfg = TaobaoConfig.from_dict({})
    per_bucket = None if events == "held" else max(TAOBAO_EVENTS // 4, 1)     # four buckets on disk
    _interleaved(benchmark, lambda: preprocess_taobao(taobao_src, tmp_path / "out", cfg, name="t", progress=False,
                                                      bucket_events=per_bucket),
                 lambda: arrow_parse(taobao_src, ","), TAOBAO_EVENTS,
                 cleanup=lambda: shutil.rmtree(tmp_path / "out"))
