"""Preprocessing of Taobao user behaviour (``UserBehavior.csv``) into a sequence dataset.

The input has no header; each line is ``user_id,item_id,category_id,
behavior_type,timestamp`` with behavior_type in pv, buy, cart, fav. A line
that repeats an earlier one exactly is dropped and counted (manifest
``bad_lines.duplicates``): it would put the target item into its own
history. As the TBSM preprocessing does, every event (any behaviour) joins
its user's time-ordered history, and samples are taken at positions of that
history (``preprocess_taobao``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from tqdm import tqdm

from hotcold.data.format import DatasetWriter
from hotcold.data.skew import coverage_from_counts
from hotcold.config import from_mapping, is_int, is_real, require
from hotcold.data.sources.inputs import Digest, check_provenance, count_lines, read_chunks, source_records
from hotcold.data.sources.textparse import (MAX_BAD_SHARE, WARN_BAD_SHARE, BadLines, check_bad_line_options,
                                            parse_ints, tokenize, words)

BEHAVIORS = ("pv", "buy", "cart", "fav")
REASONS = {"fields": "wrong number of fields (expected 5)",
           "integer": "user, item or category is not a non-negative integer, or timestamp not an integer",
           "behavior": "behavior_type is not one of pv, buy, cart, fav"}
_BEHAVIOR_CODES = [int.from_bytes(b.encode(), "little") for b in BEHAVIORS]
_BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(5)], dtype=np.uint64)  # [0..4 bytes]
INT_COLUMNS = [0, 1, 2, 4]   # user, item, category, timestamp


@dataclass(frozen=True)
class TaobaoConfig:
    """How to build Taobao samples; validated on construction."""

    max_length: int = 20            # history events per sample, at most
    min_history: int = 1            # earlier events a position needs to be a sample
    samples_per_user: int = 10      # most recent positions per user, at most
    negative_ratio: float = 1.0     # negatives per positive (fraction: drawn per positive)
    holdout_quantile: float = 0.7   # users whose last event is later are val/test
    seed: int = 0
    on_bad_line: str = "skip"       # skip (count) | error (stop with file and line)
    warn_bad_share: float = WARN_BAD_SHARE  # warn when more than this share of the lines is malformed
    max_bad_share: float = MAX_BAD_SHARE    # fail when more than this share is (skip policy)
    chunk_lines: int = 1 << 16

    def __post_init__(self) -> None:
        w = "taobao config"
        for name, low in (("max_length", 1), ("min_history", 0), ("samples_per_user", 1), ("seed", 0),
                          ("chunk_lines", 1)):
            v = getattr(self, name)
            require(is_int(v) and v >= low, w, f"{name} must be an integer >= {low}, got {v!r}")
        r = self.negative_ratio
        require(is_real(r) and 0 <= r < math.inf, w,
                     f"negative_ratio must be a finite number >= 0, got {r!r}")
        q = self.holdout_quantile
        require(is_real(q) and 0 < q < 1, w,
                     f"holdout_quantile must be in (0, 1), got {q!r}")
        check_bad_line_options(w, self.on_bad_line, self.warn_bad_share, self.max_bad_share)
        object.__setattr__(self, "negative_ratio", float(r))
        object.__setattr__(self, "holdout_quantile", float(q))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaobaoConfig":
        return from_mapping(cls, d, "taobao config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_chunk(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """-> (reason codes [lines], good line indices [G], int64 [G, 4] user/item/category/timestamp,
    int8 [G] behaviour)."""
    tok = tokenize(buf, b",", 5)
    s, n = tok.starts, tok.lens
    vals, ok = parse_ints(tok.u8, s[:, INT_COLUMNS], n[:, INT_COLUMNS])
    int_ok = ok.all(1) & (n[:, INT_COLUMNS] > 0).all(1) & (vals[:, :3] >= 0).all(1)
    blen = n[:, 3]
    word = words(tok.u8)[s[:, 3]] & _BYTE_MASKS[np.minimum(blen, 4)]
    behavior = np.full(blen.size, -1, dtype=np.int8)
    for i, (name, code) in enumerate(zip(BEHAVIORS, _BEHAVIOR_CODES)):
        behavior[(blen == len(name)) & (word == np.uint64(code))] = i
    code = np.select([~int_ok, behavior < 0], [2, 3], 0).astype(np.int8)
    keep = code == 0
    return tok.line_codes(code), tok.good[keep], vals[keep], behavior[keep]


def _first_occurrences(cols: np.ndarray, behavior: np.ndarray) -> np.ndarray:
    """bool [n]: the events that do not repeat an earlier line exactly (all five fields).

    A repeated event would make the target item its own most recent history event.
    """
    order = np.lexsort((behavior, *cols[::-1]))       # stable: equal rows stay in file order
    same = np.ones(order.size - 1, dtype=bool)
    for column in (behavior, *cols):
        sorted_column = column[order]
        same &= sorted_column[1:] == sorted_column[:-1]
    keep = np.ones(behavior.size, dtype=bool)
    keep[order[1:][same]] = False
    return keep


def _renumber(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Ids 0..n-1 by descending count (ties by raw value) -> (int32 new ids, n)."""
    uniq, inverse, counts = np.unique(raw, return_inverse=True, return_counts=True)
    rank = np.empty(uniq.size, dtype=np.int32)
    rank[np.lexsort((uniq, -counts))] = np.arange(uniq.size, dtype=np.int32)
    return rank[inverse.reshape(-1)], int(uniq.size)


def _within(lengths: np.ndarray) -> np.ndarray:
    """0..len-1 for each group of ``lengths``, concatenated."""
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def preprocess_taobao(csv: Path, out: Path, cfg: TaobaoConfig, *, name: str,
                      provenance: Mapping[str, Any] | None = None, progress: bool = True,
                      expected_sha256: str | None = None) -> dict[str, Any]:
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

    Memory: the CSV is streamed in chunks, but all events are kept in memory as
    numpy columns, preallocated from a line count: 4 int64 raw columns plus the
    behaviour byte, 33 bytes per line (~3.3 GB for the ~100M lines of the real
    file), with ~2.5 GB of temporaries while renumbering and sorting (and a
    compacted copy of the columns when duplicate lines are dropped), then 8 bytes
    per event (item, category) plus ~30 bytes per sample while writing. Histories
    (up to 8 * max_length bytes per sample) go straight to the memmapped columns.
    """
    csv = Path(csv)
    if not csv.is_file():
        raise FileNotFoundError(f"input {csv} does not exist")
    check_provenance([csv], provenance)

    # read all events into preallocated columns
    raw_lines = count_lines(csv, progress)
    cols = np.empty((4, raw_lines), dtype=np.int64)   # user, item, category, timestamp
    behavior = np.empty(raw_lines, dtype=np.int8)
    bad = BadLines(REASONS, cfg.on_bad_line)
    n = 0
    with tqdm(total=raw_lines, unit="lines", desc=f"{name}: read", disable=not progress) as bar:
        digest = Digest()
        for first, buf in read_chunks(csv, cfg.chunk_lines, digest):
            codes, good, vals, beh = _parse_chunk(buf)
            bad.add(csv.name, first, codes)
            if n + good.size > raw_lines:
                raise ValueError(f"{csv}: more lines than counted (file changed?)")
            cols[:, n:n + good.size], behavior[n:n + good.size] = vals.T, beh
            n += good.size
            bar.update(codes.size)
    source = source_records([csv], [digest], provenance, {csv.name: expected_sha256} if expected_sha256 else None)
    bad.check(str(csv), raw_lines, cfg.warn_bad_share, cfg.max_bad_share)
    if n == 0:
        raise ValueError(f"{csv}: no well-formed lines")
    cols, behavior = cols[:, :n], behavior[:n]
    keep = _first_occurrences(cols, behavior)
    duplicates = n - int(keep.sum())
    if duplicates:
        cols, behavior, n = cols[:, keep], behavior[keep], n - duplicates
    del keep
    behaviors = dict(zip(BEHAVIORS, np.bincount(behavior, minlength=len(BEHAVIORS)).tolist()))
    del behavior

    user, n_users = _renumber(cols[0])
    item, n_items = _renumber(cols[1])
    cat, n_cats = _renumber(cols[2])
    ts = cols[3].copy()
    del cols
    first_event = np.full(n_items, n, dtype=np.int64)
    np.minimum.at(first_event, item, np.arange(n, dtype=np.int64))
    item_cat = cat[first_event]                        # [items] category of each item's first event
    conflicts = int(np.count_nonzero(cat != item_cat[item]))
    del first_event

    order = np.lexsort((ts, user))                     # stable: equal times keep file order
    user_events = np.bincount(user, minlength=n_users)
    del user
    items, cats, ts = item[order], cat[order], ts[order]
    del order, item, cat
    ends = np.cumsum(user_events)
    starts = ends - user_events
    last = ts[ends - 1]
    del ts

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
                         f"{held.size - n_val_users:,} users; holdout_quantile={cfg.holdout_quantile}): "
                         f"give more users")

    cards = [n_users, n_items, n_cats]
    train_counts = [np.bincount(sample_user[:r1], minlength=n_users),
                    np.bincount(target[:r1], minlength=n_items), np.bincount(target_cat[:r1], minlength=n_cats)]
    hist_counts = [np.zeros(n_users, np.int64), np.zeros(n_items, np.int64), np.zeros(n_cats, np.int64)]
    with DatasetWriter(out) as w:
        w.column("dense", np.float32, (rows, 0))
        sparse = w.column("sparse", np.int32, (rows, 3))
        w.column("labels", np.float32, (rows,))[:] = ~neg
        w.column("history_offsets", np.int64, (rows + 1,))[:] = offsets
        history = w.column("history", np.int32, (int(offsets[-1]), 2))
        step = cfg.chunk_lines
        blocks = [(a, min(a + step, stop)) for start, stop in ((0, r1), (r1, rows)) for a in range(start, stop, step)]
        with tqdm(total=rows, unit="samples", desc=f"{name}: write", disable=not progress) as bar:
            for a, b in blocks:
                sparse[a:b] = np.stack([sample_user[a:b], target[a:b], target_cat[a:b]], axis=1)
                lengths = event[a:b] - hist_start[a:b]
                idx = np.repeat(hist_start[a:b], lengths) + _within(lengths)
                history[offsets[a]:offsets[b]] = np.stack([items[idx], cats[idx]], axis=1)
                if b <= r1:
                    hist_counts[1] += np.bincount(items[idx], minlength=n_items)
                    hist_counts[2] += np.bincount(cats[idx], minlength=n_cats)
                bar.update(b - a)
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
            "holdout": {"threshold_timestamp": threshold,
                        "users": {"train": int(split_users[0]), "val": n_val_users,
                                  "test": int(held.size - n_val_users)}},
            "item_category_conflicts": conflicts,
            "skew": coverage_from_counts(train_counts),
            "skew_with_history": coverage_from_counts([c + h for c, h in zip(train_counts, hist_counts)]),
        }
        return w.commit(cardinalities=cards, splits={"train": (0, r1), "val": (r1, r2), "test": (r2, rows)},
                        meta=meta, sequence={"tables": [1, 2], "max_length": cfg.max_length})
