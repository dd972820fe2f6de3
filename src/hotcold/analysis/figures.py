"""Paper figures from the aggregated tables in ``results/tables``.

``make_figures`` draws the timing figures here (``step_phases``,
``throughput``) and the comparisons of ``hotcold.analysis.comparison_figures``
(``speedup``, ``rows_moved``, ``fae_hot_fraction``, ``hit_rate``). Timed
figures get one panel per (dataset, timer kind): bars from different timers
never share an axis. Counter figures need no such split (counters do not
depend on the hardware). Runs the summary marks infeasible (no numbers)
are left out of every figure. These figures show one-process runs; the
scale-out runs (world > 1, fewer steps, ranks sharing the cores) have their
own figures in ``hotcold.analysis.scaleout_figures`` (``inter_node_bytes``,
``proactive_hidden``, ``flexshard_headroom``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hotcold.analysis import comparison_figures as cf
from hotcold.analysis import scaleout_figures as sf
from hotcold.analysis.plotting import PANEL_H, PANEL_W, grid, label_order, narrow, read_table, save_atomic
from hotcold.analysis.tables import one_process
from hotcold.timing import phase_order


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted(frame[["dataset", "timer"]].drop_duplicates().itertuples(index=False, name=None))


def panel_width(frame: pd.DataFrame) -> float:
    """Panels widen with the number of runs so that rotated labels do not overlap."""
    return max(PANEL_W, 0.38 * len(label_order(frame)) + 1.2)


def _tick_labels(labels: list[str], speedup: pd.Series) -> list[str]:
    return [f"{lab}\n{speedup[lab]:.2f}x" if pd.notna(speedup.get(lab)) else lab for lab in labels]


def step_phases_figure(phases: pd.DataFrame) -> Figure:
    """Stacked per-phase median step time per method, one panel per dataset and timer."""
    order = phase_order(set(phases["phase"]))
    colors = dict(zip(order, sns.color_palette("colorblind", max(len(order), 1))))
    panels = _panels(phases)
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), width=panel_width(phases), height=PANEL_H + 1.5)
        for ax, (dataset, timer) in zip(axes, panels):
            sub = phases[(phases["dataset"] == dataset) & (phases["timer"] == timer)]
            table = sub.pivot_table(index="label", columns="phase", values="ms_p50", aggfunc="mean")
            labels = [lab for lab in label_order(sub) if lab in table.index]
            table = table.reindex(index=labels, columns=[p for p in order if p in table.columns]).fillna(0.0)
            bottom = pd.Series(0.0, index=table.index)
            for phase in table.columns:
                ax.bar(table.index, table[phase], bottom=bottom, color=colors[phase], label=phase)
                bottom += table[phase]
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_ylabel(f"median step time, ms ({timer} timer)")
            ax.tick_params(axis="x", labelrotation=90)
            narrow(ax, len(labels))
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
    all_labels = label_order(summary)
    palette = dict(zip(all_labels, sns.color_palette("colorblind", len(all_labels))))
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), width=panel_width(summary), height=PANEL_H + 1.5)
        for ax, (dataset, timer) in zip(axes, panels):
            sub = summary[(summary["dataset"] == dataset) & (summary["timer"] == timer)]
            labels = label_order(sub)
            sns.barplot(data=sub, x="label", y="samples_per_s", order=labels, hue="label", hue_order=labels,
                        palette=palette, errorbar="sd", legend=False, ax=ax)
            speedup = sub.groupby("label")["speedup_vs_hybrid"].mean()
            ax.set_xticks(range(len(labels)), _tick_labels(labels, speedup), rotation=90)
            narrow(ax, len(labels))
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_xlabel("")
            ax.set_ylabel(f"samples/s ({timer} timer)")
        fig.suptitle("Training throughput\n(mean and sd over seeds; speed-up over hybrid, same timer)", fontsize="medium")
    return fig


def trained_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's runs that trained: status ``ok`` (a summary without ``status`` is older: all ok)."""
    if "status" not in summary:
        return summary
    return summary[summary["status"].fillna("ok") == "ok"].reset_index(drop=True)


def make_figures(tables_dir: Path, out_dir: Path) -> list[Path]:
    """Draw every figure whose tables are in ``tables_dir``; return the paths written.

    ``summary.csv`` and ``phases.csv`` are required; the comparison figures
    are drawn when their table is there (``hit_rate`` needs ``cache_sim.csv``
    from ``hotcold cache-sim``; the scale-out figures the tables of
    ``hotcold scaleout-tables``).
    """
    tables_dir, out_dir = Path(tables_dir), Path(out_dir)
    summary = one_process(trained_runs(read_table(tables_dir / "summary.csv"))).reset_index(drop=True)
    if summary.empty:
        raise ValueError(f"{tables_dir / 'summary.csv'} has no trained runs in one process")
    phases = one_process(read_table(tables_dir / "phases.csv"))
    written = [
        *save_atomic(step_phases_figure(phases), out_dir, "step_phases"),
        *save_atomic(throughput_figure(summary), out_dir, "throughput"),
        *save_atomic(cf.speedup_figure(summary), out_dir, "speedup"),
    ]
    optional = [("rows_moved.csv", cf.traffic_figure, "rows_moved"),
                ("fae_hot_fraction.csv", cf.fae_hot_fraction_figure, "fae_hot_fraction"),
                ("cache_sim.csv", cf.hit_rate_figure, "hit_rate"),
                ("comm_traffic.csv", sf.inter_node_bytes_figure, "inter_node_bytes"),
                ("proactive.csv", sf.proactive_hidden_figure, "proactive_hidden"),
                ("flexshard_headroom.csv", sf.flexshard_headroom_figure, "flexshard_headroom")]
    for table, draw, stem in optional:
        path = tables_dir / table
        if not path.is_file():
            print(f"skipped {stem}: {path} not found", file=sys.stderr)
            continue
        written += save_atomic(draw(read_table(path)), out_dir, stem)
    return written
