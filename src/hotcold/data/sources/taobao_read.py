"""The Taobao preprocessor's read pass: ``UserBehavior.csv`` parsed, its ids indexed, its events spilled by
user and its lines counted by reason.

Without numba the pass parses chunks of ``chunk_lines`` lines
(``taobao_parse.parse_chunk``) and indexes their ids (``IdIndex.index``);
compiled, one kernel (``taobao_ids.parse_index``) does both over blocks of
``READ_BYTES`` read straight into one buffer. Either way a leading BOM or
header line is skipped, malformed lines and lines outside ``time_range`` are
counted by reason, and the events go to a ``taobao_spill._EventSpill``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from hotcold.data.sources.inputs import Digest, _raw, open_input, read_chunks
from hotcold.data.sources.rawtext import NUL_REASON, NulReport, leading, nul_lines
from hotcold.data.sources.taobao_config import TaobaoConfig
from hotcold.data.sources.taobao_ids import IdIndex, parse_index
from hotcold.data.sources.taobao_parse import NL, OUTSIDE, parse_chunk
from hotcold.data.sources.taobao_spill import _buckets, _EventSpill
from hotcold.jit import KERNEL
from hotcold.data.sources.textparse import BadLines

REASONS = {"fields": "wrong number of fields (expected 5)",
           "integer": "user, item or category is not a non-negative integer, or timestamp not an integer",
           "behavior": "behavior_type is not one of pv, buy, cart, fav", "nul": NUL_REASON}
NUL_CODE = 1 + list(REASONS).index("nul")
OUTSIDE_REASON = {"time": "timestamp outside time_range"}
GZIP_RATIO = 4               # a gzipped input is taken to hold this many times its size in text
READ_BYTES = 1 << 22        # bytes read at a time by the compiled read pass


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
