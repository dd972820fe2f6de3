"""The check's one table: a row per run, from the runs' records and the aggregate's own columns.

``exact``, ``param_rel_diff``, ``exact_reference`` and ``degenerate`` (FAE
all-hot or all-cold) are the summary table's (``hotcold.analysis.summary.summary_frame``:
the same tolerance and reference as ``make reproduce``); ``check`` (``bits`` or
``lockstep``), the phases and counters are each record's.
A run that raised (no record) has its row, with status ``failed`` and the
error's first line as the reason.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from hotcold.analysis.markdown import to_markdown
from hotcold.analysis.summary import summary_frame
from hotcold.timing import PHASES

STATUS_FAILED = "failed"   # the run raised: no record
KEYS = ["dataset", "method", "variant"]
COLUMNS = [*KEYS, "status", "device", "timer", "samples_per_s", "step_ms_p50", "host_step_ms", "dense_step",
           "prepare_hidden", *[f"{p}_ms" for p in PHASES], "exact", "param_rel_diff", "exact_reference", "check",
           "degenerate", "hit_rate", "h2d_bytes_per_step", "d2h_bytes_per_step", "auc", "stable", "wall_s", "reason", "unstable_reason"]
FORMATS = {**{f"{p}_ms": "{:.3f}" for p in PHASES}, "host_step_ms": "{:.3f}", "prepare_hidden": "{:.2f}",
           "hit_rate": "{:.3f}", "h2d_bytes_per_step": "{:,.0f}",
           "d2h_bytes_per_step": "{:,.0f}", "wall_s": "{:.1f}"}
#: the counters whose bytes cross between host and device memory, each way (``hotcold.counters.StepCounters``)
H2D = ("param_bytes_h2d", "vector_bytes_h2d")
D2H = ("param_bytes_d2h", "grad_bytes_d2h")


def _from_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The phases (median ms per step), hit rate and host-device bytes per step of one record."""
    summary = rec.get("summary") or {}
    phases, counters = summary.get("phase_ms_p50") or {}, summary.get("counters_per_step") or {}
    lookups = counters.get("lookups")
    return {
        "check": rec.get("check"),  # bits (the harness's stores) or lockstep (a peer's kernels), when recorded
        # the host clock's step (on a CPU the step itself)
        "host_step_ms": summary.get("host_step_ms_p50", summary.get("step_ms_p50", math.nan)),
        "dense_step": (rec.get("store") or {}).get("dense_step"),   # eager, or graph (train.cuda_graphs)
        "prepare_hidden": summary.get("prepare_hidden", math.nan),  # the step pipeline's hidden share
        **{f"{p}_ms": phases.get(p, math.nan) if phases else math.nan for p in PHASES},
        "hit_rate": counters["hits"] / lookups if lookups else math.nan,
        "h2d_bytes_per_step": sum(counters.get(c, 0.0) for c in H2D) if counters else math.nan,
        "d2h_bytes_per_step": sum(counters.get(c, 0.0) for c in D2H) if counters else math.nan,
    }


def frame(records: Sequence[dict[str, Any]], failures: Sequence[dict[str, Any]],
          wall_s: dict[tuple[str, str, str], float], order: Sequence[tuple[str, str, str]],
          device: str, timer: str) -> pd.DataFrame:
    """One row per run in ``order`` (dataset, method, variant): ``records`` with the summary's columns,
    ``failures`` (keys, ``reason``) as status ``failed`` on the check's ``device`` (its name) and ``timer``;
    ``wall_s``: each run's seconds in the check."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    if records:
        summary = summary_frame(list(records))
        extra = {tuple(r[k] for k in KEYS): _from_record(r) for r in records}
        for row in summary.to_dict("records"):
            key = tuple(row[k] for k in KEYS)
            rows[key] = {**row, **extra[key]}
    for failure in failures:
        rows[tuple(failure[k] for k in KEYS)] = {"status": STATUS_FAILED, "device": device, "timer": timer,
                                                 **failure}
    out = pd.DataFrame([{**{c: None for c in COLUMNS}, **rows[key], "wall_s": wall_s.get(key)}
                        for key in order if key in rows], columns=COLUMNS)
    for col in ("samples_per_s", "step_ms_p50", "host_step_ms", "prepare_hidden", *[f"{p}_ms" for p in PHASES],
                "param_rel_diff", "hit_rate",
                "h2d_bytes_per_step", "d2h_bytes_per_step", "auc", "wall_s"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    out["exact"] = out["exact"].astype("boolean")
    out["stable"] = out["stable"].astype("boolean")
    return out


def markdown(table: pd.DataFrame) -> str:
    """The table in GitHub markdown, with empty phase columns and the unstable reasons (in the CSV) left out."""
    empty = [c for c in table.columns if c.endswith("_ms") and table[c].isna().all()]
    return to_markdown(table.drop(columns=[*empty, "unstable_reason"]), FORMATS)


def json_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as JSON values (NaN and NA as null)."""
    rows = []
    for row in table.astype(object).to_dict("records"):
        rows.append({k: None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v
                     for k, v in row.items()})
    return rows
