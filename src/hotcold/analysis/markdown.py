"""GitHub-flavoured markdown tables from data frames (``summary.md``, ``speedup.md``...)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

MARKDOWN_FORMATS = {
    "samples_per_s": "{:,.0f}", "samples_per_s_sd": "{:,.0f}",
    "step_ms_p50": "{:.3f}", "step_ms_p10": "{:.3f}", "step_ms_p90": "{:.3f}", "step_ms_mean": "{:.3f}",
    "speedup_vs_hybrid": "{:.2f}x", "speedup_sd": "{:.2f}",
    "auc": "{:.4f}", "auc_vs_hybrid": "{:+.4f}", "logloss": "{:.4f}",
    "param_rel_diff": "{:.1e}",
}


def _fmt(value: Any, fmt: str) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "**no**"
    if isinstance(value, (float, np.floating)):
        return fmt.format(float(value))
    return str(value).replace("|", "\\|")


def to_markdown(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned, text left-aligned.

    ``formats`` maps column names to ``str.format`` patterns for floats
    (default: ``MARKDOWN_FORMATS``, then ``{:.4g}``).
    """
    cols = list(frame.columns)
    fmts = [{**MARKDOWN_FORMATS, **(formats or {})}.get(c, "{:.4g}") for c in cols]
    cells = [[_fmt(v, f) for v, f in zip(row, fmts)] for row in frame.itertuples(index=False, name=None)]
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c]) for c in cols]
    widths = [max([len(c), 3, *(len(r[i]) for r in cells)]) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else (":" + "-" * (w + 1)) for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(cols), rule, *(line(r) for r in cells)]) + "\n"
