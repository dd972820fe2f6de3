"""A claim's runs: its records among the reproduction's, the shard-sim rows it reads, and their measured numbers.

``_matching`` finds the records (every seed) of a ``Run`` by variant or by
role, ``_not_run`` says why there are none; the rest read what the claims
compare from them: samples/s, communication time, hardware, stability.
``_largest_sim`` picks the simulated FlexShard and row-wise rows at the
largest scale, ``_reduction`` their inter-node all-to-all saving.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from hotcold.analysis.claims.catalog import Run
from hotcold.analysis.run_records import degenerate_of, scale_of
from hotcold.distributed.batch import GLOBAL, PER_RANK
from hotcold.record_status import STATUS_DIVERGED, STATUS_OK, record_status

#: the comm_traffic rows FlexShard's claims are read from: the largest simulated scale at this headroom, at the
#: weak-scaled (per-rank) batch where simulated, the fixed global batch's number beside it
FLEXSHARD_HEADROOM = 1.25
COMM_PHASES = ("input_a2a", "output_a2a", "grad_a2a", "replica_allreduce", "column_allreduce", "dense_allreduce")


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isclose(float(value), wanted, rel_tol=1e-9)
    return value == wanted


def _option(rec: dict[str, Any], key: str) -> Any:
    """A record's store option ``key`` (its config's; a scale-out summary's ``plan``)."""
    store = (rec.get("config") or {}).get("store") or {}
    return store[key] if key in store else (rec.get("summary") or {}).get(key)


def budget_of(rec: dict[str, Any]) -> float:
    """A record's device budget in rows: FAE's hot rows, a cache's or scratchpad's capacity (0: none)."""
    report = rec.get("store") or {}
    return float(report.get("hot_rows") or report.get("capacity") or 0)


def _matching(records: list[dict[str, Any]], dataset: str, run: Run) -> list[dict[str, Any]]:
    """The records (every seed) of ``run``: its variant, or the variant its role picks."""
    recs = [r for r in records if record_status(r) == STATUS_OK and r.get("dataset") == dataset
            and r.get("method") == run.method and scale_of(r) == (run.world, run.ranks_per_node)]
    if run.variant:
        return [r for r in recs if r.get("variant") == run.variant]
    recs = [r for r in recs if all(_same(_option(r, k), v) for k, v in run.options)]
    if not recs:
        return []
    variants = sorted({r.get("variant") for r in recs})
    if run.pick in ("largest", "smallest"):
        # a budget that ran as another store (FAE all-hot or all-cold) is picked only when every budget did
        ordinary = [v for v in variants if not any(degenerate_of(r) for r in recs if r.get("variant") == v)]
        variants = ordinary or variants
        budget = {v: max(budget_of(r) for r in recs if r.get("variant") == v) for v in variants}
        chosen = (max if run.pick == "largest" else min)(variants, key=lambda v: (budget[v], v))
    else:
        chosen = variants[0]
    return [r for r in recs if r.get("variant") == chosen]


def _not_run(records: list[dict[str, Any]], dataset: str, run: Run) -> str:
    """The status of a claim whose ``run`` has no trained record: ``diverged`` where its runs diverged, else not run."""
    diverged = sorted({f"{r.get('variant')} at step {r.get('diverged_step')}" for r in records
                       if record_status(r) == STATUS_DIVERGED and r.get("dataset") == dataset
                       and r.get("method") == run.method and scale_of(r) == (run.world, run.ranks_per_node)
                       and (r.get("variant") == run.variant if run.variant
                            else all(_same(_option(r, k), v) for k, v in run.options))})
    if diverged:
        return f"diverged: {run.label} on {dataset} ({', '.join(diverged)}): no number to compare"
    return f"not run: no trained {run.label} on {dataset} in this reproduction"


def _label(recs: list[dict[str, Any]], run: Run) -> str:
    """The variant a role resolved to, in ``compared``."""
    if not recs or run.variant:
        return run.label
    scale = f" at {run.world // run.ranks_per_node}x{run.ranks_per_node}" if run.world > 1 else ""
    return f"{run.method}/{recs[0].get('variant')}{scale}"


def _hardware(recs: list[dict[str, Any]]) -> str:
    names = []
    for rec in recs:
        prov = rec.get("provenance") or {}
        device = prov.get("device") or "?"
        host = prov.get("cpu") or "?"
        name = f"{device} ({host}, {prov.get('threads', '?')} threads)" if device != "cpu" else \
            f"CPU {host}, {prov.get('threads', '?')} threads"
        names.append(name)
    return "; ".join(sorted(set(names)))


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def _speed(recs: list[dict[str, Any]]) -> float:
    return _mean([r["summary"].get("samples_per_s", math.nan) for r in recs])


def _stable(recs: list[dict[str, Any]]) -> Any:
    flags = [(r.get("summary") or {}).get("stable") for r in recs]
    return None if any(f is None for f in flags) else all(bool(f) for f in flags)


def _degenerate(recs: list[dict[str, Any]], run: Run) -> str:
    """Says so where ``run``'s records did not run as their technique (FAE all-hot or all-cold); empty otherwise."""
    marks = sorted({f"{r.get('variant')} {m}" for r in recs if (m := degenerate_of(r))})
    if not marks:
        return ""
    return (f"degenerate: {run.method} {', '.join(marks)} (all-hot: every timed batch hot, the device store's "
            "run; all-cold: the hybrid store's), so this is not the technique's speed-up")


def _comm_ms(recs: list[dict[str, Any]]) -> float:
    return _mean([sum((r["summary"].get("phase_ms_mean") or {}).get(p, 0.0) for p in COMM_PHASES) for r in recs])


def _largest_sim(comm: pd.DataFrame, dataset: str, batching: str | None = None) -> pd.DataFrame:
    """Simulated FlexShard and row-wise rows of ``dataset`` at its largest scale and the claims' headroom, of one
    ``batching`` (``per-rank`` or ``global``; None: the weak-scaled rows where there are any, else the fixed ones)."""
    if comm.empty:
        return comm
    sim = comm[(comm["source"] == "simulated") & (comm["dataset"] == dataset) & (comm["status"] == STATUS_OK)
               & np.isclose(comm["memory_headroom"].astype(float), FLEXSHARD_HEADROOM)]
    sim = sim[sim["plan"].isin(["flexshard", "row"])]
    batchings = sim["batching"].fillna("") if "batching" in sim else pd.Series(GLOBAL, index=sim.index)
    if batching is None:
        batching = PER_RANK if (batchings == PER_RANK).any() else GLOBAL
    sim = sim[batchings == batching]
    if sim.empty:
        return sim
    world = sim.groupby("world")["plan"].nunique()
    worlds = world[world == 2].index
    return sim[sim["world"] == worlds.max()] if len(worlds) else sim.iloc[0:0]


def _reduction(sim: pd.DataFrame) -> float:
    by_plan = sim.set_index("plan")
    return 100.0 * (1.0 - by_plan.loc["flexshard", "inter_node_a2a_bytes"] / by_plan.loc["row", "inter_node_a2a_bytes"])
