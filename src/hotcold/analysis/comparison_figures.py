"""Figures of the comparison tables (``hotcold.analysis.comparisons``).

- ``speedup``: speed-up over ``hybrid`` per method, datasets side by side,
  one panel per timer kind (timers are never mixed); bars of disturbed runs
  (``stable`` false in the speed-up table) hatched;
- ``hit_rate``: hit rate against cache size (share of rows, log scale) per
  policy, one panel per dataset: ColossalAI's curve, from the simulator;
- ``fae_hot_fraction``: share of FAE's training inputs (and batches) that are
  hot against the rows its budget puts on the device;
- ``traffic``: bytes moved per step, parameter and activation traffic, per
  method, one panel per dataset (counters: the same on any hardware).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from hotcold.analysis.comparisons import SPEEDUP_KEYS
from hotcold.analysis.plotting import (
    PANEL_H,
    PANEL_W,
    disturbed,
    disturbed_handle,
    empty_panel,
    grid,
    grouped_bars,
    label_order,
    narrow,
)

COLOSSAL_RATIO = 0.015   # ColossalAI's headline cache size: 1.5% of the rows
LOOKAHEAD = "scratchpipe-"
POLICY_LABELS = {"static-topk": "static top-k (pinned, misses bypass)", "freqcache": "freqcache (ColossalAI)",
                 "freqcache-lfu": "freqcache-lfu (ColossalAI LFU)",
                 "belady": "belady (optimal demand cache)"}


def _width(frame: pd.DataFrame, per_label: float = 0.38) -> float:
    return max(PANEL_W, per_label * len(label_order(frame)) + 1.2) if not frame.empty else PANEL_W


def _speedup_marks(sub: pd.DataFrame, speedup: pd.DataFrame | None) -> pd.Series:
    """Per run: whether its speed-up bar is marked: ``speedup.csv``'s ``stable`` when given, else the run's own."""
    if speedup is None or "stable" not in speedup:
        return disturbed(sub)
    keys = [k for k in SPEEDUP_KEYS if k in sub and k in speedup]
    marks = speedup[keys].assign(marked=disturbed(speedup)).drop_duplicates(keys)
    joined = sub[keys].merge(marks, on=keys, how="left")
    return pd.Series(joined["marked"].eq(True).to_numpy(), index=sub.index)  # not in the table: unmarked


def speedup_figure(summary: pd.DataFrame, speedup: pd.DataFrame | None = None) -> Figure:
    """Speed-up over hybrid per method (mean and sd over seeds), bars per dataset, a panel per timer.

    A bar is hatched when its runs were disturbed: by ``speedup``'s (the
    speed-up table's) ``stable`` where given, else by the summary's.
    """
    timers = sorted(summary["timer"].dropna().unique())
    datasets = sorted(summary["dataset"].unique())
    palette = dict(zip(datasets, sns.color_palette("colorblind", len(datasets))))
    marked, shown = False, set()
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(timers), width=_width(summary, 0.3 * max(len(datasets), 1)), height=PANEL_H + 0.8)
        for ax, timer in zip(axes, timers):
            sub = summary[(summary["timer"] == timer) & summary["speedup_vs_hybrid"].notna()]
            labels = label_order(sub) if not sub.empty else []
            if not labels:
                empty_panel(ax, f"no speed-ups ({timer} timer): no hybrid run")
                continue
            sub = sub.assign(disturbed=_speedup_marks(sub, speedup))
            stats = sub.groupby(["label", "dataset"]).agg(mean=("speedup_vs_hybrid", "mean"),
                                                          sd=("speedup_vs_hybrid", "std"),
                                                          disturbed=("disturbed", "any"))
            hues = [d for d in datasets if d in set(sub["dataset"])]
            marked |= grouped_bars(ax, stats, labels, hues, palette)
            ax.axhline(1.0, color="0.3", linewidth=1, linestyle="--")
            ax.tick_params(axis="x", labelrotation=90)
            narrow(ax, len(labels))
            ax.set_xlabel("")
            ax.set_ylabel(f"speed-up over hybrid ({timer} timer)")
            ax.set_title(f"{timer} timer")
            shown.update(hues)
        handles = [Patch(color=palette[d], label=d) for d in datasets if d in shown]
        handles += [disturbed_handle()] if marked else []
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), title="dataset",
                       fontsize="small")
        fig.suptitle("Training speed-up over the CPU-GPU hybrid baseline\n"
                     "(samples/s ratio, same dataset, seed and timer; mean and sd over seeds)", fontsize="medium")
    return fig


def _percent_axis(ax: Axes, ticks: np.ndarray) -> None:
    """Log x axis in percent, ticked at the simulated sizes with plain labels (1.5%, not 10^0)."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(np.unique(np.round(ticks, 4))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}%"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=45)


def _rows_of_all(sim: pd.DataFrame) -> float:
    """Embedding rows of a dataset, from any simulated size: capacity / cache_ratio."""
    sized = sim[(sim["capacity"] > 0) & (sim["cache_ratio"] > 0)]
    return float((sized["capacity"] / sized["cache_ratio"]).median()) if not sized.empty else np.nan


def hit_rate_figure(sim: pd.DataFrame) -> Figure:
    """Hit rate against cache size per policy (feasible sizes), one panel per dataset."""
    datasets = sorted(sim["dataset"].unique())
    policies = sorted(p for p in sim["policy"].unique() if not p.startswith((LOOKAHEAD, "fae-")))
    palette = dict(zip(policies, sns.color_palette("colorblind", max(len(policies), 1))))
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(datasets), height=PANEL_H + 0.4)
        for ax, dataset in zip(axes, datasets):
            sub = sim[sim["dataset"] == dataset]
            feasible = sub[sub["feasible"].astype(bool)]
            for policy in policies:
                line = feasible[feasible["policy"] == policy].sort_values("cache_ratio")
                if not line.empty:
                    ax.plot(line["cache_ratio"] * 100, line["hit_rate"], marker="o", markersize=3,
                            color=palette[policy], label=POLICY_LABELS.get(policy, policy))
            ahead = feasible[feasible["policy"].str.startswith(LOOKAHEAD)]
            for marker, (policy, rows) in zip("sDP^v", ahead.groupby("policy")):
                smallest = rows.sort_values("capacity").iloc[0]  # every lookup hits: one point at its minimum
                ax.scatter(smallest["cache_ratio"] * 100, smallest["hit_rate"], marker=marker, color="0.2",
                           zorder=3, label=f"{policy} (ScratchPipe), smallest scratchpad")
            caches = ~sub["policy"].str.startswith((LOOKAHEAD, "fae-"))  # sized like a cache
            needed = sub[caches & (sub["policy"] != "static-topk")]
            n_rows = _rows_of_all(sub)
            if not needed.empty and n_rows > 0:
                smallest = needed["capacity_needed"].max() / n_rows * 100
                ax.axvspan(min(sub["cache_ratio"].min() * 100, smallest), smallest, color="0.85", zorder=0,
                           label="cache < a batch's unique rows")
            ax.axvline(COLOSSAL_RATIO * 100, color="0.4", linestyle=":", linewidth=1)
            _percent_axis(ax, sub.loc[caches, "cache_ratio"].to_numpy() * 100)
            ax.set_ylim(0, 1.02)
            ax.set_xlabel("cache size (% of all rows, log scale)")
            ax.set_ylabel("hit rate (share of lookups)")
            ax.set_title(dataset)
            ax.legend(fontsize="x-small", loc="lower right")
        fig.suptitle("Cache hit rate against cache size (trace simulation; dotted: ColossalAI's 1.5%)",
                     fontsize="medium")
    return fig


def fae_hot_fraction_figure(fae: pd.DataFrame) -> Figure:
    """Share of hot training inputs and hot batches against the hot rows' share of all rows."""
    with sns.axes_style("whitegrid"):
        fig, axes = grid(1, width=PANEL_W + 1.0)
        ax = axes[0]
        data = fae.dropna(subset=["hot_ratio", "hot_fraction"]) if not fae.empty else fae
        if data.empty:
            empty_panel(ax, "no FAE runs")
            return fig
        datasets = sorted(data["dataset"].unique())
        palette = dict(zip(datasets, sns.color_palette("colorblind", len(datasets))))
        for dataset in datasets:
            sub = data[data["dataset"] == dataset].groupby("hot_ratio", as_index=False)[
                ["hot_fraction", "hot_batch_share"]].mean()
            ax.plot(sub["hot_ratio"] * 100, sub["hot_fraction"], marker="o", color=palette[dataset],
                    label=f"{dataset}: hot inputs")
            if sub["hot_batch_share"].notna().any():
                ax.plot(sub["hot_ratio"] * 100, sub["hot_batch_share"], marker="x", linestyle="--",
                        color=palette[dataset], label=f"{dataset}: hot batches")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(0, max(float(data["hot_ratio"].max()) * 100 * 1.15, 1.0))
        ax.set_xlabel("device budget: hot rows (% of all rows)")
        ax.set_ylabel("share of training inputs / batches")
        ax.legend(fontsize="x-small")
        fig.suptitle("FAE: hot inputs against the device-memory budget", fontsize="medium")
    return fig


TRAFFIC_KINDS = {"param_bytes": "parameters (weights + state)", "activation_bytes": "activations (vectors + grads)"}


def traffic_figure(traffic: pd.DataFrame) -> Figure:
    """Bytes moved per step, parameter and activation traffic stacked, per method; a panel per dataset."""
    datasets = sorted(traffic["dataset"].unique()) if not traffic.empty else []
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(datasets), width=_width(traffic, 0.5), height=PANEL_H + 1.2)
        if not datasets:
            empty_panel(axes[0], "no counters recorded")
        colors = dict(zip(TRAFFIC_KINDS, sns.color_palette("colorblind", 2)))
        for ax, dataset in zip(axes, datasets):
            sub = traffic[traffic["dataset"] == dataset]
            labels = label_order(sub)
            means = sub.groupby("label")[list(TRAFFIC_KINDS)].mean().reindex(labels) / 2**20  # MiB
            bottom = np.zeros(len(labels))
            for kind, name in TRAFFIC_KINDS.items():
                ax.bar(range(len(labels)), means[kind].fillna(0), bottom=bottom, color=colors[kind], label=name)
                bottom += means[kind].fillna(0).to_numpy()
            for i, total in enumerate(bottom):
                if total == 0:
                    ax.text(i, 0.02, "0", ha="center", va="bottom", transform=ax.get_xaxis_transform())
            ax.set_xticks(range(len(labels)), labels, rotation=90)
            ax.set_ylabel("MiB moved per step (both directions)")
            ax.set_title(dataset)
            ax.legend(title=None, fontsize="small")
        fig.suptitle("Host-device traffic per training step (counters; mean over timed steps and seeds)",
                     fontsize="medium")
    return fig
