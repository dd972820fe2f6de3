"""The summary table: one row per run, with its speed-up, AUC and exactness against the runs it compares with.

``summary_frame`` lists every run (trained or not, one-process and
scale-out) by ``RUN_ID``; speed-ups and AUC differences are over the
``hybrid`` run of the same dataset, seed (and timer), exactness against the
``device`` store's run or the record's own replay. Columns: docs/outputs.md,
"Tables".
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from hotcold import methods
from hotcold.analysis.run_records import KEYS, RUN_ID, degenerate_of, options_label, plan_of, scale_of
from hotcold.config import AggregateConfig
from hotcold.record_status import STATUS_OK, record_status, sketch_rel_diff

BASELINE_METHOD = "hybrid"
REFERENCE_METHOD = "device"
PREFERRED_VARIANT = "base"
EXACT_RTOL = AggregateConfig().exact_rtol

REFERENCE_LABELS = {"run": "device run", "replay": "device replay of this order",
                    "scale_out": "one-process device replay", "peer": "device run (peer kernel, own rounding)",
                    "wire": "one-process device replay (not exact mode: exactness not claimed)",
                    "unchecked": "not checked (distributed.reference: none)",
                    "lockstep": "lock-step with the device store (peer kernel, own rounding)"}

SUMMARY_COLUMNS = [
    *RUN_ID, "plan", "status", "options", "timer", "device", "samples_per_s", "step_ms_p50", "step_ms_p10",
    "step_ms_p90", "step_ms_mean", "speedup_vs_hybrid", "auc", "auc_vs_hybrid", "logloss", "exact", "exact_check",
    "exact_reference", "param_rel_diff", "stable", "unstable_reason", "degenerate", "repeats", "repeat_spread",
    "timed_with", "other_cores", "probe_slowdown",
]
PROVENANCE_COLUMNS = [
    "reason", "dataset_sha256", "device_type", "batch_size", "steps_timed", "threads", "torch", "git_commit",
    "git_dirty", "source_sha256", "eval_samples", "machine",
]


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    summary, prov = rec.get("summary") or {}, rec.get("provenance") or {}
    metrics = rec.get("metrics") or {}
    world, rpn = scale_of(rec)
    return {
        **{k: rec[k] for k in KEYS},
        "world": world,
        "ranks_per_node": rpn,
        "plan": plan_of(rec),
        "status": record_status(rec),
        "reason": rec.get("reason"),
        "options": options_label((rec.get("config") or {}).get("store")),
        "timer": summary.get("timer", prov.get("timer")),
        "device": prov.get("device"),
        "samples_per_s": summary.get("samples_per_s"),
        **{k: summary.get(k) for k in ("step_ms_p50", "step_ms_p10", "step_ms_p90", "step_ms_mean")},
        "stable": summary.get("stable"),  # absent in records from before the judgement
        "unstable_reason": summary.get("unstable_reason") or None,
        "degenerate": degenerate_of(rec),
        "repeats": summary.get("repeats", 1) if summary else None,  # records from before repeats: one
        "repeat_spread": summary.get("repeat_spread"),
        "timed_with": summary.get("group_runs"),  # the runs of its job, itself included: 1 alone
        "other_cores": summary.get("other_cores"),  # absent in records from before the contention watch
        "probe_slowdown": summary.get("probe_slowdown"),
        "auc": metrics.get("auc"),
        "logloss": metrics.get("logloss"),
        "dataset_sha256": rec.get("dataset_manifest_sha256"),
        "device_type": prov.get("device_type"),
        "batch_size": summary.get("batch_size"),
        "steps_timed": summary.get("steps_timed"),
        "threads": prov.get("threads"),
        "torch": prov.get("torch"),
        "git_commit": prov.get("git_commit"),
        "git_dirty": prov.get("git_dirty"),
        "source_sha256": prov.get("source_sha256"),
        "eval_samples": metrics.get("eval_samples"),
        "machine": prov.get("machine"),  # absent in records from before it was recorded
    }


def one_process(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of one-process runs (world 1; a table without ``world`` is older: all of them)."""
    if "world" not in frame:
        return frame
    return frame[frame["world"].fillna(1).astype("int64") == 1]


def _pick_reference(group: pd.DataFrame, method: str) -> pd.Series | None:
    """The trained one-process ``method`` run of a group: variant ``base`` if present, else the first by name."""
    group = one_process(group)
    cands = group[(group["method"] == method) & (group["status"] == STATUS_OK)].sort_values("variant")
    if cands.empty:
        return None
    base = cands[cands["variant"] == PREFERRED_VARIANT]
    return (base if not base.empty else cands).iloc[0]


def _speedups(frame: pd.DataFrame) -> pd.Series:
    """samples/s over the hybrid run of the same dataset, seed and timer kind."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed", "timer"], dropna=False, sort=False):
        ref, group = _pick_reference(group, BASELINE_METHOD), one_process(group)
        if ref is not None and ref["samples_per_s"] and ref["samples_per_s"] > 0:
            out[group.index] = group["samples_per_s"].astype("float64") / float(ref["samples_per_s"])
    return out


#: ``exact_check``: how a run's ``exact`` was decided (``methods.CHECK_BITS`` and ``CHECK_LOCKSTEP``, and none)
EXACT_CHECKS = {"bits": "bits: the same operations in the same order as the reference",
                "lockstep": "lock-step: its own kernels round their own way",
                "distance": "end-state distance: its own kernels round their own way",
                "none": "none"}


def _exactness(frame: pd.DataFrame, records: list[dict[str, Any]],
               exact_rtol: float) -> tuple[pd.Series, pd.Series, pd.Series, pd.Series]:
    """Relative parameter-sketch distance to each run's reference, which reference that was, and the check.

    ``exact_check`` names how ``exact`` was decided: ``bits`` (the
    harness's stores: the reference's operations in its order, so its bits,
    held to the sketch's float32 tolerance), ``lock-step`` (a peer's kernels,
    compared step by step; a peer's record from before that check: its
    end-state distance) or ``none`` (a run outside exact mode, or with no
    reference trained): never a bare "no".

    The reference is the record's own ``reference`` (the ``device`` store
    replayed on the run's batch order) when it has one, else the ``device``
    run of the same dataset and seed. A run over ranks outside exact mode
    (``distributed.exact`` false: float32 or bfloat16 all-reduces) gets its
    distance but never ``exact``: only exact mode claims it (records before the
    option existed summed in float64, so they count as exact mode).
    """
    sketches = [(r.get("params") or {}).get("sketch") for r in records]
    replays = [((r.get("reference") or {}).get("params") or {}).get("sketch") for r in records]
    diff = pd.Series(np.nan, index=frame.index, dtype="float64")
    exact = pd.Series(pd.NA, index=frame.index, dtype="boolean")
    label = pd.Series(pd.NA, index=frame.index, dtype="string")
    check = pd.Series(pd.NA, index=frame.index, dtype="string")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref = _pick_reference(group, REFERENCE_METHOD)
        for idx in group.index:
            if (records[idx].get("reference") or {}).get("checked") is False:  # no replay was trained
                label[idx], check[idx] = REFERENCE_LABELS["unchecked"], EXACT_CHECKS["none"]
                continue
            if replays[idx] is not None:
                kind = "scale_out" if frame.at[idx, "world"] > 1 else "replay"
                d = sketch_rel_diff(sketches[idx], replays[idx])
            elif ref is not None:
                kind = "peer" if frame.at[idx, "method"] in methods.names(peer=True) else "run"
                d = sketch_rel_diff(sketches[idx], sketches[ref.name])
            else:
                continue
            if kind == "scale_out" and not ((records[idx].get("config") or {}).get("distributed") or {}).get(
                    "exact", True):
                kind = "wire"
            if not math.isnan(d):
                diff[idx], label[idx] = d, REFERENCE_LABELS[kind]
                exact[idx] = pd.NA if kind == "wire" else d <= exact_rtol
                check[idx] = EXACT_CHECKS[{"wire": "none", "peer": "distance"}.get(kind, "bits")]
            lock = records[idx].get("lockstep")
            if lock:  # a peer checked step by step: its exactness is that check's, its distance the end state's
                exact[idx], check[idx] = bool(lock["ok"]), EXACT_CHECKS["lockstep"]
                label[idx] = (f"{REFERENCE_LABELS['lockstep']}: {lock['steps']} steps, max diff "
                              f"{lock['max_diff']:.1e} {'<=' if lock['ok'] else '>'} {lock['atol']:g}")
    return exact, check, diff, label


def _auc_vs_hybrid(frame: pd.DataFrame) -> pd.Series:
    """AUC minus the AUC of the hybrid run of the same dataset and seed."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref, group = _pick_reference(group, BASELINE_METHOD), one_process(group)
        if ref is not None and pd.notna(ref["auc"]):
            out[group.index] = group["auc"].astype("float64") - float(ref["auc"])
    return out


def summary_frame(records: list[dict[str, Any]], exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """One row per run, sorted by dataset, method, variant, world, ranks per node, seed.

    Every run is identified by ``RUN_ID``: dataset, method, variant, ``world``,
    ``ranks_per_node`` and seed (a one-process run has world 1 and 1 rank per node).
    Speed-ups are computed only between runs timed by the same kind of timer, and only
    between one-process runs: a scale-out run trains fewer steps with P processes
    sharing the machine's cores, so its samples/s and AUC are not comparable with
    ``hybrid``'s; its ``speedup_vs_hybrid`` and ``auc_vs_hybrid`` stay empty, it
    is left out of ``speedup`` and ``rows_moved`` (no host-device traffic), and its
    numbers are in the scale-out tables (``hotcold.analysis.scaleout``).
    The ``exact`` column checks the invariant from the records' parameter
    sketches: against the record's own ``reference`` when it has one (a store
    with its own batch order, e.g. FAE, carries the ``device`` store replayed on
    that order), else against the ``device`` run of the same dataset and seed.
    Comparisons between runs use only runs on byte-identical datasets (same
    manifest hash), so stale runs of another scale under the same name never
    serve as a reference.
    """
    frame = pd.DataFrame([_row(r) for r in records])
    frame["seed"] = frame["seed"].astype("int64")
    frame["speedup_vs_hybrid"] = _speedups(frame)
    frame["auc_vs_hybrid"] = _auc_vs_hybrid(frame)
    frame["exact"], frame["exact_check"], frame["param_rel_diff"], frame["exact_reference"] = _exactness(
        frame, records, exact_rtol)
    frame = frame[SUMMARY_COLUMNS + PROVENANCE_COLUMNS]
    return frame.sort_values(RUN_ID, kind="stable").reset_index(drop=True)
