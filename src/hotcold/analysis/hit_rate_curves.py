"""``paper_figs/hit_rate_curves``: hit rate against cache size, one panel per dataset.

Drawn from the curves CSVs of ``hotcold simulate --curves-out``: the exact
LRU curve (one pass over the trace, ``hotcold.trace.stackdist``) as a line
over every size written, the per-size policies (LFU, freqcache) as lines
with markers at their grid sizes. The sizes the training runs used are
marked: a dotted vertical line per size, labelled with the runs (cache
stores' ``cache_ratio``, ScratchPipe's ``scratchpad_ratio``, FAE's
``budget_ratio``, read from ``summary.csv``'s ``options``), and the cache
stores' measured hit rates (``counters.csv``: hits / lookups, per-step
means over the timed steps, warm-up excluded) as crosses, beside dashed
curves over the same steps (``timed_hit_rate``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from hotcold.analysis.plotting import PANEL_H, PANEL_W, grid, save_atomic

STEM = "hit_rate_curves"
#: ``options`` keys that size a store, as a share of all rows
SIZE_KEYS = ("cache_ratio", "scratchpad_ratio", "budget_ratio")
#: methods whose counters hold cache hits comparable with a policy's curve
CACHE_METHODS = ("lru", "lfu", "freqcache", "freqcache-lfu")
_OPTION = re.compile(r"(\w+)=([^,]+)")


def read_curves(paths: Sequence[Path]) -> pd.DataFrame:
    """The curves CSVs of every dataset in one frame."""
    frames = [pd.read_csv(p, dtype={"dataset": str, "policy": str}) for p in paths]
    if not frames:
        raise ValueError("no curves CSV given")
    return pd.concat(frames, ignore_index=True)


def trained_sizes(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, method, variant) run of one process that trained at a set size.

    Columns: dataset, method, variant, ratio (share of all rows), key
    (which option set it).
    """
    rows = []
    runs = summary
    if "status" in runs:
        runs = runs[runs["status"].fillna("ok").isin(["ok", "infeasible"])]
    if "world" in runs:
        runs = runs[runs["world"].fillna(1) == 1]
    for run in runs.drop_duplicates(["dataset", "method", "variant"]).itertuples(index=False):
        options = dict(_OPTION.findall(str(getattr(run, "options", "") or "")))
        for key in SIZE_KEYS:
            if key in options:
                rows.append({"dataset": run.dataset, "method": run.method, "variant": run.variant,
                             "ratio": float(options[key]), "key": key})
    return pd.DataFrame(rows, columns=["dataset", "method", "variant", "ratio", "key"])


def measured_hit_rates(counters: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """The cache stores' trained hit rates: dataset, method, ratio, hit_rate (mean over seeds)."""
    c = counters[counters["method"].isin(CACHE_METHODS) & counters["counter"].isin(["hits", "lookups"])]
    if "world" in c:
        c = c[c["world"].fillna(1) == 1]
    if c.empty or sizes.empty:
        return pd.DataFrame(columns=["dataset", "method", "ratio", "hit_rate"])
    wide = c.pivot_table(index=["dataset", "method", "variant", "seed"], columns="counter", values="per_step",
                         aggfunc="mean").reset_index()
    wide["hit_rate"] = wide["hits"] / wide["lookups"]
    wide = wide.merge(sizes[sizes["key"] == "cache_ratio"], on=["dataset", "method", "variant"])
    return wide.groupby(["dataset", "method", "ratio"], as_index=False)["hit_rate"].mean()


def hit_rate_curves_figure(curves: pd.DataFrame, sizes: pd.DataFrame | None = None,
                           measured: pd.DataFrame | None = None) -> Figure:
    """Hit rate (share of lookups) against cache size (% of all rows, log), one panel per dataset.

    With ``measured`` hit rates, the curves' ``timed_hit_rate`` (the steps
    after warm-up, which the trained runs' counters average) is drawn dashed
    beside the whole-trace line, so the crosses compare like with like.
    """
    datasets = sorted(curves["dataset"].unique())
    policies = ["lru", *sorted(p for p in curves["policy"].unique() if p != "lru")]
    palette = dict(zip(policies, sns.color_palette("colorblind", max(len(policies), 1))))
    show_timed = measured is not None and not measured.empty
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(datasets), width=PANEL_W + 0.6, height=PANEL_H + 0.6)
        for ax, dataset in zip(axes, datasets):
            sub = curves[curves["dataset"] == dataset]
            feasible = sub[sub["feasible"].astype(bool)]
            for policy in policies:
                line = feasible[feasible["policy"] == policy].sort_values("capacity")
                if line.empty:
                    continue
                one_pass = (line.get("source") == "one-pass").all()
                ax.plot(line["cache_ratio"] * 100, line["hit_rate"], color=palette[policy],
                        marker=None if one_pass else "o", markersize=3.5, linewidth=1.8 if one_pass else 1.1,
                        label=f"{policy} ({'exact, one pass' if one_pass else 'per-size simulation'})")
                if show_timed and "timed_hit_rate" in line:  # what the trained runs' counters cover
                    ax.plot(line["cache_ratio"] * 100, line["timed_hit_rate"], color=palette[policy],
                            linestyle="--", linewidth=1.0, marker=None if one_pass else "o", markersize=3.5,
                            markerfacecolor="white", label=f"{policy}, timed steps only")
            needed = sub["capacity_needed"].max()
            rows = float((sub["capacity"] / sub["cache_ratio"]).median())
            smallest = needed / rows * 100 if needed > 0 and rows > 0 else sub["cache_ratio"].min() * 100
            left = max(sub["cache_ratio"].min() * 100, smallest / 4)  # a little of the infeasible sizes
            if sizes is not None and not sizes.empty and (sizes["dataset"] == dataset).any():
                left = min(left, sizes.loc[sizes["dataset"] == dataset, "ratio"].min() * 100 / 1.3)
            ax.axvspan(left, smallest, color="0.88", zorder=0, label="cache < a batch's unique rows")
            _mark_sizes(ax, sizes, measured, dataset, palette)
            ax.set_xscale("log")
            ax.set_xlim(left, sub["cache_ratio"].max() * 100)
            low = feasible["hit_rate"].min() if not feasible.empty else 0.0
            ax.set_ylim(max(0.0, np.floor(low * 10 - 1) / 10), 1.0 + 0.01)
            ax.xaxis.set_major_locator(LogLocator(base=10))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}%"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("cache size (% of all rows, log scale)")
            ax.set_ylabel("hit rate (share of lookups)")
            ax.set_title(dataset)
        handles: dict = {}
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize="small",
                   ncols=min(len(handles), 4))
        fig.suptitle("Hit rate against cache size over the training trace\n(dotted: sizes the training runs used; "
                     "x: their measured hit rates, over their timed steps; dashed: the simulation over those steps)",
                     fontsize="medium")
    return fig


def _mark_sizes(ax: Axes, sizes: pd.DataFrame | None, measured: pd.DataFrame | None, dataset: str,
                palette: dict) -> None:
    """Dotted verticals at the trained sizes, labelled by run; crosses at the measured hit rates."""
    if sizes is not None and not sizes.empty:
        here = sizes[sizes["dataset"] == dataset]
        for i, (ratio, runs) in enumerate(sorted(here.groupby("ratio"), key=lambda kv: kv[0])):
            ax.axvline(ratio * 100, color="0.35", linestyle=":", linewidth=1)
            names = sorted({m if m not in ("scratchpipe", "fae") else f"{m}/{v}"
                            for m, v in zip(runs["method"], runs["variant"])})
            ax.text(ratio * 100, 0.02 + 0.3 * (i % 2), " " + ", ".join(names), rotation=90, fontsize=5.5,
                    color="0.25", va="bottom", ha="right", transform=ax.get_xaxis_transform())
    if measured is not None and not measured.empty:
        here = measured[measured["dataset"] == dataset]
        for method, pts in here.groupby("method"):
            ax.scatter(pts["ratio"] * 100, pts["hit_rate"], marker="x", s=30, zorder=4,
                       color=palette.get(method, "0.1"), label=f"{method} trained (measured)")


def draw(curve_paths: Sequence[Path], tables_dir: Path | None, out_dir: Path) -> list[Path]:
    """Write ``hit_rate_curves.png/.pdf`` from the curves CSVs, marked from ``tables_dir`` when given."""
    curves = read_curves([Path(p) for p in curve_paths])
    sizes = measured = None
    if tables_dir is not None and (Path(tables_dir) / "summary.csv").is_file():
        summary = pd.read_csv(Path(tables_dir) / "summary.csv", dtype={"options": str, "variant": str})
        sizes = trained_sizes(summary)
        counters_path = Path(tables_dir) / "counters.csv"
        if counters_path.is_file():
            measured = measured_hit_rates(pd.read_csv(counters_path, dtype={"variant": str}), sizes)
    return save_atomic(hit_rate_curves_figure(curves, sizes, measured), Path(out_dir), STEM)


__all__ = ["draw", "hit_rate_curves_figure", "measured_hit_rates", "read_curves", "trained_sizes"]
