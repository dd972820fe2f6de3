"""Shared figure helpers: run labels and their order, panel grids, stability marks, atomic PNG + PDF output.

Figures are drawn on plain ``matplotlib.figure.Figure`` objects (no pyplot,
so no GUI backend is touched) and written via temporary files and renames.
A timed bar whose runs were disturbed (summary ``stable`` false) is hatched,
with a legend entry saying so; stable runs and runs from before the judgement
(no ``stable`` value) stay unmarked.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from hotcold.analysis.run_records import RUN_ID
from hotcold.files import atomic_write

FORMATS = ("png", "pdf")
FIRST_METHODS = ("device", "hybrid")  # the reference and the baseline lead every panel
PANEL_W, PANEL_H, MAX_COLS = 4.8, 3.6, 3
UNSTABLE_HATCH = "///"
UNSTABLE_EDGE = "0.1"
UNSTABLE_LABEL = "stable = no: disturbed run,\nsee summary unstable_reason"
WHISKER_COLOR = "0.15"


def run_label(method: str, variant: str) -> str:
    """Bar label: the method, with the variant unless it is ``base``."""
    return method if variant == "base" else f"{method}/{variant}"


def read_table(path: Path, hint: str = "run `hotcold aggregate` first") -> pd.DataFrame:
    """A table with string keys and a ``label`` column where it has method and variant."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; {hint}")
    frame = pd.read_csv(path, dtype={"dataset": str, "method": str, "variant": str, "timer": str, "options": str})
    if "timer" in frame:
        frame["timer"] = frame["timer"].fillna("unknown")
    if {"method", "variant"} <= set(frame.columns):
        frame["label"] = [run_label(m, v) for m, v in zip(frame["method"], frame["variant"])]
    return frame


def natural_key(text: str) -> tuple:
    """Sort key that orders numbers inside names by value (``6.2pct`` before ``12.4pct``)."""
    return tuple((0, float(part), "") if i % 2 else (1, 0.0, part)
                 for i, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", text)) if part)


def label_order(frame: pd.DataFrame) -> list[str]:
    """Run labels: ``device`` and ``hybrid`` first, then by method and variant (numbers by value)."""
    pairs = frame[["method", "variant"]].drop_duplicates()
    rank = {m: i for i, m in enumerate(FIRST_METHODS)}
    pairs = sorted(pairs.itertuples(index=False),
                   key=lambda p: (rank.get(p.method, len(rank)), p.method, natural_key(p.variant)))
    return [run_label(p.method, p.variant) for p in pairs]


def grid(n: int, width: float = PANEL_W, height: float = PANEL_H) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels (at least one), at most ``MAX_COLS`` a row."""
    cols = max(1, min(n, MAX_COLS))
    rows = max(1, math.ceil(n / cols))
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[max(n, 1):]:
        ax.set_visible(False)
    return fig, axes[: max(n, 1)]


def narrow(ax: Axes, n: int) -> None:
    """Keep a lone bar from filling the whole panel."""
    ax.set_xlim(-0.6, max(n, 3) - 0.4)


def empty_panel(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def save_atomic(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` via temporary files and renames.

    The saved area grows to hold every artist (a legend below a narrow figure, a long title). The layout is
    computed once, for the first format, and kept for the others: laying out every tick label again took a
    quarter of the drawing.
    """
    written = []
    for fmt in FORMATS:
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        written.append(atomic_write(Path(out_dir) / f"{stem}.{fmt}", lambda f, fmt=fmt, md=metadata: fig.savefig(
            f, format=fmt, dpi=150, metadata=md, bbox_inches="tight")))
        fig.set_layout_engine("none")
    return written


def _is_disturbed(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("false", "no", "0")
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return False
    return not bool(value)


def disturbed(frame: pd.DataFrame) -> pd.Series:
    """Per row: whether its run is known to be disturbed (``stable`` false); no ``stable`` value: not marked."""
    if "stable" not in frame:
        return pd.Series(False, index=frame.index, dtype=bool)
    return frame["stable"].map(_is_disturbed).astype(bool)


def with_stability(frame: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the summary's ``stable`` of each row's run, joined on the ``RUN_ID`` columns both have."""
    keys = [k for k in RUN_ID if k in frame and k in summary]
    out = frame.drop(columns=["stable"], errors="ignore")
    if not keys or "stable" not in summary:
        return out.assign(stable=pd.NA)
    marks = summary[[*keys, "stable"]].drop_duplicates(keys)
    return out.merge(marks, on=keys, how="left")


def rate_range(frame: pd.DataFrame) -> pd.DataFrame:
    """Samples/s at the p90 and p10 step time (``rate_lo``, ``rate_hi``); NaN where a column is missing."""
    cols = ("batch_size", "step_ms_p10", "step_ms_p90")
    if not all(c in frame for c in cols):
        return pd.DataFrame({"rate_lo": np.nan, "rate_hi": np.nan}, index=frame.index)
    batch = pd.to_numeric(frame["batch_size"], errors="coerce")
    p10, p90 = (pd.to_numeric(frame[c], errors="coerce").where(lambda v: v > 0) for c in cols[1:])
    return pd.DataFrame({"rate_lo": batch * 1e3 / p90, "rate_hi": batch * 1e3 / p10}, index=frame.index)


def mark_disturbed(patches: Iterable[Rectangle]) -> None:
    """Hatch the bars of disturbed runs."""
    for patch in patches:
        patch.set_hatch(UNSTABLE_HATCH)
        patch.set_edgecolor(UNSTABLE_EDGE)


def whiskers(ax: Axes, x: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> None:
    """Error bars spanning ``lo`` to ``hi`` at ``x`` (where both are known)."""
    x, lo, hi = (np.asarray(v, dtype=float) for v in (x, lo, hi))
    known = np.isfinite(lo) & np.isfinite(hi)
    if known.any():
        ax.errorbar(x[known], (lo[known] + hi[known]) / 2, yerr=np.abs(hi[known] - lo[known]) / 2, fmt="none",
                    ecolor=WHISKER_COLOR, elinewidth=1, capsize=3, zorder=3)


def whisker_handle(label: str) -> Line2D:
    return Line2D([], [], color=WHISKER_COLOR, marker="_", markersize=8, linewidth=1, label=label)


def disturbed_handle() -> Patch:
    return Patch(facecolor="white", edgecolor=UNSTABLE_EDGE, hatch=UNSTABLE_HATCH, label=UNSTABLE_LABEL)


def grouped_bars(ax: Axes, stats: pd.DataFrame, x_order: Sequence[str], hue_order: Sequence[str],
                 colors: dict[str, Any]) -> bool:
    """Bars of ``stats`` (index (x, hue); columns ``mean``, ``sd``, ``disturbed``), hues side by side.

    ``sd`` draws an error bar of +- sd where known; disturbed bars are
    hatched. Returns whether any bar was marked.
    """
    width = 0.8 / max(len(hue_order), 1)
    marked = False
    for j, hue in enumerate(hue_order):
        rows = [(i, stats.loc[(x, hue)]) for i, x in enumerate(x_order) if (x, hue) in stats.index]
        if not rows:
            continue
        xs = np.array([i for i, _ in rows]) + (j - (len(hue_order) - 1) / 2) * width
        means = np.array([float(r["mean"]) for _, r in rows])
        bars = ax.bar(xs, np.nan_to_num(means), width=width, color=colors[hue], label=hue)
        flags = [bool(r["disturbed"]) for _, r in rows]
        mark_disturbed(b for b, d in zip(bars, flags) if d)
        marked |= any(flags)
        sds = np.array([float(r["sd"]) if "sd" in r else np.nan for _, r in rows])
        whiskers(ax, xs, means - sds, means + sds)
    ax.set_xticks(range(len(x_order)), list(x_order))
    return marked
