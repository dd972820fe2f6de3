"""The claims table's measured and modelled columns: per claim kind, the comparison on the records and its model.

A ``speed`` claim compares samples/s of two runs, measured and through the
cost model (``Predict``); ``hits`` counts device hits; ``a2a_reduction``
and ``comm_latency`` read the shard-sim's counted bytes (the latter priced
by ``CommModel``). ``_why`` says why the numbers differ from the paper's.
The paper-scale columns: ``claims_paper_scale``; the GPU's: ``claims_gpu``.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd

from hotcold.analysis.claims.catalog import FLEXSHARD_2X2, SHARDED_ROW, Claim, _differs
from hotcold.analysis.claims.runs import (
    FLEXSHARD_HEADROOM,
    _comm_ms,
    _degenerate,
    _hardware,
    _label,
    _largest_sim,
    _matching,
    _mean,
    _not_run,
    _reduction,
    _speed,
    _stable,
)
from hotcold.distributed.batch import GLOBAL, PER_RANK

Predict = Callable[[dict[str, Any], Any], Any]
CommModel = Callable[..., dict[str, float]]


def _row(claim: Claim) -> dict[str, Any]:
    compared = claim.run.label if claim.run else ""
    if claim.baseline:
        compared += f" vs {claim.baseline.label}"
    return {"claim_id": claim.claim_id, "paper": claim.paper, "claim": claim.claim, "unit": claim.unit,
            "paper_value": claim.paper_value, "paper_states": claim.paper_states,
            "paper_hardware": claim.paper_hardware, "dataset": claim.dataset, "compared": compared,
            "status": "ok", "measured_value": math.nan, "measured_hardware": "", "measured_timer": "",
            "measured_stable": None, "modelled_value": math.nan, "modelled_profile": "", "modelled_dominant": "",
            "why_they_differ": "", "paper_scale_value": math.nan, "paper_scale_profile": "",
            "paper_scale_dominant": "", "paper_scale_workload": "", "paper_scale_why": ""}


def _modelled_speed(recs: list[dict[str, Any]], profile: Any, predict: Predict) -> tuple[float, str]:
    preds = [predict(r, profile) for r in recs]
    return _mean([p.samples_per_s for p in preds]), preds[0].dominant if preds else ""


def _speed_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], profiles: dict[str, Any],
                 predict: Predict) -> str:
    """Fill ``row``; return ``_degenerate``'s note on the compared run (empty for an ordinary one)."""
    run, base = _matching(records, claim.dataset, claim.run), _matching(records, claim.dataset, claim.baseline)
    if not run or not base:
        row["status"] = _not_run(records, claim.dataset, claim.run if not run else claim.baseline)
        return ""
    note = _degenerate(run, claim.run)
    row["compared"] = f"{_label(run, claim.run)} vs {_label(base, claim.baseline)}" + (f" [{note}]" if note else "")
    timers = {r["summary"].get("timer") for r in run + base}
    row["measured_timer"] = ", ".join(sorted(str(t) for t in timers))
    if len(timers) == 1:
        row["measured_value"] = _speed(run) / _speed(base)
    row["measured_hardware"] = _hardware(run + base)
    row["measured_stable"] = _stable(run + base)
    profile = profiles.get(claim.profile)
    if profile is None:
        row["modelled_profile"] = f"{claim.profile} (profile not given)"
        return note
    (speed_run, dominant), (speed_base, _) = (_modelled_speed(run, profile, predict),
                                              _modelled_speed(base, profile, predict))
    row["modelled_value"] = speed_run / speed_base
    row["modelled_profile"], row["modelled_dominant"] = claim.profile, f"{claim.run.method}: {dominant}"
    return note


def _hits_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]]) -> None:
    run = _matching(records, claim.dataset, claim.run)
    if not run:
        row["status"] = _not_run(records, claim.dataset, claim.run)
        return
    row["compared"] = _label(run, claim.run)
    counters = [r["summary"].get("counters_per_step") or {} for r in run]
    lookups = sum(c.get("lookups", 0.0) for c in counters)
    row["measured_value"] = 100.0 * sum(c.get("hits", 0.0) for c in counters) / lookups if lookups else math.nan
    row["measured_timer"], row["measured_hardware"] = "counted", "any"
    row["modelled_profile"] = "counted: not modelled"


def _batch_words(first: pd.Series) -> str:
    """``512 samples per rank (global batch 65,536)`` or ``the fixed global batch 1,024 (8 per rank)``."""
    size, per_rank = first.get("batch_size"), first.get("batch_per_rank")
    if pd.isna(size):
        return "batch not stated"
    if first.get("batching") == PER_RANK:
        return f"{per_rank:,.6g} samples per rank (global batch {size:,.0f})"
    return f"the fixed global batch {size:,.0f} ({per_rank:,.6g} per rank)"


def _whole(sim: pd.DataFrame) -> str:
    """``; with replica sync: X% less inter-node traffic; sync-free bound: Y%`` (empty for tables without them)."""
    by_plan = sim.set_index("plan")
    if not {"inter_node_embedding_bytes", "syncfree_inter_node_a2a_bytes"} <= set(by_plan.columns):
        return ""
    row_total = float(by_plan.loc["row", "inter_node_embedding_bytes"])
    flex = by_plan.loc["flexshard"]
    if not row_total > 0 or pd.isna(flex["inter_node_embedding_bytes"]):
        return ""
    out = f"; with replica sync: {100 * (1 - flex['inter_node_embedding_bytes'] / row_total):.1f}% less"
    if pd.notna(flex["syncfree_inter_node_a2a_bytes"]):
        out += f"; sync-free bound: {100 * (1 - flex['syncfree_inter_node_a2a_bytes'] / row_total):.1f}% less"
    return out


def _a2a_claim(row: dict[str, Any], claim: Claim, comm: pd.DataFrame) -> None:
    sim = _largest_sim(comm, claim.dataset)
    if sim.empty:
        row["status"] = f"not run: no simulated flexshard and row plans on {claim.dataset} at headroom " \
                        f"{FLEXSHARD_HEADROOM:g}"
        return
    first = sim.set_index("plan").loc["flexshard"]
    row["compared"] = (f"flexshard vs row, shard-sim at {int(first['nodes'])}x{int(first['ranks_per_node'])}, "
                       f"headroom {FLEXSHARD_HEADROOM:g}, {_batch_words(first)}")
    fixed = _largest_sim(comm, claim.dataset, GLOBAL) if first.get("batching") == PER_RANK else sim.iloc[0:0]
    fixed = fixed[fixed["world"] == first["world"]]
    if not fixed.empty:
        row["compared"] += (f"; at {_batch_words(fixed.set_index('plan').loc['flexshard'])}: "
                            f"{_reduction(fixed):.1f}% less")
    row["compared"] += _whole(sim)
    row["measured_value"] = _reduction(sim)
    row["measured_timer"], row["measured_hardware"] = "counted (shard-sim)", "any"
    row["modelled_profile"] = "counted: not modelled"


def _latency_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], comm: pd.DataFrame,
                   profiles: dict[str, Any], comm_model: CommModel) -> None:
    trained_flex = _matching(records, claim.dataset, FLEXSHARD_2X2)
    trained_row = _matching(records, claim.dataset, SHARDED_ROW)
    if trained_flex and trained_row:
        row["measured_value"] = _comm_ms(trained_row) / _comm_ms(trained_flex)
        row["measured_timer"] = ", ".join(sorted({str(r["summary"].get("timer")) for r in trained_flex}))
        row["measured_hardware"] = _hardware(trained_flex + trained_row)
        row["measured_stable"] = _stable(trained_flex + trained_row)
        measured = "trained at 2x2 (communication phases)"
    else:
        measured = "no trained 2x2 runs"
    sim = _largest_sim(comm, claim.dataset)
    profile = profiles.get(claim.profile)
    if sim.empty or profile is None:
        row["compared"] = f"flexshard vs sharded/row: {measured}"
        row["modelled_profile"] = f"{claim.profile} (profile not given)" if profile is None else ""
        return
    by_plan = sim.set_index("plan")
    first = by_plan.loc["flexshard"]
    scale = f"{int(first['nodes'])}x{int(first['ranks_per_node'])}"
    times = {plan: comm_model(by_plan.loc[plan].to_dict(), int(first["world"]), int(first["ranks_per_node"]),
                              profile) for plan in ("row", "flexshard")}
    row["modelled_value"] = times["row"]["total"] / times["flexshard"]["total"]
    row["modelled_profile"] = claim.profile
    flex = {k: v for k, v in times["flexshard"].items() if k != "total"}
    row["modelled_dominant"] = f"flexshard: {max(flex, key=flex.get)}" if flex else ""
    row["compared"] = f"flexshard vs sharded/row: {measured}; modelled from shard-sim at {scale}, " \
                      f"headroom {FLEXSHARD_HEADROOM:g}, {_batch_words(first)}"


def _why(row: dict[str, Any], claim: Claim, note: str = "") -> str:
    reasons = [note] if note else []
    if row["measured_stable"] is False:
        reasons.append("measured runs disturbed (stable = no)")
    measured_off = _differs(row["measured_value"], claim.paper_value)
    modelled_off = _differs(row["modelled_value"], claim.paper_value)
    if (measured_off or modelled_off or math.isnan(claim.paper_value)) and claim.why:
        reasons.append(claim.why)
    elif claim.kind == "none":
        reasons.append(claim.why)
    return "; ".join(reasons)
