"""Shared figure helpers: run labels and their order, panel grids, atomic PNG + PDF output.

Figures are drawn on plain ``matplotlib.figure.Figure`` objects (no pyplot,
so no GUI backend is touched) and written via temporary files and renames.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hotcold.files import atomic_write

FORMATS = ("png", "pdf")
FIRST_METHODS = ("device", "hybrid")  # the reference and the baseline lead every panel
PANEL_W, PANEL_H, MAX_COLS = 4.8, 3.6, 3


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
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` via temporary files and renames."""
    written = []
    for fmt in FORMATS:
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        written.append(atomic_write(Path(out_dir) / f"{stem}.{fmt}",
                                    lambda f, fmt=fmt, md=metadata: fig.savefig(f, format=fmt, dpi=150, metadata=md)))
    return written
