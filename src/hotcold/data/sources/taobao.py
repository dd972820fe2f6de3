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
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from tqdm import tqdm

from hotcold.data.format import DatasetWriter
from hotcold.data.skew import coverage_from_counts
from hotcold.config import from_mapping, is_int, is_real, require
from hotcold.data.sources.inputs import Digest, _raw, check_provenance, open_input, read_chunks, source_records
from hotcold.data.sources.rawtext import NUL_REASON, NulReport, leading, nul_lines
from hotcold.data.sources.spill import NpyColumn
from hotcold.data.sources.taobao_kernels import (BEHAVIORS, NL, OUTSIDE, IdIndex, bucket_stats, by_bucket,
                                                 fill_history, group_events, parse_chunk, parse_index)
from hotcold.jit import KERNEL
from hotcold.data.sources.textparse import MAX_BAD_SHARE, WARN_BAD_SHARE, BadLines, check_bad_line_options

log = logging.getLogger(__name__)

REASONS = {"fields": "wrong number of fields (expected 5)",
           "integer": "user, item or category is not a non-negative integer, or timestamp not an integer",
           "behavior": "behavior_type is not one of pv, buy, cart, fav", "nul": NUL_REASON}
NUL_CODE = 1 + list(REASONS).index("nul")
OUTSIDE_REASON = {"time": "timestamp outside time_range"}
# The dataset's documented period (https://tianchi.aliyun.com/dataset/649): 25 Nov to 3 Dec 2017, China
# Standard Time (UTC+8), in epoch seconds [2017-11-25 00:00, 2017-12-04 00:00) UTC+8.
TAOBAO_PERIOD = (1_511_539_200, 1_512_316_800)
MAX_OUT_OF_RANGE_SHARE = 0.01   # more lines outside time_range than this share fail the run
_NO_RANGE = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class TaobaoConfig:
    """How to build Taobao samples; validated on construction."""

    max_length: int = 20            # history events per sample, at most
    min_history: int = 1            # earlier events a position needs to be a sample
    samples_per_user: int = 10      # most recent positions per user, at most
    negative_ratio: float = 1.0     # negatives per positive (fraction: drawn per positive)
    holdout_quantile: float = 0.7   # users whose last event is later are val/test
    seed: int = 0
    # epoch seconds [start, end): lines with a timestamp outside are dropped and counted, with a warning;
    # null keeps every timestamp. Default: the dataset's documented period (TAOBAO_PERIOD).
    time_range: tuple[int, int] | None = TAOBAO_PERIOD
    max_out_of_range_share: float = MAX_OUT_OF_RANGE_SHARE  # fail when more than this share is outside
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
        t = self.time_range
        require(t is None or (isinstance(t, (list, tuple)) and len(t) == 2 and all(is_int(x) for x in t)
                              and _NO_RANGE[0] <= t[0] < t[1] <= _NO_RANGE[1]), w,
                f"time_range must be null or [start, end] epoch seconds with start < end, got {t!r}")
        s = self.max_out_of_range_share
        require(is_real(s) and 0 <= s <= 1, w, f"max_out_of_range_share must be a number in [0, 1], got {s!r}")
        if t is not None:
            object.__setattr__(self, "time_range", (int(t[0]), int(t[1])))
        object.__setattr__(self, "negative_ratio", float(r))
        object.__setattr__(self, "holdout_quantile", float(q))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaobaoConfig":
        return from_mapping(cls, d, "taobao config")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["time_range"] = None if self.time_range is None else list(self.time_range)
        return d

    @property
    def time_bounds(self) -> tuple[int, int]:
        """``[start, end)`` of the timestamps kept (every int64 when ``time_range`` is null)."""
        return _NO_RANGE if self.time_range is None else self.time_range


def _renumber(counts: np.ndarray, raws: np.ndarray) -> np.ndarray:
    """int32 [n] new id of each index: 0..n-1 by descending count, ties by raw value."""
    rank = np.empty(counts.size, dtype=np.int32)
    rank[np.lexsort((raws, -counts))] = np.arange(counts.size, dtype=np.int32)
    return rank


def _within(lengths: np.ndarray) -> np.ndarray:
    """0..len-1 for each group of ``lengths``, concatenated."""
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


FIELDS = (("user", np.int32), ("item", np.int32), ("cat", np.int32), ("beh", np.int8), ("ts", np.int64))
BUCKET_EVENTS = 1 << 23      # events per spill bucket aimed at (bounds the grouping pass's memory)
GZIP_RATIO = 4               # a gzipped input is taken to hold this many times its size in text
READ_BYTES = 1 << 22        # bytes read at a time by the compiled read pass
MAX_BUCKETS = 128            # spill files stay few (5 per bucket); past this buckets grow instead


def _buckets(file_bytes: int, first_chunk: tuple[int, int], bucket_events: int | None) -> int:
    """Spill buckets for a file of ``file_bytes`` whose first chunk had ``(lines, bytes)``: enough that none
    should exceed ``bucket_events`` events (for a gzipped file, ``file_bytes`` is a guess of its text
    size, so the estimate may be rough: it only changes memory, never the output)."""
    per = BUCKET_EVENTS if bucket_events is None else bucket_events
    if not (is_int(per) and per >= 1):
        raise ValueError(f"bucket_events must be a positive integer, got {per!r}")
    lines, size = first_chunk
    estimate = file_bytes * lines / max(size, 1)
    return int(min(max(1, math.ceil(estimate / per)), MAX_BUCKETS))


class _EventSpill:
    """Events by user index (bucket: user % buckets), so a bucket holds whole users in file order. One bucket
    stays in memory (at most about ``BUCKET_EVENTS`` events); more go to files, one per bucket and field,
    by plain writes, so resident memory stays at one chunk."""

    def __init__(self, directory: Path, buckets: int, expected: int = 1 << 16, compiled: bool | None = None) -> None:
        self.directory, self.buckets, self.compiled = Path(directory), buckets, compiled
        self.events = 0
        self._held = [np.empty(expected if buckets == 1 else 0, dtype=t) for _, t in FIELDS]
        self._scratch = [np.empty(0, dtype=t) for _, t in FIELDS]
        self._sorted = [np.empty(0, dtype=t) for _, t in FIELDS]    # a chunk's events by bucket
        self._files: list[list[Any]] = []
        if buckets > 1:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._files = [[open(self._path(b, f), "wb") for f, _ in FIELDS] for b in range(buckets)]

    def _path(self, b: int, field: str) -> Path:
        return self.directory / f"bucket{b:04d}.{field}.bin"

    def _grow(self, end: int) -> None:
        if end > self._held[0].size:
            self._held = [np.concatenate([h[:self.events], np.empty(max(end, 2 * h.size) - self.events, dtype=h.dtype)])
                          for h in self._held]

    def append(self, user: np.ndarray, item: np.ndarray, cat: np.ndarray, beh: np.ndarray, ts: np.ndarray) -> None:
        cols = [np.ascontiguousarray(c, dtype=t) for c, (_, t) in zip((user, item, cat, beh, ts), FIELDS)]
        if self.buckets == 1:
            self._grow(self.events + user.size)
            for h, c in zip(self._held, cols):
                h[self.events:self.events + user.size] = c
            self.events += user.size
            return
        self.events += user.size
        if self._sorted[0].size < user.size:
            self._sorted = [np.empty(user.size, dtype=t) for _, t in FIELDS]
        cols, bounds = by_bucket(cols, self.buckets, self._sorted, self.compiled)
        for c, col in enumerate(cols):
            for b in np.flatnonzero(np.diff(bounds)):
                self._files[b][c].write(memoryview(col[bounds[b]:bounds[b + 1]]).cast("B"))

    def room(self, n: int) -> tuple[list[np.ndarray], int]:
        """Columns (user, item, cat, beh, ts) and the row from which a kernel may write up to ``n`` events;
        ``commit`` the ones written."""
        if self.buckets == 1:
            self._grow(self.events + n)
            return self._held, self.events
        if self._scratch[0].size < n:
            self._scratch = [np.empty(n, dtype=t) for _, t in FIELDS]
        return self._scratch, 0

    def commit(self, n: int) -> None:
        """Take the ``n`` events written to ``room``'s columns."""
        if self.buckets == 1:
            self.events += n
        else:
            self.append(*(c[:n] for c in self._scratch))

    def close(self) -> None:
        for files in self._files:
            for f in files:
                f.close()

    def read(self, b: int) -> list[np.ndarray]:
        """Bucket ``b``'s user, item, cat, beh, ts columns (the held bucket is handed over once)."""
        if self.buckets == 1:
            held, self._held = self._held, []
            return [h[:self.events] for h in held]
        return [np.fromfile(self._path(b, f), dtype=t) for f, t in FIELDS]

    def remove(self) -> None:
        self.close()
        self._held = []
        for b in range(len(self._files)):
            for f, _ in FIELDS:
                self._path(b, f).unlink(missing_ok=True)
        if self._files:
            self.directory.rmdir()


@dataclass
class _Events:
    """The first pass's result: the events spilled by user, the id indices and the line accounting."""

    spill: _EventSpill | None
    users: IdIndex
    items: IdIndex
    cats: IdIndex
    item_cat: np.ndarray     # int32 [items] category index of each item's first event
    raw_lines: int
    bad: BadLines
    digest: Digest
    outside: BadLines        # well-formed lines whose timestamp is outside time_range
    head: int = 0            # lines skipped before the data (a header line)
    skipped: dict[str, bool] = dataclasses.field(default_factory=lambda: {"bom": False, "header": False})
    nuls: NulReport = dataclasses.field(default_factory=NulReport)


def _read_events(csv: Path, cfg: TaobaoConfig, name: str, progress: bool, directory: Path,
                 bucket_events: int | None, compiled: bool | None) -> _Events:
    """Parse ``csv`` chunk by chunk; index the ids in order of first appearance and spill the events."""
    compiled = KERNEL == "numba" if compiled is None else compiled
    ev = _Events(None, IdIndex(compiled), IdIndex(compiled), IdIndex(compiled), np.zeros(1 << 10, dtype=np.int32),
                 0, BadLines(REASONS, cfg.on_bad_line), Digest(), BadLines(OUTSIDE_REASON, cfg.on_bad_line))
    try:
        with tqdm(total=csv.stat().st_size, unit="B", unit_scale=True, desc=f"{name}: read",
                  disable=not progress) as bar:
            (_read_compiled if compiled else _read_numpy)(csv, cfg, ev, directory, bucket_events, bar.update)
    finally:
        if ev.spill is not None:
            ev.spill.close()
    ev.nuls.warn(str(csv))
    if ev.spill is None:
        ev.spill = _EventSpill(directory, 1)
    ev.item_cat = ev.item_cat[:ev.items.size]
    return ev


def _new_spill(csv: Path, cfg: TaobaoConfig, directory: Path, bucket_events: int | None, lines: int,
               size: int, compiled: bool) -> _EventSpill:
    """The spill for ``csv`` whose first ``lines`` lines took ``size`` bytes."""
    file_bytes = csv.stat().st_size * (GZIP_RATIO if csv.suffix == ".gz" else 1)
    expected = math.ceil(1.05 * file_bytes * lines / max(size, 1)) + cfg.chunk_lines
    return _EventSpill(directory, _buckets(file_bytes, (lines, size), bucket_events), expected, compiled)


def _read_numpy(csv: Path, cfg: TaobaoConfig, ev: _Events, directory: Path, bucket_events: int | None,
                progress: Callable[[int], Any]) -> None:
    """The read pass by ``parse_chunk`` and ``IdIndex.index`` on chunks of ``chunk_lines`` lines."""
    for first, buf in read_chunks(csv, cfg.chunk_lines, ev.digest, progress):
        if first == 0:
            buf = _leading(csv, ev, buf)
            if not buf:
                continue
        at = first + ev.head if first == 0 else first        # the chunk's first line in the file
        codes, good, vals, beh = parse_chunk(buf, cfg.chunk_lines, False)
        if ev.spill is None:
            ev.spill = _new_spill(csv, cfg, directory, bucket_events, codes.size, len(buf), False)
        t_lo, t_hi = cfg.time_bounds
        out = (vals[:, 3] < t_lo) | (vals[:, 3] >= t_hi)
        if out.any():
            codes[good[out]] = OUTSIDE
            vals, beh = vals[~out], beh[~out]
        if good.size < codes.size:
            _nul(ev, csv, at, codes, nul_lines(buf))
        _count_bad(ev, csv.name, at, codes, int(out.sum()))
        ev.raw_lines = at - ev.head + codes.size
        if not beh.size:
            continue
        user, _ = ev.users.index(vals[:, 0])
        item, new_items = ev.items.index(vals[:, 1])
        cat, _ = ev.cats.index(vals[:, 2])
        _room_item_cat(ev, ev.items.size)
        ev.item_cat[ev.items.size - new_items.size:ev.items.size] = cat[new_items]
        ev.spill.append(user, item, cat, beh, vals[:, 3])


def _leading(csv: Path, ev: _Events, first_chunk: bytes) -> bytes:
    """The first chunk without a BOM and a header line (each skipped with a warning, ``rawtext.leading``)."""
    rest, found = leading(first_chunk, str(csv))
    ev.head = found.lines
    ev.skipped = {"bom": found.bom, "header": found.header}
    return rest


def _nul(ev: _Events, csv: Path, first: int, codes: np.ndarray, lines: np.ndarray) -> None:
    """Give the lines ``lines`` of a chunk (whose first line is ``first`` of the file), which hold NUL bytes,
    their own reason code."""
    if lines.size:
        codes[lines] = NUL_CODE
        ev.nuls.add(str(csv), first, lines)


def _count_bad(ev: _Events, file: str, first: int, codes: np.ndarray, outside: int) -> None:
    """Account a chunk's reason codes: malformed lines in ``ev.bad``; the ``outside`` lines of code
    ``OUTSIDE`` (timestamp outside time_range) in ``ev.outside``."""
    if outside:
        is_out = codes == OUTSIDE
        ev.outside.add(file, first, is_out.astype(np.int8))
        codes = np.where(is_out, np.int8(0), codes)
    ev.bad.add(file, first, codes)


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


def _room_item_cat(ev: _Events, n: int) -> None:
    if n > ev.item_cat.size:
        ev.item_cat = np.concatenate([ev.item_cat, np.zeros(max(n, 2 * ev.item_cat.size) - ev.item_cat.size,
                                                            dtype=np.int32)])


def _read_compiled(csv: Path, cfg: TaobaoConfig, ev: _Events, directory: Path, bucket_events: int | None,
                   progress: Callable[[int], Any]) -> None:
    """The read pass by one kernel (``parse_index``: parse, index the ids, write the events) over blocks of
    ``READ_BYTES`` read straight into one buffer (hashed as they are read); a block's unfinished last line
    is carried to the next."""
    m = cfg.chunk_lines
    t_lo, t_hi = cfg.time_bounds
    codes, vals = np.empty(m, dtype=np.int8), np.empty((m, 3), dtype=np.int64)
    sizes = np.zeros(3, dtype=np.int64)
    buf = np.empty(READ_BYTES + 1, dtype=np.uint8)
    keep, told = 0, 0                                  # bytes carried over; file bytes told to the progress bar
    start = True                                       # the file's first block: a BOM or header may lead it
    with open_input(csv, ev.digest) as f:
        raw = _raw(f)
        while True:
            end = keep
            while end < buf.size - 1 and (n := f.readinto(memoryview(buf)[end:buf.size - 1])):
                end += n
            progress(raw.count - told)
            told = raw.count
            if end == keep:                            # the end of the file
                if keep == 0:
                    break
                buf[end] = NL                          # its last line lacks a newline
                stop = end = end + 1
            else:
                stop = _after_last_newline(buf, end)
                if stop == 0:                          # one line longer than the buffer
                    buf = np.concatenate([buf, np.empty(buf.size, dtype=np.uint8)])
                    keep = end
                    continue
            text, pos = buf[:stop], 0
            if start:
                pos, start = stop - len(_leading(csv, ev, text.tobytes())), False
            while pos < stop:
                raws = [index.reserve(m) for index in (ev.users, ev.items, ev.cats)]
                _room_item_cat(ev, ev.items.size + m)
                if ev.spill is None:
                    lines = min(m, int(np.count_nonzero(text[:1 << 20] == NL)))
                    ev.spill = _new_spill(csv, cfg, directory, bucket_events, max(lines, 1),
                                          _after_last_newline(text[:1 << 20], min(stop, 1 << 20)), True)
                cols, at = ev.spill.room(m)
                sizes[:] = ev.users.size, ev.items.size, ev.cats.size
                begin = pos
                pos, lines, good, outside = parse_index(text, pos, codes, vals, ev.users.table, raws[0],
                                                        ev.items.table, raws[1], ev.cats.table, raws[2], sizes,
                                                        ev.item_cat, *cols, at, t_lo, t_hi)
                ev.users.size, ev.items.size, ev.cats.size = (int(x) for x in sizes)
                if good + outside < lines:                    # malformed lines: any NUL bytes among them?
                    _nul(ev, csv, ev.raw_lines + ev.head, codes, nul_lines(text[begin:pos]))
                _count_bad(ev, csv.name, ev.raw_lines + ev.head, codes[:lines], outside)
                ev.raw_lines += lines
                ev.spill.commit(good)
            keep = end - stop
            buf[:keep] = buf[stop:end]


def _after_last_newline(buf: np.ndarray, end: int) -> int:
    """The position after the last ``\\n`` in ``buf[:end]``; 0 when there is none."""
    look = 1 << 12
    while True:
        lo = max(end - look, 0)
        nl = np.flatnonzero(buf[lo:end] == NL)
        if nl.size:
            return lo + int(nl[-1]) + 1
        if lo == 0:
            return 0
        look *= 4


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
