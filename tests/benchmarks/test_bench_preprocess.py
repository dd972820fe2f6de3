"""Throughput of the streaming preprocessors on generated files in the real formats (``make bench``).

Each benchmark records rows (or events) per second in ``extra_info``. The Criteo
ones also time a one-thread ``pyarrow.csv.read_csv`` of the same file, interleaved
with hotcold's runs, and record both lines/s and their ratio (issue target: hotcold
at >= 0.5 of pyarrow's speed). The first call compiles the numba kernels, so it is
run once before timing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from hotcold.data.sources.criteo import CriteoConfig, preprocess_criteo
from hotcold.data.sources.taobao import TaobaoConfig, preprocess_taobao

CRITEO_LINES = int(os.environ.get("HOTCOLD_BENCH_CRITEO_LINES", 1_000_000))
TAOBAO_EVENTS = int(os.environ.get("HOTCOLD_BENCH_TAOBAO_EVENTS", 1_000_000))
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


def taobao_file(path: Path, n: int, seed: int = 0) -> Path:
    """UserBehavior.csv: user, item, category, behaviour, timestamp."""
    rng = np.random.default_rng(seed)
    items = np.minimum(rng.zipf(1.1, n), 400_000)
    table = pa.table({"u": rng.integers(1, 50_000, n), "i": items, "c": items % 5_000,
                      "b": pa.array(np.array(["pv", "buy", "cart", "fav"])[rng.integers(0, 4, n)]),
                      "t": 1_511_500_000 + rng.integers(0, 800_000, n)})
    pacsv.write_csv(table, str(path), pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return path


def arrow_parse(path: Path, delimiter: str) -> None:
    """The reference: pyarrow's CSV reader on one thread (types inferred)."""
    pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False, autogenerate_column_names=True),
                   parse_options=pacsv.ParseOptions(delimiter=delimiter))


def _interleaved(benchmark, ours, reference, count: int) -> None:
    """Time ``ours`` (the benchmark) and ``reference`` alternately; record lines/s of both and the ratio."""
    ours()                                   # compile the kernels, warm the page cache
    ref_times, times = [], []

    def run():
        t0 = time.perf_counter()
        reference()
        ref_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours()
        times.append(time.perf_counter() - t0)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    ours_rate, ref_rate = count / min(times), count / min(ref_times)
    benchmark.extra_info.update(lines=count, rows_per_s=ours_rate, pyarrow_rows_per_s=ref_rate,
                                ratio_to_pyarrow=ours_rate / ref_rate, load_average=os.getloadavg()[0])
    print(f"\n{count:,} lines: hotcold {ours_rate:,.0f} lines/s, pyarrow (1 thread) {ref_rate:,.0f} lines/s, "
          f"ratio {ours_rate / ref_rate:.2f} (load average {os.getloadavg()[0]:.2f})")


@pytest.fixture(scope="module")
def criteo_src(tmp_path_factory) -> Path:
    return criteo_file(tmp_path_factory.mktemp("criteo") / "train.txt", CRITEO_LINES)


@pytest.mark.parametrize("encoding", ["frequency", "modulo"])
def test_criteo_kaggle_throughput(benchmark, tmp_path, criteo_src, encoding):
    cfg = CriteoConfig.from_dict({"kind": "criteo-kaggle", "encoding": encoding, "max_ind_range": 1_000_000})
    _interleaved(benchmark, lambda: preprocess_criteo([criteo_src], tmp_path / "out", cfg, name="k", progress=False),
                 lambda: arrow_parse(criteo_src, "\t"), CRITEO_LINES)


def test_taobao_throughput(benchmark, tmp_path):
    src = taobao_file(tmp_path / "UserBehavior.csv", TAOBAO_EVENTS)
    cfg = TaobaoConfig.from_dict({})
    _interleaved(benchmark, lambda: preprocess_taobao(src, tmp_path / "out", cfg, name="t", progress=False),
                 lambda: arrow_parse(src, ","), TAOBAO_EVENTS)
