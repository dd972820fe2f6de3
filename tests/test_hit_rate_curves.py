"""The hit-rate-curves figure: drawn from tiny curves CSVs, trained sizes and measured hit rates read right."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("seaborn", reason="seaborn is not installed: the figures need it (make setup installs it)")

from hotcold.analysis.hit_rate_curves import measured_hit_rates, trained_sizes
from hotcold.cli import main
from hotcold.trace import stackdist
from hotcold.policies.batches import Trace


def _curves(tmp_path: Path, dataset: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    trace = Trace.from_batches([rng.integers(0, 200, 12) for _ in range(40)], 200)
    grid = pd.concat([stackdist.grid_curve(trace, p, [8, 20, 60], from_step=5) for p in ("lfu", "freqcache")])
    whole, timed = stackdist.lru_curves(trace, 5)
    frame = stackdist.curves_frame(whole, stackdist.log_capacities(200, 30), grid, dataset, timed)
    path = tmp_path / f"{dataset}.csv"
    frame.to_csv(path, index=False)
    return path


SUMMARY = pd.DataFrame({
    "dataset": ["a", "a", "a", "a", "b", "a"], "method": ["lru", "lfu", "scratchpipe", "fae", "lru", "device"],
    "variant": ["10pct", "10pct", "w2-5pct", "6.2pct", "10pct", "base"], "world": [1] * 6, "seed": [0] * 6,
    "status": ["ok", "ok", "ok", "ok", "infeasible", "ok"],
    "options": ["cache_ratio=0.1", "cache_ratio=0.1", "window=2, scratchpad_ratio=0.05",
                "budget_ratio=0.062, sample_fraction=1.0", "cache_ratio=0.1", None],
})


def test_trained_sizes_come_from_the_options() -> None:
    sizes = trained_sizes(SUMMARY)
    got = sorted(zip(sizes.dataset, sizes.method, sizes.ratio, sizes.key))
    assert got == [("a", "fae", 0.062, "budget_ratio"), ("a", "lfu", 0.1, "cache_ratio"),
                   ("a", "lru", 0.1, "cache_ratio"), ("a", "scratchpipe", 0.05, "scratchpad_ratio"),
                   ("b", "lru", 0.1, "cache_ratio")]


def test_measured_hit_rates_are_hits_over_lookups_averaged_over_seeds() -> None:
    counters = pd.DataFrame({
        "dataset": ["a"] * 6, "method": ["lru"] * 6, "variant": ["10pct"] * 6, "world": [1] * 6,
        "seed": [0, 0, 1, 1, 0, 0], "counter": ["hits", "lookups", "hits", "lookups", "evictions", "misses"],
        "per_step": [30.0, 40.0, 35.0, 40.0, 2.0, 10.0]})
    got = measured_hit_rates(counters, trained_sizes(SUMMARY))
    assert got[["dataset", "method", "ratio"]].values.tolist() == [["a", "lru", 0.1]]
    assert got.hit_rate.iloc[0] == pytest.approx((0.75 + 0.875) / 2)


def test_the_figure_is_drawn_with_and_without_tables(tmp_path: Path) -> None:
    paths = [str(_curves(tmp_path, "a", 0)), str(_curves(tmp_path, "b", 1))]
    tables = tmp_path / "tables"
    tables.mkdir()
    SUMMARY.to_csv(tables / "summary.csv", index=False)
    pd.DataFrame({"dataset": "a", "method": "lru", "variant": "10pct", "world": 1, "seed": 0,
                  "counter": ["hits", "lookups"], "per_step": [9.0, 12.0]}).to_csv(tables / "counters.csv", index=False)
    assert main(["hit-rate-curves", *paths, "--tables", str(tables), "--out", str(tmp_path / "figs")]) == 0
    assert main(["hit-rate-curves", paths[0], "--out", str(tmp_path / "bare")]) == 0
    for out in ("figs", "bare"):
        for ext in ("png", "pdf"):
            assert (tmp_path / out / f"hit_rate_curves.{ext}").stat().st_size > 1000
