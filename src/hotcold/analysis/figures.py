"""Paper figures from the aggregated tables (``summary.csv``, ``phases.csv``).

One panel per (dataset, timer kind): bars from different timers never share
an axis. Figures are drawn on plain ``matplotlib.figure.Figure`` objects (no
pyplot, so no GUI backend is touched) and written atomically as PNG and PDF.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hotcold.timing import phase_order

FORMATS = ("png", "pdf")
FIRST_METHODS = ("device", "hybrid")  # the reference and the baseline lead every panel
PANEL_W, PANEL_H, MAX_COLS = 4.8, 3.6, 3


def run_label(method: str, variant: str) -> str:
    """Bar label: the method, with the variant unless it is ``base``."""
    return method if variant == "base" else f"{method}/{variant}"


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run `hotcold aggregate` first")
    frame = pd.read_csv(path, dtype={"dataset": str, "method": str, "variant": str, "timer": str})
    frame["timer"] = frame["timer"].fillna("unknown")
    frame["label"] = [run_label(m, v) for m, v in zip(frame["method"], frame["variant"])]
    return frame


def _label_order(frame: pd.DataFrame) -> list[str]:
    pairs = frame[["method", "variant"]].drop_duplicates()
    rank = {m: i for i, m in enumerate(FIRST_METHODS)}
    pairs = sorted(pairs.itertuples(index=False), key=lambda p: (rank.get(p.method, len(rank)), p.method, p.variant))
    return [run_label(p.method, p.variant) for p in pairs]


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted(frame[["dataset", "timer"]].drop_duplicates().itertuples(index=False, name=None))


def _grid(n: int) -> tuple[Figure, list[Axes]]:
    cols = max(1, min(n, MAX_COLS))
    rows = max(1, math.ceil(n / cols))
    fig = Figure(figsize=(PANEL_W * cols, PANEL_H * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[max(n, 1):]:
        ax.set_visible(False)
    return fig, axes[: max(n, 1)]


def _tick_labels(labels: list[str], speedup: pd.Series) -> list[str]:
    return [f"{lab}\n{speedup[lab]:.2f}x" if pd.notna(speedup.get(lab)) else lab for lab in labels]


def _narrow(ax: Axes, n: int) -> None:
    """Keep a lone bar from filling the whole panel."""
    ax.set_xlim(-0.6, max(n, 3) - 0.4)


def step_phases_figure(phases: pd.DataFrame) -> Figure:
    """Stacked per-phase median step time per method, one panel per dataset and timer."""
    order = phase_order(set(phases["phase"]))
    colors = dict(zip(order, sns.color_palette("colorblind", max(len(order), 1))))
    panels = _panels(phases)
    with sns.axes_style("whitegrid"):
        fig, axes = _grid(len(panels))
        for ax, (dataset, timer) in zip(axes, panels):
            sub = phases[(phases["dataset"] == dataset) & (phases["timer"] == timer)]
            table = sub.pivot_table(index="label", columns="phase", values="ms_p50", aggfunc="mean")
            labels = [lab for lab in _label_order(sub) if lab in table.index]
            table = table.reindex(index=labels, columns=[p for p in order if p in table.columns]).fillna(0.0)
            bottom = pd.Series(0.0, index=table.index)
            for phase in table.columns:
                ax.bar(table.index, table[phase], bottom=bottom, color=colors[phase], label=phase)
                bottom += table[phase]
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_ylabel(f"median step time, ms ({timer} timer)")
            _narrow(ax, len(labels))
        if not panels:
            axes[0].text(0.5, 0.5, "no phase times recorded", ha="center", va="center")
        handles = [Patch(color=colors[p], label=p) for p in order]
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), title="phase")
        fig.suptitle("Step time by phase\n(median over timed steps, mean over seeds)", fontsize="medium")
    return fig


def throughput_figure(summary: pd.DataFrame) -> Figure:
    """Training samples/s per method (mean and sd over seeds), one panel per dataset and timer."""
    panels = _panels(summary)
    all_labels = _label_order(summary)
    palette = dict(zip(all_labels, sns.color_palette("colorblind", len(all_labels))))
    with sns.axes_style("whitegrid"):
        fig, axes = _grid(len(panels))
        for ax, (dataset, timer) in zip(axes, panels):
            sub = summary[(summary["dataset"] == dataset) & (summary["timer"] == timer)]
            labels = _label_order(sub)
            sns.barplot(data=sub, x="label", y="samples_per_s", order=labels, hue="label", hue_order=labels,
                        palette=palette, errorbar="sd", legend=False, ax=ax)
            speedup = sub.groupby("label")["speedup_vs_hybrid"].mean()
            ax.set_xticks(range(len(labels)), _tick_labels(labels, speedup))
            _narrow(ax, len(labels))
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_xlabel("")
            ax.set_ylabel(f"samples/s ({timer} timer)")
        fig.suptitle("Training throughput\n(mean and sd over seeds; speed-up over hybrid, same timer)", fontsize="medium")
    return fig


def save_atomic(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` via temporary files and renames."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in FORMATS:
        path = out_dir / f"{stem}.{fmt}"
        tmp = out_dir / f".{stem}.tmp-{os.getpid()}.{fmt}"
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        try:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(path)
    return written


def make_figures(tables_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``step_phases`` and ``throughput`` from the tables in ``tables_dir``; return the paths."""
    tables_dir, out_dir = Path(tables_dir), Path(out_dir)
    summary = _read(tables_dir / "summary.csv")
    if summary.empty:
        raise ValueError(f"{tables_dir / 'summary.csv'} has no runs")
    phases = _read(tables_dir / "phases.csv")
    return [
        *save_atomic(step_phases_figure(phases), out_dir, "step_phases"),
        *save_atomic(throughput_figure(summary), out_dir, "throughput"),
    ]
