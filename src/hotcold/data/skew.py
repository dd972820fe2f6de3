"""Access-skew statistics of categorical ids, measured from the ids themselves.

Hot/cold embedding methods (FAE, Bagpipe, caching) rely on a few rows taking
most lookups. These helpers measure how concentrated the lookups of a dataset
really are, per table and over all tables together, so the numbers recorded in
a manifest describe the data rather than the generator's intent. They work on
any ``[N, T]`` id matrix (synthetic or real).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

DEFAULT_FRACTIONS = (0.001, 0.01, 0.1)


def share_key(fraction: float) -> str:
    """Stats key of a row fraction: 0.01 -> ``"top_1%"``, 0.001 -> ``"top_0.1%"``."""
    return f"top_{fraction * 100:g}%"


def coverage_curve(counts: np.ndarray, fractions: Sequence[float], rows: int | None = None) -> np.ndarray:
    """Share of lookups covered by the top ``ceil(f * rows)`` rows, for each f.

    ``counts`` [R] holds per-row lookup counts (in any order); rows are ranked
    by count. ``rows`` is the number of rows the fractions refer to, by default
    ``len(counts)``; pass it to give only the accessed rows' counts. Returns
    float64 [len(fractions)]; all zeros when nothing was looked up.
    """
    counts = np.asarray(counts)
    rows = counts.size if rows is None else rows
    if rows < counts.size:
        raise ValueError(f"rows={rows} is smaller than the {counts.size} counts given")
    out = np.zeros(len(fractions), dtype=np.float64)
    for f in fractions:
        if not 0 <= f <= 1:
            raise ValueError(f"fractions must lie in [0, 1], got {f}")
    total = float(counts.sum())
    if total <= 0:
        return out
    cum = np.cumsum(np.sort(counts)[::-1], dtype=np.float64)  # [R], descending counts
    for i, f in enumerate(fractions):
        k = min(counts.size, math.ceil(f * rows))
        out[i] = cum[k - 1] / total if k > 0 else 0.0
    return out


def _shares(counts: np.ndarray, rows: int, fractions: Sequence[float]) -> dict[str, float]:
    curve = coverage_curve(counts, fractions, rows)
    return {share_key(f): float(s) for f, s in zip(fractions, curve)}


def coverage_stats(
    sparse: np.ndarray,
    cardinalities: Sequence[int],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[str, Any]:
    """Per-table and overall lookup concentration of an id matrix.

    ``sparse`` int [N, T], column t holding ids in ``[0, cardinalities[t])``.
    Per table: ``rows`` (cardinality), ``accessed_rows``, the share of lookups
    covered by the top ``ceil(f * rows)`` rows for each fraction (keys
    ``top_0.1%``, ``top_1%``, ``top_10%``) and ``max_over_median`` (largest
    count over the median count of accessed rows). ``overall`` ranks the rows
    of all tables together (as one global id space) with the same shares.
    """
    sparse = np.asarray(sparse)
    if sparse.ndim != 2 or sparse.shape[1] != len(cardinalities):
        raise ValueError(f"sparse must be [N, {len(cardinalities)}], got {sparse.shape}")
    tables, accessed_counts = [], []
    for t, card in enumerate(cardinalities):
        ids = np.asarray(sparse[:, t], dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= card):
            raise ValueError(f"table {t}: ids must lie in [0, {card})")
        counts = np.bincount(ids, minlength=int(card))  # [card]
        accessed = counts[counts > 0]
        tables.append({
            "table": t,
            "rows": int(card),
            "accessed_rows": int(accessed.size),
            **_shares(accessed, int(card), fractions),
            "max_over_median": float(accessed.max() / np.median(accessed)) if accessed.size else 0.0,
        })
        accessed_counts.append(accessed)
    merged = np.concatenate(accessed_counts) if accessed_counts else np.zeros(0, dtype=np.int64)
    total_rows = int(sum(int(c) for c in cardinalities))
    overall = {
        "rows": total_rows,
        "accessed_rows": int(merged.size),
        "lookups": int(merged.sum()),
        **_shares(merged, total_rows, fractions),
    }
    return {"tables": tables, "overall": overall}
