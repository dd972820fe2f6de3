"""Tables and figures from hand-made run records and simulation CSVs."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("seaborn", reason="seaborn is not installed: the figures need it (make setup installs it)")
from matplotlib.collections import LineCollection  # noqa: E402 - after the skip

from hotcold.analysis.comparisons import cache_sim_table
from hotcold.analysis.figures import make_figures
from hotcold.analysis.run_records import NoRecordsError, RecordError, find_records
from hotcold.analysis.tables import aggregate
from hotcold.cli import main
from hotcold.counters import FIELDS

PHASES = ("data", "h2d", "emb_fwd", "dense_fwd_bwd", "d2h", "emb_update")
COUNTERS = FIELDS
SKETCH = np.linspace(-1.0, 1.0, 256)
FIGURES = ("fae_hot_fraction", "hit_rate", "rows_moved", "speedup", "step_phases", "throughput")


def write_run(runs: Path, dataset: str, method: str, variant: str, seed: int, *, rate: float,
              timer: str = "cpu", sketch: np.ndarray = SKETCH, step_ms: float = 10.0,
              data_sha: str = "0" * 64, auc: float = 0.7, options: dict | None = None,
              store: dict | None = None, reference_sketch: np.ndarray | None = None,
              counters: dict | None = None, commit: str = "abc", dirty: bool = False) -> Path:
    """Write a minimal but complete run directory the way ``hotcold train`` does."""
    out = runs / dataset / method / variant / f"seed~{seed}"
    out.mkdir(parents=True)
    phase_ms = {p: step_ms / len(PHASES) for p in PHASES}
    counters = counters or {c: float(i + 1) for i, c in enumerate(COUNTERS)}
    steps = pd.DataFrame(
        [{"step": s, "kind": "phase", "name": p, "value": v} for s in range(3) for p, v in phase_ms.items()]
        + [{"step": s, "kind": "counter", "name": c, "value": v} for s in range(3) for c, v in counters.items()]
    )
    steps.to_parquet(out / "steps.parquet")
    device = "cpu" if timer == "cpu" else "NVIDIA H100"
    record = {
        "dataset": dataset, "method": method, "variant": variant, "seed": seed,
        "config": {"store": options or {}},
        "dataset_manifest_sha256": data_sha,
        "provenance": {"device": device, "device_type": timer, "cpu": "x86_64", "driver": None, "cuda": None,
                       "torch": "2.13.0", "python": "3.11.7", "threads": 2, "git_commit": commit,
                       "git_dirty": dirty, "hotcold_version": "0.1.0", "timer": timer},
        "summary": {"timer": timer, "batch_size": 1024, "steps_timed": 3, "samples_per_s": rate,
                    "step_ms_p50": step_ms, "step_ms_p10": step_ms * 0.9, "step_ms_p90": step_ms * 1.1,
                    "step_ms_mean": step_ms, "phase_ms_p50": phase_ms, "phase_ms_mean": phase_ms,
                    "counters_per_step": counters},
        "metrics": {"auc": auc, "logloss": 0.5, "eval_samples": 1000},
        "params": {"checksum": "f" * 64, "sketch": list(map(float, sketch)), "norm": 1.0},
        "store": store or {},
    }
    if reference_sketch is not None:
        record["reference"] = {"method": "device", "order": "this run's", "metrics": {"auc": auc},
                               "params": {"checksum": "e" * 64, "sketch": list(map(float, reference_sketch)),
                                          "norm": 1.0}}
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
    required = ["dataset", "method", "variant", "world", "ranks_per_node", "plan", "seed", "timer", "device",
                "samples_per_s", "step_ms_p50",
                "step_ms_p10", "step_ms_p90", "speedup_vs_hybrid", "auc", "logloss", "exact", "param_rel_diff"]
    assert set(required) <= set(summary.columns)
    on_disk = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert set(required) <= set(on_disk.columns)
    keys = list(on_disk[["dataset", "method", "variant", "seed"]].itertuples(index=False, name=None))
    assert keys == sorted(keys)
    assert len(on_disk) == 7
    assert (on_disk.world == 1).all() and (on_disk.ranks_per_node == 1).all() and on_disk.plan.isna().all()


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
    assert list(phases.columns) == ["dataset", "method", "variant", "world", "ranks_per_node", "seed", "timer", "phase",
                                    "ms_p50", "ms_mean"]
    assert list(phases.phase[:len(PHASES)]) == list(PHASES)
    assert len(phases) == 7 * len(PHASES)
    counters = pd.read_csv(tmp_path / "tables" / "counters.csv")
    assert list(counters.columns) == ["dataset", "method", "variant", "world", "ranks_per_node", "seed", "timer",
                                      "counter", "per_step"]
    assert len(counters) == 7 * len(COUNTERS)
    assert counters[counters.counter == "hits"].per_step.eq(3.0).all()


def test_markdown_is_written(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    text = (tmp_path / "tables" / "summary.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:7] == ["dataset", "method", "variant", "world", "ranks_per_node", "seed", "plan"]
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
    write_sim(tmp_path / "tables" / "cache_sim.csv", "kaggle")
    paths = make_figures(tmp_path / "tables", tmp_path / "figs")
    names = sorted(p.name for p in paths)
    assert names == sorted(f"{f}.{ext}" for f in FIGURES for ext in ("png", "pdf"))
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


def test_figures_without_simulation_skip_hit_rate(runs: Path, tmp_path: Path, drawn_figures) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    names = set(drawn_figures(tmp_path / "tables"))  # drawn, not saved (saving: test_figures_are_written)
    assert "hit_rate" not in names and "speedup" in names and "rows_moved" in names


# ---------------------------------------------------------------- exactness and accuracy


def test_exact_uses_the_records_own_reference(tmp_path: Path) -> None:
    """A store with its own batch order is exact against its device replay, not against the device run."""
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "device", "base", 0, rate=5000.0)
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0)
    reordered = SKETCH + 1e-2  # another batch order trains other parameters
    write_run(runs, "kaggle", "fae", "good", 0, rate=2000.0, sketch=reordered, reference_sketch=reordered)
    write_run(runs, "kaggle", "fae", "bad", 0, rate=2000.0, sketch=reordered + 1e-3, reference_sketch=reordered)
    write_run(runs, "terabyte", "fae", "alone", 0, rate=2000.0, reference_sketch=SKETCH)  # no device run
    summary = aggregate(find_records(runs), tmp_path / "tables", exact_rtol=1e-6)
    good = row(summary, "kaggle", "fae", "good", 0)
    assert bool(good.exact) is True and good.param_rel_diff == 0.0
    assert good.exact_reference == "device replay of this order" and good.exact_check.startswith("bits: ")
    bad = row(summary, "kaggle", "fae", "bad", 0)
    assert bool(bad.exact) is False
    assert bad.param_rel_diff == pytest.approx(np.linalg.norm(np.full(256, 1e-3)) / np.linalg.norm(reordered))
    alone = row(summary, "terabyte", "fae", "alone", 0)
    assert bool(alone.exact) is True and alone.exact_reference == "device replay of this order"
    hybrid = row(summary, "kaggle", "hybrid", "base", 0)
    assert hybrid.exact_reference == "device run"
    on_disk = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert set(on_disk.exact_reference) == {"device run", "device replay of this order"}
    assert "device replay of this order" in (tmp_path / "tables" / "summary.md").read_text()


def test_auc_vs_hybrid(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0, auc=0.70)
    write_run(runs, "kaggle", "fae", "b", 0, rate=2000.0, auc=0.72)
    write_run(runs, "kaggle", "fae", "b", 1, rate=2000.0, auc=0.71)
    write_run(runs, "kaggle", "hybrid", "cuda", 0, rate=900.0, auc=0.60, timer="cuda")
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert row(summary, "kaggle", "fae", "b", 0).auc_vs_hybrid == pytest.approx(0.02)
    assert row(summary, "kaggle", "hybrid", "base", 0).auc_vs_hybrid == pytest.approx(0.0)
    assert row(summary, "kaggle", "hybrid", "cuda", 0).auc_vs_hybrid == pytest.approx(-0.10)  # against base
    assert math.isnan(row(summary, "kaggle", "fae", "b", 1).auc_vs_hybrid)  # no hybrid run with seed 1
    assert "+0.0200" in (tmp_path / "tables" / "summary.md").read_text()


# ---------------------------------------------------------------- comparison tables


def test_speedup_table_means_over_seeds(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    speedup = pd.read_csv(tmp_path / "tables" / "speedup.csv")
    assert list(speedup.columns[:4]) == ["dataset", "timer", "method", "variant"]
    lfu = speedup[(speedup.dataset == "kaggle") & (speedup.method == "cache")].iloc[0]
    assert lfu.seeds == 2
    assert lfu.samples_per_s == pytest.approx(2250.0)
    assert lfu.speedup_vs_hybrid == pytest.approx(2.5)  # seed 1 has no hybrid run
    assert not bool(lfu.exact)
    terabyte = speedup[speedup.dataset == "terabyte"]
    assert set(terabyte.timer) == {"cpu", "cuda"}  # one row per timer kind, never pooled
    assert terabyte[terabyte.timer == "cuda"].speedup_vs_hybrid.isna().all()
    assert len(speedup) == 6
    assert "2.50x" in (tmp_path / "tables" / "speedup.md").read_text()


def test_fae_table_from_store_reports(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0)
    for variant, ratio, frac in (("big", 0.25, 0.6), ("small", 0.06, 0.2)):
        write_run(runs, "kaggle", "fae", variant, 0, rate=2000.0, options={"budget_ratio": ratio},
                  store={"hot_fraction": frac, "hot_rows": int(ratio * 1000), "hot_ratio": ratio,
                         "hot_bytes": int(ratio * 1000) * 68, "sampled_inputs": 50},
                  counters={"lookups": 10.0, "param_rows_h2d": 1.0, "param_rows_d2h": 1.0, "hot_batch": frac / 2,
                            "switches": 0.01, "sync_bytes": 680.0, "vector_bytes_h2d": 64.0,
                            "grad_bytes_d2h": 64.0})
    aggregate(find_records(runs), tmp_path / "tables")
    fae = pd.read_csv(tmp_path / "tables" / "fae_hot_fraction.csv")
    assert list(fae.variant) == ["small", "big"]  # by hot rows
    assert list(fae.hot_fraction) == [0.2, 0.6]
    assert list(fae.budget_ratio) == [0.06, 0.25]
    assert fae.budget_bytes.isna().all()
    assert list(fae.hot_batch_share) == pytest.approx([0.1, 0.3])
    assert list(fae.switches_per_step) == [0.01, 0.01] and list(fae.sync_bytes_per_step) == [680.0, 680.0]
    assert list(fae.activation_bytes_per_step) == [128.0, 128.0]
    assert list(fae.speedup_vs_hybrid) == pytest.approx([2.0, 2.0])
    assert list(fae.options) == ["budget_ratio=0.06", "budget_ratio=0.25"]


def test_traffic_table_adds_bytes_of_each_kind(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    moved = pd.read_csv(tmp_path / "tables" / "rows_moved.csv")
    assert len(moved) == 7
    v = {c: float(i + 1) for i, c in enumerate(FIELDS)}  # the fixture's counters
    first = moved.iloc[0]
    assert first.param_bytes == v["param_bytes_h2d"] + v["param_bytes_d2h"]
    assert first.activation_bytes == v["vector_bytes_h2d"] + v["grad_bytes_d2h"]
    assert first.bytes_moved == first.param_bytes + first.activation_bytes
    assert first.bytes_per_lookup == pytest.approx(first.bytes_moved / v["lookups"])
    assert first.hit_rate == pytest.approx(v["hits"] / v["lookups"])
    assert moved.bytes_moved.notna().all()


def write_sim(path: Path, dataset: str) -> Path:
    """A small table in the shape ``hotcold simulate`` writes."""
    rows = []
    for policy in ("lru", "freqcache", "static-topk"):
        for cap in (10, 100, 1000):
            feasible = policy == "static-topk" or cap >= 100
            rows.append({"dataset": dataset, "policy": policy, "capacity": cap, "cache_ratio": cap / 10000,
                         "feasible": feasible, "hit_rate": 0.5 + cap / 4000 if feasible else np.nan,
                         "capacity_needed": 0 if policy == "static-topk" else 100})
    rows.append({"dataset": dataset, "policy": "scratchpipe-1", "capacity": 300, "cache_ratio": 0.03,
                 "feasible": True, "hit_rate": 0.99, "capacity_needed": 300})
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_cache_sim_table_concatenates_simulations(tmp_path: Path) -> None:
    sims = [write_sim(tmp_path / "sim" / f"{d}.csv", d) for d in ("taobao", "kaggle")]
    table = cache_sim_table(sims)
    assert list(dict.fromkeys(table.dataset)) == ["kaggle", "taobao"]
    assert len(table) == 2 * 10
    out = tmp_path / "tables" / "cache_sim.csv"
    assert main(["cache-sim", *map(str, sims), "--out", str(out)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out), table, check_dtype=False)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"dataset": ["x"], "policy": ["lru"]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="lacks column"):
        cache_sim_table([bad])
    assert main(["cache-sim", str(bad), "--out", str(tmp_path / "x.csv")]) == 2


def write_infeasible_run(runs: Path, dataset: str, method: str, variant: str, seed: int = 0) -> Path:
    """A run directory the way ``hotcold train`` writes it for a variant that cannot run."""
    out = runs / dataset / method / variant / f"seed~{seed}"
    out.mkdir(parents=True)
    pd.DataFrame(columns=["step", "kind", "name", "value"]).to_parquet(out / "steps.parquet")
    record = {"dataset": dataset, "method": method, "variant": variant, "seed": seed, "status": "infeasible",
              "reason": "cache of 1 rows is too small", "config": {"store": {"cache_rows": 1}},
              "dataset_manifest_sha256": "0" * 64, "provenance": {"device": "cpu", "timer": "cpu"}}
    (out / "record.json").write_text(json.dumps(record))
    return out


def test_infeasible_runs_are_marked_in_the_summary_and_left_out_elsewhere(runs: Path, tmp_path: Path,
                                                                         drawn_figures) -> None:
    write_infeasible_run(runs, "kaggle", "lru", "tiny")
    tables = tmp_path / "tables"
    summary = aggregate(find_records(runs), tables)
    bad = row(summary, "kaggle", "lru", "tiny", 0)
    assert bad.status == "infeasible" and bad.reason == "cache of 1 rows is too small"
    assert bad.options == "cache_rows=1" and pd.isna(bad.samples_per_s) and pd.isna(bad.exact)
    assert (summary[summary.method != "lru"].status == "ok").all()  # records without a status are ok
    on_disk = pd.read_csv(tables / "summary.csv")
    assert on_disk.status.tolist().count("infeasible") == 1
    assert "infeasible" in (tables / "summary.md").read_text()
    listing = (tables / "infeasible.md").read_text()
    assert "- kaggle/lru/tiny/seed~0 (cache_rows=1): cache of 1 rows is too small" in listing
    for name in ("phases.csv", "counters.csv", "speedup.csv", "rows_moved.csv", "fae_hot_fraction.csv"):
        assert "tiny" not in (tables / name).read_text(), name
    assert row(summary, "kaggle", "device", "base", 0).speedup_vs_hybrid == pytest.approx(5.0)
    write_sim(tables / "cache_sim.csv", "kaggle")
    assert sorted(drawn_figures(tables)) == sorted(FIGURES)  # every figure drawn, not saved (test_figures_are_written)


def test_no_infeasible_runs_says_so(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "tables")
    assert "None: every configured run trained." in (tmp_path / "tables" / "infeasible.md").read_text()


def test_only_infeasible_runs_still_write_every_table(tmp_path: Path) -> None:
    write_infeasible_run(tmp_path / "runs", "kaggle", "lru", "tiny")
    summary = aggregate(find_records(tmp_path / "runs"), tmp_path / "tables")
    assert summary.status.tolist() == ["infeasible"]
    for name in ("summary.csv", "phases.csv", "counters.csv", "speedup.csv", "rows_moved.csv", "infeasible.md"):
        assert (tmp_path / "tables" / name).is_file(), name
    with pytest.raises(ValueError, match="no trained runs"):
        make_figures(tmp_path / "tables", tmp_path / "figs")


def test_tables_say_when_runs_mix_code_versions(runs: Path, tmp_path: Path) -> None:
    aggregate(find_records(runs), tmp_path / "one")
    for name in ("summary.md", "speedup.md"):
        assert "**Code:**" not in (tmp_path / "one" / name).read_text()
    write_run(runs, "kaggle", "lru", "new", 0, rate=900.0, commit="0123456789abcdef", dirty=True)
    aggregate(find_records(runs), tmp_path / "two")
    for name in ("summary.md", "speedup.md"):
        text = (tmp_path / "two" / name).read_text()
        assert "several code versions: `abc`, `0123456789` (modified tree)" in text, name


def test_a_disturbed_run_is_marked_in_the_summary_and_speedup(runs: Path, tmp_path: Path) -> None:
    path = runs / "kaggle" / "cache" / "lfu" / "seed~1" / "record.json"
    record = json.loads(path.read_text())
    record["summary"].update(stable=False, unstable_reason="step times spread p90/p10 = 6.0 (> 3)")
    path.write_text(json.dumps(record))
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert row(summary, "kaggle", "cache", "lfu", 1)["unstable_reason"].startswith("step times spread")
    speedup = pd.read_csv(tmp_path / "tables" / "speedup.csv")
    lfu = speedup[(speedup.method == "cache") & (speedup.dataset == "kaggle")]
    assert lfu["stable"].tolist() == [False]  # one of its two seeds was disturbed
    assert speedup[speedup.method == "hybrid"]["stable"].isna().all()  # older records: not judged


def test_a_speedup_over_a_disturbed_baseline_is_not_stable(runs: Path, tmp_path: Path) -> None:
    for path in runs.glob("kaggle/*/*/seed~*/record.json"):
        record = json.loads(path.read_text())
        disturbed = record["method"] == "hybrid" and record["seed"] == 0
        record["summary"].update(stable=not disturbed, unstable_reason="CPU time 30%" if disturbed else "")
        path.write_text(json.dumps(record))
    aggregate(find_records(runs), tmp_path / "tables")
    speedup = pd.read_csv(tmp_path / "tables" / "speedup.csv")
    kaggle = speedup[speedup.dataset == "kaggle"]
    assert not kaggle["stable"].astype(bool).any()   # every method's own runs were stable; hybrid's were not


# ---------------------------------------------------------------- stability marks in the figures


def set_stable(runs: Path, dataset: str, method: str, variant: str, seed: int, stable: bool) -> None:
    path = runs / dataset / method / variant / f"seed~{seed}" / "record.json"
    record = json.loads(path.read_text())
    record["summary"].update(stable=stable, unstable_reason="" if stable else "CPU time 30% of wall time x 1 thread(s)")
    path.write_text(json.dumps(record))


@pytest.fixture
def judged_runs(tmp_path: Path) -> Path:
    """Runs whose step times match their samples/s; every one judged stable except ``cache/lfu`` seed 1."""
    runs = tmp_path / "runs"
    for method, variant, seed, rate in [("device", "base", 0, 5000.0), ("hybrid", "base", 0, 1000.0),
                                        ("hybrid", "base", 1, 1100.0), ("cache", "lfu", 0, 2500.0),
                                        ("cache", "lfu", 1, 2000.0)]:
        write_run(runs, "kaggle", method, variant, seed, rate=rate, step_ms=1024 / rate * 1e3)
        set_stable(runs, "kaggle", method, variant, seed, not (method == "cache" and seed == 1))
    return runs


def bars_by_label(ax) -> dict[str, list]:
    """The axes' bars by the x tick label they stand on (its first line)."""
    ticks = {round(t): lab.get_text().split("\n")[0] for t, lab in zip(ax.get_xticks(), ax.get_xticklabels())}
    out: dict[str, list] = {}
    for patch in ax.patches:
        out.setdefault(ticks[round(patch.get_x() + patch.get_width() / 2)], []).append(patch)
    return out


def whisker_spans(ax) -> dict[str, tuple[float, float]]:
    """Error bars by the x tick label they stand on: (low, high)."""
    ticks = {round(t): lab.get_text().split("\n")[0] for t, lab in zip(ax.get_xticks(), ax.get_xticklabels())}
    spans = {}
    for coll in ax.collections:
        for seg in coll.get_segments() if isinstance(coll, LineCollection) else []:
            (x0, y0), (x1, y1) = seg
            if x0 == x1 and y0 != y1:
                spans[ticks[round(x0)]] = (min(y0, y1), max(y0, y1))
    return spans


def test_a_disturbed_run_is_hatched_in_the_timed_figures(judged_runs: Path, tmp_path: Path, drawn_figures) -> None:
    aggregate(find_records(judged_runs), tmp_path / "tables")
    drawn = drawn_figures(tmp_path / "tables")
    for name in ("throughput", "step_phases", "speedup"):
        bars = bars_by_label(drawn[name].axes[0])
        assert set(bars) == {"device", "hybrid", "cache/lfu"}, name
        assert all(p.get_hatch() for p in bars["cache/lfu"]), name
        assert not any(p.get_hatch() for lab in ("device", "hybrid") for p in bars[lab]), name
        legend = [t.get_text() for leg in drawn[name].legends for t in leg.get_texts()]
        assert any(t.startswith("stable = no: disturbed run") for t in legend), name
    assert len(bars_by_label(drawn["step_phases"].axes[0])["cache/lfu"]) == len(PHASES)  # every phase of the stack


def test_throughput_whiskers_span_the_rates_at_p90_and_p10(judged_runs: Path, tmp_path: Path, drawn_figures) -> None:
    aggregate(find_records(judged_runs), tmp_path / "tables")
    ax = drawn_figures(tmp_path / "tables")["throughput"].axes[0]
    spans = whisker_spans(ax)
    # write_run: p10 = 0.9 and p90 = 1.1 x the step time, which is 1024 / rate; means over the two seeds
    for label, rates in {"cache/lfu": (2500.0, 2000.0), "hybrid": (1000.0, 1100.0), "device": (5000.0,)}.items():
        lo, hi = spans[label]
        assert lo == pytest.approx(np.mean([1024 / (1.1 * 1024 / r) for r in rates]))
        assert hi == pytest.approx(np.mean([1024 / (0.9 * 1024 / r) for r in rates]))
    heights = {lab: p[0].get_height() for lab, p in bars_by_label(ax).items()}
    assert heights["cache/lfu"] == pytest.approx(2250.0)


def test_figures_of_tables_without_stability_are_unmarked(judged_runs: Path, tmp_path: Path, drawn_figures) -> None:
    tables = tmp_path / "tables"
    aggregate(find_records(judged_runs), tables)
    for name in ("summary.csv", "speedup.csv"):
        pd.read_csv(tables / name).drop(columns=["stable", "unstable_reason"], errors="ignore").to_csv(
            tables / name, index=False)
    drawn = drawn_figures(tables)
    for name in ("throughput", "step_phases", "speedup"):
        assert not any(p.get_hatch() for p in drawn[name].axes[0].patches), name
        legend = [t.get_text() for leg in drawn[name].legends for t in leg.get_texts()]
        assert not any(t.startswith("stable = no") for t in legend), name


def test_speedup_bars_follow_the_speedup_table(judged_runs: Path, tmp_path: Path, drawn_figures) -> None:
    tables = tmp_path / "tables"
    aggregate(find_records(judged_runs), tables)
    speedup = pd.read_csv(tables / "speedup.csv")
    speedup["stable"] = speedup["method"] != "device"  # the table's judgement, whatever the summary says
    speedup.to_csv(tables / "speedup.csv", index=False)
    bars = bars_by_label(drawn_figures(tables)["speedup"].axes[0])
    assert [lab for lab, ps in bars.items() if any(p.get_hatch() for p in ps)] == ["device"]


def test_a_peer_is_compared_with_the_device_run_and_labelled_as_its_own_kernel(tmp_path: Path) -> None:
    """A peer method (own kernels, own rounding) is checked against the device run, and says so."""
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "device", "base", 0, rate=5000.0)
    write_run(runs, "kaggle", "hybrid", "base", 0, rate=1000.0)
    write_run(runs, "kaggle", "fbgemm", "base", 0, rate=4000.0, sketch=SKETCH + 1e-2)
    summary = aggregate(find_records(runs), tmp_path / "tables", exact_rtol=1e-6)
    peer = row(summary, "kaggle", "fbgemm", "base", 0)
    assert bool(peer.exact) is False and peer.param_rel_diff > 1e-6
    assert peer.exact_reference == "device run (peer kernel, own rounding)"
    assert peer.exact_check.startswith("end-state distance: ")
    assert row(summary, "kaggle", "hybrid", "base", 0).exact_reference == "device run"
    assert "own kernels" in (tmp_path / "tables" / "summary.md").read_text()


@pytest.mark.parametrize("ok", [True, False])
def test_a_peer_checked_in_lock_step_takes_that_checks_exactness(tmp_path: Path, ok: bool) -> None:
    """A peer's record with a lock-step check: `exact` is the check's, the end-state distance stays beside it."""
    runs = tmp_path / "runs"
    write_run(runs, "kaggle", "device", "base", 0, rate=5000.0)
    out = write_run(runs, "kaggle", "fbgemm", "base", 0, rate=4000.0, sketch=SKETCH + 1e-2)
    rec = json.loads((out / "record.json").read_text())
    rec["lockstep"] = {"check": "lockstep", "steps": 20, "atol": 1e-5, "ok": ok, "max_diff": 3e-8 if ok else 0.2}
    (out / "record.json").write_text(json.dumps(rec))
    peer = row(aggregate(find_records(runs), tmp_path / "tables", exact_rtol=1e-6), "kaggle", "fbgemm", "base", 0)
    assert bool(peer.exact) is ok and peer.param_rel_diff > 1e-6
    assert peer.exact_reference.startswith("lock-step with the device store") and "20 steps" in peer.exact_reference
    assert ("<= 1e-05" if ok else "> 1e-05") in peer.exact_reference
    assert peer.exact_check.startswith("lock-step: ")


def test_runs_of_several_machines_are_named_with_their_spread(tmp_path: Path) -> None:
    """Two fresh machines of one kind time the same run differently: the summary says so, with the spread."""
    from hotcold.analysis.summary import summary_frame
    from hotcold.analysis.tables_markdown import machines_note

    records = []
    for machine, rate in (("gpu-a", 1000.0), ("gpu-b", 1700.0)):
        out = write_run(tmp_path / machine, "kaggle", "device", "base", 0, rate=rate, timer="cuda")
        rec = json.loads((out / "record.json").read_text())
        rec["provenance"]["machine"] = machine
        records.append(rec)
    note = machines_note(summary_frame(records))
    assert "2 machines (`gpu-a`, `gpu-b`)" in note and "up to 1.70x" in note and "kaggle/device/base" in note
    assert machines_note(summary_frame(records[:1])) == ""
