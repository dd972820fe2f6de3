"""Tables and figures from hand-made run records."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hotcold.analysis.figures import make_figures
from hotcold.analysis.tables import NoRecordsError, RecordError, aggregate, find_records

PHASES = ("data", "h2d", "emb_fwd", "dense_fwd_bwd", "d2h", "emb_update")
COUNTERS = ("lookups", "unique_rows", "hits", "misses", "rows_h2d", "rows_d2h", "bytes_h2d", "bytes_d2h")
SKETCH = np.linspace(-1.0, 1.0, 256)


def write_run(runs: Path, dataset: str, method: str, variant: str, seed: int, *, rate: float,
              timer: str = "cpu", sketch: np.ndarray = SKETCH, step_ms: float = 10.0,
              data_sha: str = "0" * 64) -> Path:
    """Write a minimal but complete run directory the way ``hotcold train`` does."""
    out = runs / dataset / method / variant / f"seed~{seed}"
    out.mkdir(parents=True)
    phase_ms = {p: step_ms / len(PHASES) for p in PHASES}
    counters = {c: float(i + 1) for i, c in enumerate(COUNTERS)}
    steps = pd.DataFrame(
        [{"step": s, "kind": "phase", "name": p, "value": v} for s in range(3) for p, v in phase_ms.items()]
        + [{"step": s, "kind": "counter", "name": c, "value": v} for s in range(3) for c, v in counters.items()]
    )
    steps.to_parquet(out / "steps.parquet")
    device = "cpu" if timer == "cpu" else "NVIDIA H100"
    record = {
        "dataset": dataset, "method": method, "variant": variant, "seed": seed, "config": {},
        "dataset_manifest_sha256": data_sha,
        "provenance": {"device": device, "device_type": timer, "cpu": "x86_64", "driver": None, "cuda": None,
                       "torch": "2.13.0", "python": "3.11.7", "threads": 2, "git_commit": "abc",
                       "git_dirty": False, "hotcold_version": "0.1.0", "timer": timer},
        "summary": {"timer": timer, "batch_size": 1024, "steps_timed": 3, "samples_per_s": rate,
                    "step_ms_p50": step_ms, "step_ms_p10": step_ms * 0.9, "step_ms_p90": step_ms * 1.1,
                    "step_ms_mean": step_ms, "phase_ms_p50": phase_ms, "phase_ms_mean": phase_ms,
                    "counters_per_step": counters},
        "metrics": {"auc": 0.7, "logloss": 0.5, "eval_samples": 1000},
        "params": {"checksum": "f" * 64, "sketch": list(map(float, sketch)), "norm": 1.0},
    }
    (out / "record.json").write_text(json.dumps(record))
    return out


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "device", "base", 0, rate=5000.0)
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0, sketch=SKETCH * (1 + 1e-8))
    write_run(runs, "kaggle", "hybrid", "big", 0, rate=1500.0)
    write_run(runs, "kaggle", "cache", "lfu", 0, rate=2500.0, sketch=SKETCH + 1e-3)
    write_run(runs, "kaggle", "cache", "lfu", 1, rate=2000.0)
    write_run(runs, "terabyte", "cache", "lfu", 0, rate=3000.0, timer="cuda")
    write_run(runs, "terabyte", "hybrid", "base", 0, rate=1200.0, timer="cpu")
    return runs


def row(frame: pd.DataFrame, dataset: str, method: str, variant: str, seed: int) -> pd.Series:
    sel = frame[(frame.dataset == dataset) & (frame.method == method) & (frame.variant == variant)
                & (frame.seed == seed)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_summary_columns_and_order(runs: Path, tmp_path: Path) -> None:
    summary = aggregate(find_records(runs), tmp_path / "tables", exact_rtol=1e-6)
    required = ["dataset", "method", "variant", "seed", "timer", "device", "samples_per_s", "step_ms_p50",
                "step_ms_p10", "step_ms_p90", "speedup_vs_hybrid", "auc", "logloss", "exact", "param_rel_diff"]
    assert set(required) <= set(summary.columns)
    on_disk = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert set(required) <= set(on_disk.columns)
    keys = list(on_disk[["dataset", "method", "variant", "seed"]].itertuples(index=False, name=None))
    assert keys == sorted(keys)
    assert len(on_disk) == 7


def test_speedup_is_over_hybrid_base_of_same_seed(runs: Path, tmp_path: Path) -> None:
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert row(summary, "kaggle", "device", "base", 0).speedup_vs_hybrid == pytest.approx(5.0)
    assert row(summary, "kaggle", "hybrid", "base", 0).speedup_vs_hybrid == pytest.approx(1.0)
    assert row(summary, "kaggle", "hybrid", "big", 0).speedup_vs_hybrid == pytest.approx(1.5)
    assert row(summary, "kaggle", "cache", "lfu", 0).speedup_vs_hybrid == pytest.approx(2.5)
    assert math.isnan(row(summary, "kaggle", "cache", "lfu", 1).speedup_vs_hybrid)  # no hybrid with seed 1


def test_speedup_falls_back_to_first_hybrid_variant(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "hybrid", "zeta", 0, rate=400.0)
    write_run(runs, "kaggle", "hybrid", "alpha", 0, rate=200.0)
    write_run(runs, "kaggle", "cache", "lfu", 0, rate=1000.0)
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert row(summary, "kaggle", "cache", "lfu", 0).speedup_vs_hybrid == pytest.approx(5.0)


def test_timer_kinds_are_not_mixed(runs: Path, tmp_path: Path) -> None:
    summary = aggregate(find_records(runs), tmp_path / "tables")
    # the only terabyte hybrid run was timed on the CPU; the cache run on CUDA has no baseline
    assert math.isnan(row(summary, "terabyte", "cache", "lfu", 0).speedup_vs_hybrid)
    assert row(summary, "terabyte", "cache", "lfu", 0).timer == "cuda"
    phases = pd.read_csv(tmp_path / "tables" / "phases.csv")
    assert set(phases[phases.dataset == "terabyte"].groupby("method").timer.unique().map(tuple)) == {
        ("cuda",), ("cpu",)}


def test_runs_on_another_dataset_build_are_not_compared(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "device", "base", 0, rate=5000.0, data_sha="a" * 64)
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0, data_sha="b" * 64)
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert math.isnan(row(summary, "kaggle", "device", "base", 0).speedup_vs_hybrid)
    assert pd.isna(row(summary, "kaggle", "hybrid", "base", 0).exact)


def test_exact_compares_sketches_with_device_run(runs: Path, tmp_path: Path) -> None:
    summary = aggregate(find_records(runs), tmp_path / "tables", exact_rtol=1e-6)
    assert bool(row(summary, "kaggle", "device", "base", 0).exact) is True
    hybrid = row(summary, "kaggle", "hybrid", "base", 0)
    assert bool(hybrid.exact) is True
    assert hybrid.param_rel_diff == pytest.approx(1e-8, rel=1e-3)
    cache = row(summary, "kaggle", "cache", "lfu", 0)
    expected = np.linalg.norm(np.full(256, 1e-3)) / np.linalg.norm(SKETCH)
    assert cache.param_rel_diff == pytest.approx(expected)
    assert bool(cache.exact) is False
    assert pd.isna(row(summary, "kaggle", "cache", "lfu", 1).exact)  # no device run with seed 1
    assert pd.isna(row(summary, "terabyte", "hybrid", "base", 0).exact)
    strict = aggregate(find_records(runs), tmp_path / "strict", exact_rtol=1e-9)
    assert bool(row(strict, "kaggle", "hybrid", "base", 0).exact) is False


def test_phase_and_counter_tables_are_long(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    phases = pd.read_csv(tmp_path / "tables" / "phases.csv")
    assert list(phases.columns) == ["dataset", "method", "variant", "seed", "timer", "phase", "ms_p50", "ms_mean"]
    assert list(phases.phase[:len(PHASES)]) == list(PHASES)
    assert len(phases) == 7 * len(PHASES)
    counters = pd.read_csv(tmp_path / "tables" / "counters.csv")
    assert list(counters.columns) == ["dataset", "method", "variant", "seed", "timer", "counter", "per_step"]
    assert len(counters) == 7 * len(COUNTERS)
    assert counters[counters.counter == "hits"].per_step.eq(3.0).all()


def test_markdown_is_written(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    text = (tmp_path / "tables" / "summary.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["dataset", "method", "variant", "seed"]
    assert "speedup_vs_hybrid" in header and "exact" in header
    assert set(lines[1]) <= {"|", "-", ":"}
    assert len(lines) == 2 + 7
    assert len({len(ln) for ln in lines}) == 1  # columns are aligned
    assert "5.00x" in text
    counters = [ln for ln in (tmp_path / "tables" / "counters.md").read_text().splitlines() if ln.startswith("|")]
    assert len(counters) == 2 + 7
    assert "bytes_d2h" in counters[0] and "8.0 |" in counters[2]
    assert not list((tmp_path / "tables").glob(".*tmp*"))


def test_figures_are_written(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    paths = make_figures(tmp_path / "tables", tmp_path / "figs")
    names = sorted(p.name for p in paths)
    assert names == ["step_phases.pdf", "step_phases.png", "throughput.pdf", "throughput.png"]
    for p in paths:
        assert p.is_file() and p.stat().st_size > 1000
    assert (tmp_path / "figs" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "figs" / "step_phases.pdf").read_bytes()[:5] == b"%PDF-"
    assert not list((tmp_path / "figs").glob(".*"))


def test_no_records_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "runs" / "kaggle" / "hybrid" / "base" / "seed~0").mkdir(parents=True)  # incomplete run
    with pytest.raises(NoRecordsError, match="no run records given"):
        aggregate(find_records(tmp_path / "runs"), tmp_path / "tables")
    assert not (tmp_path / "tables" / "summary.csv").exists()


def test_missing_tables_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="summary.csv"):
        make_figures(tmp_path / "tables", tmp_path / "figs")


def test_record_in_wrong_place_is_rejected(tmp_path: Path) -> None:
    out = write_run(tmp_path / "runs", "kaggle", "hybrid", "base", 0, rate=1.0)
    moved = out.parent.parent / "other" / "seed~0"
    moved.parent.mkdir()
    out.rename(moved)
    with pytest.raises(RecordError, match="variant"):
        aggregate(find_records(tmp_path / "runs"), tmp_path / "tables")
