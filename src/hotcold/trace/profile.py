"""Access profiles of a dataset's training lookups (``hotcold profile``).

A profile counts how often each embedding row is looked up in the training
split, the way FAE profiles its input before training (optionally from a
random sample of the training rows, FAE uses 5%), and summarises the counts
(``profile_dataset``). Frequency-aware techniques read its counts; a profile
directory is complete once it has its ``profile.json`` (``save_profile``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from hotcold.files import atomic_write
from hotcold.data.columns import release_pages
from hotcold.data.format import Dataset
from hotcold.data.order import batch_rows
from hotcold.data.skew import (COUNT_CHUNK, MIN_FIT_COUNT, TAIL_THRESHOLDS, coverage_curve, coverage_from_counts,
                               powerlaw_exponent, row_counts, tail_key, tail_stats)

PROFILE_VERSION = 1
RELEASE_BATCHES = 16   # the batch scan drops the columns' mapped pages it read every this many batches
GRID = np.logspace(-4, 0, 41)  # shares of rows of the coverage curves: 0.01% .. 100%, 10 per decade
TAIL_COLUMNS = tuple(tail_key(k) for k in TAIL_THRESHOLDS)
STATS_COLUMNS = ("dataset", "table", "rows", "accessed_rows", "touched", *TAIL_COLUMNS, "top_0.1%", "top_1%",
                 "top_10%", "exponent", "unique_per_batch_mean", "unique_per_window_mean")
EXPONENT_FIT = (f"least squares of log count on log rank, ranks with >= {MIN_FIT_COUNT} lookups "
                "sampled at log-spaced ranks")


@dataclass
class Profile:
    """Per-table lookup counts of a training split and their summaries; column/row T is all tables."""

    dataset: str
    cardinalities: list[int]
    counts: list[np.ndarray]         # int64 [rows_t] lookups of each row of table t
    fractions: np.ndarray            # float64 [G] shares of rows of the coverage curves
    coverage: np.ndarray             # float64 [T+1, G] share of lookups on the top rows
    exponents: np.ndarray            # float64 [T+1] fitted power-law exponents, NaN if too few rows
    unique_per_batch: np.ndarray     # int64 [batches, T+1] distinct rows per batch
    unique_per_window: np.ndarray    # int64 [windows, T+1] distinct rows per window of batches
    lookups_per_batch: np.ndarray    # int64 [batches, T+1] non-padding lookups per batch
    params: dict[str, Any]

    @property
    def num_tables(self) -> int:
        return len(self.cardinalities)

    @property
    def stats(self) -> dict[str, Any]:
        """``coverage_from_counts`` of the counts (top 0.1/1/10% shares, per table and overall)."""
        return coverage_from_counts(self.counts)

    @property
    def tail(self) -> dict[str, Any]:
        """``tail_stats`` of the counts: share of rows touched, of lookups on rows seen < 2, 8, 64 times."""
        return tail_stats(self.counts)


def _unique_per_table(ids: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64 [T+1] distinct global ids per table (bounds [T+1] table starts) and in all."""
    per_table = np.diff(np.searchsorted(ids, bounds))
    return np.append(per_table, ids.size)


def profile_dataset(ds: Dataset, *, sample_fraction: float = 1.0, batch_size: int, window: int,
                    batches: int, seed: int) -> Profile:
    """Profile the training split of ``ds``: row counts and their summaries.

    - coverage curves: share of lookups covered by the top x of rows, x on a log
      grid from 0.01% to 100%, per table and over all tables together;
    - a fitted power-law exponent per table: least squares of log count on log
      rank over the ranks with at least ``MIN_FIT_COUNT`` lookups, at log-spaced
      ranks (``hotcold.data.skew.powerlaw_exponent``);
    - distinct rows per training batch and per window of W consecutive batches
      (non-overlapping windows), in the loader's ``shuffle="global"`` order — the
      working set a cache or a look-ahead store sees.

    All lookups of ``Dataset.batch_ids`` count (sequence histories included,
    padding skipped); ``Dataset.column_tables`` maps columns to tables.

    Counts come from a random ``sample_fraction`` of the training rows: each
    row is kept with that probability (drawn with ``seed``), so the sample
    holds about that fraction and memory stays bounded on any split size. The
    unique-row statistics come from the first ``batches`` batches of
    ``batch_rows(..., shuffle="global")`` with ``seed``, grouped into
    ``batches // window`` windows (a trailing partial window is dropped).
    """
    if not 0 < sample_fraction <= 1:
        raise ValueError(f"sample_fraction must be in (0, 1], got {sample_fraction}")
    if batch_size < 1 or window < 1 or batches < 1:
        raise ValueError(f"batch_size, window and batches must be >= 1, got {batch_size}, {window}, {batches}")
    if window > batches:
        raise ValueError(f"window={window} is longer than the {batches} profiled batches")
    start, stop = ds.split("train")
    n = stop - start
    cards = ds.cardinalities
    bounds = ds.table_bounds   # [T+1]
    sampled: list[int] = []

    def sample() -> Iterator[np.ndarray]:
        """Chunks of the kept training rows (split-relative); every row is kept when sampling all."""
        rng = np.random.default_rng(seed)
        for a in range(0, n, COUNT_CHUNK):
            rows = np.arange(a, min(a + COUNT_CHUNK, n))
            if sample_fraction < 1:
                rows = rows[rng.random(rows.size) < sample_fraction]
            sampled.append(rows.size)
            yield rows

    counts = np.split(row_counts(ds, "train", sample()), bounds[1:-1])  # [rows_t] per table
    profiled = sum(sampled)

    per_batch, lookups, per_window, pending = [], [], [], []
    for i, b in enumerate(batch_rows(n, batch_size, batches, seed, "global")):
        if i % RELEASE_BATCHES == 0:   # random batches touch pages all over the columns: drop them
            for col in (ds.sparse, ds.history, ds.history_offsets):
                if col is not None:
                    release_pages(col)
        rows = ds.global_rows(start + b)                                # [L]
        uniq = np.unique(rows)
        per_batch.append(_unique_per_table(uniq, bounds))
        tables = np.searchsorted(bounds, rows, side="right") - 1        # [L] table of each lookup
        lookups.append(np.append(np.bincount(tables, minlength=len(cards)), rows.size))
        pending.append(uniq)
        if len(pending) == window:
            per_window.append(_unique_per_table(np.unique(np.concatenate(pending)), bounds))
            pending = []

    merged = np.concatenate([c[c > 0] for c in counts])
    coverage = np.stack([coverage_curve(c[c > 0], GRID, rows=c.size) for c in counts]
                        + [coverage_curve(merged, GRID, rows=int(sum(cards)))])
    exponents = np.array([powerlaw_exponent(c) for c in counts] + [powerlaw_exponent(merged)])
    params = {
        "dataset_path": str(ds.path), "manifest_sha256": ds.manifest_sha256, "kind": ds.manifest.get("kind"),
        "split": "train", "train_rows": int(n), "profiled_rows": int(profiled),
        "sample_fraction": float(sample_fraction), "batch_size": int(batch_size), "window": int(window),
        "batches": int(batches), "seed": int(seed), "shuffle": "global", "column_tables": list(ds.column_tables),
        "exponent_fit": EXPONENT_FIT,
    }
    width = len(cards) + 1
    return Profile(ds.name, cards, counts, GRID.copy(), coverage, exponents,
                   np.array(per_batch, dtype=np.int64).reshape(-1, width),
                   np.array(per_window, dtype=np.int64).reshape(-1, width),
                   np.array(lookups, dtype=np.int64).reshape(-1, width), params)


def _finite(x: Any) -> Any:
    """JSON-safe nested lists: NaN and infinities become None."""
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _mean(a: np.ndarray) -> list[float | None]:
    return _finite(a.mean(axis=0).tolist()) if len(a) else [None] * a.shape[1]


def save_profile(profile: Profile, out_dir: Path) -> list[Path]:
    """Write ``counts.npz`` then ``profile.json`` into ``out_dir``, each atomically; return both paths.

    A profile directory holds ``counts.npz`` (int64 array ``table_<t>`` per table, in table
    order), which frequency-aware techniques read, and ``profile.json`` with
    everything else; both are written atomically, the JSON last and carrying the
    counts' sha256, so a directory with a ``profile.json`` is complete.
    """
    out_dir = Path(out_dir)
    arrays = {f"table_{t}": np.asarray(c, dtype=np.int64) for t, c in enumerate(profile.counts)}
    counts_path = atomic_write(out_dir / "counts.npz", lambda f: np.savez(f, **arrays))
    doc = {
        "profile_version": PROFILE_VERSION,
        "dataset": profile.dataset,
        "params": profile.params,
        "cardinalities": [int(c) for c in profile.cardinalities],
        "counts_file": counts_path.name,
        "counts_sha256": hashlib.sha256(counts_path.read_bytes()).hexdigest(),
        "stats": profile.stats,
        "tail": profile.tail,
        "exponents": {"method": EXPONENT_FIT, "tables": _finite(profile.exponents[:-1].tolist()),
                      "overall": _finite(float(profile.exponents[-1]))},
        "coverage": {"fractions": profile.fractions.tolist(), "tables": profile.coverage[:-1].tolist(),
                     "overall": profile.coverage[-1].tolist()},
        "unique": {
            "columns": "one per table, then all tables",
            "per_batch_mean": _mean(profile.unique_per_batch),
            "per_window_mean": _mean(profile.unique_per_window),
            "lookups_per_batch_mean": _mean(profile.lookups_per_batch),
            "per_batch": profile.unique_per_batch.tolist(),
            "per_window": profile.unique_per_window.tolist(),
            "lookups_per_batch": profile.lookups_per_batch.tolist(),
        },
    }
    text = json.dumps(doc, indent=1) + "\n"
    json_path = atomic_write(out_dir / "profile.json", lambda f: f.write(text.encode()))
    return [counts_path, json_path]


def load_profile(path: Path) -> Profile:
    """Read a profile directory written by ``save_profile``, checking the counts' sha256."""
    path = Path(path)
    jpath = path / "profile.json"
    if not jpath.is_file():
        raise FileNotFoundError(f"{path} is not a profile directory (no profile.json)")
    doc = json.loads(jpath.read_text())
    if doc.get("profile_version") != PROFILE_VERSION:
        raise ValueError(f"{jpath}: profile_version {doc.get('profile_version')!r}, expected {PROFILE_VERSION}")
    cpath = path / doc["counts_file"]
    if hashlib.sha256(cpath.read_bytes()).hexdigest() != doc["counts_sha256"]:
        raise ValueError(f"{cpath}: sha256 does not match profile.json (stale or corrupted)")
    cards = doc["cardinalities"]
    with np.load(cpath) as z:
        counts = [z[f"table_{t}"] for t in range(len(cards))]
    width = len(cards) + 1

    def table(key: str) -> np.ndarray:
        return np.array(doc["unique"][key], dtype=np.int64).reshape(-1, width)

    exps = doc["exponents"]["tables"] + [doc["exponents"]["overall"]]
    return Profile(
        dataset=doc["dataset"], cardinalities=cards, counts=counts,
        fractions=np.array(doc["coverage"]["fractions"]),
        coverage=np.array(doc["coverage"]["tables"] + [doc["coverage"]["overall"]], dtype=np.float64),
        exponents=np.array([np.nan if e is None else e for e in exps], dtype=np.float64),
        unique_per_batch=table("per_batch"), unique_per_window=table("per_window"),
        lookups_per_batch=table("lookups_per_batch"), params=doc["params"],
    )


def dataset_stats(profile_dirs: list[Path]) -> pd.DataFrame:
    """One row per (dataset, table) plus an ``overall`` row per dataset (columns ``STATS_COLUMNS``).

    Over the profiled training samples: ``touched`` is the share of the rows
    looked up at least once, ``lookups_seen_lt<k>`` the share of lookups on
    rows looked up fewer than k times (``skew.tail_stats``), ``top_*`` the
    share of lookups on the hottest rows (``skew.coverage_from_counts``).
    Profiles are read one at a time.
    """
    records = []
    for d in profile_dirs:
        p = load_profile(Path(d))
        stats, tail = p.stats, p.tail
        upb = p.unique_per_batch.mean(axis=0) if len(p.unique_per_batch) else np.full(p.num_tables + 1, np.nan)
        upw = p.unique_per_window.mean(axis=0) if len(p.unique_per_window) else np.full(p.num_tables + 1, np.nan)
        for t, (s, r) in enumerate(zip(stats["tables"] + [stats["overall"]], tail["tables"] + [tail["overall"]])):
            records.append({
                "dataset": p.dataset, "table": str(t) if t < p.num_tables else "overall",
                "rows": s["rows"], "accessed_rows": s["accessed_rows"], "touched": r["touched"],
                **{k: r[k] for k in TAIL_COLUMNS},
                "top_0.1%": s["top_0.1%"], "top_1%": s["top_1%"], "top_10%": s["top_10%"],
                "exponent": float(p.exponents[t]),
                "unique_per_batch_mean": float(upb[t]), "unique_per_window_mean": float(upw[t]),
            })
    return pd.DataFrame.from_records(records, columns=list(STATS_COLUMNS))


def write_dataset_stats(frame: pd.DataFrame, out_csv: Path) -> Path:
    """Write ``frame`` as CSV atomically."""
    text = frame.to_csv(index=False)
    return atomic_write(Path(out_csv), lambda f: f.write(text.encode()))


def coverage_figure(profile_dirs: list[Path], out_dir: Path) -> list[Path]:
    """``coverage.png`` and ``coverage.pdf``: share of lookups vs share of rows, one line per dataset."""
    import seaborn as sns
    from matplotlib.figure import Figure

    frames = []
    for d in profile_dirs:
        p = load_profile(Path(d))
        frames.append(pd.DataFrame({"dataset": p.dataset, "rows_pct": p.fractions * 100, "share": p.coverage[-1]}))
    frame = pd.concat(frames, ignore_index=True)
    fig = Figure(figsize=(5.0, 3.6), layout="constrained")
    ax = fig.subplots()
    sns.lineplot(data=frame, x="rows_pct", y="share", hue="dataset", ax=ax, palette="colorblind")
    ax.plot(GRID * 100, GRID, color="0.6", linestyle="--", linewidth=1, label="uniform")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("hottest rows (% of all rows, log scale)")
    ax.set_ylabel("share of training lookups")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title=None, fontsize="small")
    ax.set_title("Access skew of the embedding rows (all tables)", fontsize="medium")
    out_dir = Path(out_dir)
    written = []
    for fmt in ("png", "pdf"):
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        written.append(atomic_write(out_dir / f"coverage.{fmt}",
                               lambda f, fmt=fmt, md=metadata: fig.savefig(f, format=fmt, dpi=150, metadata=md)))
    return written
