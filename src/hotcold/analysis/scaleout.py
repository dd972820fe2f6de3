"""Scale-out tables: collective traffic per plan and scale, FlexShard over memory headroom, Proactive.

Trained scale-out runs and ``hotcold shard-sim`` rows land in one traffic
table with the same bytes per step, so the two compare row by row where
both exist and the simulation carries a plan to scales no machine here
trains. Every row says which batch it used: ``batching`` ``per-rank``
(weak scaling: ``batch_per_rank`` samples per rank, a global batch of
``batch_per_rank x world``) or ``global`` (the fixed global batch
``batch_size`` split over the ranks), and rows compare only at the same
global batch. One function per table (``comm_traffic_table``,
``flexshard_headroom_table``, ``proactive_table``); columns: docs/outputs.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from hotcold import methods
from hotcold.analysis.markdown import to_markdown
from hotcold.analysis.run_records import load_records, plan_of, scale_of
from hotcold.counters import COLLECTIVES, PROACTIVE_WINDOWS
from hotcold.distributed.batch import GLOBAL, PER_RANK
from hotcold.files import atomic_write_text
from hotcold.record_status import STATUS_OK, record_status

A2A = ("input_a2a", "output_a2a", "grad_a2a")
#: inter-node bytes of: the all-to-alls, the replica synchronisation, the dense all-reduce (the same for every plan)
#: and every collective of the embeddings (all but the dense all-reduce: the plans' total)
INTER_PARTS = ["inter_node_a2a_bytes", "inter_node_replica_bytes", "inter_node_dense_bytes",
               "inter_node_embedding_bytes"]
BYTE_COLUMNS = [f"{c}_bytes" for c in COLLECTIVES] + ["intra_node_bytes", "inter_node_bytes", *INTER_PARTS]
REDUCTIONS = {"row": "inter_a2a_reduction_vs_row", "table": "inter_a2a_reduction_vs_table"}
#: FlexShard's whole picture against row-wise: total (all-to-alls + replica sync) and the sync-free bound
WHOLE = ["inter_total_reduction_vs_row", "syncfree_bound_vs_row"]
FLEX_EXTRA = ["syncfree_inter_node_a2a_bytes", "replica_sparse_share", "host_bytes_per_rank_max"]
BATCH_KEYS = ["batching", "batch_size", "batch_per_rank"]
COMM_KEYS = ["dataset", "source", "method", "variant", "plan", "world", "ranks_per_node", "nodes", "memory_headroom",
             *BATCH_KEYS, "seed"]
COMM_COLUMNS = [*COMM_KEYS, "status", "steps", *BYTE_COLUMNS, *REDUCTIONS.values(), *WHOLE, *FLEX_EXTRA,
                "load_imbalance", "memory_used_share", "reason"]
# rows compared with each other: same dataset, source, scale, headroom, global batch and seed
COMPARABLE = ["dataset", "source", "world", "ranks_per_node", "memory_headroom", "batch_size", "seed"]
SIM_REQUIRED = ("dataset", "plan", "world", "ranks_per_node", "nodes", "memory_headroom", "steps", "status",
                "inter_node_a2a_bytes")
HEADROOM_PLANS = ("flexshard", "row", "table", "flexshard-device")
HEADROOM_KEYS = ["dataset", "nodes", "ranks_per_node", "world", *BATCH_KEYS, "memory_headroom"]
HEADROOM_WHOLE = ["inter_replica_flexshard", "inter_total_flexshard", "inter_dense", "syncfree_inter_a2a_flexshard",
                  "total_reduction_vs_row", "syncfree_bound_vs_row", "reduction_device_vs_row",
                  "total_reduction_device_vs_row", "replica_sparse_share"]
HEADROOM_COLUMNS = [*HEADROOM_KEYS, "flexshard_status", *(f"inter_a2a_{p}" for p in HEADROOM_PLANS),
                    "reduction_vs_row", "reduction_vs_table", *HEADROOM_WHOLE]
#: per Proactive window, the share of served lookups done in it and the share of all lookup time it hid
PROACTIVE_WINDOW_COLUMNS = [f"{kind}_{w}" for w in PROACTIVE_WINDOWS for kind in ("window_lookup_share", "hidden_share")]
PROACTIVE_COLUMNS = ["dataset", "variant", "plan", "world", "ranks_per_node", "seed", "depth", "early_lookup_share",
                     "hidden_lookup_share", *PROACTIVE_WINDOW_COLUMNS, "lookup_ms_early", "lookup_ms_late",
                     "early_lookups_per_step", "served_lookups_per_step", "timer", "step_ms_p50",
                     "sharded_step_ms_p50"]


class ShardSimError(ValueError):
    """A CSV that is not ``hotcold shard-sim`` output."""


def read_shard_sims(paths: Sequence[Path]) -> pd.DataFrame:
    """The ``hotcold shard-sim`` CSVs in one frame (empty when there are none), with their batch columns."""
    frames = []
    for path in paths:
        frame = pd.read_csv(path, dtype={"dataset": str, "plan": str, "status": str, "reason": str, "batching": str})
        missing = [c for c in SIM_REQUIRED if c not in frame.columns]
        if missing:
            raise ShardSimError(f"{path}: not a `hotcold shard-sim` table (lacks column(s) {missing})")
        frames.append(with_batch(frame))
    if not frames:
        return pd.DataFrame(columns=[*SIM_REQUIRED, *BATCH_KEYS])
    return pd.concat(frames, ignore_index=True)


def with_batch(sims: pd.DataFrame) -> pd.DataFrame:
    """Shard-sim rows with ``batching``, ``batch_size`` and ``batch_per_rank`` filled where a table lacks them.

    ``batch_per_rank`` missing: ``batch_size / world``; ``batching`` missing:
    ``global`` for a table from before the batch columns (which always kept
    the fixed global batch), else ``per-rank`` where the row's per-rank batch
    was set (``shard_sim(batch_per_rank=...)`` rows name it) and unknown
    (empty) otherwise.
    """
    out = sims.copy()
    if "batch_size" not in out:
        out["batch_size"] = np.nan
        out["batching"] = out.get("batching", GLOBAL)
    out["batch_size"] = pd.to_numeric(out["batch_size"], errors="coerce").astype("float64")
    derived = out["batch_size"] / pd.to_numeric(out["world"], errors="coerce")
    out["batch_per_rank"] = (pd.to_numeric(out["batch_per_rank"], errors="coerce").astype("float64")
                             if "batch_per_rank" in out else derived).fillna(derived)
    if "batching" not in out:
        out["batching"] = ""
    out["batching"] = out["batching"].fillna("").astype(str)
    return out


def batch_label(frame: pd.DataFrame) -> pd.Series:
    """Which batch each row used, in words: ``512 samples per rank``, ``global batch 1,024`` or ``batch not stated``."""
    def one(batching: str, size: float, per_rank: float) -> str:
        if batching == PER_RANK and pd.notna(per_rank):
            return f"{int(per_rank):,} samples per rank"
        if batching == GLOBAL and pd.notna(size):
            return f"global batch {int(size):,}"
        return "batch not stated"
    if frame.empty:
        return pd.Series([], dtype=str, index=frame.index)
    return pd.Series([one(*v) for v in zip(frame["batching"], frame["batch_size"], frame["batch_per_rank"])],
                     index=frame.index, dtype=str)


def _headroom(rec: dict[str, Any]) -> float:
    """The run's per-rank memory headroom: its options, with the store's default."""
    options = methods.get(rec["method"]).parse_options((rec.get("config") or {}).get("store"))
    return float(options.memory_headroom)


def _trained_bytes(rec: dict[str, Any]) -> dict[str, float]:
    """Bytes per step of every collective over the whole run (the store's ledger / the run's steps)."""
    collectives = (rec.get("store") or {}).get("collectives") or {}
    steps = ((rec.get("config") or {}).get("train") or {}).get("steps")
    if not collectives or not steps:
        return {}
    get = lambda c, k: float((collectives.get(c) or {}).get(k, 0.0)) / steps  # noqa: E731
    out = {f"{c}_bytes": get(c, "bytes") for c in COLLECTIVES}
    out["intra_node_bytes"] = sum(get(c, "intra_node_bytes") for c in COLLECTIVES)
    out["inter_node_bytes"] = sum(get(c, "inter_node_bytes") for c in COLLECTIVES)
    out["inter_node_a2a_bytes"] = sum(get(c, "inter_node_bytes") for c in A2A)
    out["inter_node_replica_bytes"] = get("replica_allreduce", "inter_node_bytes")
    out["inter_node_dense_bytes"] = get("dense_allreduce", "inter_node_bytes")
    out["inter_node_embedding_bytes"] = out["inter_node_bytes"] - out["inter_node_dense_bytes"]
    return out


def trained_rows(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per scale-out record (world > 1), infeasible ones with their reason."""
    rows = []
    for rec in records:
        world, rpn = scale_of(rec)
        if world == 1:
            continue
        store = rec.get("store") or {}
        budget = store.get("memory_budget_bytes")
        held = store.get("memory_bytes_per_rank") or []
        config = rec.get("config") or {}
        batch = (config.get("train") or {}).get("batch_size")
        per_rank = (config.get("distributed") or {}).get("batch_per_rank")
        rows.append({
            "dataset": rec["dataset"], "source": "trained", "method": rec["method"], "variant": rec["variant"],
            "plan": plan_of(rec), "world": world, "ranks_per_node": rpn, "nodes": world // rpn,
            "memory_headroom": _headroom(rec), "seed": int(rec["seed"]), "status": record_status(rec),
            "batching": GLOBAL if per_rank is None else PER_RANK, "batch_size": batch,
            "batch_per_rank": batch / world if batch is not None else None,
            "steps": ((rec.get("config") or {}).get("train") or {}).get("steps"),
            **_trained_bytes(rec),
            "load_imbalance": store.get("load_imbalance"),
            "memory_used_share": store.get("memory_used_share", max(held) / budget if held and budget else None),
            "reason": rec.get("reason"),
        })
    return pd.DataFrame(rows, columns=[c for c in COMM_COLUMNS if c not in [*REDUCTIONS.values(), *WHOLE]])


def simulated_rows(sims: pd.DataFrame) -> pd.DataFrame:
    """The shard-sim rows in ``comm_traffic``'s columns (no method, variant or seed)."""
    out = with_batch(sims)
    out["source"] = "simulated"
    out["method"], out["variant"], out["seed"] = "", "", pd.NA
    if "memory_bytes_per_rank_max" in out and "memory_budget_bytes" in out:
        out["memory_used_share"] = out["memory_bytes_per_rank_max"] / out["memory_budget_bytes"]
    if "inter_node_embedding_bytes" not in out and "inter_node_bytes" in out:  # a table from before these columns
        out["inter_node_embedding_bytes"] = out["inter_node_a2a_bytes"]
    return out.reindex(columns=[c for c in COMM_COLUMNS if c not in [*REDUCTIONS.values(), *WHOLE]])


def _reference(group: pd.DataFrame, plan: str, column: str = "inter_node_a2a_bytes") -> float:
    """``column`` (inter-node all-to-all bytes) of the group's feasible ``plan`` row (the ``sharded`` run first);
    NaN if none."""
    cands = group[(group["plan"] == plan) & (group["status"] == STATUS_OK)]
    cands = cands.sort_values("method", key=lambda m: m != "sharded", kind="stable")
    return float(cands[column].iloc[0]) if not cands.empty else float("nan")


def reduction(values: pd.Series, reference: float) -> pd.Series:
    """``1 - values / reference``: the share of bytes saved (NaN where the reference is missing or zero)."""
    if not np.isfinite(reference) or reference <= 0:
        return pd.Series(np.nan, index=values.index, dtype="float64")
    return 1.0 - values.astype("float64") / reference


def comm_traffic_table(records: list[dict[str, Any]], sims: pd.DataFrame) -> pd.DataFrame:
    """Trained and simulated bytes per step per collective, with the reductions against row- and table-wise.

    One row per trained scale-out run (``source`` ``trained``, from its
    record) and per ``hotcold shard-sim`` row (``simulated``): mean bytes per
    training step of every collective, all of them intra- and inter-node, the
    inter-node all-to-all bytes (input, output and gradient exchanges), and
    how much fewer of those a plan sends than the row-wise plan
    (``inter_a2a_reduction_vs_row``) and the table-wise plan (``..._vs_table``)
    at the same dataset, source, scale, memory headroom (and seed):
    ``1 - bytes / reference bytes``, so 0.3 means 30% fewer bytes, a negative
    value more. A trained run's bytes per step are its whole run's (warm-up
    included) divided by its steps, which is what shard-sim reports for the
    same batches, so the two sources compare row by row.

    Infeasible plans (a plan that does not fit its memory budget, trained or
    simulated) stay in the table with their ``status`` and ``reason`` and no
    bytes.
    """
    parts = [p for p in (trained_rows(records), simulated_rows(sims)) if not p.empty]
    if not parts:
        return pd.DataFrame(columns=COMM_COLUMNS)
    frame = pd.concat(parts, ignore_index=True)
    for col in [*BYTE_COLUMNS, *FLEX_EXTRA, "batch_size", "batch_per_rank"]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["memory_headroom"] = frame["memory_headroom"].astype("float64")
    for col in [*REDUCTIONS.values(), *WHOLE]:
        frame[col] = np.nan
    for _, group in frame.groupby(COMPARABLE, dropna=False, sort=False):
        for plan, col in REDUCTIONS.items():
            frame.loc[group.index, col] = reduction(group["inter_node_a2a_bytes"], _reference(group, plan))
        row_total = _reference(group, "row", "inter_node_embedding_bytes")
        frame.loc[group.index, "inter_total_reduction_vs_row"] = reduction(group["inter_node_embedding_bytes"],
                                                                            row_total)
        frame.loc[group.index, "syncfree_bound_vs_row"] = reduction(group["syncfree_inter_node_a2a_bytes"], row_total)
    frame.loc[frame["status"] != STATUS_OK, [*REDUCTIONS.values(), *WHOLE]] = np.nan
    frame = frame[COMM_COLUMNS]
    return frame.sort_values(["dataset", "source", "world", "ranks_per_node", "batch_size", "memory_headroom", "plan",
                              "method", "variant", "seed"], kind="stable", key=_plan_key).reset_index(drop=True)


#: the plans in tables and figures: TorchRec's baselines first, its per-table plans, then the techniques
PLAN_ORDER = ("row", "table", "column", "data-parallel", "twrw", "auto", "balanced", "recshard", "flexshard",
              "flexshard-device")


def _plan_key(col: pd.Series) -> pd.Series:
    """Sort plans in ``PLAN_ORDER``; other columns as they are."""
    order = {p: i for i, p in enumerate(PLAN_ORDER)}
    return col.map(lambda p: order.get(p, len(order))) if col.name == "plan" else col


def flexshard_headroom_table(sims: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, simulated scale and headroom: inter-node all-to-all bytes of flexshard, row and table.

    From the simulations, FlexShard's, row-wise's and table-wise's inter-node
    all-to-all bytes at every memory headroom, simulated scale and batch, and
    FlexShard's reduction against the two (the curve over headroom 1.0-2.0).
    """
    sims = with_batch(sims[sims["plan"].isin(HEADROOM_PLANS)]) if not sims.empty else sims
    if sims.empty:
        return pd.DataFrame(columns=HEADROOM_COLUMNS)
    ok = simulated_rows(sims[sims["status"] == STATUS_OK])
    for col in [*INTER_PARTS, *FLEX_EXTRA]:
        ok[col] = pd.to_numeric(ok[col], errors="coerce").astype("float64")

    def per_plan(column: str, prefix: str) -> pd.DataFrame:
        w = ok.groupby([*HEADROOM_KEYS, "plan"], dropna=False)[column].first().unstack("plan")
        w = w.reindex(columns=list(HEADROOM_PLANS))
        w.columns = [f"{prefix}{p}" for p in w.columns]
        return w

    total, replica = per_plan("inter_node_embedding_bytes", "total_"), per_plan("inter_node_replica_bytes", "rep_")
    free, share = per_plan("syncfree_inter_node_a2a_bytes", "free_"), per_plan("replica_sparse_share", "share_")
    dense = ok.groupby(HEADROOM_KEYS, dropna=False)["inter_node_dense_bytes"].first().rename("inter_dense")
    wide = pd.concat([per_plan("inter_node_a2a_bytes", "inter_a2a_"), total, replica, free, share, dense], axis=1)
    keys = sims[HEADROOM_KEYS].drop_duplicates()
    out = keys.merge(wide.reset_index(), on=HEADROOM_KEYS, how="left")
    status = sims[sims["plan"] == "flexshard"][[*HEADROOM_KEYS, "status"]].rename(columns={"status": "flexshard_status"})
    out = out.merge(status, on=HEADROOM_KEYS, how="left")
    out["flexshard_status"] = out["flexshard_status"].fillna("not simulated")
    flex = out["inter_a2a_flexshard"].astype("float64")
    for plan in ("row", "table"):
        ref = out[f"inter_a2a_{plan}"].astype("float64")
        out[f"reduction_vs_{plan}"] = (1.0 - flex / ref).where(ref > 0)
    row_total = out["total_row"].astype("float64").where(lambda v: v > 0)
    out["inter_replica_flexshard"], out["inter_total_flexshard"] = out["rep_flexshard"], out["total_flexshard"]
    out["syncfree_inter_a2a_flexshard"] = out["free_flexshard"]
    out["replica_sparse_share"] = out["share_flexshard"]
    out["total_reduction_vs_row"] = 1.0 - out["total_flexshard"] / row_total
    out["syncfree_bound_vs_row"] = 1.0 - out["free_flexshard"] / row_total
    out["reduction_device_vs_row"] = 1.0 - out["inter_a2a_flexshard-device"] / row_total
    out["total_reduction_device_vs_row"] = 1.0 - out["total_flexshard-device"] / row_total
    out = out[HEADROOM_COLUMNS]
    return out.sort_values(HEADROOM_KEYS, kind="stable").reset_index(drop=True)


def proactive_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per trained Proactive run: early and hidden lookup shares, next to the plain sharded run's step time.

    The early share is the share of its served lookups done early (while an
    earlier step's collectives ran), the hidden share the share of its lookup
    time hidden behind communication; per window (``PROACTIVE_WINDOWS``) the
    share of the lookups done in it and of the lookup time it hid (absent
    for records made before the windows: empty).
    """
    step_ms = {}
    for rec in records:
        if rec.get("method") == "sharded" and record_status(rec) == STATUS_OK:
            step_ms[(rec["dataset"], plan_of(rec), *scale_of(rec), rec["seed"])] = rec["summary"].get("step_ms_p50")
    rows = []
    for rec in records:
        store = rec.get("store") or {}
        if record_status(rec) != STATUS_OK or "early_lookup_share" not in store:
            continue
        summary, world_rpn = rec["summary"], scale_of(rec)
        counters = summary.get("counters_per_step") or {}
        rows.append({
            "dataset": rec["dataset"], "variant": rec["variant"], "plan": plan_of(rec), "world": world_rpn[0],
            "ranks_per_node": world_rpn[1], "seed": int(rec["seed"]), "depth": store.get("depth"),
            **{k: store.get(k) for k in ("early_lookup_share", "hidden_lookup_share", *PROACTIVE_WINDOW_COLUMNS,
                                         "lookup_ms_early", "lookup_ms_late")},
            "early_lookups_per_step": counters.get("early_lookups"),
            "served_lookups_per_step": counters.get("served_lookups"),
            "timer": summary.get("timer"), "step_ms_p50": summary.get("step_ms_p50"),
            "sharded_step_ms_p50": step_ms.get((rec["dataset"], plan_of(rec), *world_rpn, rec["seed"])),
        })
    out = pd.DataFrame(rows, columns=PROACTIVE_COLUMNS)
    return out.sort_values(["dataset", "world", "ranks_per_node", "variant", "seed"], kind="stable").reset_index(
        drop=True)


BYTE_FORMATS = {c: "{:,.0f}" for c in BYTE_COLUMNS}
SHARE_FORMATS = {c: "{:+.1%}" for c in [*REDUCTIONS.values(), *WHOLE, "reduction_vs_row", "reduction_vs_table",
                                        "total_reduction_vs_row", "reduction_device_vs_row",
                                        "total_reduction_device_vs_row"]}
BATCH_FORMATS = {"batch_size": "{:,.0f}", "batch_per_rank": "{:,.6g}"}
BATCHING_TEXT = (f"`{PER_RANK}` rows are weak-scaled (every rank trains on `batch_per_rank` samples a step, so the "
                 f"global `batch_size` grows with the world, as the papers' runs); `{GLOBAL}` rows split the fixed "
                 "global `batch_size` over the ranks (`batch_per_rank` = batch_size / world). Reductions compare rows "
                 "of the same global batch only.")


def comm_traffic_markdown(frame: pd.DataFrame) -> str:
    shown = frame.drop(columns=["reason", "steps"]) if not frame.empty else frame
    return (
        "# hotcold collective traffic per step\n\n"
        "Mean bytes per training step of every collective, summed over ranks: `trained` from scale-out runs' "
        "records (the whole run's bytes over its steps), `simulated` from `hotcold shard-sim` on the same "
        "batches. `inter_node_a2a_bytes`: the input, output and gradient all-to-alls' bytes between nodes. "
        "`inter_a2a_reduction_vs_row` / `_vs_table`: 1 - bytes / the row-wise (table-wise) plan's at the same "
        "dataset, source, scale, memory headroom and seed (+30% = 30% fewer bytes). "
        "`inter_node_embedding_bytes`: every collective but the dense all-reduce (all-to-alls, replica "
        "synchronisation, column all-reduce) between nodes, `inter_node_dense_bytes` the dense all-reduce's (the "
        "same for every plan); `inter_total_reduction_vs_row`: 1 - embedding bytes / row-wise's; "
        "`syncfree_bound_vs_row`: the same for FlexShard's plan with replica synchronisation priced at zero (its "
        "all-to-alls only). `replica_sparse_share`: replica syncs that all-gathered the touched rows rather than "
        "all-reducing the tier; `host_bytes_per_rank_max`: rows the profile never saw, in host memory. "
        "`infeasible`: the plan "
        "does not fit its per-rank memory budget (memory_headroom x the row-wise shard); no bytes. "
        f"`batching`: {BATCHING_TEXT}\n\n"
        + to_markdown(shown, {**BYTE_FORMATS, **SHARE_FORMATS, **BATCH_FORMATS, "memory_headroom": "{:g}",
                              "syncfree_inter_node_a2a_bytes": "{:,.0f}", "replica_sparse_share": "{:.0%}",
                              "host_bytes_per_rank_max": "{:,.0f}",
                              "seed": "{:.0f}", "load_imbalance": "{:.3f}", "memory_used_share": "{:.2f}"})
    )


def flexshard_headroom_markdown(frame: pd.DataFrame) -> str:
    return (
        "# FlexShard against row-wise and table-wise over memory headroom (simulated)\n\n"
        "Inter-node all-to-all bytes per step (`hotcold shard-sim`) at each per-rank memory budget "
        "(memory_headroom x the row-wise shard), simulated scale (nodes x ranks_per_node) and batch. "
        "`reduction_vs_row` / `_vs_table`: FlexShard's share of all-to-all bytes saved; empty where a plan is "
        "infeasible or not simulated. FlexShard whole: `inter_replica_flexshard` (its replica synchronisation), "
        "`inter_total_flexshard` (all-to-alls + replica sync), `inter_dense` (the dense all-reduce, the same for "
        "every plan, not in the totals), `total_reduction_vs_row` (1 - total / row-wise's), "
        "`syncfree_bound_vs_row` (the all-to-all bytes of FlexShard's plan with replica sync priced at zero, "
        "against row-wise's total), `reduction_device_vs_row` / `total_reduction_device_vs_row` (the plan "
        "`flexshard-device`, which keeps the never-seen rows on the device budget), `replica_sparse_share` "
        f"(replica syncs that all-gathered the touched rows). `batching`: {BATCHING_TEXT}\n\n"
        + to_markdown(frame, {**{c: "{:,.0f}" for c in frame.columns if c.startswith(("inter_", "syncfree_inter"))},
                              **SHARE_FORMATS, **BATCH_FORMATS, "memory_headroom": "{:g}",
                              "replica_sparse_share": "{:.0%}"})
    )


def proactive_markdown(frame: pd.DataFrame) -> str:
    return (
        "# Proactive Embedding: lookups done early and lookup time hidden\n\n"
        "`early_lookup_share`: served lookups done while an earlier step's collectives ran (rows no step in "
        "between updates); `hidden_lookup_share`: lookup time that ran while a collective was still in flight. "
        "Step times are from P ranks sharing this machine's cores (the timer of `timer`), next to the plain "
        "`sharded` run's at the same plan and scale.\n\n"
        + to_markdown(frame, {"early_lookup_share": "{:.1%}", "hidden_lookup_share": "{:.1%}",
                              "early_lookups_per_step": "{:,.0f}", "served_lookups_per_step": "{:,.0f}",
                              "step_ms_p50": "{:.2f}", "sharded_step_ms_p50": "{:.2f}", "depth": "{:.0f}"})
    )


def scaleout_tables(records: Sequence[Path], sims: Sequence[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    """Write comm_traffic, flexshard_headroom and proactive (.csv and .md) to ``out_dir``; return the frames."""
    loaded = load_records(records) if records else []
    sim = read_shard_sims(sims)
    frames = {"comm_traffic": comm_traffic_table(loaded, sim), "flexshard_headroom": flexshard_headroom_table(sim),
              "proactive": proactive_table(loaded)}
    writers = {"comm_traffic": comm_traffic_markdown, "flexshard_headroom": flexshard_headroom_markdown,
               "proactive": proactive_markdown}
    for name, frame in frames.items():
        atomic_write_text(Path(out_dir) / f"{name}.csv", frame.to_csv(index=False))
        atomic_write_text(Path(out_dir) / f"{name}.md", writers[name](frame))
    return frames
