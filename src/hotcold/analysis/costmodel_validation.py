"""``costmodel_validation.csv/.md``: the cost model's per-phase prediction against each run's measured times.

One row per (run, phase): the measured mean ms (``phase_ms_mean``: means add
up to the mean step, medians do not), the modelled ms on one profile, the
relative error ``(modelled - measured) / measured``, the run's ``stable`` and
timer, the profile. A ``step`` row per run compares the totals. The
per-method summary takes stable runs only: the median absolute relative
error over the phases that take at least ``MIN_PHASE_SHARE`` of the measured
step, and the step total's error, with the number of runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from hotcold import methods
from hotcold.analysis.markdown import to_markdown
from hotcold.costmodel.prediction import Prediction, predict_record
from hotcold.costmodel.profile import HardwareProfile
from hotcold.costmodel.workload import ModelShape
from hotcold.files import atomic_write_text

MIN_PHASE_SHARE = 0.05  # phases below this share of the measured step are listed but not summarised
ROW_COLUMNS = ["dataset", "method", "variant", "seed", "world", "timer", "stable", "profile", "phase",
               "measured_ms", "modelled_ms", "rel_error", "measured_share", "dominant_term"]
SUMMARY_COLUMNS = ["method", "variant", "world", "profile", "runs", "runs_unstable", "phases", "median_abs_phase_error",
                   "step_error"]


def _rel(modelled: float, measured: float) -> float:
    return (modelled - measured) / measured if measured > 0 else float("nan")


def validation_rows(record: dict[str, Any], prediction: Prediction) -> list[dict[str, Any]]:
    """The (run, phase) rows of one record, and its ``step`` row."""
    s = record["summary"]
    measured = {p: float(v) for p, v in s["phase_ms_mean"].items()}
    step = float(s.get("step_ms_mean", sum(measured.values())))
    key = {"dataset": record.get("dataset"), "method": record.get("method"), "variant": record.get("variant"),
           "seed": record.get("seed"), "world": int(s.get("world", 1) or 1), "timer": s.get("timer"),
           "stable": bool(s.get("stable", True)), "profile": prediction.profile}
    rows = []
    for phase in list(measured) + [p for p in prediction.phases_ms if p not in measured]:
        got, model = measured.get(phase, 0.0), prediction.phases_ms.get(phase, 0.0)
        terms = {k: v for k, v in prediction.terms_ms.items() if k.startswith(f"{phase}.")}
        rows.append({**key, "phase": phase, "measured_ms": got, "modelled_ms": model, "rel_error": _rel(model, got),
                     "measured_share": got / step if step > 0 else float("nan"),
                     "dominant_term": max(terms, key=terms.get) if terms else ""})
    rows.append({**key, "phase": "step", "measured_ms": step, "modelled_ms": prediction.step_ms,
                 "rel_error": _rel(prediction.step_ms, step), "measured_share": 1.0,
                 "dominant_term": prediction.dominant})
    return rows


def models_collectives(profile: HardwareProfile) -> bool:
    """Whether ``profile`` has the network rates that scale-out runs need."""
    return all(profile.has(k) for k in ("intra_node_bw", "inter_node_bw", "collective_latency_us"))


def validated(records: Sequence[dict[str, Any]], profile: HardwareProfile) -> list[dict[str, Any]]:
    """The trained records ``profile`` can model: scale-out runs only where it has network rates; not the
    peer methods (FBGEMM's kernels), which are measured beside the harness's, never modelled."""
    network = models_collectives(profile)
    return [r for r in records if r.get("status", "ok") == "ok" and r.get("method") not in methods.names(peer=True)
            and (network or int((r.get("summary") or {}).get("world", 1) or 1) == 1)]


def validation_frame(records: Sequence[dict[str, Any]], profile: HardwareProfile,
                     shape_of: Callable[[dict[str, Any]], ModelShape | None] = lambda r: None) -> pd.DataFrame:
    """Rows of every record ``validated`` keeps (``shape_of``: each record's dense model sizes, when known)."""
    rows = []
    for rec in validated(records, profile):
        rows += validation_rows(rec, predict_record(rec, profile, methods.price(rec["method"]), shape_of(rec)))
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def summary_frame(rows: pd.DataFrame, min_share: float = MIN_PHASE_SHARE) -> pd.DataFrame:
    """Per method, variant and world size: median |relative error| over the phases >= ``min_share`` of the
    measured step, and the step total's median error, over stable runs only (unstable ones are counted apart)."""
    out = []
    for (method, variant, world, profile), g in rows.groupby(["method", "variant", "world", "profile"], sort=True):
        runs = g.drop_duplicates(["dataset", "seed", "world"])
        stable = g[g["stable"]]
        phases = stable[(stable["phase"] != "step") & (stable["measured_share"] >= min_share)]
        steps = stable[stable["phase"] == "step"]
        out.append({"method": method, "variant": variant, "world": int(world), "profile": profile,
                    "runs": int(runs["stable"].sum()), "runs_unstable": int((~runs["stable"]).sum()),
                    "phases": ", ".join(dict.fromkeys(phases["phase"])),
                    "median_abs_phase_error": float(np.median(np.abs(phases["rel_error"]))) if len(phases)
                    else float("nan"),
                    "step_error": float(np.median(steps["rel_error"])) if len(steps) else float("nan")})
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def markdown(rows: pd.DataFrame, summary: pd.DataFrame, profile: HardwareProfile, left_out: int = 0) -> str:
    pct = {"median_abs_phase_error": "{:.0%}", "step_error": "{:+.0%}", "rel_error": "{:+.0%}",
           "measured_share": "{:.0%}", "measured_ms": "{:.3f}", "modelled_ms": "{:.3f}"}
    lines = [f"# Cost model validation: profile `{profile.name}` (modelled) against measured phase times", "",
             f"Profile: {profile.description}", "",
             f"Per method and world size, stable runs only: the median absolute relative error over the phases "
             f"that take at least {MIN_PHASE_SHARE:.0%} of the measured step, and the error of the step total "
             "(modelled - measured) / measured. Measured: each phase's mean over the timed steps.", "",
             *(["Scale-out runs (world > 1) are rank 0's phases: a collective's phase includes the wait for the "
                "slowest peer. The model adds a wait only where the ranks outnumber the profile's cores "
                "(`wait_for_peers`), so time lost to other programs on the machine shows as collective error.", ""]
               if (rows["world"] > 1).any() else []),
             *([f"{left_out} scale-out run(s) left out: the profile has no network rates to model their "
                "collectives.", ""] if left_out else []),
             to_markdown(summary, pct), "", "## Every run and phase", "",
             to_markdown(rows, pct)]
    return "\n".join(lines) + "\n"


def write_validation(records: Sequence[dict[str, Any]], profile: HardwareProfile, out_dir: Path,
                     shape_of: Callable[[dict[str, Any]], ModelShape | None] = lambda r: None) -> pd.DataFrame:
    """Write ``costmodel_validation.csv`` (every row, then no summary) and ``.md`` (summary first)."""
    rows = validation_frame(records, profile, shape_of)
    summary = summary_frame(rows)
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "costmodel_validation.csv", rows.to_csv(index=False))
    atomic_write_text(out_dir / "costmodel_validation_summary.csv", summary.to_csv(index=False))
    left_out = sum(r.get("status", "ok") == "ok" for r in records) - len(validated(records, profile))
    atomic_write_text(out_dir / "costmodel_validation.md", markdown(rows, summary, profile, left_out))
    return summary
