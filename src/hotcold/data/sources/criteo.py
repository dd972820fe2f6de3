"""Streaming preprocessing of the Criteo click logs into the dataset format.

Inputs are Criteo TSV lines ``label \\t I1..I13 \\t C1..C26`` (40 fields): the
Kaggle ``train.txt`` or Terabyte ``day_N`` files (plain or ``.gz``, read as a
gzip stream). The text is read once, in chunks of ``chunk_lines`` lines, parsed
by a compiled kernel (``criteo_parse``, ``kernels``; without numba by
vectorised numpy, ``textparse``, with the same result), its ids counted
(``criteo_counts``) and its rows go straight to disk (``spill``); a second
pass over the written ids encodes them in place. Memory is bounded by the
chunk and the id vocabulary, never by the number of lines
(``preprocess_criteo``); the conventions, also recorded in the manifest:
``CriteoConfig``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from hotcold.data.format import DatasetWriter
from hotcold.data.skew import coverage_from_counts
from hotcold.data.sources.criteo_config import CriteoConfig
from hotcold.data.sources.criteo_counts import _DenseCounts, _HashedCounts, _SortedCounts
from hotcold.data.sources.criteo_parse import NUM_DENSE, NUM_TABLES, _parse_criteo
from hotcold.data.sources.inputs import Digest, check_provenance, read_chunks, source_records
from hotcold.data.sources.rawtext import NUL_REASON, NulReport, leading, nul_lines
from hotcold.data.sources.spill import NpyColumn, Spill
from hotcold.jit import KERNEL
from hotcold.data.sources.textparse import BadLines

FULL_LINES = {"criteo-kaggle": 45_840_617, "criteo-terabyte": 4_373_472_329}  # all of train.txt / 24 days
KAGGLE_DAYS = 7
TERABYTE_DAYS = 24
REASONS = {"fields": "wrong number of fields", "label": "label is not 0 or 1",
           "integer": "malformed integer", "hex": "categorical is not 8 hex digits or empty", "nul": NUL_REASON}
NUL_CODE = 1 + list(REASONS).index("nul")


# ---------------------------------------------------------------- Criteo


def _new_counts(cfg: CriteoConfig) -> _SortedCounts | _HashedCounts | _DenseCounts:
    if cfg.encoding == "modulo":
        return _DenseCounts(cfg.max_ind_range)
    return _HashedCounts() if KERNEL == "numba" else _SortedCounts()


class _Encoder:
    """Maps parsed raw ids to table rows under the configured convention."""

    def __init__(self, cfg: CriteoConfig, counts: _SortedCounts | _HashedCounts | _DenseCounts,
                 train_rows: int) -> None:
        self.cfg = cfg
        counted = counts.per_table()
        self.counts = counts
        if cfg.encoding == "modulo":
            self.cardinalities = [cfg.max_ind_range] * NUM_TABLES
            self.train_counts = [c for _, c in counted]
            self.full_cardinalities = None
            return
        self.train_counts, self.cardinalities, self.full_cardinalities = [], [], []
        for t, (values, counts_t) in enumerate(counted):
            keep = counts_t >= cfg.min_frequency
            kept = counts_t[keep]
            ids = np.empty(kept.size, dtype=np.int32)
            ids[np.lexsort((values[keep], -kept))] = np.arange(1, kept.size + 1, dtype=np.int32)
            counts.set_ids(t, keep, ids)
            self.train_counts.append(np.concatenate(([train_rows - kept.sum()], kept)))  # bucket 0 first
            self.cardinalities.append(kept.size + 1)
            self.full_cardinalities.append(int(keep.size))

    def encode(self, spilled: np.ndarray, missing: np.ndarray | None) -> np.ndarray:
        """int32 ids of spilled rows (``missing``: their missing ids, for the counts that keep them)."""
        return self.counts.encode(spilled, missing)


def _check_count(what: str, expected: int | None, found: int) -> None:
    if expected is not None and found != expected:
        raise ValueError(f"{what}: expected {expected:,} lines for the full input, found {found:,}")


def _require_splits(where: str, unit: str, train: int, val: int, test: int) -> None:
    """Refuse an empty split now rather than let training fail at evaluation."""
    empty = [name for name, n in (("train", train), ("val", val), ("test", test)) if n <= 0]
    if empty:
        raise ValueError(f"{where}: the {' and '.join(empty)} split(s) would be empty (train/val/test get "
                         f"{train:,}/{val:,}/{test:,} {unit}; the last day is halved into val and test): "
                         f"give more lines")


def _halve(start: int, lines: int) -> int:
    """End of the val half of ``lines`` lines from ``start`` (np.array_split: val gets the odd one)."""
    return start + math.ceil(lines / 2)


def preprocess_criteo(inputs: Sequence[Path], out: Path, cfg: CriteoConfig, *, name: str,
                      provenance: Mapping[str, Any] | None = None, progress: bool = True,
                      full: bool = False, expected_sha256: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Preprocess Criteo TSV ``inputs`` into dataset directory ``out``; return the manifest.

    Kaggle takes the one ``train.txt``; Terabyte the day files in day order.
    ``full`` (or ``cfg.check_rows``) says the inputs are the whole dataset, so
    their raw line count must be the known one (``cfg.expected_rows`` if given,
    else 45,840,617 / 4,373,472,329). ``source`` records the size and sha256
    of each input as read (pass 1; pass 2 must read the same bytes);
    ``provenance`` adds fields (url, sha256 at fetch...) per input file name,
    ``expected_sha256`` configured checksums the inputs must match.

    One pass over the text, one over the ids written: pass 1 validates every
    line, writes the good lines' dense features and labels to their columns and
    each id's hashed entry (numpy path: its raw value, and the missing marks
    aside; modulo: the id) to the sparse column, and counts the ids (Kaggle:
    all lines, the val/test lines' counts are taken back once the line count
    fixes the split; Terabyte: the train days). Pass 2 builds the vocabulary and
    rewrites the sparse column with the ids, chunk by chunk. Columns are written
    and read with file I/O, not memory maps, so resident memory is one chunk plus
    the id counts: with ``frequency`` encoding 16-40 bytes per distinct (table,
    raw id) of the input (hashed; the numpy path: 16 bytes, ~5x while merging),
    with ``modulo`` one int64 per (table, row) (26 * 8 * max_ind_range bytes of
    address space, resident only where ids occur). A file changed after pass 1
    does not matter: its bytes were read (and hashed for ``source``) once.
    """
    inputs = [Path(p) for p in inputs]
    kaggle = cfg.kind == "criteo-kaggle"
    if kaggle and len(inputs) != 1:
        raise ValueError(f"criteo-kaggle takes one train.txt, got {len(inputs)} inputs")
    if not kaggle and len(inputs) < 2:
        raise ValueError("criteo-terabyte needs at least two day files (the last one is val/test)")
    for p in inputs:
        if not p.is_file():
            raise FileNotFoundError(f"input {p} does not exist")
    check_provenance(inputs, provenance)
    expected = cfg.expected_rows if cfg.expected_rows is not None else (
        FULL_LINES[cfg.kind] if full or cfg.check_rows else None)
    where = ", ".join(p.name for p in inputs)
    if not kaggle and cfg.expected_rows is None and expected is not None and len(inputs) != TERABYTE_DAYS:
        raise ValueError(f"the full criteo-terabyte input is {TERABYTE_DAYS} day files, got {len(inputs)}")

    with DatasetWriter(out) as w:
        # pass 1 over the text: validate every line, spill the good ones' fields, count ids
        bad = BadLines(REASONS, cfg.on_bad_line)
        counts = _new_counts(cfg)
        # the columns are written as they are parsed; sparse holds the raw uint32 ids until pass 2
        dense = NpyColumn(w.tmp / "dense.npy", np.float32, (NUM_DENSE,))
        labels = NpyColumn(w.tmp / "labels.npy", np.float32, ())
        sparse = NpyColumn(w.tmp / "sparse.npy", np.uint32, (NUM_TABLES,))
        spill = Spill(w.tmp / "spill", {"missing": (np.uint8, ((NUM_TABLES + 7) // 8,))}) \
            if counts.keeps_missing else None
        bad_at = Spill(w.tmp / "bad", {"line": (np.int64, ())})   # raw line number of each bad line
        file_lines, offset = [], 0
        digests = [Digest() for _ in inputs]
        nuls, skipped = NulReport(), {"bom": [], "header": []}
        with tqdm(total=sum(p.stat().st_size for p in inputs), unit="B", unit_scale=True,
                  desc=f"{name}: pass 1 (parse)", disable=not progress) as bar:
            for i, path in enumerate(inputs):
                n_file, head = 0, 0
                # Kaggle's train split is known only once the lines are counted: count every line's ids
                # now and take the val/test lines' back below. Terabyte: all but the last file are train.
                counted = kaggle or i < len(inputs) - 1
                for first, buf in read_chunks(path, cfg.chunk_lines, digests[i], bar.update):
                    if first == 0:           # a BOM or a header line is not data: skipped, with a warning
                        buf, found = leading(buf, str(path))
                        head = found.lines
                        skipped["bom"] += [path.name] * found.bom
                        skipped["header"] += [path.name] * found.header
                        if not buf:
                            continue
                    at = first + head if first == 0 else first      # the chunk's first line in the file
                    p = _parse_criteo(buf, cfg.chunk_lines)
                    if p.lines.size < p.codes.size:
                        nul = nul_lines(buf)
                        p.codes[nul] = NUL_CODE
                        nuls.add(str(path), at, nul)
                    bad.add(path.name, at, p.codes)
                    if p.lines.size < p.codes.size:
                        bad_at.append(line=offset + at - head + np.flatnonzero(p.codes))
                    dense.append(np.log1p(np.maximum(p.ints, 0).astype(np.float64)))
                    labels.append(p.labels)
                    sparse.append(counts.record(p.hexv, p.missing, counted))
                    if spill is not None:
                        spill.append(missing=np.packbits(p.missing, axis=1, bitorder="little"))
                    n_file += p.codes.size
                file_lines.append(n_file)
                offset += n_file
                nuls.warn(str(path))
        dense.finish()
        labels.finish()
        if spill is not None:
            spill.close()
        bad_at.close()
        total, rows = offset, sparse.rows
        _check_count(where, expected, total)
        if kaggle:
            days = [total // KAGGLE_DAYS + (d < total % KAGGLE_DAYS) for d in range(KAGGLE_DAYS)]
            train_end = sum(days[:-1])
            val_end = _halve(train_end, days[-1])
        else:
            train_end = sum(file_lines[:-1])
            val_end = _halve(train_end, file_lines[-1])
        source = source_records(inputs, digests, provenance, expected_sha256)
        bad.check(where, total, cfg.warn_bad_share, cfg.max_bad_share)
        if rows == 0:
            raise ValueError(f"{where}: no well-formed lines")
        _require_splits(where, "lines", train_end, val_end - train_end, total - val_end)
        r1, r2 = (int(x) for x in np.array([train_end, val_end]) - _count_below(bad_at, [train_end, val_end],
                                                                                  cfg.chunk_lines))
        bad_at.remove()
        if kaggle:   # take back the ids of the val/test lines
            for a in range(r1, rows, cfg.chunk_lines):
                b = min(a + cfg.chunk_lines, rows)
                counts.take_back(sparse.read(a, b), _missing(spill, a, b))
        enc = _Encoder(cfg, counts, r1)

        # pass 2 over the spilled rows: encode the ids, write the columns
        _require_splits(where, "well-formed lines", r1, r2 - r1, rows - r2)
        sparse.retype(np.int32)                # rewritten in place: spilled uint32 -> int32 ids
        with tqdm(total=rows, unit="rows", desc=f"{name}: pass 2 (encode)", disable=not progress) as bar:
            for a in range(0, rows, cfg.chunk_lines):
                b = min(a + cfg.chunk_lines, rows)
                spilled = sparse.read(a, b).view(np.uint32)
                sparse.write_at(a, enc.encode(spilled, _missing(spill, a, b)))
                bar.update(b - a)
        sparse.finish()
        if spill is not None:
            spill.remove()
        meta = {
            "name": name,
            "kind": cfg.kind,
            "source": source,
            "preprocess": {**cfg.to_dict(), "full": bool(full)},
            "conventions": {
                "dense": "log(1 + max(x, 0)), missing -> 0",
                "ids": ("frequency: 0 = missing/rare/unseen, 1..n by descending train count (ties by raw value)"
                        if cfg.encoding == "frequency" else
                        f"modulo: int(hex, 16) % {cfg.max_ind_range}, missing -> 0"),
                "splits": ("7 days of divmod(lines, 7) lines (first days +1), days 0-5 train"
                           if kaggle else "all day files but the last train")
                          + "; last day halved val then test, val gets the odd line",
            },
            "raw_lines": int(total),
            "bad_lines": bad.to_dict(),
            "skipped": skipped,
            "skew": coverage_from_counts(enc.train_counts, rows=enc.cardinalities),
            "full_cardinalities": enc.full_cardinalities,
        }
        return w.commit(cardinalities=enc.cardinalities,
                        splits={"train": (0, r1), "val": (r1, r2), "test": (r2, rows)}, meta=meta)


def _missing(spill: Spill | None, start: int, stop: int) -> np.ndarray | None:
    """The spilled missing-id marks of rows ``[start, stop)``, if kept."""
    if spill is None:
        return None
    return np.unpackbits(spill.read("missing", start, stop), axis=1, count=NUM_TABLES, bitorder="little").view(bool)


def _count_below(lines: Spill, bounds: Sequence[int], chunk: int) -> np.ndarray:
    """How many of the (ascending) spilled line numbers lie below each of ``bounds``."""
    below = np.zeros(len(bounds), dtype=np.int64)
    for a in range(0, lines.rows, chunk):
        below += np.searchsorted(lines.read("line", a, a + chunk), bounds)
    return below
