"""Paper figures from the aggregated tables in ``results/tables``.

``make_figures`` draws the timing figures here and the comparison and
scale-out figures of ``hotcold.analysis.comparison_figures`` and
``hotcold.analysis.scaleout_figures``. Timers are never mixed on one axis
and disturbed runs are hatched, so that a reader sees which bars to
trust. What each figure shows: docs/outputs.md, "Figures".
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from hotcold.analysis import comparison_figures as cf
from hotcold.analysis import scaleout_figures as sf
from hotcold.analysis.plotting import (
    PANEL_H,
    PANEL_W,
    disturbed,
    disturbed_handle,
    grid,
    label_order,
    mark_disturbed,
    narrow,
    rate_range,
    read_table,
    save_atomic,
    whisker_handle,
    whiskers,
    with_stability,
)
from hotcold.analysis.summary import one_process
from hotcold.timing import phase_order


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted(frame[["dataset", "timer"]].drop_duplicates().itertuples(index=False, name=None))


def panel_width(frame: pd.DataFrame) -> float:
    """Panels widen with the number of runs so that rotated labels do not overlap."""
    return max(PANEL_W, 0.38 * len(label_order(frame)) + 1.2)


def _tick_labels(labels: list[str], speedup: pd.Series) -> list[str]:
    return [f"{lab}\n{speedup[lab]:.2f}x" if pd.notna(speedup.get(lab)) else lab for lab in labels]


def _by_label(frame: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """Per run label, means over seeds of samples/s, its p90/p10 rates and step times; whether a seed was disturbed."""
    frame = pd.concat([frame.assign(disturbed=disturbed(frame)), rate_range(frame)], axis=1)
    frame = frame.assign(**{c: np.nan for c in ("samples_per_s", "step_ms_p10", "step_ms_p90") if c not in frame})
    return frame.groupby("label").agg(rate=("samples_per_s", "mean"), rate_lo=("rate_lo", "mean"),
                                      rate_hi=("rate_hi", "mean"), step_p10=("step_ms_p10", "mean"),
                                      step_p90=("step_ms_p90", "mean"),
                                      disturbed=("disturbed", "any")).reindex(labels)


def step_phases_figure(phases: pd.DataFrame, summary: pd.DataFrame | None = None) -> Figure:
    """Stacked per-phase median step time per method, one panel per dataset and timer.

    ``phases`` may carry the runs' ``stable`` (see ``plotting.with_stability``):
    a disturbed run's stack is hatched. With the ``summary``, each stack gets
    a whisker from the step time's p10 to its p90 (means over seeds).
    """
    order = phase_order(set(phases["phase"]))
    colors = dict(zip(order, sns.color_palette("colorblind", max(len(order), 1))))
    phases = phases.assign(disturbed=disturbed(phases))
    panels = _panels(phases)
    marked = drew_whiskers = False
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), width=panel_width(phases), height=PANEL_H + 1.5)
        for ax, (dataset, timer) in zip(axes, panels):
            sub = phases[(phases["dataset"] == dataset) & (phases["timer"] == timer)]
            table = sub.pivot_table(index="label", columns="phase", values="ms_p50", aggfunc="mean")
            labels = [lab for lab in label_order(sub) if lab in table.index]
            table = table.reindex(index=labels, columns=[p for p in order if p in table.columns]).fillna(0.0)
            flags = sub.groupby("label")["disturbed"].any().reindex(labels, fill_value=False).to_numpy()
            xs = np.arange(len(labels))
            bottom = np.zeros(len(labels))
            for phase in table.columns:
                bars = ax.bar(xs, table[phase].to_numpy(), bottom=bottom, color=colors[phase], label=phase)
                mark_disturbed(b for b, d in zip(bars, flags) if d)
                bottom += table[phase].to_numpy()
            marked |= bool(flags.any())
            if summary is not None and not summary.empty:
                runs = summary[(summary["dataset"] == dataset) & (summary["timer"] == timer)]
                steps = _by_label(runs, labels)
                whiskers(ax, xs, steps["step_p10"], steps["step_p90"])
                drew_whiskers |= bool(steps[["step_p10", "step_p90"]].notna().all(axis=1).any())
            ax.set_xticks(xs, labels, rotation=90)
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_ylabel(f"median step time, ms ({timer} timer)")
            narrow(ax, len(labels))
        if not panels:
            axes[0].text(0.5, 0.5, "no phase times recorded", ha="center", va="center")
        handles = [Patch(color=colors[p], label=p) for p in order]
        handles += [whisker_handle("step time p10-p90")] if drew_whiskers else []
        handles += [disturbed_handle()] if marked else []
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3),
                       title="phase" if len(handles) == len(order) else None)
        fig.suptitle("Step time by phase\n(median over timed steps, mean over seeds)", fontsize="medium")
    return fig


def throughput_figure(summary: pd.DataFrame) -> Figure:
    """Training samples/s per method, one panel per dataset and timer.

    Bars: mean over seeds; whiskers: samples/s at the p90 and at the p10 step
    time (batch size / step time, means over seeds); dots: each seed's run
    where there are several; hatched: a disturbed run (summary ``stable`` false).
    """
    panels = _panels(summary)
    all_labels = label_order(summary)
    palette = dict(zip(all_labels, sns.color_palette("colorblind", len(all_labels))))
    marked = several_seeds = False
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), width=panel_width(summary), height=PANEL_H + 1.5)
        for ax, (dataset, timer) in zip(axes, panels):
            sub = summary[(summary["dataset"] == dataset) & (summary["timer"] == timer)]
            labels = label_order(sub)
            stats = _by_label(sub, labels)
            xs = np.arange(len(labels))
            bars = ax.bar(xs, stats["rate"].fillna(0.0).to_numpy(), color=[palette[lab] for lab in labels])
            mark_disturbed(b for b, d in zip(bars, stats["disturbed"]) if d)
            marked |= bool(stats["disturbed"].any())
            whiskers(ax, xs, stats["rate_lo"], stats["rate_hi"])
            for x, label in enumerate(labels):
                seeds = sub[sub["label"] == label]
                if len(seeds) > 1:
                    several_seeds = True
                    ax.scatter(np.full(len(seeds), float(x)), seeds["samples_per_s"], s=10, color="0.2", zorder=4)
            speedup = sub.groupby("label")["speedup_vs_hybrid"].mean()
            ax.set_xticks(xs, _tick_labels(labels, speedup), rotation=90)
            narrow(ax, len(labels))
            ax.set_title(f"{dataset} ({timer} timer)")
            ax.set_xlabel("")
            ax.set_ylabel(f"samples/s ({timer} timer)")
        handles = [whisker_handle("samples/s at step time p90 .. p10")]
        handles += [Line2D([], [], linestyle="none", marker="o", markersize=3, color="0.2", label="one seed's run")] \
            if several_seeds else []
        handles += [disturbed_handle()] if marked else []
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 2))
        fig.suptitle("Training throughput\n(mean over seeds; speed-up over hybrid, same timer)", fontsize="medium")
    return fig


def trained_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's runs that trained: status ``ok`` (a summary without ``status`` is older: all ok)."""
    if "status" not in summary:
        return summary
    return summary[summary["status"].fillna("ok") == "ok"].reset_index(drop=True)


#: the figure sets ``make_figures`` draws alone: the one-process runs' figures, the scale-out runs' figures
ONE_PROCESS, SCALE_OUT = "one-process", "scale-out"
FIGURE_SETS = (ONE_PROCESS, SCALE_OUT)


def make_figures(tables_dir: Path, out_dir: Path, which: str = "all") -> list[Path]:
    """Draw every figure whose tables are in ``tables_dir``; return the paths written. ``which``: ``all``, or
    one of ``FIGURE_SETS``, the one-process figures or the scale-out ones (the workflow draws each set in a job).

    ``summary.csv`` and ``phases.csv`` are required; the comparison figures
    are drawn when their table is there (``hit_rate`` needs ``cache_sim.csv``
    from ``hotcold cache-sim``; the scale-out figures the tables of
    ``hotcold scaleout-tables``). The summary's ``stable`` marks the timed
    bars: phases and Proactive's runs get it joined on their run ids, the
    speed-up bars take ``speedup.csv``'s where it is there.

    It draws the timing figures of this module (``step_phases``,
    ``throughput``) and the comparisons of ``hotcold.analysis.comparison_figures``
    (``speedup``, ``rows_moved``, ``fae_hot_fraction``, ``hit_rate``). Timed
    figures get one panel per (dataset, timer kind): bars from different timers
    never share an axis. Counter figures need no such split (counters do not
    depend on the hardware). Runs the summary marks infeasible (no numbers)
    are left out of every figure. These figures show one-process runs; the
    scale-out runs (world > 1, fewer steps, ranks sharing the cores) have their
    own figures in ``hotcold.analysis.scaleout_figures`` (``inter_node_bytes``,
    ``proactive_hidden``, ``flexshard_headroom``). Timed bars of disturbed runs
    (summary ``stable`` false) are hatched, with a legend entry saying so;
    throughput and step-time bars carry whiskers from each run's step-time
    distribution (p10 to p90).
    """
    if which != "all" and which not in FIGURE_SETS:
        raise ValueError(f"which figures: 'all' or one of {list(FIGURE_SETS)}, got {which!r}")
    tables_dir, out_dir = Path(tables_dir), Path(out_dir)
    runs = trained_runs(read_table(tables_dir / "summary.csv"))
    written, optional = [], []
    if which in ("all", ONE_PROCESS):
        summary = one_process(runs).reset_index(drop=True)
        if summary.empty:
            raise ValueError(f"{tables_dir / 'summary.csv'} has no trained runs in one process")
        phases = with_stability(one_process(read_table(tables_dir / "phases.csv")), summary)
        speedup_path = tables_dir / "speedup.csv"
        speedup = read_table(speedup_path) if speedup_path.is_file() else None
        written += [
            *save_atomic(step_phases_figure(phases, summary), out_dir, "step_phases"),
            *save_atomic(throughput_figure(summary), out_dir, "throughput"),
            *save_atomic(cf.speedup_figure(summary, speedup), out_dir, "speedup"),
        ]
        optional += [("rows_moved.csv", cf.traffic_figure, "rows_moved"),
                     ("fae_hot_fraction.csv", cf.fae_hot_fraction_figure, "fae_hot_fraction"),
                     ("cache_sim.csv", cf.hit_rate_figure, "hit_rate")]
    if which in ("all", SCALE_OUT):
        proactive_runs = runs[runs["method"] == sf.PROACTIVE_METHOD]
        optional += [("comm_traffic.csv", sf.inter_node_bytes_figure, "inter_node_bytes"),
                     ("proactive.csv", lambda t: sf.proactive_hidden_figure(with_stability(t, proactive_runs)),
                      "proactive_hidden"),
                     ("flexshard_headroom.csv", sf.flexshard_headroom_figure, "flexshard_headroom")]
    for table, draw, stem in optional:
        path = tables_dir / table
        if not path.is_file():
            print(f"skipped {stem}: {path} not found", file=sys.stderr)
            continue
        written += save_atomic(draw(read_table(path)), out_dir, stem)
    return written
