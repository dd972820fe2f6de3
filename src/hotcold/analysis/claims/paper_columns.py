"""The claims table's paper-scale columns and the knob sweep behind their reasons (``claims_sweep.csv``).

Per claim with a hotcold method: the cost model on the paper-scale
configuration's workload (``paper_scale.PaperScale``: its trained records
where it trains the claim's run role, else the simulators' counters) under
the claim's hardware profile. Where the value differs from the paper's by
more than ``AGREE_RTOL``, the same workloads are priced with one group of
the profile's rates (or one share of the workload) swept, and the row names
the smallest change that brings the value within the tolerance, or says that
none of the swept ones does. docs/costmodel.md, "The claims at paper scale".
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from hotcold.analysis.claims.catalog import Claim, Run, _differs
from hotcold.analysis.claims.runs import FLEXSHARD_HEADROOM, _largest_sim, _matching, _reduction, budget_of
from hotcold.analysis.claims.paper_scale import (
    COMM_KNOBS,
    EARLY_STEPS,
    FACTORS,
    SHARES,
    SPEED_KNOBS,
    PaperScale,
    Resolved,
    resolve,
    sweep_profile,
    workload_words,
)
from hotcold.distributed.batch import PER_RANK

ShapeOf = Callable[[dict[str, Any]], Any]


def _predict(workloads: list[Any], profile: Any) -> tuple[float, str]:
    from hotcold import methods
    from hotcold.costmodel.prediction import predict

    preds = [predict(w, profile, methods.price(w.method)) for w in workloads]
    return float(np.mean([p.samples_per_s for p in preds])), preds[0].dominant


def _ratio(run: list[Any], base: list[Any], profile: Any) -> tuple[float, str]:
    (a, dominant), (b, _) = _predict(run, profile), _predict(base, profile)
    return a / b, dominant


def _sweep_rate_knobs(claim: Claim, knobs: dict[str, tuple[tuple[str, ...], bool]], profile: Any,
                      value_at: Callable[[Any], float]) -> list[dict[str, Any]]:
    out = []
    for knob, (rates, faster) in knobs.items():
        if not any(profile.has(r) for r in rates):
            continue
        for f in FACTORS:
            value = value_at(sweep_profile(profile, rates, faster, f))
            setting = f"{f:g}x the profile's {knob}" if faster else f"the profile's {knob} / {f:g}"
            out.append(_sweep_row(claim, f"{knob} ({profile.name})", setting, f, value))
    return out


def _sweep_row(claim: Claim, knob: str, setting: str, factor: float, value: float) -> dict[str, Any]:
    return {"claim_id": claim.claim_id, "knob": knob, "setting": setting, "factor": factor, "value": value,
            "paper_value": claim.paper_value, "agrees": not _differs(value, claim.paper_value)}


def _share_rows(claim: Claim, knob: str, current: float, value_at: Callable[[float], float]) -> list[dict[str, Any]]:
    return [_sweep_row(claim, knob, f"{knob} {s:g} (paper scale: {current:.2f})", s / current if current else math.inf,
                       value_at(s)) for s in SHARES]


def _reason(claim: Claim, value: float, rows: list[dict[str, Any]]) -> str:
    """Which swept knob closes the gap with the least change, or that none does."""
    unit = claim.unit.split()[0]
    head = f"paper-scale {value:.3g}{unit} vs the paper's {claim.paper_value:.3g}{unit}"
    if not rows:
        return head
    agree = [r for r in rows if r["agrees"]]
    if agree:
        best = min(agree, key=lambda r: abs(math.log(r["factor"])) if 0 < r["factor"] < math.inf else math.inf)
        return f"{head}: reaches {best['value']:.3g}{unit} at {best['setting']} (claims_sweep.csv)"
    closest = min(rows, key=lambda r: abs(r["value"] - claim.paper_value) if not math.isnan(r["value"]) else math.inf)
    return (f"{head}: no swept knob closes it (claims_sweep.csv); closest {closest['value']:.3g}{unit} at "
            f"{closest['setting']}")


# --- per kind ----------------------------------------------------------------------------------------------------

def _speed(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], paper: PaperScale,
           profile: Any, shape_of: ShapeOf, sweep: list[dict[str, Any]]) -> None:
    def resolved(run: Run) -> Resolved | str:
        trained = _matching(records, claim.dataset, run)
        key = max((budget_of(r) for r in trained), default=0.0)
        return resolve(paper, claim.dataset, run, trained, key, shape_of)

    run, base = resolved(claim.run), resolved(claim.baseline)
    for r in (run, base):
        if isinstance(r, str):
            row["paper_scale_why"] = f"paper-scale: {r}"
            return
    assert isinstance(run, Resolved) and isinstance(base, Resolved)
    value, dominant = _ratio(run.workloads, base.workloads, profile)
    w = run.workloads[0]
    row.update(paper_scale_value=value, paper_scale_profile=profile.name,
               paper_scale_dominant=f"{claim.run.method}: {dominant}",
               paper_scale_workload=workload_words(w.shape, w.batch_size, f"{run.source} vs {base.source}",
                                                   run.budget))
    if not _differs(value, claim.paper_value):
        return
    rows = _sweep_rate_knobs(claim, SPEED_KNOBS, profile, lambda p: _ratio(run.workloads, base.workloads, p)[0])
    if claim.run.method == "fae":
        hot = float(np.mean([x.c("hot_batch") for x in run.workloads]))
        rows += _share_rows(claim, "FAE hot-batch share", hot, lambda s: _ratio(
            [replace(x, counters={**x.counters, "hot_batch": s}) for x in run.workloads], base.workloads, profile)[0])
    sweep += rows
    row["paper_scale_why"] = _reason(claim, value, rows)


def _largest_row_plan(frame: pd.DataFrame) -> pd.Series | None:
    ok = frame[(frame["plan"] == "row") & (frame["status"] == "ok")]
    if "batching" in ok and (ok["batching"] == PER_RANK).any():
        ok = ok[ok["batching"] == PER_RANK]
    if ok.empty:
        return None
    return ok[ok["world"] == ok["world"].max()].iloc[0]


def _scaleout_speed(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], paper: PaperScale,
                    profile: Any, sweep: list[dict[str, Any]]) -> None:
    """Proactive vs row-wise: the shard-sim's row plan at the largest weak-scaled scale, Proactive's early
    lookups (rows the previous step did not touch) counted on the same global batches."""
    from hotcold.costmodel.simulated import shard_sim_workload

    absent = paper.absent(claim.dataset, "shard_sim")
    if absent:
        row["paper_scale_why"] = absent
        return
    sim = _largest_row_plan(paper.shard_sims[claim.dataset])
    if sim is None:
        row["paper_scale_why"] = f"paper-scale: no row plan simulated on {claim.dataset}"
        return
    shape = paper.shape(claim.dataset)
    trace = paper.trace_counters(claim.dataset, int(sim["batch_size"]))
    opt = paper.row_optimizer(claim.dataset)

    def pair(early: float) -> tuple[list[Any], list[Any]]:
        make = lambda m, e: shard_sim_workload(  # noqa: E731
            sim.to_dict(), shape, trace["lookups"], trace["unique_rows"], e, m, opt)
        return [make("proactive", early)], [make("sharded", 0.0)]

    run, base = pair(trace["early_lookups"])
    value, dominant = _ratio(run, base, profile)
    share = trace["early_lookups"] / trace["lookups"] if trace["lookups"] else 0.0
    w = run[0]
    row.update(paper_scale_value=value, paper_scale_profile=profile.name,
               paper_scale_dominant=f"proactive: {dominant}",
               paper_scale_workload=workload_words(
                   w.shape, w.batch_size, f"shard-sim row plan ({int(sim['steps'])} steps), early lookups "
                   f"{share:.0%} of the lookups (depth 1, over {EARLY_STEPS} steps of the trace)",
                   world=w.world, ranks_per_node=w.ranks_per_node))
    if not _differs(value, claim.paper_value):
        return
    rows = _sweep_rate_knobs(claim, {**COMM_KNOBS, **SPEED_KNOBS}, profile, lambda p: _ratio(run, base, p)[0])
    rows += _share_rows(claim, "Proactive early-lookup share", share,
                        lambda s: _ratio(*pair(s * trace["lookups"]), profile)[0])
    sweep += rows
    row["paper_scale_why"] = _reason(claim, value, rows)


def _hits(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], paper: PaperScale,
          shape_of: ShapeOf) -> None:
    trained = _matching(records, claim.dataset, claim.run)
    r = resolve(paper, claim.dataset, claim.run, trained, max((budget_of(x) for x in trained), default=0.0),
                shape_of)
    if isinstance(r, str):
        row["paper_scale_why"] = f"paper-scale: {r}"
        return
    lookups = sum(w.c("lookups") for w in r.workloads)
    row["paper_scale_value"] = 100.0 * sum(w.c("hits") for w in r.workloads) / lookups if lookups else math.nan
    row["paper_scale_profile"] = "counted"
    w = r.workloads[0]
    row["paper_scale_workload"] = workload_words(w.shape, w.batch_size, r.source, r.budget)
    if _differs(row["paper_scale_value"], claim.paper_value):
        row["paper_scale_why"] = f"paper-scale {row['paper_scale_value']:.3g}% vs the paper's {claim.paper_value:.3g}%"


def _shard_frame(paper: PaperScale, dataset: str) -> pd.DataFrame:
    return paper.shard_sims[dataset].assign(source="simulated")


def _a2a(row: dict[str, Any], claim: Claim, paper: PaperScale, sweep: list[dict[str, Any]]) -> None:
    absent = paper.absent(claim.dataset, "shard_sim")
    if absent:
        row["paper_scale_why"] = absent
        return
    comm = _shard_frame(paper, claim.dataset)
    sim = _largest_sim(comm, claim.dataset)
    if sim.empty:
        row["paper_scale_why"] = f"paper-scale: no flexshard and row plans at headroom {FLEXSHARD_HEADROOM:g}"
        return
    value = _reduction(sim)
    first = sim.set_index("plan").loc["flexshard"]
    shape = paper.shape(claim.dataset)
    row.update(paper_scale_value=value, paper_scale_profile="counted (shard-sim)",
               paper_scale_workload=workload_words(shape, int(first["batch_size"]),
                                                   f"shard-sim, headroom {FLEXSHARD_HEADROOM:g}",
                                                   world=int(first["world"]),
                                                   ranks_per_node=int(first["ranks_per_node"])))
    if not _differs(value, claim.paper_value):
        return
    rows = []
    ok = comm[(comm["status"] == "ok") & comm["plan"].isin(["flexshard", "row"])]
    keys = ["world", "ranks_per_node", "memory_headroom"] + (["batching"] if "batching" in ok else [])
    for key, part in ok.groupby(keys):
        if set(part["plan"]) != {"flexshard", "row"}:
            continue
        world, rpn, headroom = int(key[0]), int(key[1]), float(key[2])
        batching = f", {key[3]} batch" if len(key) > 3 else ""
        rows.append(_sweep_row(claim, "scale and memory headroom (counted)",
                               f"{world // rpn}x{rpn}, headroom {headroom:g}{batching}",
                               headroom / FLEXSHARD_HEADROOM, _reduction(part)))
    sweep += rows
    row["paper_scale_why"] = _reason(claim, value, rows)


def _latency(row: dict[str, Any], claim: Claim, paper: PaperScale, profile: Any, comm_model: Any,
             sweep: list[dict[str, Any]]) -> None:
    absent = paper.absent(claim.dataset, "shard_sim")
    if absent:
        row["paper_scale_why"] = absent
        return
    sim = _largest_sim(_shard_frame(paper, claim.dataset), claim.dataset)
    if sim.empty:
        row["paper_scale_why"] = f"paper-scale: no flexshard and row plans at headroom {FLEXSHARD_HEADROOM:g}"
        return
    by_plan = sim.set_index("plan")
    first = by_plan.loc["flexshard"]
    world, rpn = int(first["world"]), int(first["ranks_per_node"])

    def value_at(p: Any) -> tuple[float, str]:
        times = {plan: comm_model(by_plan.loc[plan].to_dict(), world, rpn, p) for plan in ("row", "flexshard")}
        flex = {k: v for k, v in times["flexshard"].items() if k != "total"}
        return times["row"]["total"] / times["flexshard"]["total"], max(flex, key=flex.get) if flex else ""

    value, dominant = value_at(profile)
    shape = paper.shape(claim.dataset)
    row.update(paper_scale_value=value, paper_scale_profile=profile.name, paper_scale_dominant=f"flexshard: {dominant}",
               paper_scale_workload=workload_words(shape, int(first["batch_size"]),
                                                   f"shard-sim bytes, headroom {FLEXSHARD_HEADROOM:g}",
                                                   world=world, ranks_per_node=rpn))
    if not _differs(value, claim.paper_value):
        return
    rows = _sweep_rate_knobs(claim, COMM_KNOBS, profile, lambda p: value_at(p)[0])
    sweep += rows
    row["paper_scale_why"] = _reason(claim, value, rows)


def paper_scale_columns(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], paper: PaperScale | None,
                        profiles: dict[str, Any], shape_of: ShapeOf, comm_model: Any,
                        sweep: list[dict[str, Any]]) -> None:
    """Fill ``row``'s ``paper_scale_*`` columns for ``claim``; append its sweep's rows to ``sweep``."""
    if claim.kind == "none":
        row["paper_scale_why"] = "no hotcold method"
        return
    if paper is None:
        row["paper_scale_why"] = "paper-scale outputs absent: no simulations given to `hotcold claims`"
        return
    absent = paper.absent(claim.dataset, "data")
    if absent:
        row["paper_scale_why"] = absent
        return
    profile = profiles.get(claim.profile)
    if claim.kind in ("speed", "comm_latency") and profile is None:
        row["paper_scale_why"] = f"paper-scale: profile {claim.profile} not given"
        return
    if claim.kind == "speed" and claim.run.world > 1:
        _scaleout_speed(row, claim, records, paper, profile, sweep)
    elif claim.kind == "speed":
        absent = paper.absent(claim.dataset, "sim")
        if absent:
            row["paper_scale_why"] = absent
            return
        _speed(row, claim, records, paper, profile, shape_of, sweep)
    elif claim.kind == "hits":
        _hits(row, claim, records, paper, shape_of)
    elif claim.kind == "a2a_reduction":
        _a2a(row, claim, paper, sweep)
    elif claim.kind == "comm_latency":
        _latency(row, claim, paper, profile, comm_model, sweep)
