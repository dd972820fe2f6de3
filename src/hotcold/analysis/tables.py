"""Tidy tables from run records: summary, per-phase times, counters and the comparisons.

``aggregate`` reads run records (one-process and scale-out) and writes the
summary, per-phase and counter tables, the comparison tables of
``hotcold.analysis.comparisons`` and ``infeasible.md``. A variant that could not
run keeps its summary row, so the tables show what is missing instead of the
workflow stopping; speed-ups and exactness compare only runs that compare
(same timer kind, one process, byte-identical datasets: ``summary_frame``).
Columns: docs/outputs.md, "Tables".
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from hotcold.analysis.comparisons import fae_table, speedup_markdown, speedup_table, traffic_table
from hotcold.analysis.run_records import KEYS, RUN_ID, load_records, ok_records, scale_of
from hotcold.analysis.summary import EXACT_RTOL, one_process, summary_frame
from hotcold.analysis.tables_markdown import _counters_markdown, _summary_markdown, code_note, infeasible_markdown
from hotcold.files import atomic_write_text
from hotcold.record_status import STATUS_OK


def _long(records: list[dict[str, Any]], name: str, values: dict[str, str]) -> pd.DataFrame:
    """Long frame of one per-name section of the summaries, in the records' own key order."""
    rows = []
    for rec in ok_records(records):
        summary = rec["summary"]
        first = summary.get(next(iter(values.values())), {}) or {}
        world, rpn = scale_of(rec)
        for key in first:
            rows.append({
                **{k: rec[k] for k in KEYS},
                "world": world,
                "ranks_per_node": rpn,
                "timer": summary.get("timer"),
                name: key,
                **{col: (summary.get(src) or {}).get(key, math.nan) for col, src in values.items()},
            })
    cols = [*RUN_ID, "timer", name, *values]
    frame = pd.DataFrame(rows, columns=cols)
    frame[["world", "ranks_per_node", "seed"]] = frame[["world", "ranks_per_node", "seed"]].astype("int64")
    return frame.sort_values(RUN_ID, kind="stable").reset_index(drop=True)


def phases_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-phase step times (median and mean ms), one row per trained run and phase."""
    return _long(records, "phase", {"ms_p50": "phase_ms_p50", "ms_mean": "phase_ms_mean"})


def counters_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-step counters (lookups, hits, rows and bytes moved...), one row per trained run and counter."""
    return _long(records, "counter", {"per_step": "counters_per_step"})


def aggregate(records: Sequence[Path], out_dir: Path, exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """Read the given run records, write every table to ``out_dir``, return the summary.

    The summary and ``infeasible.md`` list every run; the other tables hold
    the runs that trained.

    ``records`` are ``<dataset>/<method>/<variant>/seed~<n>/record.json``
    files, and those of scale-out runs under ``<variant>/world~<P>-rpn~<G>/seed~<n>/``
    (the workflow passes the runs its config asks for; by hand, ``find_records``
    lists all under a runs directory). Written: ``summary.csv``/``summary.md``,
    ``phases.csv``, ``counters.csv``/``counters.md`` and the comparison tables of
    ``hotcold.analysis.comparisons`` (``speedup``, ``fae_hot_fraction``, ``rows_moved``),
    and ``infeasible.md``: the runs whose variant could not run on their dataset
    (record status ``infeasible``) with the reason, and the runs of peer methods
    skipped because their optional package is not installed (status ``skipped``;
    the summary says which, above its table). Such runs stay in the summary
    as rows with their ``status`` and ``reason`` and no numbers; every other table
    is built from the ``ok`` runs only.
    """
    out_dir = Path(out_dir)
    loaded = load_records(records)
    summary = summary_frame(loaded, exact_rtol)
    trained, ok = ok_records(loaded), summary[summary["status"] == STATUS_OK].reset_index(drop=True)
    single = one_process(ok).reset_index(drop=True)
    phases = phases_frame(trained)
    counters = counters_frame(trained)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out_dir / "summary.md", _summary_markdown(summary, exact_rtol))
    atomic_write_text(out_dir / "infeasible.md", infeasible_markdown(summary))
    atomic_write_text(out_dir / "phases.csv", phases.to_csv(index=False))
    atomic_write_text(out_dir / "counters.csv", counters.to_csv(index=False))
    atomic_write_text(out_dir / "counters.md", _counters_markdown(counters))
    speedup = speedup_table(single)
    atomic_write_text(out_dir / "speedup.csv", speedup.to_csv(index=False))
    atomic_write_text(out_dir / "speedup.md", speedup_markdown(speedup, code_note(single)))
    atomic_write_text(out_dir / "fae_hot_fraction.csv", fae_table(trained, single).to_csv(index=False))
    atomic_write_text(out_dir / "rows_moved.csv", traffic_table(one_process(counters), single).to_csv(index=False))
    return summary
