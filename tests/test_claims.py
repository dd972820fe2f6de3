"""The claims table: measured ratios from records, counted traffic, modelled values through the cost model."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

pytest.importorskip("seaborn", reason="seaborn is not installed: the figures need it (make setup installs it)")

from hotcold.analysis.claims.table import claims_markdown, claims_table
from hotcold.analysis.claims.catalog import CLAIMS, Claim, Run
from hotcold.analysis.claims.figure import UNSTABLE_HATCH, claims_figure


def record(method, variant, samples_per_s, seed=0, dataset="kaggle", world=1, rpn=1, stable=True,
           counters=None, phases=None, timer="cpu", store=None, report=None):
    return {
        "dataset": dataset, "method": method, "variant": variant, "seed": seed, "status": "ok",
        "summary": {"samples_per_s": samples_per_s, "timer": timer, "stable": stable, "world": world,
                    "ranks_per_node": rpn, "counters_per_step": counters or {}, "phase_ms_mean": phases or {}},
        "provenance": {"device": "cpu", "cpu": "TestCPU", "threads": 2},
        "config": {"distributed": {"world": world, "ranks_per_node": rpn}, "store": store or {}},
        "store": report or {},
    }


SPEED = Claim("speed", "P", "faster", "x", 1.5, "1.5x", "GPU", "speed", "kaggle", Run("fae", "v"),
              Run("hybrid", "base"), "prof", why="scaled down")
HITS = Claim("hits", "P", "hits", "% hits", 100.0, "all", "any", "hits", "kaggle", Run("scratchpipe", "w2"))
A2A = Claim("a2a", "P", "fewer bytes", "% less", 85.0, ">85%", "cluster", "a2a_reduction", "taobao", why="toy")
LATENCY = Claim("lat", "P", "faster comm", "x", 6.0, "~6x", "cluster", "comm_latency", "taobao", profile="prof")
NONE = Claim("none", "P", "vs CPU", "x", 2.3, "2.3x", "GPU", "none", why="no such method")

SPEEDS = {"fae": 300.0, "hybrid": 100.0, "proactive": 10.0, "sharded": 10.0}


def fake_predict(rec, profile):
    return SimpleNamespace(samples_per_s=SPEEDS[rec["method"]] * profile.scale, dominant="pcie_h2d")


def fake_comm(row, world, rpn, profile):
    a2a = row["inter_node_a2a_bytes"] / 1e3
    return {"input_a2a": a2a, "dense_allreduce": 1.0, "total": a2a + 1.0}


PROFILES = {"prof": SimpleNamespace(name="prof", scale=10.0)}


def table(records, comm=None, claims=(SPEED,)):
    return claims_table(records, comm if comm is not None else pd.DataFrame(), PROFILES, fake_predict, fake_comm,
                        claims).set_index("claim_id")


def test_speed_claim_is_the_mean_over_seeds_ratio_and_modelled_through_the_profile():
    recs = [record("fae", "v", 200.0, 0), record("fae", "v", 400.0, 1), record("hybrid", "base", 100.0, 0),
            record("hybrid", "base", 200.0, 1)]
    row = table(recs).loc["speed"]
    assert row["measured_value"] == pytest.approx(300.0 / 150.0)
    assert row["modelled_value"] == pytest.approx(3.0)   # 3000 / 1000 samples/s under the profile
    assert row["modelled_profile"] == "prof" and "pcie_h2d" in row["modelled_dominant"]
    assert bool(row["measured_stable"]) and row["measured_timer"] == "cpu"
    assert "TestCPU" in row["measured_hardware"]
    assert "scaled down" in row["why_they_differ"]   # 2.0 and 3.0 are not within 25% of 1.5


def test_a_disturbed_run_marks_the_claim_and_says_so():
    recs = [record("fae", "v", 150.0, stable=False), record("hybrid", "base", 100.0)]
    row = table(recs).loc["speed"]
    assert not bool(row["measured_stable"])
    assert "disturbed" in row["why_they_differ"]


def test_a_claim_within_the_tolerance_needs_no_reason():
    recs = [record("fae", "v", 160.0), record("hybrid", "base", 100.0)]
    profiles = {"prof": SimpleNamespace(name="prof", scale=1.0)}
    speeds = dict(SPEEDS, fae=140.0)
    frame = claims_table(recs, pd.DataFrame(), profiles,
                         lambda r, p: SimpleNamespace(samples_per_s=speeds[r["method"]], dominant="x"), fake_comm,
                         (SPEED,))
    assert frame.loc[0, "why_they_differ"] == ""


def test_missing_runs_keep_their_row_with_the_reason():
    frame = table([record("hybrid", "base", 100.0)], claims=(SPEED, HITS, A2A, LATENCY, NONE))
    assert list(frame.index) == ["speed", "hits", "a2a", "lat", "none"]
    assert frame.loc["speed", "status"].startswith("not run: no trained fae/v on kaggle")
    assert frame.loc["hits", "status"].startswith("not run")
    assert frame.loc["a2a", "status"].startswith("not run")
    assert frame.loc["none", "status"] == "no hotcold method"
    assert frame.loc["none", "why_they_differ"] == "no such method"
    assert math.isnan(frame.loc["speed", "measured_value"])


def test_timers_are_never_mixed_in_one_ratio():
    recs = [record("fae", "v", 300.0, timer="cuda"), record("hybrid", "base", 100.0, timer="cpu")]
    row = table(recs).loc["speed"]
    assert math.isnan(row["measured_value"]) and row["measured_timer"] == "cpu, cuda"


def test_hit_share_is_counted_from_the_counters():
    recs = [record("scratchpipe", "w2", 1.0, 0, counters={"lookups": 1000.0, "hits": 1000.0}),
            record("scratchpipe", "w2", 1.0, 1, counters={"lookups": 1000.0, "hits": 900.0})]
    row = table(recs, claims=(HITS,)).loc["hits"]
    assert row["measured_value"] == pytest.approx(95.0)
    assert row["measured_timer"] == "counted"


def comm_rows():
    rows = []
    for world, rpn, nodes in ((4, 2, 2), (128, 8, 16)):
        for plan, inter in (("row", 1000.0 * world), ("flexshard", 500.0 * world), ("table", 10.0)):
            for headroom in (1.0, 1.25):
                rows.append({"dataset": "taobao", "source": "simulated", "plan": plan, "world": world,
                             "ranks_per_node": rpn, "nodes": nodes, "memory_headroom": headroom, "status": "ok",
                             "inter_node_a2a_bytes": inter * (2.0 if headroom == 1.0 else 1.0)})
    rows.append({**rows[0], "source": "trained", "inter_node_a2a_bytes": 1.0})  # never used by the claims
    return pd.DataFrame(rows)


def test_a2a_reduction_comes_from_the_largest_simulated_scale_at_the_claims_headroom():
    row = table([], comm_rows(), claims=(A2A,)).loc["a2a"]
    assert row["measured_value"] == pytest.approx(50.0)
    assert "16x8" in row["compared"] and "1.25" in row["compared"]
    assert "toy" in row["why_they_differ"]   # 50% is not within 25% of 85%
    assert row["modelled_profile"].startswith("counted")


def test_comm_latency_is_modelled_from_the_simulated_bytes_and_measured_from_trained_phases():
    comm = {"input_a2a": 2.0, "output_a2a": 1.0, "grad_a2a": 1.0, "dense_allreduce": 4.0}
    recs = [record("sharded", "row", 1.0, dataset="taobao", world=4, rpn=2, phases=comm, store={"plan": "row"}),
            record("flexshard", "base", 1.0, dataset="taobao", world=4, rpn=2,
                   phases={**comm, "input_a2a": 0.5, "replica_allreduce": 0.5})]
    row = table(recs, comm_rows(), claims=(LATENCY,)).loc["lat"]
    world = 128
    assert row["modelled_value"] == pytest.approx((1000.0 * world / 1e3 + 1) / (500.0 * world / 1e3 + 1))
    assert row["measured_value"] == pytest.approx(8.0 / 7.0)
    assert row["modelled_dominant"] == "flexshard: input_a2a"


def test_every_shipped_claim_names_its_paper_number_and_hardware():
    ids = [c.claim_id for c in CLAIMS]
    assert len(ids) == len(set(ids))
    for claim in CLAIMS:
        assert claim.paper and claim.paper_states and claim.paper_hardware
        if claim.kind == "speed":
            assert claim.run and claim.baseline and claim.profile
    assert {"fae", "scratchpipe", "freqcache", "proactive"} <= {c.run.method for c in CLAIMS if c.run}
    assert {"a2a_reduction", "comm_latency", "none"} <= {c.kind for c in CLAIMS}


def test_markdown_labels_modelled_values_and_the_figure_hatches_disturbed_measurements():
    recs = [record("fae", "v", 150.0, stable=False), record("hybrid", "base", 100.0)]
    frame = claims_table(recs, pd.DataFrame(), PROFILES, fake_predict, fake_comm, (SPEED, NONE))
    text = claims_markdown(frame)
    assert "**modelled**" in text and "| **no** " in text
    fig = claims_figure(frame)
    measured = fig.axes[0].patches[1]
    assert measured.get_hatch() == UNSTABLE_HATCH
    assert fig.axes[0].patches[0].get_hatch() is None


def test_a2a_reduction_is_read_at_the_weak_scaled_batch_with_the_fixed_batchs_beside():
    fixed = comm_rows().assign(batching="global", batch_size=1024)
    fixed["batch_per_rank"] = 1024 / fixed["world"]
    weak = comm_rows().assign(batching="per-rank", batch_per_rank=512)
    weak["batch_size"] = 512 * weak["world"]
    weak.loc[weak.plan == "flexshard", "inter_node_a2a_bytes"] *= 0.4  # fewer bytes at the large batch: 80% less
    row = table([], pd.concat([fixed, weak], ignore_index=True), claims=(A2A,)).loc["a2a"]
    assert row["measured_value"] == pytest.approx(80.0)
    assert "16x8" in row["compared"] and "512 samples per rank (global batch 65,536)" in row["compared"]
    assert "at the fixed global batch 1,024 (8 per rank): 50.0% less" in row["compared"]
    only_fixed = table([], fixed, claims=(A2A,)).loc["a2a"]
    assert only_fixed["measured_value"] == pytest.approx(50.0)
    assert "the fixed global batch 1,024 (8 per rank)" in only_fixed["compared"]


def test_a_degenerate_fae_run_is_not_printed_as_fae_without_saying_so():
    """FAE at a budget where every timed batch is hot ran as the device store: the row says so."""
    plain = table([record("fae", "v", 160.0), record("hybrid", "base", 100.0)]).loc["speed"]
    assert "degenerate" not in plain["compared"] and "degenerate" not in plain["why_they_differ"]
    recs = [record("fae", "v", 160.0, report={"degenerate": "all-hot"}), record("hybrid", "base", 100.0)]
    row = table(recs).loc["speed"]
    assert row["measured_value"] == pytest.approx(1.6)
    for column in ("compared", "why_they_differ"):
        assert "degenerate: fae v all-hot" in row[column] and "device store's run" in row[column]
    assert "degenerate" in claims_markdown(table(recs).reset_index())


def test_the_largest_budget_role_skips_a_budget_that_ran_as_another_store():
    """FAE's largest budget is all-hot (the device store's run): the claim reads the largest ordinary one."""
    role = dataclasses.replace(SPEED, run=Run("fae", pick="largest"))
    recs = [record("fae", "big", 400.0, report={"hot_rows": 300, "degenerate": "all-hot"}),
            record("fae", "mid", 160.0, report={"hot_rows": 200}),
            record("fae", "small", 120.0, report={"hot_rows": 100}),
            record("hybrid", "base", 100.0)]
    row = table(recs, claims=(role,)).loc["speed"]
    assert row["measured_value"] == pytest.approx(1.6) and "degenerate" not in row["compared"]
    every = [dict(r, store={**r["store"], "degenerate": "all-hot"}) if r["method"] == "fae" else r for r in recs]
    row = table(every, claims=(role,)).loc["speed"]
    assert row["measured_value"] == pytest.approx(4.0) and "degenerate: fae big all-hot" in row["compared"]


# -- the claims on a GPU -----------------------------------------------------------------------------------------

EVIDENCE = Path(__file__).resolve().parents[1] / "docs/evidence/2026-11-27-h100"
H100 = Path(__file__).resolve().parents[1] / "workflows/config/hardware/h100-calibrated-2026-11-27.yaml"


def test_the_committed_gpu_evidence_measures_and_models_the_claims_on_its_card():
    """The first GPU run's records (default scale): each speed claim measured there, by hand from two records'
    samples/s, with the card's name, and modelled on that card's calibrated profile."""
    from hotcold import methods
    from hotcold.analysis.claims.gpu import gpu_columns
    from hotcold.analysis.run_records import load_records
    from hotcold.costmodel import load_profile, predict_record

    records = load_records(sorted((EVIDENCE / "records/default-scale").rglob("record.json")))
    profile = load_profile(H100)
    rows = {}
    for claim in CLAIMS:
        row: dict = {}
        gpu_columns(row, claim, records, "evidence", profile,
                    lambda rec, p: predict_record(rec, p, methods.price(rec["method"])))
        rows[claim.claim_id] = row

    def rate(method: str, variant: str) -> float:
        (rec,) = [r for r in records if (r["dataset"], r["method"], r["variant"]) == ("kaggle", method, variant)]
        return rec["summary"]["samples_per_s"]

    fae = rows["fae_vs_hybrid"]  # 24.8% ran all-hot (the device store's run): the largest ordinary budget
    assert fae["gpu_measured_value"] == pytest.approx(rate("fae", "12.4pct") / rate("hybrid", "base"))
    assert "NVIDIA H100" in fae["gpu_measured_hardware"] and "fae/12.4pct vs hybrid/base" in fae["gpu_records"]
    assert fae["gpu_modelled_profile"] == "h100-calibrated-2026-11-27" and fae["gpu_modelled_value"] > 0
    assert rows["scratchpipe_hits"]["gpu_measured_value"] == 100.0  # counted on the GPU run too
    assert math.isnan(rows["fae_vs_cpu"]["gpu_measured_value"])     # no hotcold method: no GPU value either


def test_without_gpu_records_the_gpu_columns_stay_empty():
    from hotcold.analysis.claims.gpu import gpu_columns

    row: dict = {}
    gpu_columns(row, CLAIMS[0], [], "this reproduction", None, lambda rec, p: None)
    assert math.isnan(row["gpu_measured_value"]) and row["gpu_records"] is None
