"""Preprocessing of Taobao user behaviour (``UserBehavior.csv``) into a sequence dataset.

The input has no header; each line is ``user_id,item_id,category_id,
behavior_type,timestamp`` with behavior_type in pv, buy, cart, fav. A line
that repeats an earlier one exactly is dropped and counted (manifest
``bad_lines.duplicates``): it would put the target item into its own
history. As the TBSM preprocessing does, every event (any behaviour) joins
its user's time-ordered history, and samples are taken at positions of that
history (``preprocess_taobao``). A well-formed line whose timestamp lies
outside ``time_range`` (default: the dataset's documented period, 25 Nov to
3 Dec 2017 in UTC+8) is dropped and counted (manifest ``outside_time_range``)
with a warning giving the count and share; more than
``max_out_of_range_share`` of the lines (default 1%) fail the run with one
line naming the file.

The read pass is ``taobao_read``'s (lines parsed by ``taobao_parse``, ids
indexed by ``taobao_ids``, events spilled by ``taobao_spill``); the grouping
pass (``taobao_group``, ``taobao_history``) and the writing of the samples
are here. The options: ``TaobaoConfig`` (``taobao_config``).
"""
from __future__ import annotations

import datetime
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from tqdm import tqdm

from hotcold.data.format import DatasetWriter
from hotcold.data.skew import coverage_from_counts
from hotcold.data.sources.inputs import check_provenance, source_records
from hotcold.data.sources.spill import NpyColumn
from hotcold.data.sources.taobao_config import TaobaoConfig
from hotcold.data.sources.taobao_group import group_events
from hotcold.data.sources.taobao_history import bucket_stats, fill_history
from hotcold.data.sources.taobao_parse import BEHAVIORS
from hotcold.data.sources.taobao_read import _Events, _read_events

log = logging.getLogger(__name__)


def _renumber(counts: np.ndarray, raws: np.ndarray) -> np.ndarray:
    """int32 [n] new id of each index: 0..n-1 by descending count, ties by raw value."""
    rank = np.empty(counts.size, dtype=np.int32)
    rank[np.lexsort((raws, -counts))] = np.arange(counts.size, dtype=np.int32)
    return rank


def _within(lengths: np.ndarray) -> np.ndarray:
    """0..len-1 for each group of ``lengths``, concatenated."""
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _when(t: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(t, datetime.timezone(datetime.timedelta(hours=8))).strftime(
            "%Y-%m-%d %H:%M UTC+8")
    except (OverflowError, OSError, ValueError):
        return "out of calendar range"


def _check_time_range(csv: Path, cfg: TaobaoConfig, ev: _Events) -> dict[str, Any] | None:
    """Warn about the lines dropped for a timestamp outside ``time_range`` (count and share); fail when
    their share is above ``max_out_of_range_share``. -> the manifest's record of them."""
    if cfg.time_range is None:
        return None
    lo, hi = cfg.time_range
    n, lines = ev.outside.total, ev.raw_lines
    share = n / lines if lines else 0.0
    record = {"range": [lo, hi], "outside": n, "share": share, "first": list(ev.outside.first)}
    if not n:
        return record
    where = ", ".join(f"{e['file']}:{e['line']}" for e in ev.outside.first[:3])
    detail = (f"{n:,} of {lines:,} lines ({share:.2%}) have a timestamp outside time_range [{lo}, {hi}) "
              f"({_when(lo)} to {_when(hi)}; first at {where})")
    if share > cfg.max_out_of_range_share:
        raise ValueError(f"{csv}: {detail}, more than max_out_of_range_share={cfg.max_out_of_range_share:g}: are "
                         f"they epoch seconds of the dataset's period? (set preprocess.time_range to the file's "
                         f"period, or null to keep every timestamp)")
    log.warning("%s: %s; dropped them (preprocess.time_range sets the range, null keeps every timestamp)",
                csv, detail)
    return record


@dataclass
class _Grouped:
    """Per user (renumbered ids) the deduplicated event count, last time and the events samples use."""

    events: int
    behaviors: np.ndarray    # int64 [4] events per behaviour
    conflicts: int           # events whose category is not their item's first
    user_events: np.ndarray  # int64 [users]
    last: np.ndarray         # int64 [users] time of the last event
    starts: np.ndarray       # int64 [users] where user-position 0 would be in tail_* (only the tail is there)
    tail_item: np.ndarray    # int32 the last events of each user that gives samples
    tail_cat: np.ndarray
    item_cat: np.ndarray     # int32 [items] category of each item's first event
    n_cats: int


def _group(ev: _Events, cfg: TaobaoConfig, name: str, progress: bool, compiled: bool | None) -> _Grouped:
    """Read the spilled buckets one at a time: order each user's events by time, drop exact repeats, count,
    and keep the last ``samples_per_user + max_length`` events of each user that gives samples."""
    B, n_users, n_items, n_cats = ev.spill.buckets, ev.users.size, ev.items.size, ev.cats.size
    S, L = cfg.samples_per_user, cfg.max_length
    count, last, tail_start = (np.zeros(n_users, dtype=np.int64) for _ in range(3))
    item_counts, cat_counts = np.zeros(n_items, dtype=np.int64), np.zeros(n_cats, dtype=np.int64)
    behaviors, conflicts = np.zeros(len(BEHAVIORS), dtype=np.int64), 0
    size = min(ev.spill.events, n_users * (S + L))
    tail_item, tail_cat = np.empty(size, dtype=np.int32), np.empty(size, dtype=np.int32)
    filled = 0
    with tqdm(total=ev.spill.events, unit="events", desc=f"{name}: group", disable=not progress) as bar:
        for b in range(B):
            user, item, cat, beh, ts = ev.spill.read(b)
            if not user.size:
                continue
            local = user // B if B > 1 else user
            del user
            n_local = -(-(n_users - b) // B)               # users b, b + B, ... below n_users
            order = group_events(local, ts, item, cat, beh, n_local, compiled)
            cnt, last_b, start_b, filled, c = bucket_stats(order, local, ts, item, cat, beh, ev.item_cat,
                                                           cfg.min_history, S, L, n_local, item_counts, cat_counts,
                                                           behaviors, tail_item, tail_cat, filled, compiled)
            users = b + B * np.arange(n_local, dtype=np.int64)
            count[users], last[users], tail_start[users] = cnt, last_b, start_b
            conflicts += c
            del order, local
            bar.update(ts.size)
    tail_item, tail_cat = tail_item[:filled], tail_cat[:filled]
    user_rank = _renumber(count, ev.users.raws)
    item_rank = _renumber(item_counts, ev.items.raws)
    cat_rank = _renumber(cat_counts, ev.cats.raws)
    by_rank = np.empty(n_users, dtype=np.int64)
    by_rank[user_rank] = np.arange(n_users)
    np.take(item_rank, tail_item, out=tail_item)
    np.take(cat_rank, tail_cat, out=tail_cat)
    item_cat = np.empty(n_items, dtype=np.int32)
    item_cat[item_rank] = cat_rank[ev.item_cat]
    return _Grouped(int(count.sum()), behaviors, conflicts, count[by_rank], last[by_rank], tail_start[by_rank],
                    tail_item, tail_cat, item_cat, n_cats)


def preprocess_taobao(csv: Path, out: Path, cfg: TaobaoConfig, *, name: str,
                      provenance: Mapping[str, Any] | None = None, progress: bool = True,
                      expected_sha256: str | None = None, bucket_events: int | None = None,
                      compiled: bool | None = None) -> dict[str, Any]:
    """Preprocess ``UserBehavior.csv`` into sequence dataset ``out``; return its manifest.

    ``source`` records the size and sha256 of the bytes read; ``provenance``
    adds fields (path, sha256 when located...), ``expected_sha256`` is a
    configured checksum the file must match.

    Samples are taken at positions of each user's time-ordered history:

    - target: the event's (item, category), label 1; history: the previous up to
      ``max_length`` events' (item, category), oldest first. Positions with fewer
      than ``min_history`` earlier events are not samples; of the others each user
      gives at most ``samples_per_user``, the most recent ones.
    - negatives: each positive is followed by ``floor(negative_ratio)`` negatives
      (plus one with probability ``frac(negative_ratio)``) with the same user and
      history and a uniformly drawn other item (never the target) with its
      category; ratio 1.0 gives exactly 50% negatives.
    - split by user: users whose last event is later than the ``holdout_quantile``
      quantile of all users' last-event times are held out; held-out users ordered
      by (last event, user) are halved into val then test (val gets the odd user).
      Rows are train users (by user id), then val, then test users; per user,
      positions oldest first, each positive followed by its negatives.
    - ids: users, items and categories are each renumbered 0..n-1 by descending
      event count over the whole file (ties by raw id). An item's category (for
      negatives) is the category of its first event in the file.

    Output: ``sparse`` [N, 3] (user, item, category), ``dense`` [N, 0],
    ``labels``, ``history`` [H, 2] (item, category) with ``history_offsets``,
    ``sequence={"tables": [1, 2], "max_length": L}``.

    Memory (``_read_events``, ``_group``): the CSV is read once, in chunks; each
    good line's ids become int32 indices of first appearance (hash tables:
    memory grows with the distinct users, items and categories) and the event
    (21 bytes) goes to one of ``buckets`` by user, so a bucket holds whole
    users: a file with up to ``bucket_events`` events (estimated from the first
    chunk's line length and the file size; default ``BUCKET_EVENTS``) keeps its
    one bucket in memory, a longer one spills the buckets to files. Buckets are
    then taken one at a time, sorted by (user, time) and deduplicated (about 40
    bytes per event of the bucket while sorting); what stays is per user
    (count, last time, tail position: 24 bytes) and the last
    ``samples_per_user + max_length`` events of each user that gives samples
    (8 bytes each), never all events. The sample arrays of the write pass
    (about 60 bytes per sample) grow with the users. ``bucket_events`` changes
    memory only, never the output.
    """
    csv = Path(csv)
    if not csv.is_file():
        raise FileNotFoundError(f"input {csv} does not exist")
    check_provenance([csv], provenance)
    with DatasetWriter(out) as w:
        ev = _read_events(csv, cfg, name, progress, w.tmp / "events", bucket_events, compiled)
        source = source_records([csv], [ev.digest], provenance,
                                {csv.name: expected_sha256} if expected_sha256 else None)
        ev.bad.check(str(csv), ev.raw_lines, cfg.warn_bad_share, cfg.max_bad_share)
        outside = _check_time_range(csv, cfg, ev)
        if ev.spill.events == 0:
            raise ValueError(f"{csv}: no well-formed lines")
        g = _group(ev, cfg, name, progress, compiled)
        ev.spill.remove()
        return _write(w, csv, cfg, name, progress, ev, g, source, compiled, outside)


def _write(w: DatasetWriter, csv: Path, cfg: TaobaoConfig, name: str, progress: bool, ev: "_Events",
           g: "_Grouped", source: list[dict[str, Any]], compiled: bool | None,
           outside: dict[str, Any] | None) -> dict[str, Any]:
    """Samples from the grouped users (in renumbered ids), written to ``w``; -> the manifest."""
    n, raw_lines, bad, duplicates = g.events, ev.raw_lines, ev.bad, ev.spill.events - g.events
    behaviors = dict(zip(BEHAVIORS, g.behaviors.tolist()))
    n_users, n_items, n_cats = g.user_events.size, g.item_cat.size, int(g.n_cats)
    items, cats, item_cat, conflicts = g.tail_item, g.tail_cat, g.item_cat, g.conflicts
    user_events, starts, last = g.user_events, g.starts, g.last
    ends = starts + user_events

    threshold = float(np.quantile(last, cfg.holdout_quantile))
    held = np.flatnonzero(last > threshold)
    held = held[np.lexsort((held, last[held]))]
    n_val_users = math.ceil(held.size / 2)
    user_order = np.concatenate([np.flatnonzero(last <= threshold), held])
    split_users = np.cumsum([user_order.size - held.size, n_val_users])

    # positives: the most recent eligible positions of each user, in user_order
    k = np.clip(user_events - cfg.min_history, 0, cfg.samples_per_user)[user_order]
    pos = np.repeat(ends[user_order] - k, k) + _within(k)          # [P] event index of each positive
    pos_user = np.repeat(user_order, k).astype(np.int32)
    split_pos = np.concatenate(([0], np.cumsum(k)))[split_users]

    rng = np.random.default_rng(cfg.seed)
    extra = cfg.negative_ratio - math.floor(cfg.negative_ratio)
    mult = 1 + math.floor(cfg.negative_ratio) + (rng.random(pos.size) < extra if extra else 0)
    mult = np.broadcast_to(mult, pos.shape).astype(np.int64)
    event = np.repeat(pos, mult)                                      # [N] target event of each sample
    rows = event.size
    if rows == 0:
        raise ValueError(f"{csv}: no samples (min_history={cfg.min_history} leaves no positions)")
    neg = _within(mult) > 0
    target = items[event]
    if neg.any():
        if n_items < 2:
            raise ValueError(f"{csv}: negatives need at least two items")
        draw = rng.integers(0, n_items - 1, size=int(neg.sum()), dtype=np.int64).astype(np.int32)
        target[neg] = draw + (draw >= target[neg])
    target_cat = np.where(neg, item_cat[target], cats[event])
    sample_user = np.repeat(pos_user, mult)
    hist_start = np.maximum(np.repeat(starts[np.repeat(user_order, k)], mult), event - cfg.max_length)
    offsets = np.concatenate(([0], np.cumsum(event - hist_start)))
    del pos, pos_user, k
    r1, r2 = (int(x) for x in np.concatenate(([0], np.cumsum(mult)))[split_pos])
    empty = [s for s, size in (("train", r1), ("val", r2 - r1), ("test", rows - r2)) if size <= 0]
    if empty:
        raise ValueError(f"{csv}: the {' and '.join(empty)} split(s) would be empty (train/val/test samples "
                         f"{r1:,}/{r2 - r1:,}/{rows - r2:,} from {split_users[0]:,}/{n_val_users:,}/"
                         f"{held.size - n_val_users:,} users; holdout_quantile={cfg.holdout_quantile}; the "
                         f"users' last events lie in [{int(last.min())}, {int(last.max())}]): give more users")

    cards = [n_users, n_items, n_cats]
    train_counts = [np.bincount(sample_user[:r1], minlength=n_users),
                    np.bincount(target[:r1], minlength=n_items), np.bincount(target_cat[:r1], minlength=n_cats)]
    hist_counts = [np.zeros(n_users, np.int64), np.zeros(n_items, np.int64), np.zeros(n_cats, np.int64)]
    w.column("dense", np.float32, (rows, 0))
    sparse = w.column("sparse", np.int32, (rows, 3))
    w.column("labels", np.float32, (rows,))[:] = ~neg
    w.column("history_offsets", np.int64, (rows + 1,))[:] = offsets
    history = NpyColumn(w.tmp / "history.npy", np.int32, (2,))    # file writes: no mapped pages to fault in
    step = cfg.chunk_lines
    blocks = [(a, min(a + step, stop)) for start, stop in ((0, r1), (r1, rows)) for a in range(start, stop, step)]
    with tqdm(total=rows, unit="samples", desc=f"{name}: write", disable=not progress) as bar:
        for a, b in blocks:
            sparse[a:b] = np.stack([sample_user[a:b], target[a:b], target_cat[a:b]], axis=1)
            block = np.empty((offsets[b] - offsets[a], 2), dtype=np.int32)
            fill_history(hist_start[a:b], event[a:b], items, cats, block, hist_counts[1], hist_counts[2], b <= r1,
                         compiled)
            history.append(block)
            bar.update(b - a)
    history.finish()
    meta = {
        "name": name,
        "kind": "taobao",
        "source": source,
        "preprocess": cfg.to_dict(),
        "conventions": {
            "ids": "users, items, categories renumbered 0..n-1 by descending event count (ties by raw id)",
            "samples": "positions of time-ordered user histories, most recent samples_per_user; "
                       "each positive followed by its negatives (other item, with its first category)",
            "splits": "users with last event > holdout_quantile of last events are held out; "
                      "held-out users by last event halved val then test (val gets the odd user)",
        },
        "raw_lines": int(raw_lines),
        "events": int(n),
        "behaviors": behaviors,
        "bad_lines": {**bad.to_dict(), "duplicates": duplicates},
        "outside_time_range": outside,
        "skipped": {k: [csv.name] if v else [] for k, v in ev.skipped.items()},
        "holdout": {"threshold_timestamp": threshold,
                    "users": {"train": int(split_users[0]), "val": n_val_users,
                              "test": int(held.size - n_val_users)}},
        "item_category_conflicts": conflicts,
        "skew": coverage_from_counts(train_counts),
        "skew_with_history": coverage_from_counts([c + h for c, h in zip(train_counts, hist_counts)]),
    }
    return w.commit(cardinalities=cards, splits={"train": (0, r1), "val": (r1, r2), "test": (r2, rows)},
                    meta=meta, sequence={"tables": [1, 2], "max_length": cfg.max_length})
