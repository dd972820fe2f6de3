"""Access-skew statistics of categorical ids, measured from the ids themselves.

Hot/cold embedding methods (FAE, Bagpipe, caching) rely on a few rows taking
most lookups. These helpers measure how concentrated the lookups of a dataset
really are, per table and over all tables together, so the numbers recorded in
a manifest describe the data rather than the generator's intent. They work on
any ``[N, T]`` id matrix (synthetic or real) or on per-row lookup counts
(``coverage_from_counts``), e.g. the counts of ``hotcold profile``.
``row_counts`` counts the lookups of every row over (a sample of) a split of
a dataset, the one count that profiles, FAE, the frequency-aware cache and the
cache simulator share.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from hotcold.data.columns import release_pages

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

DEFAULT_FRACTIONS = (0.001, 0.01, 0.1)
TAIL_THRESHOLDS = (2, 8, 64)   # tail_stats: share of lookups on rows seen fewer than these many times
MIN_FIT_COUNT = 10   # ranks with fewer lookups are left out of the exponent fit
FIT_POINTS = 50      # log-spaced ranks used by the exponent fit
SPARSE_COUNT_RATIO = 8  # add_counts sorts instead of a dense bincount above this rows/lookups ratio
COUNT_CHUNK = 1 << 16   # samples per batch_ids call while counting a split
RELEASE_SAMPLES = 1 << 22  # row_counts drops the mapped pages it read after this many samples


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


def add_counts(counts: np.ndarray, rows: np.ndarray) -> None:
    """Add one lookup of each entry of ``rows`` (int, in ``[0, counts.size)``) to ``counts``, in place.

    Few lookups into many rows (more than ``SPARSE_COUNT_RATIO`` rows per
    lookup) are sorted instead of a dense bincount over every row.
    """
    if not rows.size:
        return
    if counts.size > SPARSE_COUNT_RATIO * rows.size:
        uniq, n = np.unique(rows, return_counts=True)
        counts[uniq] += n
    else:
        counts += np.bincount(rows, minlength=counts.size)


def count_lookups(
    counts: Sequence[np.ndarray],
    ids: np.ndarray,
    column_tables: Sequence[int],
) -> None:
    """Add the lookups of an id matrix to per-table counts, in place.

    ``ids`` int [B, K], column k holding ids of table ``column_tables[k]``;
    negative ids (padding) are skipped. ``counts[t]`` is int64 [rows of t].
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[1] != len(column_tables):
        raise ValueError(f"ids must be [B, {len(column_tables)}], got {ids.shape}")
    col_tables = np.asarray(column_tables)
    if col_tables.size and not 0 <= col_tables.min() <= col_tables.max() < len(counts):
        raise ValueError(f"column tables must lie in [0, {len(counts)}), got {sorted(set(column_tables))}")
    for t, c in enumerate(counts):
        sel = ids[:, col_tables == t].ravel()
        sel = sel[sel >= 0].astype(np.int64, copy=False)
        if sel.size and sel.max() >= c.size:
            raise ValueError(f"table {t}: ids must lie in [0, {c.size})")
        add_counts(c, sel)


def row_counts(ds: "Dataset", split: str = "train", rows: np.ndarray | Iterable[np.ndarray] | None = None,
               chunk: int = COUNT_CHUNK) -> np.ndarray:
    """Lookups of every global row by samples of a split: int64 [N] (``StoreSpec.frequencies``).

    ``rows``: the samples to count, as indices relative to the split: one
    int array (read ``chunk`` samples at a time), an iterable of such arrays
    (read one at a time, so a sample drawn chunk by chunk never sits in memory
    whole), or None for the whole split. Every non-padding lookup of
    ``Dataset.batch_ids`` counts (sequence histories included).
    """
    start, stop = ds.split(split)
    n = stop - start
    if rows is None:
        blocks: Iterable[np.ndarray] = (np.arange(a, min(a + chunk, n)) for a in range(0, n, chunk))
    elif isinstance(rows, np.ndarray):
        blocks = (rows[a:a + chunk] for a in range(0, rows.size, chunk))
    else:
        blocks = rows
    counts = np.zeros(sum(ds.cardinalities), dtype=np.int64)
    read = 0
    for block in blocks:
        if len(block):
            add_counts(counts, ds.global_rows(start + np.asarray(block, dtype=np.int64)))
            read += len(block)
        if read >= RELEASE_SAMPLES:        # the columns' pages read so far leave this process
            for col in (ds.sparse, ds.history, ds.history_offsets):
                if col is not None:
                    release_pages(col)
            read = 0
    return counts


def coverage_from_counts(
    counts_per_table: Sequence[np.ndarray],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    rows: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Per-table and overall lookup concentration from per-row lookup counts.

    ``counts_per_table[t]`` holds lookup counts of rows of table t: one per
    row (its cardinality is then the array's length), or, with ``rows[t]``
    the cardinality of table t, those of the accessed rows only, in any order
    (zeros allowed), so a table of 10M rows costs only its accessed rows.
    Per table: ``rows`` (cardinality), ``accessed_rows``, the share of lookups
    covered by the top ``ceil(f * rows)`` rows for each fraction (keys
    ``top_0.1%``, ``top_1%``, ``top_10%``) and ``max_over_median`` (largest
    count over the median count of accessed rows). ``overall`` ranks the rows
    of all tables together (as one global id space) with the same shares.
    """
    if rows is None:
        rows = [np.asarray(c).size for c in counts_per_table]
    if len(rows) != len(counts_per_table):
        raise ValueError(f"rows gives {len(rows)} table sizes for {len(counts_per_table)} tables")
    tables, accessed_counts = [], []
    for t, (counts, n) in enumerate(zip(counts_per_table, rows)):
        counts = np.asarray(counts, dtype=np.int64)
        accessed = counts[counts > 0]
        tables.append({
            "table": t,
            "rows": int(n),
            "accessed_rows": int(accessed.size),
            **_shares(accessed, int(n), fractions),
            "max_over_median": float(accessed.max() / np.median(accessed)) if accessed.size else 0.0,
        })
        accessed_counts.append(accessed)
    merged = np.concatenate(accessed_counts) if accessed_counts else np.zeros(0, dtype=np.int64)
    total_rows = int(sum(int(n) for n in rows))
    overall = {
        "rows": total_rows,
        "accessed_rows": int(merged.size),
        "lookups": int(merged.sum()),
        **_shares(merged, total_rows, fractions),
    }
    return {"tables": tables, "overall": overall}


def tail_key(threshold: int) -> str:
    """Stats key of a tail threshold: 8 -> ``"lookups_seen_lt8"`` (share of lookups on rows seen < 8 times)."""
    return f"lookups_seen_lt{threshold}"


def tail_stats(counts_per_table: Sequence[np.ndarray], thresholds: Sequence[int] = TAIL_THRESHOLDS) -> dict[str, Any]:
    """The rarely seen rows: per table and over all, the share of rows touched and of lookups on rare rows.

    ``counts_per_table[t]`` int [rows of t]: lookups of every row of table t
    (over whatever was counted: a split, a whole dataset). Per table:
    ``rows``, ``touched_rows`` (rows looked up at least once), ``touched``
    (their share), ``lookups`` and, for each threshold k,
    ``lookups_seen_lt<k>``: the share of the lookups that fall on rows looked
    up fewer than k times in all (a row seen once contributes its one lookup
    to every threshold above 1). ``overall`` pools the rows of all tables.
    """
    for k in thresholds:
        if int(k) != k or k < 1:
            raise ValueError(f"thresholds must be integers >= 1, got {k}")
    sums = []   # per table: rows, touched rows, lookups, lookups on rows seen < k for each k
    for t, c in enumerate(counts_per_table):
        c = np.asarray(c, dtype=np.int64)
        if c.size and c.min() < 0:
            raise ValueError(f"table {t}: counts must be >= 0")
        sums.append([c.size, int((c > 0).sum()), int(c.sum())] + [int(c[c < k].sum()) for k in thresholds])

    def entry(rows: int, touched: int, lookups: int, *rare: int) -> dict[str, Any]:
        return {"rows": rows, "touched_rows": touched, "touched": touched / rows if rows else 0.0,
                "lookups": lookups,
                **{tail_key(k): r / lookups if lookups else 0.0 for k, r in zip(thresholds, rare)}}

    tables = [{"table": t, **entry(*s)} for t, s in enumerate(sums)]
    overall = entry(*(int(v) for v in np.sum(np.array(sums, dtype=np.int64).reshape(len(sums), -1), axis=0))) \
        if sums else entry(0, 0, 0, *[0] * len(thresholds))
    return {"thresholds": [int(k) for k in thresholds], "tables": tables, "overall": overall}


def coverage_stats(
    sparse: np.ndarray,
    cardinalities: Sequence[int],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[str, Any]:
    """``coverage_from_counts`` of an id matrix ``sparse`` int [N, T], one column per table."""
    sparse = np.asarray(sparse)
    if sparse.ndim != 2 or sparse.shape[1] != len(cardinalities):
        raise ValueError(f"sparse must be [N, {len(cardinalities)}], got {sparse.shape}")
    counts = []
    for t, card in enumerate(cardinalities):
        ids = np.asarray(sparse[:, t], dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= card):
            raise ValueError(f"table {t}: ids must lie in [0, {card})")
        counts.append(np.bincount(ids, minlength=int(card)))  # [card]
    return coverage_from_counts(counts, fractions)


def powerlaw_exponent(counts: np.ndarray, min_count: int = MIN_FIT_COUNT, points: int = FIT_POINTS) -> float:
    """Exponent s of ``count ~ rank^-s``, by least squares of log count on log rank.

    Rows are ranked by count (rank 1 = most looked up). Only ranks whose count
    is at least ``min_count`` enter (the tail of rows seen once or twice is a
    sampling floor, not the law), sampled at ``points`` log-spaced ranks so
    each decade of ranks weighs the same. NaN when fewer than 3 ranks qualify.
    """
    counts = np.sort(np.asarray(counts)[np.asarray(counts) >= min_count])[::-1].astype(np.float64)
    if counts.size < 3:
        return float("nan")
    ranks = np.unique(np.geomspace(1, counts.size, points).round().astype(np.int64))  # 1-based
    if ranks.size < 3:
        return float("nan")
    slope = np.polyfit(np.log(ranks), np.log(counts[ranks - 1]), 1)[0]
    return float(-slope)
