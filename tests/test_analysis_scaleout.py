"""Scale-out tables and figures from hand-made records and shard-sim rows (hotcold.analysis.scaleout)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("seaborn", reason="seaborn is not installed: the figures need it (make setup installs it)")

from hotcold.analysis.scaleout import (batch_label, comm_traffic_markdown, comm_traffic_table,
                                       flexshard_headroom_markdown, flexshard_headroom_table, proactive_table,
                                       read_shard_sims, ShardSimError)
from hotcold.analysis.run_records import RecordError, find_records
from hotcold.analysis.tables import aggregate
from hotcold.cli import main
from hotcold.counters import COLLECTIVES

STEPS = 10
SKETCH = list(np.linspace(-1.0, 1.0, 256))


def collectives(inter_a2a: float, intra_a2a: float = 0.0, dense: float = 100.0) -> dict:
    """Totals over a run of STEPS steps: each all-to-all carries a third of the given bytes."""
    out = {c: {"bytes": 0, "intra_node_bytes": 0, "inter_node_bytes": 0} for c in COLLECTIVES}
    for c in ("input_a2a", "output_a2a", "grad_a2a"):
        out[c] = {"bytes": (inter_a2a + intra_a2a) / 3, "intra_node_bytes": intra_a2a / 3,
                  "inter_node_bytes": inter_a2a / 3}
    out["dense_allreduce"] = {"bytes": dense, "intra_node_bytes": 0, "inter_node_bytes": dense}
    return out


def record(method: str, variant: str, plan: str | None, world: int, rpn: int, *, inter_a2a: float = 0.0,
           intra_a2a: float = 0.0, status: str = "ok", store: dict | None = None, options: dict | None = None,
           step_ms: float = 10.0, seed: int = 0, dataset: str = "kaggle") -> dict:
    """A scale-out run record as ``hotcold train`` writes it (only what the tables read)."""
    rec = {"dataset": dataset, "method": method, "variant": variant, "seed": seed, "status": status,
           "config": {"store": options if options is not None else ({"plan": plan} if plan else {}),
                      "train": {"steps": STEPS}, "distributed": {"world": world, "ranks_per_node": rpn}},
           "dataset_manifest_sha256": "0" * 64,
           "provenance": {"device": "cpu", "device_type": "cpu", "threads": 2, "timer": "cpu"}}
    if status != "ok":
        return {**rec, "reason": f"plan {plan}: rank 0 needs more than the budget"}
    rec["summary"] = {"timer": "cpu", "batch_size": 1024, "steps_timed": STEPS - 1, "samples_per_s": 1000.0,
                      "step_ms_p50": step_ms, "world": world, "ranks_per_node": rpn, "plan": plan,
                      "phase_ms_p50": {"data": 1.0}, "phase_ms_mean": {"data": 1.0},
                      "counters_per_step": {"served_lookups": 500.0, "early_lookups": 200.0}}
    rec["metrics"] = {"auc": 0.6, "logloss": 0.5, "eval_samples": 100}
    rec["params"] = {"checksum": "f" * 64, "sketch": SKETCH, "norm": 1.0}
    rec["reference"] = {"method": "device", "params": {"checksum": "e" * 64, "sketch": SKETCH, "norm": 1.0}}
    rec["store"] = {"plan": plan, "world": world, "ranks_per_node": rpn, "memory_budget_bytes": 1000,
                    "memory_bytes_per_rank": [500, 600], "memory_used_share": 0.6, "load_imbalance": 1.1,
                    "collectives": collectives(inter_a2a, intra_a2a), **(store or {})}
    return rec


def sim_row(plan: str, headroom: float, inter_a2a: float | None, *, nodes: int = 2, rpn: int = 2,
            dataset: str = "kaggle") -> dict:
    status = "ok" if inter_a2a is not None else "infeasible"
    return {"dataset": dataset, "plan": plan, "world": nodes * rpn, "ranks_per_node": rpn, "nodes": nodes,
            "memory_headroom": headroom, "steps": STEPS, "status": status,
            **{f"{c}_bytes": (inter_a2a or 0) / 3 if c.endswith("a2a") else 0.0 for c in COLLECTIVES},
            "intra_node_bytes": 0.0, "inter_node_bytes": inter_a2a, "inter_node_a2a_bytes": inter_a2a,
            "memory_bytes_per_rank_max": 50.0 if status == "ok" else None, "memory_budget_bytes": 100.0,
            "load_imbalance": 1.0, "reason": None if status == "ok" else "does not fit"}


@pytest.fixture
def sims() -> pd.DataFrame:
    return pd.DataFrame([
        sim_row("row", 1.0, 1000.0), sim_row("table", 1.0, None), sim_row("flexshard", 1.0, 700.0),
        sim_row("row", 1.25, 1000.0), sim_row("table", 1.25, 800.0), sim_row("flexshard", 1.25, 400.0),
        sim_row("column", 1.25, 1500.0),
        sim_row("row", 1.25, 90.0, nodes=2, rpn=1), sim_row("table", 1.25, 60.0, nodes=2, rpn=1),
    ])


@pytest.fixture
def records() -> list[dict]:
    return [
        record("sharded", "row", "row", 4, 2, inter_a2a=2000.0, intra_a2a=500.0),
        record("sharded", "table", "table", 4, 2, inter_a2a=1500.0),
        record("proactive", "row", "row", 4, 2, inter_a2a=2000.0, options={"plan": "row", "depth": 1},
               store={"depth": 1, "early_lookup_share": 0.4, "hidden_lookup_share": 0.25, "lookup_ms_early": 2.0,
                      "lookup_ms_late": 3.0, "window_lookup_share_input_a2a": 0.5, "hidden_share_dense_allreduce": 0.1},
               step_ms=9.0),
        record("sharded", "column", "column", 4, 2, status="infeasible"),
    ]


def one(frame: pd.DataFrame, **where) -> pd.Series:
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_comm_traffic_reductions_against_row_and_table(records: list[dict], sims: pd.DataFrame) -> None:
    table = comm_traffic_table(records, sims)
    sim = table[table.source == "simulated"]
    flex = one(sim, plan="flexshard", memory_headroom=1.25)
    assert flex.inter_a2a_reduction_vs_row == pytest.approx(1 - 400 / 1000)
    assert flex.inter_a2a_reduction_vs_table == pytest.approx(1 - 400 / 800)
    assert one(sim, plan="column", memory_headroom=1.25).inter_a2a_reduction_vs_row == pytest.approx(-0.5)
    assert one(sim, plan="row", world=2).inter_a2a_reduction_vs_table == pytest.approx(1 - 90 / 60)
    at_one = one(sim, plan="flexshard", memory_headroom=1.0)  # table-wise does not fit at headroom 1.0
    assert at_one.inter_a2a_reduction_vs_row == pytest.approx(0.3) and math.isnan(at_one.inter_a2a_reduction_vs_table)
    infeasible = one(sim, plan="table", memory_headroom=1.0)
    assert infeasible.status == "infeasible" and math.isnan(infeasible.inter_node_a2a_bytes)


def test_comm_traffic_trained_rows_are_bytes_per_step(records: list[dict], sims: pd.DataFrame) -> None:
    trained = comm_traffic_table(records, sims).query("source == 'trained'")
    assert set(trained.memory_headroom) == {1.25}  # the store default when the options leave it out
    row = one(trained, method="sharded", plan="row")
    assert row.inter_node_a2a_bytes == pytest.approx(2000 / STEPS)
    assert row.intra_node_bytes == pytest.approx(500 / STEPS)
    assert row.inter_node_bytes == pytest.approx((2000 + 100) / STEPS)
    assert row.input_a2a_bytes == pytest.approx(2500 / 3 / STEPS)
    assert row.dense_allreduce_bytes == pytest.approx(100 / STEPS)
    assert (row.world, row.ranks_per_node, row.nodes) == (4, 2, 2)
    tablewise = one(trained, method="sharded", plan="table")
    assert tablewise.inter_a2a_reduction_vs_row == pytest.approx(1 - 1500 / 2000)
    assert tablewise.inter_a2a_reduction_vs_table == pytest.approx(0.0)
    assert one(trained, method="proactive").inter_a2a_reduction_vs_row == pytest.approx(0.0)
    column = one(trained, plan="column")
    assert column.status == "infeasible" and "budget" in column.reason
    assert math.isnan(column.inter_node_a2a_bytes) and math.isnan(column.inter_a2a_reduction_vs_row)


def test_flexshard_headroom_curve(sims: pd.DataFrame) -> None:
    curve = flexshard_headroom_table(sims)
    at = curve.set_index(["world", "memory_headroom"])
    assert at.loc[(4, 1.25)].reduction_vs_row == pytest.approx(0.6)
    assert at.loc[(4, 1.25)].reduction_vs_table == pytest.approx(0.5)
    assert at.loc[(4, 1.0)].reduction_vs_row == pytest.approx(0.3) and math.isnan(at.loc[(4, 1.0)].reduction_vs_table)
    assert at.loc[(2, 1.25)].flexshard_status == "not simulated" and math.isnan(at.loc[(2, 1.25)].reduction_vs_row)
    assert list(curve.memory_headroom[curve.world == 4]) == [1.0, 1.25]


def test_proactive_table(records: list[dict]) -> None:
    table = proactive_table(records)
    assert len(table) == 1
    row = table.iloc[0]
    assert (row.early_lookup_share, row.hidden_lookup_share, row.depth) == (0.4, 0.25, 1)
    assert (row.step_ms_p50, row.sharded_step_ms_p50) == (9.0, 10.0)
    assert (row.early_lookups_per_step, row.served_lookups_per_step) == (200.0, 500.0)
    assert (row.window_lookup_share_input_a2a, row.hidden_share_dense_allreduce) == (0.5, 0.1)
    assert pd.isna(row.hidden_share_grad_a2a)                  # a window the record does not report stays empty


def test_shard_sim_csv_must_be_shard_sim_output(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    pd.DataFrame({"dataset": ["k"], "policy": ["lru"]}).to_csv(bad, index=False)
    with pytest.raises(ShardSimError, match="not a `hotcold shard-sim` table"):
        read_shard_sims([bad])


def write_record(runs: Path, rec: dict) -> Path:
    dist = rec["config"].get("distributed", {"world": 1, "ranks_per_node": 1})
    world, rpn = dist["world"], dist["ranks_per_node"]
    scale = f"world~{world}-rpn~{rpn}" if world > 1 else ""
    out = runs / rec["dataset"] / rec["method"] / rec["variant"] / scale / f"seed~{rec['seed']}"
    out.mkdir(parents=True)
    steps = [{"step": 0, "kind": "counter", "name": k, "value": v}
             for k, v in (rec.get("summary") or {}).get("counters_per_step", {}).items()]
    pd.DataFrame(steps, columns=["step", "kind", "name", "value"]).to_parquet(out / "steps.parquet")
    (out / "record.json").write_text(json.dumps(rec))
    return out / "record.json"


def one_process(method: str, rate: float) -> dict:
    rec = record(method, "base", None, 1, 1)
    rec["summary"].update(samples_per_s=rate, world=1, ranks_per_node=1, plan=None)
    del rec["config"]["distributed"], rec["reference"]
    rec["store"] = {}
    return rec


def test_summary_marks_scale_out_runs_and_keeps_them_out_of_speedups(tmp_path: Path, records: list[dict]) -> None:
    runs = tmp_path / "runs"
    for rec in [one_process("hybrid", 1000.0), one_process("device", 2000.0), *records]:
        write_record(runs, rec)
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert len(summary) == 6
    scaled = summary[summary.world > 1]
    assert set(zip(scaled.method, scaled.variant, scaled.plan)) == {
        ("sharded", "row", "row"), ("sharded", "table", "table"), ("proactive", "row", "row"),
        ("sharded", "column", "column")}
    assert (scaled.ranks_per_node == 2).all()
    assert scaled.speedup_vs_hybrid.isna().all() and scaled.auc_vs_hybrid.isna().all()
    assert scaled[scaled.status == "ok"].exact.astype(bool).all()  # against the record's own device replay
    single = summary[summary.world == 1]
    assert single.plan.isna().all() or (single.plan == "").all()
    assert one(single, method="device").speedup_vs_hybrid == pytest.approx(2.0)
    speedup = pd.read_csv(tmp_path / "tables" / "speedup.csv")
    assert set(speedup.method) == {"hybrid", "device"}
    assert "world~4-rpn~2/seed~0" in (tmp_path / "tables" / "infeasible.md").read_text()


def test_scale_out_record_in_the_wrong_scale_directory_is_rejected(tmp_path: Path) -> None:
    path = write_record(tmp_path / "runs", record("sharded", "row", "row", 4, 2))
    wrong = path.parent.parent.parent / "world~4-rpn~1"
    path.parent.parent.rename(wrong)
    with pytest.raises(RecordError, match="belongs under world~4-rpn~2/"):
        aggregate(find_records(tmp_path / "runs"), tmp_path / "tables")


def test_cli_writes_scale_out_tables_and_figures(tmp_path: Path, records: list[dict], sims: pd.DataFrame,
                                                drawn_figures) -> None:
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    paths = [write_record(runs, rec) for rec in [one_process("hybrid", 1000.0), *records]]
    sims.to_csv(tmp_path / "kaggle.csv", index=False)
    assert main(["aggregate", *map(str, paths), "--out", str(tables)]) == 0
    assert main(["scaleout-tables", *map(str, paths[1:]), "--shard-sims", str(tmp_path / "kaggle.csv"),
                 "--out", str(tables)]) == 0
    for name in ("comm_traffic", "flexshard_headroom", "proactive"):
        assert (tables / f"{name}.csv").is_file() and (tables / f"{name}.md").read_text().startswith("# ")
    assert "+60.0%" in (tables / "flexshard_headroom.md").read_text()
    names = set(drawn_figures(tables))  # drawn, not saved: saving is test_analysis.py's test_figures_are_written
    assert {"inter_node_bytes", "proactive_hidden", "flexshard_headroom"} <= names


def test_scale_out_tables_without_runs_or_simulations(tmp_path: Path) -> None:
    assert main(["scaleout-tables", "--out", str(tmp_path)]) == 0
    assert pd.read_csv(tmp_path / "comm_traffic.csv").empty
    assert pd.read_csv(tmp_path / "proactive.csv").empty


def test_proactive_hidden_share_of_a_disturbed_run_is_hatched(tmp_path: Path, drawn_figures) -> None:
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    shares = {(4, 2): 0.25, (2, 1): 0.6}
    recs = [one_process("hybrid", 1000.0)]
    for (world, rpn), hidden in shares.items():
        rec = record("proactive", "row", "row", world, rpn, options={"plan": "row", "depth": 1},
                     store={"depth": 1, "early_lookup_share": 0.4, "hidden_lookup_share": hidden})
        rec["summary"].update(stable=world != 4, unstable_reason="" if world != 4 else "step times spread")
        recs.append(rec)
    paths = [write_record(runs, rec) for rec in recs]
    assert main(["aggregate", *map(str, paths), "--out", str(tables)]) == 0
    assert main(["scaleout-tables", *map(str, paths[1:]), "--out", str(tables)]) == 0
    early, hidden = drawn_figures(tables)["proactive_hidden"].axes[:2]
    assert [round(p.get_height(), 6) for p in hidden.patches] == [0.6, 0.25]  # scale 2x1 (2), then 2x2 (4)
    assert [bool(p.get_hatch()) for p in hidden.patches] == [False, True]
    assert not any(p.get_hatch() for p in early.patches)  # a counter share: never marked


# --- which batch each row used ------------------------------------------------------------------------------------

def md_cells(md: str) -> list[list[str]]:
    """The rows of a markdown table's cells (header first, the rule left out)."""
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in md.splitlines() if ln.startswith("|")]
    return [r for r in rows if not set("".join(r)) <= set("-: ")]


def batched(row: dict, batching: str, batch_size: int) -> dict:
    return {**row, "batching": batching, "batch_size": batch_size, "batch_per_rank": batch_size // row["world"]}


def test_rows_state_their_batch_and_compare_only_at_the_same_global_batch(records: list[dict]) -> None:
    """A weak-scaled and a fixed-batch simulation of one scale: each its own reductions, both in the table."""
    sims = pd.DataFrame([
        batched(sim_row("row", 1.25, 1000.0), "per-rank", 2048),
        batched(sim_row("flexshard", 1.25, 300.0), "per-rank", 2048),
        batched(sim_row("row", 1.25, 100.0), "global", 1024),
        batched(sim_row("flexshard", 1.25, 80.0), "global", 1024),
    ])
    for rec in records:
        rec["config"]["train"]["batch_size"] = 1024
    table = comm_traffic_table(records, sims)
    sim = table[table.source == "simulated"]
    weak, fixed = one(sim, plan="flexshard", batching="per-rank"), one(sim, plan="flexshard", batching="global")
    assert (weak.batch_size, weak.batch_per_rank, fixed.batch_size, fixed.batch_per_rank) == (2048, 512, 1024, 256)
    assert weak.inter_a2a_reduction_vs_row == pytest.approx(0.7)
    assert fixed.inter_a2a_reduction_vs_row == pytest.approx(0.2)
    trained = one(table[table.source == "trained"], method="sharded", plan="row")
    assert (trained.batching, trained.batch_size, trained.batch_per_rank) == ("global", 1024, 256)
    cells = md_cells(comm_traffic_markdown(table))
    at = [cells[0].index(c) for c in ("batching", "batch_size", "batch_per_rank")]
    source = cells[0].index("source")
    assert sorted([r[i] for i in at] for r in cells[1:] if r[source] == "simulated") == \
        [["global", "1,024", "256"]] * 2 + [["per-rank", "2,048", "512"]] * 2
    curve = flexshard_headroom_table(sims).set_index("batching")
    assert curve.loc["per-rank"].reduction_vs_row == pytest.approx(0.7)
    assert curve.loc["global"].reduction_vs_row == pytest.approx(0.2)
    cells = md_cells(flexshard_headroom_markdown(flexshard_headroom_table(sims)))
    at = [cells[0].index(c) for c in ("batching", "batch_size", "batch_per_rank")]
    assert sorted([r[i] for i in at] for r in cells[1:]) == [["global", "1,024", "256"], ["per-rank", "2,048", "512"]]
    assert sorted(batch_label(curve.reset_index())) == ["512 samples per rank", "global batch 1,024"]


def test_a_shard_sim_table_from_before_the_batch_columns_kept_the_fixed_batch(tmp_path: Path, sims: pd.DataFrame):
    old = tmp_path / "old.csv"
    sims.to_csv(old, index=False)
    read = read_shard_sims([old])
    assert set(read.batching) == {"global"} and read.batch_size.isna().all()
    assert set(batch_label(read)) == {"batch not stated"}
    new = tmp_path / "new.csv"
    sims.assign(batch_size=64).to_csv(new, index=False)  # batch columns but no batching: per rank derived
    read = read_shard_sims([new])
    assert list(read.batch_per_rank) == [64 / w for w in sims.world] and set(read.batching) == {""}


def test_figures_draw_a_panel_per_dataset_and_batch(records: list[dict]) -> None:
    from hotcold.analysis.scaleout_figures import flexshard_headroom_figure, inter_node_bytes_figure

    sims = pd.DataFrame([batched(sim_row(p, 1.25, b), batching, size)
                         for p, b in (("row", 1000.0), ("flexshard", 300.0))
                         for batching, size in (("per-rank", 2048), ("global", 1024))])
    for rec in records:
        rec["config"]["train"]["batch_size"] = 1024
    figs = {"inter_node_bytes": inter_node_bytes_figure(comm_traffic_table(records, sims)),
            "flexshard_headroom": flexshard_headroom_figure(flexshard_headroom_table(sims))}
    for name, fig in figs.items():
        fig.draw_without_rendering()
        titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
        assert titles == ["kaggle, 512 samples per rank", "kaggle, global batch 1,024"], (name, titles)
    # the trained runs (global batch 1,024) are markers on the fixed-batch panel only
    per_rank, fixed = [ax for ax in figs["inter_node_bytes"].axes if ax.get_visible()][:2]
    assert not any(line.get_marker() == "D" and len(line.get_xdata()) for line in per_rank.lines)
    assert any(line.get_marker() == "D" and len(line.get_xdata()) for line in fixed.lines)


def test_exact_is_never_claimed_outside_exact_mode(tmp_path: Path) -> None:
    """Even at distance 0 from its replay, a run on the float32 wire has its distance and no `exact`; an exact-mode
    run (and a record from before the option, which summed in float64) claims it."""
    runs = tmp_path / "runs"
    wire = record("sharded", "row", "row", 4, 2)
    wire["config"]["distributed"].update(wire_dtype="float32", exact=False)
    exact = record("sharded", "table", "table", 4, 2)
    exact["config"]["distributed"].update(wire_dtype="float32", exact=True)
    old = record("sharded", "column", "column", 4, 2)
    for rec in (wire, exact, old):
        write_record(runs, rec)
    summary = aggregate(find_records(runs), tmp_path / "tables")
    row = one(summary, variant="row")
    assert pd.isna(row.exact) and row.param_rel_diff == 0.0 and "not exact mode" in row.exact_reference
    assert bool(one(summary, variant="table").exact) and bool(one(summary, variant="column").exact)


def test_flexshard_reported_whole_total_and_sync_free_bound() -> None:
    """Total (all-to-alls + replica sync) and the sync-free bound against row-wise's total, the dense all-reduce
    apart, and the plan that keeps never-seen rows on the device beside."""
    from hotcold.analysis.scaleout import comm_traffic_table

    key = {"dataset": "t", "world": 16, "ranks_per_node": 8, "nodes": 2, "memory_headroom": 1.0, "steps": 4,
           "status": "ok", "batching": "per-rank", "batch_size": 8192, "batch_per_rank": 512}
    rows = []
    for plan, a2a, rep, free in (("row", 100.0, 0.0, None), ("flexshard", 30.0, 10.0, 5.0),
                                 ("flexshard-device", 90.0, 1.0, 80.0)):
        rows.append({**key, "plan": plan, "inter_node_a2a_bytes": a2a, "inter_node_replica_bytes": rep,
                     "inter_node_dense_bytes": 7.0, "inter_node_embedding_bytes": a2a + rep,
                     "inter_node_bytes": a2a + rep + 7.0, "syncfree_inter_node_a2a_bytes": free,
                     "replica_sparse_share": 0.25 if rep else None})
    sims = pd.DataFrame(rows)
    curve = flexshard_headroom_table(sims).iloc[0]
    assert curve.reduction_vs_row == pytest.approx(0.7)
    assert curve.total_reduction_vs_row == pytest.approx(0.6)      # 1 - (30 + 10) / 100
    assert curve.syncfree_bound_vs_row == pytest.approx(0.95)      # 1 - 5 / 100
    assert curve.reduction_device_vs_row == pytest.approx(0.1)
    assert curve.total_reduction_device_vs_row == pytest.approx(0.09)
    assert (curve.inter_dense, curve.inter_replica_flexshard, curve.inter_total_flexshard) == (7.0, 10.0, 40.0)
    assert curve.replica_sparse_share == 0.25
    table = comm_traffic_table([], sims).set_index("plan")
    assert table.loc["flexshard", "inter_total_reduction_vs_row"] == pytest.approx(0.6)
    assert table.loc["flexshard", "syncfree_bound_vs_row"] == pytest.approx(0.95)
    assert table.loc["row", "inter_total_reduction_vs_row"] == pytest.approx(0.0)
    assert math.isnan(table.loc["row", "syncfree_bound_vs_row"])


def test_tables_and_figures_order_every_plan() -> None:
    """A new plan in the registry gets its place in the tables' and figures' order."""
    from hotcold.analysis.scaleout import PLAN_ORDER
    from hotcold.distributed.plans import PLANS

    assert sorted(PLAN_ORDER) == sorted(PLANS)
