"""The claims at paper scale: simulated counters as workloads, run roles, the knob sweep, absent outputs."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from hotcold import costmodel, methods
from hotcold.analysis.claims.table import claims_and_sweep
from hotcold.analysis.claims.catalog import CLAIMS, Run
from hotcold.analysis.claims.paper_columns import _reason
from hotcold.analysis.claims.runs import _matching
from hotcold.analysis.claims.paper_scale import FACTORS, PaperScale, capped_tables, resolve, sweep_profile
from hotcold.run_config import RunConfig
from hotcold.costmodel import ModelShape, Workload, load_profile
from hotcold.costmodel.simulated import lookup_workload, simulated_workload
from hotcold.counters import FIELDS
from hotcold.data.skew import row_counts
from hotcold.trace.cachesim import RowSizes, dataset_trace, sweep
from hotcold.trace.faesim import fae_sweep
from hotcold.train import train

REPO = Path(__file__).resolve().parents[1]
V100 = load_profile(REPO / "workflows/config/hardware/v100-xeon-pcie3.yaml")
STEPS, BATCH = 30, 64
MODEL = {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]}


def _cfg(method: str, store: dict) -> RunConfig:
    return RunConfig.from_dict({
        "dataset": "small", "method": method, "seed": 0, "store": store, "model": MODEL,
        "train": {"steps": STEPS, "warmup_steps": 2, "batch_size": BATCH, "eval_batch_size": 1024,
                  "eval_samples": 256, "row_optimizer": "adagrad", "dense_optimizer": "sgd"},
    })


def _record(cfg: RunConfig, res) -> dict:
    """A record of the run whose counters are the means over every step (the simulator's span)."""
    steps = pd.DataFrame([c for _, c in res.counters])
    return {"status": "ok", "method": cfg.method, "variant": "v", "dataset": "small", "config": cfg.to_dict(),
            "summary": {"batch_size": BATCH, "counters_per_step": steps.mean().to_dict()},
            "store": res.store.report()}


def _same_workload(sim: Workload, trained: Workload) -> None:
    fields = [f for f in FIELDS if f != "prefetch_batch"]
    assert {f: sim.c(f) for f in fields} == pytest.approx({f: trained.c(f) for f in fields})
    assert (sim.method, sim.batch_size, sim.shape, sim.row_optimizer) == \
        (trained.method, trained.batch_size, trained.shape, trained.row_optimizer)
    for key in ("capacity", "hot_rows", "window"):
        assert sim.report.get(key) == trained.report.get(key)
    price = methods.price(sim.method)
    a, b = costmodel.predict(sim, V100, price), costmodel.predict(trained, V100, price)
    assert a.step_ms == pytest.approx(b.step_ms) and a.terms_ms == pytest.approx(b.terms_ms)


@pytest.mark.parametrize("method,policy,options", [("lru", "lru", {}), ("freqcache", "freqcache", {"warmup_ratio": 0.7}),
                                                   ("scratchpipe", "scratchpipe-2", {"window": 2})])
def test_a_simulated_store_gives_the_trained_records_workload(small_dataset, method, policy, options):
    trace = dataset_trace(small_dataset, BATCH, STEPS)
    frame = sweep(trace, (0.3,), [policy.split("-")[0]] if method != "scratchpipe" else [], row_counts(small_dataset,
                  "train"), windows=(2,) if method == "scratchpipe" else (), sizes=RowSizes(4, 1))
    row = frame[(frame.policy == policy) & frame.feasible].iloc[0]
    key = "scratchpad_rows" if method == "scratchpipe" else "cache_rows"
    cfg = _cfg(method, {key: int(row.capacity), **options})
    res = train(cfg, small_dataset, torch.device("cpu"), progress=False)
    shape = ModelShape.of(small_dataset, cfg.model)
    _same_workload(simulated_workload(row.to_dict(), shape, BATCH), Workload.from_record(_record(cfg, res), shape))


def test_a_simulated_fae_gives_the_trained_records_workload(small_dataset):
    frame = fae_sweep(small_dataset, BATCH, STEPS, 0, budgets=(0.3,), run_lengths=("epoch",), sample_fraction=1.0,
                      sizes=RowSizes(4, 1), warmup=2)  # the run's warm-up steps: the same scaled-epoch order
    cfg = _cfg("fae", {"budget_ratio": 0.3, "sample_fraction": 1.0, "run_length": "epoch"})
    res = train(cfg, small_dataset, torch.device("cpu"), progress=False)
    shape = ModelShape.of(small_dataset, cfg.model)
    sim = simulated_workload(frame.iloc[0].to_dict(), shape, BATCH)
    _same_workload(sim, Workload.from_record(_record(cfg, res), shape))
    assert 0 < sim.c("hot_batch") < 1


def _rec(method, variant, store, report, dataset="kaggle"):
    return {"status": "ok", "dataset": dataset, "method": method, "variant": variant,
            "config": {"store": store}, "store": report,
            "summary": {"samples_per_s": 1.0, "timer": "cpu", "world": 1, "ranks_per_node": 1, "batch_size": 8,
                        "counters_per_step": {"lookups": 16.0, "unique_rows": 8.0, "hits": 12.0}}}


def test_claims_pick_runs_by_role_whatever_the_variants_are_called():
    recs = [_rec("fae", "128mib", {"budget_bytes": 1}, {"hot_rows": 10}),
            _rec("fae", "whatever", {"budget_bytes": 2}, {"hot_rows": 30}),
            _rec("fae", "256mib", {"budget_bytes": 3}, {"hot_rows": 20}),
            _rec("freqcache", "small", {"cache_ratio": 0.015, "warmup_ratio": 0.7}, {"capacity": 5}),
            _rec("freqcache", "big", {"cache_ratio": 0.05}, {"capacity": 50}),
            _rec("scratchpipe", "w2-5pct", {"window": 2, "scratchpad_ratio": 0.05}, {"capacity": 50}),
            _rec("scratchpipe", "w2", {"window": 2}, {"capacity": 7}),
            _rec("scratchpipe", "w1", {"window": 1}, {"capacity": 3})]
    by_id = {c.claim_id: c for c in CLAIMS}
    assert [r["variant"] for r in _matching(recs, "kaggle", by_id["fae_vs_hybrid"].run)] == ["whatever"]
    assert [r["variant"] for r in _matching(recs, "kaggle", by_id["freqcache_hits"].run)] == ["small"]
    assert [r["variant"] for r in _matching(recs, "kaggle", by_id["scratchpipe_hits"].run)] == ["w2"]
    assert _matching(recs, "taobao", by_id["fae_vs_hybrid"].run) == []
    frame = claims_and_sweep(recs, pd.DataFrame(), {}, claims=(by_id["scratchpipe_hits"],))[0]
    assert frame.loc[0, "compared"] == "scratchpipe/w2" and frame.loc[0, "measured_value"] == pytest.approx(75.0)


def test_at_paper_scale_a_larger_simulated_budget_replaces_the_trained_one(monkeypatch):
    shape = ModelShape(num_tables=2, dim=4, rows=1000)
    sim = pd.DataFrame([{"policy": p, "capacity": c, "cache_ratio": c / 1000, "feasible": True, "steps": 10,
                         "lookups": 160, "unique_rows": 80, "hot_batch": 5}
                        for p, c in (("fae-epoch", 100), ("fae-epoch", 300), ("fae-1", 500))])
    paper = PaperScale({"kaggle": sim}, {}, {"kaggle": {"simulate": {"train": {"batch_size": 8}}}})
    monkeypatch.setattr(PaperScale, "shape", lambda self, name: shape)
    trained = [_rec("fae", "256mib", {}, {"hot_rows": 200})]
    got = resolve(paper, "kaggle", Run("fae", pick="largest"), trained, 200.0, lambda r: shape)
    assert got.source.startswith("simulated fae-epoch") and got.workloads[0].report["hot_rows"] == 300
    assert got.workloads[0].c("hot_batch") == pytest.approx(0.5) and got.workloads[0].c("lookups") == 16
    smaller = resolve(paper, "kaggle", Run("fae", pick="largest"), trained, 400.0, lambda r: shape)
    assert smaller.source == "trained fae/256mib"


def _toy() -> tuple[list[Workload], list[Workload]]:
    shape = ModelShape(num_tables=26, dim=16, rows=30_000_000)
    base = {"lookups": 53248.0, "unique_rows": 13000.0}
    fae = replace(lookup_workload("hybrid", base, shape, 2048), method="fae",
                  counters={**lookup_workload("hybrid", base, shape, 2048).counters, "hot_batch": 0.2},
                  report={"hot_rows": 8_000_000})
    return [fae], [lookup_workload("hybrid", base, shape, 2048)]


def _speed(ws: list[Workload], profile) -> float:
    return costmodel.predict(ws[0], profile, methods.price(ws[0].method)).samples_per_s


def test_the_sweep_is_monotone_in_each_knob_on_a_toy_profile():
    fae, hybrid = _toy()
    for rates in (("pcie_h2d_bw", "pcie_d2h_bw"), ("host_memory_bw",), ("device_memory_bw",)):
        speeds = [_speed(hybrid, sweep_profile(V100, rates, True, f)) for f in FACTORS]
        assert speeds == sorted(speeds) and speeds[-1] > speeds[0]
    slower = [_speed(hybrid, sweep_profile(V100, ("host_gather_row_ns",), False, f)) for f in FACTORS]
    assert slower == sorted(slower)
    ratios = [_speed([replace(fae[0], counters={**fae[0].counters, "hot_batch": s})], V100) / _speed(hybrid, V100)
              for s in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert ratios == sorted(ratios) and ratios[-1] > 1.2 * ratios[0]


def test_the_reason_names_the_smallest_change_that_closes_the_gap_or_says_none_does():
    claim = SimpleNamespace(unit="x", paper_value=1.5)
    rows = [{"setting": f"{f:g}x PCIe", "factor": f, "value": v, "agrees": abs(v - 1.5) <= 0.375}
            for f, v in ((2.0, 1.0), (4.0, 1.2), (8.0, 1.4), (16.0, 1.5))]
    assert _reason(claim, 0.9, rows).endswith("reaches 1.2x at 4x PCIe (claims_sweep.csv)")
    assert "no swept knob closes it" in _reason(claim, 0.9, rows[:1])


def test_without_paper_scale_outputs_each_row_says_so_in_one_line(monkeypatch):
    assert capped_tables({"generator": {"max_rows_per_table": 100_000}, "cardinalities": [10, 20]}).startswith(
        "tables capped at 100,000 rows")
    assert capped_tables({"generator": {"max_rows_per_table": None, "scale": 1.0}}) == ""
    assert capped_tables({"kind": "criteo-kaggle"}) == ""   # prepared real data: its real sizes
    frame = claims_and_sweep([], pd.DataFrame(), {})[0].set_index("claim_id")
    assert frame.loc["fae_vs_hybrid", "paper_scale_why"].startswith("paper-scale outputs absent")
    capped = SimpleNamespace(manifest={"generator": {"max_rows_per_table": 100_000}, "cardinalities": [5]})
    monkeypatch.setattr(PaperScale, "dataset", lambda self, name: capped)
    frame = claims_and_sweep([], pd.DataFrame(), {}, paper=PaperScale())[0].set_index("claim_id")
    for cid in ("fae_vs_hybrid", "fae_vs_hybrid_v1", "proactive_speedup", "flexshard_a2a", "scratchpipe_hits"):
        why = frame.loc[cid, "paper_scale_why"]
        assert why.startswith("paper-scale outputs absent: kaggle's tables capped") or \
            why.startswith("paper-scale outputs absent: taobao's tables capped")
        assert "\n" not in why and math.isnan(frame.loc[cid, "paper_scale_value"])
    assert frame.loc["fae_vs_cpu", "paper_scale_why"] == "no hotcold method"
