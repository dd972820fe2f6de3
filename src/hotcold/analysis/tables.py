"""Tidy tables from run records: summary, per-phase times, counters and the comparisons.

``aggregate`` reads the given ``<dataset>/<method>/<variant>/seed~<n>/record.json``
files (the workflow passes the runs its config asks for; by hand,
``find_records`` lists all under a runs directory) and writes ``summary.csv``/``summary.md``,
``phases.csv``, ``counters.csv``/``counters.md`` and the comparison tables of
``hotcold.analysis.comparisons`` (``speedup``, ``fae_hot_fraction``, ``rows_moved``),
and ``infeasible.md``: the runs whose variant could not run on their dataset
(record status ``infeasible``) with the reason. Such runs stay in the summary
as rows with their ``status`` and ``reason`` and no numbers; every other table
is built from the ``ok`` runs only.
Speed-ups are computed only between runs timed by the same kind of timer.
The ``exact`` column checks the invariant from the records' parameter
sketches: against the record's own ``reference`` when it has one (a store
with its own batch order, e.g. FAE, carries the ``device`` store replayed on
that order), else against the ``device`` run of the same dataset and seed.
Comparisons between runs use only runs on byte-identical datasets (same
manifest hash), so stale runs of another scale under the same name never
serve as a reference.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from hotcold.analysis.comparisons import fae_table, speedup_markdown, speedup_table, traffic_table
from hotcold.analysis.markdown import to_markdown
from hotcold.config import AggregateConfig
from hotcold.files import atomic_write_text
from hotcold.records import STATUS_OK, record_status, sketch_rel_diff

RECORD_GLOB = "*/*/*/seed~*/record.json"
KEYS = ["dataset", "method", "variant", "seed"]
BASELINE_METHOD = "hybrid"
REFERENCE_METHOD = "device"
PREFERRED_VARIANT = "base"
EXACT_RTOL = AggregateConfig().exact_rtol

REFERENCE_LABELS = {"run": "device run", "replay": "device replay of this order"}

SUMMARY_COLUMNS = [
    *KEYS, "status", "options", "timer", "device", "samples_per_s", "step_ms_p50", "step_ms_p10", "step_ms_p90",
    "step_ms_mean", "speedup_vs_hybrid", "auc", "auc_vs_hybrid", "logloss", "exact", "exact_reference",
    "param_rel_diff",
]
PROVENANCE_COLUMNS = [
    "reason", "dataset_sha256", "device_type", "batch_size", "steps_timed", "threads", "torch", "git_commit", "git_dirty",
    "eval_samples",
]


class NoRecordsError(FileNotFoundError):
    """The runs directory holds no complete run record."""


class RecordError(ValueError):
    """A run record is malformed or disagrees with where it lies."""


def find_records(runs_dir: Path) -> list[Path]:
    """Paths of all complete run records under ``runs_dir``, sorted."""
    return sorted(Path(runs_dir).glob(RECORD_GLOB))


def load_record(path: Path) -> dict[str, Any]:
    """Read one record and check that its keys match its directory."""
    try:
        rec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: not valid JSON ({e})") from None
    required = (*KEYS, "summary") if record_status(rec) == STATUS_OK else (*KEYS, "reason")
    missing = [k for k in required if k not in rec]
    if missing:
        raise RecordError(f"{path}: record lacks key(s) {missing}")
    seed_dir, variant_dir, method_dir, dataset_dir = Path(path).parents[:4]
    expected = {
        "dataset": dataset_dir.name, "method": method_dir.name,
        "variant": variant_dir.name, "seed": seed_dir.name.removeprefix("seed~"),
    }
    for key, value in expected.items():
        if str(rec[key]) != value:
            raise RecordError(f"{path}: record says {key}={rec[key]!r} but lies under {value!r}")
    return rec


def load_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The records at ``paths``; raises if there are none."""
    if not paths:
        raise NoRecordsError(f"no run records given (expected {RECORD_GLOB} under a runs directory); "
                             "run the train step first")
    return [load_record(p) for p in paths]


def ok_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of runs that trained (status ``ok``, or no status: older records)."""
    return [r for r in records if record_status(r) == STATUS_OK]


def options_label(options: dict[str, Any] | None) -> str:
    """Store options as ``key=value, ...`` (sorted keys); empty for none."""
    return ", ".join(f"{k}={v}" for k, v in sorted((options or {}).items()))


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    summary, prov = rec.get("summary") or {}, rec.get("provenance") or {}
    metrics = rec.get("metrics") or {}
    return {
        **{k: rec[k] for k in KEYS},
        "status": record_status(rec),
        "reason": rec.get("reason"),
        "options": options_label((rec.get("config") or {}).get("store")),
        "timer": summary.get("timer", prov.get("timer")),
        "device": prov.get("device"),
        "samples_per_s": summary.get("samples_per_s"),
        **{k: summary.get(k) for k in ("step_ms_p50", "step_ms_p10", "step_ms_p90", "step_ms_mean")},
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
        "eval_samples": metrics.get("eval_samples"),
    }


def _pick_reference(group: pd.DataFrame, method: str) -> pd.Series | None:
    """The trained ``method`` run of a group: variant ``base`` if present, else the first by name."""
    cands = group[(group["method"] == method) & (group["status"] == STATUS_OK)].sort_values("variant")
    if cands.empty:
        return None
    base = cands[cands["variant"] == PREFERRED_VARIANT]
    return (base if not base.empty else cands).iloc[0]


def _speedups(frame: pd.DataFrame) -> pd.Series:
    """samples/s over the hybrid run of the same dataset, seed and timer kind."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed", "timer"], dropna=False, sort=False):
        ref = _pick_reference(group, BASELINE_METHOD)
        if ref is not None and ref["samples_per_s"] and ref["samples_per_s"] > 0:
            out[group.index] = group["samples_per_s"].astype("float64") / float(ref["samples_per_s"])
    return out


def _exactness(frame: pd.DataFrame, records: list[dict[str, Any]],
               exact_rtol: float) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Relative parameter-sketch distance to each run's reference, and which reference that was.

    The reference is the record's own ``reference`` (the ``device`` store
    replayed on the run's batch order) when it has one, else the ``device``
    run of the same dataset and seed.
    """
    sketches = [(r.get("params") or {}).get("sketch") for r in records]
    replays = [((r.get("reference") or {}).get("params") or {}).get("sketch") for r in records]
    diff = pd.Series(np.nan, index=frame.index, dtype="float64")
    exact = pd.Series(pd.NA, index=frame.index, dtype="boolean")
    label = pd.Series(pd.NA, index=frame.index, dtype="string")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref = _pick_reference(group, REFERENCE_METHOD)
        for idx in group.index:
            if replays[idx] is not None:
                d, kind = sketch_rel_diff(sketches[idx], replays[idx]), "replay"
            elif ref is not None:
                d, kind = sketch_rel_diff(sketches[idx], sketches[ref.name]), "run"
            else:
                continue
            if not math.isnan(d):
                diff[idx], exact[idx], label[idx] = d, d <= exact_rtol, REFERENCE_LABELS[kind]
    return exact, diff, label


def _auc_vs_hybrid(frame: pd.DataFrame) -> pd.Series:
    """AUC minus the AUC of the hybrid run of the same dataset and seed."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref = _pick_reference(group, BASELINE_METHOD)
        if ref is not None and pd.notna(ref["auc"]):
            out[group.index] = group["auc"].astype("float64") - float(ref["auc"])
    return out


def summary_frame(records: list[dict[str, Any]], exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """One row per run, sorted by dataset, method, variant, seed."""
    frame = pd.DataFrame([_row(r) for r in records])
    frame["seed"] = frame["seed"].astype("int64")
    frame["speedup_vs_hybrid"] = _speedups(frame)
    frame["auc_vs_hybrid"] = _auc_vs_hybrid(frame)
    frame["exact"], frame["param_rel_diff"], frame["exact_reference"] = _exactness(frame, records, exact_rtol)
    frame = frame[SUMMARY_COLUMNS + PROVENANCE_COLUMNS]
    return frame.sort_values(KEYS, kind="stable").reset_index(drop=True)


def _long(records: list[dict[str, Any]], name: str, values: dict[str, str]) -> pd.DataFrame:
    """Long frame of one per-name section of the summaries, in the records' own key order."""
    rows = []
    for rec in ok_records(records):
        summary = rec["summary"]
        first = summary.get(next(iter(values.values())), {}) or {}
        for key in first:
            rows.append({
                **{k: rec[k] for k in KEYS},
                "timer": summary.get("timer"),
                name: key,
                **{col: (summary.get(src) or {}).get(key, math.nan) for col, src in values.items()},
            })
    cols = [*KEYS, "timer", name, *values]
    frame = pd.DataFrame(rows, columns=cols)
    frame["seed"] = frame["seed"].astype("int64")
    return frame.sort_values(KEYS, kind="stable").reset_index(drop=True)


def phases_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-phase step times (median and mean ms), one row per trained run and phase."""
    return _long(records, "phase", {"ms_p50": "phase_ms_p50", "ms_mean": "phase_ms_mean"})


def counters_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-step counters (lookups, hits, rows and bytes moved...), one row per trained run and counter."""
    return _long(records, "counter", {"per_step": "counters_per_step"})


def _summary_markdown(summary: pd.DataFrame, exact_rtol: float) -> str:
    timers = ", ".join(sorted(summary["timer"].dropna().astype(str).unique())) or "unknown"
    return (
        "# hotcold summary\n\n"
        f"Timer kind(s): {timers}. Speed-up is samples/s over the `{BASELINE_METHOD}` run "
        "of the same dataset, seed and timer kind; times from different timers are never compared.\n"
        f"`exact`: final parameters match the reference (relative sketch distance <= {exact_rtol:g}); "
        f"`exact_reference` says which: the `{REFERENCE_METHOD}` run of the same dataset and seed, or, "
        "for a store with its own batch order (FAE), the record's own replay of that order on the "
        f"`{REFERENCE_METHOD}` store. `auc_vs_hybrid`: AUC minus the `{BASELINE_METHOD}` run's. "
        "`status` `infeasible`: the variant cannot run on this dataset (no numbers; see infeasible.md).\n\n"
        + to_markdown(summary[SUMMARY_COLUMNS])
    )


def _counters_markdown(counters: pd.DataFrame) -> str:
    title = "# hotcold counters (per step)\n\n"
    if counters.empty:
        return title + "No counters recorded.\n"
    order = list(dict.fromkeys(counters["counter"]))
    wide = counters.pivot(index=[*KEYS, "timer"], columns="counter", values="per_step").reset_index()
    wide = wide[[*KEYS, "timer", *order]].sort_values(KEYS, kind="stable")
    wide.columns.name = None
    return title + to_markdown(wide, {c: "{:,.1f}" for c in order})


def infeasible_markdown(summary: pd.DataFrame) -> str:
    """The runs that could not run on their dataset, one line each with the reason."""
    rows = summary[summary["status"] != STATUS_OK]
    title = "# hotcold infeasible runs\n\n"
    if rows.empty:
        return title + "None: every configured run trained.\n"
    lines = [f"- {r.dataset}/{r.method}/{r.variant}/seed~{r.seed} ({r.options or 'no options'}): {r.reason}"
             for r in rows.itertuples(index=False)]
    return title + "These variants cannot run on their dataset; they have no numbers in any table.\n\n" + \
        "\n".join(lines) + "\n"


def aggregate(records: Sequence[Path], out_dir: Path, exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """Read the given run records, write every table to ``out_dir``, return the summary.

    The summary and ``infeasible.md`` list every run; the other tables hold
    the runs that trained.
    """
    out_dir = Path(out_dir)
    loaded = load_records(records)
    summary = summary_frame(loaded, exact_rtol)
    trained, ok = ok_records(loaded), summary[summary["status"] == STATUS_OK].reset_index(drop=True)
    phases = phases_frame(trained)
    counters = counters_frame(trained)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out_dir / "summary.md", _summary_markdown(summary, exact_rtol))
    atomic_write_text(out_dir / "infeasible.md", infeasible_markdown(summary))
    atomic_write_text(out_dir / "phases.csv", phases.to_csv(index=False))
    atomic_write_text(out_dir / "counters.csv", counters.to_csv(index=False))
    atomic_write_text(out_dir / "counters.md", _counters_markdown(counters))
    speedup = speedup_table(ok)
    atomic_write_text(out_dir / "speedup.csv", speedup.to_csv(index=False))
    atomic_write_text(out_dir / "speedup.md", speedup_markdown(speedup))
    atomic_write_text(out_dir / "fae_hot_fraction.csv", fae_table(trained, ok).to_csv(index=False))
    atomic_write_text(out_dir / "rows_moved.csv", traffic_table(counters, ok).to_csv(index=False))
    return summary
