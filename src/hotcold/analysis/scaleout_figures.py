"""Figures of the scale-out tables (``hotcold.analysis.scaleout``); counters and shares, so no timer split.

- ``inter_node_bytes``: bytes per step sent between nodes, per plan and
  scale, one panel per dataset and batch (weak-scaled per-rank batch or the
  fixed global batch): simulated bars (at the trained runs' memory
  headroom), trained runs of the same batch as markers on them;
- ``proactive_hidden``: Proactive's share of lookups done early and of lookup
  time hidden behind communication, per dataset and scale (the timed share's
  bars hatched where a run was disturbed);
- ``flexshard_headroom``: FlexShard's reduction of inter-node all-to-all
  bytes against row-wise and table-wise over memory headroom, a line per
  simulated scale, one panel per dataset and batch.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import PercentFormatter

from hotcold.analysis.plotting import PANEL_H, PANEL_W, disturbed, disturbed_handle, empty_panel, grid, grouped_bars
from hotcold.analysis.scaleout import PLAN_ORDER, batch_label
from hotcold.options.sharded import DEFAULT_HEADROOM

PROACTIVE_METHOD = "proactive"  # the method whose runs ``proactive.csv`` lists


def scale_label(nodes: int, ranks_per_node: int) -> str:
    """``2x4 (8)``: nodes x ranks per node, and the world size."""
    return f"{int(nodes)}x{int(ranks_per_node)} ({int(nodes) * int(ranks_per_node)})"


def _with_scale(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["nodes"] = frame["world"] // frame["ranks_per_node"]
    frame["scale"] = [scale_label(n, g) for n, g in zip(frame["nodes"], frame["ranks_per_node"])]
    return frame


def _scales(frame: pd.DataFrame) -> list[str]:
    ordered = frame.drop_duplicates("scale").sort_values(["world", "ranks_per_node"])
    return ordered["scale"].tolist()


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(dataset, batch label) of every panel: per dataset, the weak-scaled batch first, then the fixed one."""
    if frame.empty:
        return []
    keys = frame[["dataset", "batch", "batching", "batch_size"]].drop_duplicates(["dataset", "batch"])
    keys = keys.assign(order=keys["batching"].map({"per-rank": 0, "global": 1}).fillna(2))
    keys = keys.sort_values(["dataset", "order", "batch_size"], kind="stable")
    return list(zip(keys["dataset"], keys["batch"]))


def _with_batch(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(batch=batch_label(frame)) if not frame.empty else frame.assign(batch=pd.Series(dtype=str))


def _headroom(comm: pd.DataFrame) -> float:
    """The memory headroom the trained runs used (the store default when there are none)."""
    trained = comm[comm["source"] == "trained"]["memory_headroom"].dropna()
    return float(trained.mode().iloc[0]) if not trained.empty else DEFAULT_HEADROOM


def inter_node_bytes_figure(comm: pd.DataFrame) -> Figure:
    """Inter-node bytes per step per plan (bars: simulated; markers: trained), x = scale, a panel per dataset
    and batch."""
    comm = _with_batch(_with_scale(comm[comm["status"] == "ok"])) if not comm.empty else comm
    panels = _panels(comm)
    plans = [p for p in PLAN_ORDER if not comm.empty and p in set(comm["plan"])]
    plans += sorted(set(comm["plan"]) - set(plans)) if not comm.empty else []
    colors = dict(zip(plans, sns.color_palette("colorblind", max(len(plans), 1))))
    headroom = _headroom(comm) if not comm.empty else DEFAULT_HEADROOM
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), width=PANEL_W + 1.0, height=PANEL_H + 0.6)
        for ax, (dataset, batch) in zip(axes, panels):
            sub = comm[(comm["dataset"] == dataset) & (comm["batch"] == batch)
                       & np.isclose(comm["memory_headroom"], headroom)]
            scales = _scales(sub)
            width = 0.8 / max(len(plans), 1)
            for j, plan in enumerate(plans):
                offset = (j - (len(plans) - 1) / 2) * width
                for source, draw in (("simulated", "bar"), ("trained", "marker")):
                    rows = sub[(sub["plan"] == plan) & (sub["source"] == source)]
                    vals = rows.groupby("scale")["inter_node_bytes"].mean()
                    xs = [i + offset for i, s in enumerate(scales) if s in vals.index]
                    ys = [vals[s] for s in scales if s in vals.index]
                    if draw == "bar":
                        ax.bar(xs, ys, width=width, color=colors[plan])
                    else:
                        ax.plot(xs, ys, linestyle="none", marker="D", markersize=5, color="black")
            ax.set_xticks(range(len(scales)), scales)
            ax.set_xlim(-0.6, max(len(scales), 1) - 0.4)
            ax.set_xlabel("nodes x ranks per node (world)")
            ax.set_ylabel("inter-node bytes per step")
            if (sub["inter_node_bytes"] > 0).any():
                ax.set_yscale("log")
            ax.set_title(f"{dataset}, {batch}")
        if not panels:
            empty_panel(axes[0], "no scale-out runs or simulations")
        handles = [Patch(color=colors[p], label=f"{p} (simulated)") for p in plans]
        handles.append(Line2D([], [], linestyle="none", marker="D", color="black", label="trained run"))
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), title="plan")
        fig.suptitle("Bytes sent between nodes per training step, all collectives summed over ranks\n"
                     f"(memory headroom {headroom:g} x the row-wise shard; infeasible plans have no bar; a panel "
                     "per batch: per rank = weak scaling, global = fixed global batch)",
                     fontsize="medium")
    return fig


def proactive_hidden_figure(proactive: pd.DataFrame) -> Figure:
    """Early-lookup share and hidden-lookup-time share per dataset, bars per trained scale (means over runs).

    The hidden share is timed: where ``proactive`` carries the runs'
    ``stable`` (see ``plotting.with_stability``), a bar with a disturbed run
    is hatched. The early share is a counter and is never marked.
    """
    frame = _with_scale(proactive) if not proactive.empty else proactive
    measures = [("early_lookup_share", "lookups served early", False),
                ("hidden_lookup_share", "lookup time hidden", True)]
    marked = False
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(measures), height=PANEL_H + 0.4)
        for ax, (col, title, timed) in zip(axes, measures):
            if frame.empty:
                empty_panel(ax, "no Proactive runs")
                continue
            scales = _scales(frame)
            colors = dict(zip(scales, sns.color_palette("colorblind", len(scales))))
            rows = frame.assign(disturbed=disturbed(frame) if timed else False)
            stats = rows.groupby(["dataset", "scale"]).agg(mean=(col, "mean"), disturbed=("disturbed", "any"))
            hit = grouped_bars(ax, stats, sorted(frame["dataset"].unique()), scales, colors)
            marked |= hit
            ax.set_ylim(0, 1)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_xlabel("")
            ax.set_ylabel(f"share of {title.split()[0]} {title.split()[1]}")
            ax.set_title(title)
            handles = [Patch(color=colors[s], label=s) for s in scales] + ([disturbed_handle()] if hit else [])
            ax.legend(handles=handles, title="nodes x ranks (world)", fontsize="small")
        fig.suptitle("Proactive Embedding: lookups done while earlier steps' collectives ran", fontsize="medium")
    return fig


def flexshard_headroom_figure(headroom: pd.DataFrame) -> Figure:
    """FlexShard's reduction of inter-node all-to-all bytes vs row- and table-wise over memory headroom."""
    headroom = _with_batch(headroom) if not headroom.empty else headroom
    frame = headroom.dropna(subset=["reduction_vs_row", "reduction_vs_table"], how="all") if not headroom.empty \
        else headroom
    panels = _panels(headroom)
    frame = _with_scale(frame) if not frame.empty else frame
    scales = _scales(frame) if not frame.empty else []
    colors = dict(zip(scales, sns.color_palette("colorblind", max(len(scales), 1))))
    styles = {"reduction_vs_row": ("-", "o", "vs row-wise"), "reduction_vs_table": ("--", "s", "vs table-wise")}
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(panels), height=PANEL_H + 0.4)
        for ax, (dataset, batch) in zip(axes, panels):
            sub = frame[(frame["dataset"] == dataset) & (frame["batch"] == batch)] if not frame.empty else frame
            if sub.empty:
                empty_panel(ax, f"{dataset}, {batch}: FlexShard not simulated or infeasible")
                continue
            for scale in scales:
                rows = sub[sub["scale"] == scale].sort_values("memory_headroom")
                for col, (line, marker, _) in styles.items():
                    ax.plot(rows["memory_headroom"], rows[col], linestyle=line, marker=marker, color=colors[scale])
            ax.axhline(0.0, color="0.3", linewidth=1)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_xlabel("memory headroom (x the row-wise shard per rank)")
            ax.set_ylabel("inter-node all-to-all bytes saved")
            ax.set_title(f"{dataset}, {batch}")
        if not panels:
            empty_panel(axes[0], "no shard-sim results")
        handles = [Line2D([], [], color=colors[s], label=s) for s in scales]
        handles += [Line2D([], [], color="0.3", linestyle=line, marker=marker, label=label)
                    for line, marker, label in styles.values()]
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4),
                       title="nodes x ranks (world); reference plan")
        fig.suptitle("FlexShard's reduction of inter-node all-to-all bytes per step (simulated)\n"
                     "against row-wise (solid) and table-wise (dashed); no point where a plan is infeasible",
                     fontsize="medium")
    return fig
