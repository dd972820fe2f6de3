"""Streaming preprocessing of the Criteo click logs into the dataset format.

Inputs are Criteo TSV lines ``label \\t I1..I13 \\t C1..C26`` (40 fields): the
Kaggle ``train.txt`` or Terabyte ``day_N`` files (plain or ``.gz``, read as a
gzip stream). Lines are parsed in chunks of ``chunk_lines`` with vectorised
numpy (no Python loop per field), so memory is bounded by the chunk and the id
vocabulary, never by the number of lines.

Two passes over the inputs: pass 1 validates every line, counts the good ones
and counts each (table, id) of the train split; pass 2 encodes and writes the
columns chunk by chunk into ``DatasetWriter`` memmaps. The id counts take
16 bytes per distinct (table, raw id) in the train split (~0.5 GB for Kaggle,
~2.5 GB while merging) with ``frequency`` encoding, and one int64 per (table,
row) with ``modulo`` (26 * 8 * max_ind_range bytes of address space, resident
only where ids occur).

Conventions (also recorded in the manifest):

- dense: ``log(1 + max(x, 0))`` as float32; a missing integer is 0.
- ``frequency`` encoding: per table, ids seen at least ``min_frequency`` times
  in the train split get 1..n by descending train count (ties: ascending raw
  value); 0 is the shared bucket of missing, rare and unseen (val/test) ids.
  Cardinality n + 1.
- ``modulo`` encoding (torchrec/DLRM hashing): ``int(hex, 16) % max_ind_range``,
  a missing id is read as ``"0"`` (id 0) as the DLRM reference does.
  Cardinality ``max_ind_range`` for every table.
- splits: Kaggle's lines are cut into 7 "days" as DLRM does (``divmod(lines,
  7)``, the first ``lines % 7`` days one line longer); days 0-5 are train.
  Terabyte: all but the last given day file are train. The last day is halved
  into val then test with ``np.array_split`` rounding (val gets the odd line).
  Boundaries are on raw line numbers; skipped bad lines do not shift them.
"""
from __future__ import annotations

import dataclasses
import gzip
import math
import numbers
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from hotcold.config import ConfigError
from hotcold.data.format import DatasetWriter
from hotcold.data.skew import DEFAULT_FRACTIONS, coverage_curve, share_key

KINDS = ("criteo-kaggle", "criteo-terabyte")
ENCODINGS = ("frequency", "modulo")
BAD_LINE_POLICIES = ("skip", "error")
FULL_LINES = {"criteo-kaggle": 45_840_617, "criteo-terabyte": 4_373_472_329}  # all of train.txt / 24 days
KAGGLE_DAYS = 7
TERABYTE_DAYS = 24
NUM_DENSE, NUM_TABLES = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_TABLES
MAX_INT_DIGITS = 16        # longer integers are malformed (two 8-digit SWAR words)
MAX_BAD_EXAMPLES = 10
MERGE_MIN_KEYS = 1 << 16   # the id counter merges its buffer once it holds this many keys (or the table's size)
PAD_BYTES = 32             # zeros after a chunk so fixed-width gathers never leave the buffer
REASONS = {"fields": "wrong number of fields", "label": "label is not 0 or 1",
           "integer": "malformed integer", "hex": "categorical is not 8 hex digits or empty"}


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_config(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def config_from_dict(cls: type, d: Mapping[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from a plain dict, rejecting unknown keys by name."""
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(allowed))
    check_config(not unknown, where, f"unknown key(s) {unknown}; allowed: {allowed}")
    try:
        return cls(**dict(d))
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


@dataclass(frozen=True)
class CriteoConfig:
    """How to preprocess Criteo; validated on construction."""

    kind: str                       # criteo-kaggle | criteo-terabyte
    encoding: str = "frequency"     # frequency | modulo
    min_frequency: int = 1          # frequency: train ids seen fewer times share bucket 0
    max_ind_range: int = 10_000_000  # modulo: rows per table
    on_bad_line: str = "skip"       # skip (count) | error (stop with file and line)
    chunk_lines: int = 1 << 16
    expected_rows: int | None = None  # raw lines the inputs must hold (checked when given)
    check_rows: bool = False        # inputs are the full dataset: check the known line count

    def __post_init__(self) -> None:
        w = "criteo config"
        check_config(self.kind in KINDS, w, f"unknown kind {self.kind!r}; allowed: {list(KINDS)}")
        check_config(self.encoding in ENCODINGS, w, f"encoding must be one of {list(ENCODINGS)}, got {self.encoding!r}")
        check_config(_is_int(self.min_frequency) and self.min_frequency >= 1, w,
                     f"min_frequency must be an integer >= 1, got {self.min_frequency!r}")
        check_config(_is_int(self.max_ind_range) and 1 <= self.max_ind_range < 2**31, w,
                     f"max_ind_range must be an integer in [1, 2**31), got {self.max_ind_range!r}")
        check_config(self.on_bad_line in BAD_LINE_POLICIES, w,
                     f"on_bad_line must be one of {list(BAD_LINE_POLICIES)}, got {self.on_bad_line!r}")
        check_config(_is_int(self.chunk_lines) and self.chunk_lines >= 1, w,
                     f"chunk_lines must be a positive integer, got {self.chunk_lines!r}")
        check_config(self.expected_rows is None or (_is_int(self.expected_rows) and self.expected_rows >= 0), w,
                     f"expected_rows must be a non-negative integer or null, got {self.expected_rows!r}")
        check_config(isinstance(self.check_rows, bool), w, f"check_rows must be true or false, got {self.check_rows!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CriteoConfig":
        return config_from_dict(cls, d, "criteo config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- shared line parsing


def read_chunks(path: Path, chunk_lines: int) -> Iterator[tuple[int, bytes]]:
    """``(index of the chunk's first line, its lines joined)``; ``.gz`` is decompressed as a stream."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        first = 0
        while lines := list(islice(f, chunk_lines)):
            yield first, b"".join(lines)
            first += len(lines)


def count_lines(path: Path, progress: bool = False, block: int = 1 << 20) -> int:
    """Lines of a (possibly gzipped) text file; a last line without newline counts."""
    opener = gzip.open if path.suffix == ".gz" else open
    n, last = 0, b"\n"
    with opener(path, "rb") as f, tqdm(total=path.stat().st_size if path.suffix != ".gz" else None,
                                       unit="B", unit_scale=True, desc=f"count {path.name}",
                                       disable=not progress) as bar:
        while data := f.read(block):
            n += data.count(b"\n")
            last = data[-1:]
            bar.update(len(data))
    return n + (last != b"\n")


@dataclass
class Tokens:
    """Fields of the lines of one chunk: byte offsets into ``u8`` (zero-padded)."""

    u8: np.ndarray       # uint8 [bytes + PAD_BYTES]
    n_lines: int
    good: np.ndarray     # int64 [G] indices of the lines with the expected field count
    starts: np.ndarray   # int32 [G, F] first byte of each field
    lens: np.ndarray     # int32 [G, F] field length in bytes


def tokenize(buf: bytes, sep: bytes, n_fields: int) -> Tokens:
    """Split whole lines (``\\n`` or ``\\r\\n``) at ``sep`` without a Python loop per line."""
    if not buf.endswith(b"\n"):
        buf += b"\n"
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    u8 = np.frombuffer(buf + bytes(PAD_BYTES), dtype=np.uint8)
    body = u8[:len(buf)]
    seps = np.flatnonzero((body == sep[0]) | (body == 10)).astype(np.int32)   # chunks are far below 2 GiB
    nl_at = np.flatnonzero(body[seps] == 10)        # [lines] index in seps of each line's newline
    fields = np.diff(nl_at, prepend=-1)
    good = np.flatnonzero(fields == n_fields)
    line_starts = np.concatenate(([0], seps[nl_at[:-1]] + 1)).astype(np.int32)
    del fields
    starts = np.empty((good.size, n_fields), dtype=np.int32)
    starts[:, 0] = line_starts[good]
    lens = seps[nl_at[good, None] - (n_fields - 1) + np.arange(n_fields)]   # [G, F] separator after each field
    starts[:, 1:] = lens[:, :-1] + 1
    lens -= starts
    return Tokens(u8, int(nl_at.size), good, starts, lens)


def _words(u8: np.ndarray) -> np.ndarray:
    """uint64 view of the 8 bytes at every offset of ``u8`` (unaligned, little-endian: byte 0 lowest)."""
    return np.ndarray((u8.size - 7,), dtype="<u8", buffer=u8, strides=(1,))


def _u64(v: int) -> np.uint64:
    return np.uint64(v)


_ASCII0 = _u64(0x3030303030303030)
_HIGH_NIBBLES = _u64(0xF0F0F0F0F0F0F0F0)
_HIGH_BITS = _u64(0x8080808080808080)
_SIXES = _u64(0x0606060606060606)
_SHIFT = np.array([0] + [8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)        # [9] by digit count
_FILL = np.array([0x3030303030303030 >> (8 * n) if n < 8 else 0 for n in range(9)], dtype=np.uint64)


def _at_least(x: np.ndarray, lo: int) -> np.ndarray:
    """0x80 in each byte of ``x`` that is >= ``lo`` (bytes must be < 0x80, so nothing carries)."""
    return (x + _u64((0x80 - lo) * 0x0101010101010101)) & _HIGH_BITS


def _decimal8(words: np.ndarray, pos: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` (0..8) decimal digits at ``pos`` -> (int64 values, ok mask), 8 digits per uint64 (SWAR)."""
    x = np.where(n == 0, _u64(0), words[pos] << _SHIFT[n]) | _FILL[n]   # left-padded with '0', MSD in byte 0
    t = x ^ _ASCII0
    ok = ((t & _HIGH_NIBBLES) == 0) & (((t + _SIXES) & _HIGH_NIBBLES) == 0)
    t = (t * _u64(10) + (t >> _u64(8))) & _u64(0x00FF00FF00FF00FF)
    t = (t * _u64(100) + (t >> _u64(16))) & _u64(0x0000FFFF0000FFFF)
    t = (t * _u64(10000) + (t >> _u64(32))) & _u64(0xFFFFFFFF)
    return t.astype(np.int64), ok


def parse_ints(u8: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal integers (at most 16 digits) at ``starts``/``lens`` -> (int64 values, ok mask).

    Empty fields read 0 with ok True (the caller decides whether that is allowed).
    """
    neg = u8[starts] == ord("-")
    first = starts + neg
    ndig = lens - neg
    ok = (lens == 0) | ((ndig >= 1) & (ndig <= MAX_INT_DIGITS))
    ndig = np.clip(ndig, 0, MAX_INT_DIGITS)
    n_high = np.maximum(ndig - 8, 0)
    words = _words(u8)
    val, ok_low = _decimal8(words, first + n_high, ndig - n_high)
    ok &= ok_low
    long = np.nonzero(n_high)
    if long[0].size:   # more than 8 digits: the leading ones
        high, ok_high = _decimal8(words, first[long], n_high[long])
        val[long] += high * 100_000_000
        ok[long] &= ok_high
    return np.where(neg, -val, val), ok


def parse_hex8(u8: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-hex-digit ids -> (uint32 values, ok mask, missing mask); empty fields are missing (value 0)."""
    x = _words(u8)[starts]                   # byte k: character k
    valid = (lens == 8) & ((x & _HIGH_BITS) == 0)
    digit = _at_least(x, 0x30)
    digit &= ~_at_least(x, 0x3A)
    low = x | _u64(0x2020202020202020)       # 'A'-'F' -> 'a'-'f'; digits keep their code
    alpha = _at_least(low, 0x61)
    alpha &= ~_at_least(low, 0x67)
    del low
    digit |= alpha
    valid &= digit == _HIGH_BITS
    del digit
    x &= _u64(0x0F0F0F0F0F0F0F0F)
    alpha >>= _u64(7)
    alpha *= _u64(9)
    x += alpha                               # byte k: value of digit k
    del alpha
    v = x.byteswap(inplace=True)             # byte j: digit of weight 16**j
    v |= v >> _u64(4)
    v &= _u64(0x00FF00FF00FF00FF)
    v |= v >> _u64(8)
    v &= _u64(0x0000FFFF0000FFFF)
    v |= v >> _u64(16)
    v = v.astype(np.uint32)
    v[~valid] = 0
    missing = lens == 0
    return v, missing | valid, missing


class BadLines:
    """Malformed lines: counts per reason and the first few (file, line); or an error at the first."""

    def __init__(self, reasons: Mapping[str, str], policy: str) -> None:
        self.reasons = dict(reasons)
        self.names = list(self.reasons)   # code c >= 1 is names[c - 1]
        self.policy = policy
        self.counts = dict.fromkeys(self.names, 0)
        self.first: list[dict[str, Any]] = []

    def add(self, file: str, first_line: int, codes: np.ndarray) -> None:
        """Record the lines of a chunk with a non-zero reason code; ``first_line`` is 0-based."""
        bad = np.flatnonzero(codes)
        if not bad.size:
            return
        if self.policy == "error":
            name = self.names[codes[bad[0]] - 1]
            raise ValueError(f"{file}: line {first_line + bad[0] + 1}: {self.reasons[name]} (on_bad_line: error)")
        for c, n in zip(*np.unique(codes[bad], return_counts=True)):
            self.counts[self.names[c - 1]] += int(n)
        for i in bad[:MAX_BAD_EXAMPLES - len(self.first)]:
            self.first.append({"file": file, "line": int(first_line + i + 1), "reason": self.names[codes[i] - 1]})

    def to_dict(self) -> dict[str, Any]:
        return {"total": sum(self.counts.values()), "by_reason": dict(self.counts), "first": list(self.first)}


def source_meta(inputs: Sequence[Path], provenance: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One ``{"file", "bytes", ...}`` per input; ``provenance`` maps a file name (or path) to a sha256
    string or a dict of fields (sha256, url...) recorded as given."""
    provenance = dict(provenance or {})
    out = []
    for p in inputs:
        extra = provenance.pop(p.name, None) or provenance.pop(str(p), None) or {}
        out.append({"file": p.name, "bytes": p.stat().st_size,
                    **({"sha256": extra} if isinstance(extra, str) else dict(extra))})
    if provenance:
        raise ValueError(f"provenance names files that are not inputs: {sorted(provenance)}")
    return out


def coverage_from_accessed(accessed: Sequence[np.ndarray], rows: Sequence[int],
                           fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[str, Any]:
    """``skew.coverage_stats`` from the lookup counts of accessed rows only (any order, zeros allowed).

    ``accessed[t]`` holds the counts of the looked-up rows of table t and
    ``rows[t]`` its cardinality, so a table of 10M rows costs only its
    accessed rows. Gives the same dict as ``coverage_stats`` on the ids.
    """
    def shares(c: np.ndarray, n: int) -> dict[str, float]:
        return {share_key(f): float(s) for f, s in zip(fractions, coverage_curve(c, fractions, n))}

    tables, kept = [], []
    for t, (counts, n) in enumerate(zip(accessed, rows)):
        counts = np.asarray(counts, dtype=np.int64)
        counts = counts[counts > 0]
        tables.append({"table": t, "rows": int(n), "accessed_rows": int(counts.size), **shares(counts, int(n)),
                       "max_over_median": float(counts.max() / np.median(counts)) if counts.size else 0.0})
        kept.append(counts)
    merged = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    total = int(sum(int(n) for n in rows))
    overall = {"rows": total, "accessed_rows": int(merged.size), "lookups": int(merged.sum()),
               **shares(merged, total)}
    return {"tables": tables, "overall": overall}


# ---------------------------------------------------------------- Criteo


@dataclass
class _Parsed:
    """Good lines of a chunk: their indices in the chunk and parsed fields."""

    codes: np.ndarray    # int8 [lines] 0 = good, else 1 + index into REASONS
    lines: np.ndarray    # int64 [G]
    labels: np.ndarray   # float32 [G]
    ints: np.ndarray     # int64 [G, 13]
    hexv: np.ndarray     # uint32 [G, 26]
    missing: np.ndarray  # bool [G, 26]


def _parse_criteo(buf: bytes) -> _Parsed:
    tok = tokenize(buf, b"\t", NUM_FIELDS)
    u8, s, n = tok.u8, tok.starts, tok.lens
    first = u8[s[:, 0]]
    label_ok = (n[:, 0] == 1) & ((first == ord("0")) | (first == ord("1")))
    ints, int_ok = parse_ints(u8, s[:, 1:1 + NUM_DENSE], n[:, 1:1 + NUM_DENSE])
    hexv, hex_ok, missing = parse_hex8(u8, s[:, 1 + NUM_DENSE:], n[:, 1 + NUM_DENSE:])
    code = np.select([~label_ok, ~int_ok.all(1), ~hex_ok.all(1)], [2, 3, 4], 0).astype(np.int8)
    codes = np.ones(tok.n_lines, dtype=np.int8)   # 1: wrong field count
    codes[tok.good] = code
    keep = code == 0
    return _Parsed(codes, tok.good[keep], (first[keep] == ord("1")).astype(np.float32),
                   ints[keep], hexv[keep], missing[keep])


class _Counter:
    """Counts of uint64 keys in memory bounded by the distinct keys: per-chunk uniques are
    buffered and merged into one sorted table once the buffer outgrows it."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._buf: list[tuple[np.ndarray, np.ndarray]] = []
        self._buffered = 0

    def add(self, keys: np.ndarray) -> None:
        k, c = np.unique(keys, return_counts=True)
        self._buf.append((k, c.astype(np.int64)))
        self._buffered += k.size
        if self._buffered > max(self.keys.size, MERGE_MIN_KEYS):
            self._merge()

    def _merge(self) -> None:
        keys = np.concatenate([self.keys] + [k for k, _ in self._buf])
        counts = np.concatenate([self.counts] + [c for _, c in self._buf])
        self._buf, self._buffered = [], 0
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        del order
        first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        self.keys = keys[first]
        self.counts = np.add.reduceat(counts, first) if first.size else counts

    def per_table(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(uint32 values ascending, int64 counts)`` of each table (the key's high 32 bits)."""
        self._merge()
        bounds = np.searchsorted(self.keys >> np.uint64(32), np.arange(NUM_TABLES + 1, dtype=np.uint64))
        return [((self.keys[a:b] & np.uint64(0xFFFFFFFF)).astype(np.uint32), self.counts[a:b])
                for a, b in zip(bounds[:-1], bounds[1:])]


class _DenseCounter:
    """Counts of ``table * rows + id`` in one int64 [26, rows] array (modulo encoding: ids are
    bounded, so 208 bytes per row; np.zeros pages in only the rows that occur)."""

    def __init__(self, rows: int) -> None:
        self.counts = np.zeros((NUM_TABLES, rows), dtype=np.int64)

    def add(self, keys: np.ndarray) -> None:
        np.add.at(self.counts.reshape(-1), keys, 1)

    def per_table(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(ids seen ascending, their counts)`` of each table."""
        return [(ids, c[ids]) for c in self.counts for ids in [np.flatnonzero(c)]]


def _table_keys(values: np.ndarray) -> np.ndarray:
    """uint64 ``table << 32 | value`` of a [G, 26] uint32 matrix, flattened."""
    return (np.arange(NUM_TABLES, dtype=np.uint64) << np.uint64(32) | values.astype(np.uint64)).ravel()


class _Encoder:
    """Maps parsed raw ids to table rows under the configured convention."""

    def __init__(self, cfg: CriteoConfig, counted: list[tuple[np.ndarray, np.ndarray]], train_rows: int) -> None:
        self.cfg = cfg
        if cfg.encoding == "modulo":
            self.cardinalities = [cfg.max_ind_range] * NUM_TABLES
            self.train_counts = [c for _, c in counted]
            self.full_cardinalities = None
            return
        self.vocab, self.train_counts, self.cardinalities, self.full_cardinalities = [], [], [], []
        for values, counts in counted:
            keep = counts >= cfg.min_frequency
            values, counts = values[keep], counts[keep]
            ids = np.empty(values.size, dtype=np.int32)
            ids[np.lexsort((values, -counts))] = np.arange(1, values.size + 1, dtype=np.int32)
            self.vocab.append((values, ids))
            self.train_counts.append(np.concatenate(([train_rows - counts.sum()], counts)))  # bucket 0 first
            self.cardinalities.append(values.size + 1)
            self.full_cardinalities.append(int(keep.size))

    @staticmethod
    def count_keys(cfg: CriteoConfig, p: _Parsed, rows: np.ndarray) -> np.ndarray:
        """Pass-1 counter keys of the train rows ``rows`` of a chunk."""
        if cfg.encoding == "modulo":
            ids = np.where(p.missing[rows], 0, p.hexv[rows] % cfg.max_ind_range).astype(np.int64)
            return (ids + np.arange(NUM_TABLES, dtype=np.int64) * cfg.max_ind_range).ravel()
        return _table_keys(p.hexv[rows])[~p.missing[rows].ravel()]

    def encode(self, p: _Parsed) -> np.ndarray:
        if self.cfg.encoding == "modulo":
            return np.where(p.missing, 0, p.hexv % self.cfg.max_ind_range).astype(np.int32)
        out = np.zeros(p.hexv.shape, dtype=np.int32)
        for t, (values, ids) in enumerate(self.vocab):
            if values.size:
                v = p.hexv[:, t]
                pos = np.minimum(np.searchsorted(values, v), values.size - 1)
                out[:, t] = np.where((values[pos] == v) & ~p.missing[:, t], ids[pos], 0)
        return out


def _check_count(what: str, expected: int | None, found: int) -> None:
    if expected is not None and found != expected:
        raise ValueError(f"{what}: expected {expected:,} lines for the full input, found {found:,}")


def _halve(start: int, lines: int) -> int:
    """End of the val half of ``lines`` lines from ``start`` (np.array_split: val gets the odd one)."""
    return start + math.ceil(lines / 2)


def preprocess_criteo(inputs: Sequence[Path], out: Path, cfg: CriteoConfig, *, name: str,
                      provenance: Mapping[str, Any] | None = None, progress: bool = True,
                      full: bool = False) -> dict[str, Any]:
    """Preprocess Criteo TSV ``inputs`` into dataset directory ``out``; return the manifest.

    Kaggle takes the one ``train.txt``; Terabyte the day files in day order.
    ``full`` (or ``cfg.check_rows``) says the inputs are the whole dataset, so
    their raw line count must be the known one (``cfg.expected_rows`` if given,
    else 45,840,617 / 4,373,472,329); ``provenance`` adds sha256 (or other
    fields) per input file name to ``source``.
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
    source = source_meta(inputs, provenance)
    expected = cfg.expected_rows if cfg.expected_rows is not None else (
        FULL_LINES[cfg.kind] if full or cfg.check_rows else None)
    where = ", ".join(p.name for p in inputs)
    if not kaggle and cfg.expected_rows is None and expected is not None and len(inputs) != TERABYTE_DAYS:
        raise ValueError(f"the full criteo-terabyte input is {TERABYTE_DAYS} day files, got {len(inputs)}")

    if kaggle:   # day boundaries need the line count before pass 1
        total = count_lines(inputs[0], progress)
        _check_count(where, expected, total)
        days = [total // KAGGLE_DAYS + (d < total % KAGGLE_DAYS) for d in range(KAGGLE_DAYS)]
        train_end = sum(days[:-1])
        val_end = _halve(train_end, days[-1])

    # pass 1: validate everything, count good lines and the train split's ids
    bad = BadLines(REASONS, cfg.on_bad_line)
    counter = _DenseCounter(cfg.max_ind_range) if cfg.encoding == "modulo" else _Counter()
    file_lines, rows, train_rows = [], 0, 0
    offset = 0
    with tqdm(total=total if kaggle else None, unit="lines", desc=f"{name}: pass 1 (count)",
              disable=not progress) as bar:
        for i, path in enumerate(inputs):
            n_file = 0
            for first, buf in read_chunks(path, cfg.chunk_lines):
                p = _parse_criteo(buf)
                bad.add(path.name, first, p.codes)
                train = (offset + first + p.lines < train_end) if kaggle else \
                    np.full(p.lines.size, i < len(inputs) - 1)
                sel = np.flatnonzero(train)
                if sel.size:
                    counter.add(_Encoder.count_keys(cfg, p, sel))
                rows += p.lines.size
                train_rows += sel.size
                n_file += p.codes.size
                bar.update(p.codes.size)
            file_lines.append(n_file)
            offset += n_file
    if not kaggle:
        total = offset
        _check_count(where, expected, total)
        train_end = sum(file_lines[:-1])
        val_end = _halve(train_end, file_lines[-1])
    elif offset != total:
        raise ValueError(f"{where}: counted {total:,} lines, then read {offset:,} (file changed?)")
    if rows == 0:
        raise ValueError(f"{where}: no well-formed lines")
    enc = _Encoder(cfg, counter.per_table(), train_rows)
    del counter

    # pass 2: encode and write
    bounds = np.array([train_end, val_end])
    split_rows = np.zeros(2, dtype=np.int64)
    with DatasetWriter(out) as w:
        dense = w.column("dense", np.float32, (rows, NUM_DENSE))
        sparse = w.column("sparse", np.int32, (rows, NUM_TABLES))
        labels = w.column("labels", np.float32, (rows,))
        at, offset = 0, 0
        with tqdm(total=total, unit="lines", desc=f"{name}: pass 2 (write)", disable=not progress) as bar:
            for i, path in enumerate(inputs):
                for first, buf in read_chunks(path, cfg.chunk_lines):
                    p = _parse_criteo(buf)
                    g = p.lines.size
                    if at + g > rows:
                        raise ValueError(f"{path}: more good lines than in pass 1 (file changed?)")
                    dense[at:at + g] = np.log1p(np.maximum(p.ints, 0).astype(np.float64))
                    sparse[at:at + g] = enc.encode(p)
                    labels[at:at + g] = p.labels
                    split_rows += ((offset + first + p.lines)[:, None] < bounds).sum(0)
                    at += g
                    bar.update(p.codes.size)
                offset += file_lines[i]
        if at != rows:
            raise ValueError(f"{where}: {at:,} good lines in pass 2, {rows:,} in pass 1 (file changed?)")
        r1, r2 = (int(x) for x in split_rows)
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
            "skew": coverage_from_accessed(enc.train_counts, enc.cardinalities),
            "full_cardinalities": enc.full_cardinalities,
        }
        return w.commit(cardinalities=enc.cardinalities,
                        splits={"train": (0, r1), "val": (r1, r2), "test": (r2, rows)}, meta=meta)
