"""The claims figure: per claim, the paper's number beside hotcold's measured and modelled ones."""
from __future__ import annotations

import math
import textwrap

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hotcold.analysis.plotting import PANEL_H, empty_panel, grid

SOURCES = ("paper", "measured", "modelled")
UNSTABLE_HATCH = "//"


def _value(v) -> float:
    return float(v) if v is not None and not pd.isna(v) else math.nan


def _disturbed(stable) -> bool:
    """``measured_stable`` is no: a bool from the table in memory, a string from its CSV."""
    return str(stable).strip().lower() in ("false", "0", "no")


def claims_figure(claims: pd.DataFrame) -> Figure:
    """One panel per claim, in the claim's own unit; modelled bars are labelled with their profile.

    A measured bar whose runs were disturbed (``measured_stable`` no) is hatched.
    """
    colors = dict(zip(SOURCES, sns.color_palette("colorblind", len(SOURCES))))
    with sns.axes_style("whitegrid"):
        fig, axes = grid(len(claims), width=3.6, height=PANEL_H)
        for ax, row in zip(axes, claims.itertuples(index=False)):
            values = [_value(row.paper_value), _value(row.measured_value), _value(row.modelled_value)]
            title = "\n".join(textwrap.wrap(f"{row.paper.split(' (')[0]}: {row.claim}", 40))
            ax.set_title(title, fontsize="small")
            if all(math.isnan(v) for v in values):
                empty_panel(ax, "\n".join(textwrap.wrap(str(row.status), 30)))
                continue
            profile = str(row.modelled_profile or "")
            labels = ["paper", f"measured\n({row.measured_timer or '-'})",
                      "modelled\n(" + "\n".join(textwrap.wrap(profile, 18)) + ")" if profile else "modelled"]
            bars = ax.bar(range(3), [0.0 if math.isnan(v) else v for v in values],
                          color=[colors[s] for s in SOURCES])
            if _disturbed(row.measured_stable):
                bars[1].set_hatch(UNSTABLE_HATCH)
            for i, v in enumerate(values):
                ax.text(i, 0 if math.isnan(v) else v, "n/a" if math.isnan(v) else f"{v:.3g}", ha="center",
                        va="bottom", fontsize="small")
            ax.set_xticks(range(3), labels, fontsize="x-small")
            ax.set_ylabel(row.unit)
        handles = [Patch(facecolor="white", edgecolor="black", hatch=UNSTABLE_HATCH,
                         label="measured runs disturbed (stable = no)")]
        fig.legend(handles=handles, loc="outside lower center")
        fig.suptitle("Papers' claims: the paper's number, hotcold measured, hotcold modelled (cost model, "
                     "profile named)", fontsize="medium")
    return fig
