"""Chunked reading and vectorised parsing of delimited text, with bad-line accounting.

The raw-format preprocessors (``criteo``, ``taobao``) share this input side:
chunks of whole lines (``inputs.read_chunks``) are split into fields without a
Python loop per line (``tokenize``) and parsed with numpy: signed decimal integers
(``parse_ints``) and 8-digit hex ids (``parse_hex8``), 8 bytes per uint64
word (SWAR, ``words``). Malformed lines are counted by reason or stop the run
(``BadLines``, ``BAD_LINE_POLICIES``); too many of them fail the run
(``BadLines.check``). Also shared: the validation of the bad-line options of
the preprocessors' config dataclasses.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hotcold.config import is_real, require

log = logging.getLogger(__name__)

BAD_LINE_POLICIES = ("skip", "error")
MAX_INT_DIGITS = 16        # longer integers are malformed (two 8-digit SWAR words)
MAX_BAD_EXAMPLES = 10
WARN_BAD_SHARE = 0.001     # default share of malformed lines above which preprocessing warns
MAX_BAD_SHARE = 0.01       # default share above which it fails (the real files have essentially none)
PAD_BYTES = 32             # zeros after a chunk so fixed-width gathers never leave the buffer


# ---------------------------------------------------------------- config helpers


def check_bad_line_options(where: str, policy: str, warn: Any, limit: Any) -> None:
    """Validate ``on_bad_line``, ``warn_bad_share`` and ``max_bad_share`` of a preprocessor config."""
    require(policy in BAD_LINE_POLICIES, where,
            f"on_bad_line must be one of {list(BAD_LINE_POLICIES)}, got {policy!r}")
    for name, v in (("warn_bad_share", warn), ("max_bad_share", limit)):
        require(is_real(v) and 0 <= v <= 1, where, f"{name} must be a number in [0, 1], got {v!r}")
    require(warn <= limit, where, f"warn_bad_share ({warn}) must not exceed max_bad_share ({limit})")


# ---------------------------------------------------------------- fields


@dataclass
class Tokens:
    """Fields of the lines of one chunk: byte offsets into ``u8`` (zero-padded)."""

    u8: np.ndarray       # uint8 [bytes + PAD_BYTES]
    n_lines: int
    good: np.ndarray     # int64 [G] indices of the lines with the expected field count
    starts: np.ndarray   # int32 [G, F] first byte of each field
    lens: np.ndarray     # int32 [G, F] field length in bytes

    def line_codes(self, good_codes: np.ndarray) -> np.ndarray:
        """int8 [lines] reason code of every line (``BadLines.add``): 1 (the first reason, which
        must be the wrong field count) for lines not in ``good``, ``good_codes`` [G] for the others."""
        codes = np.ones(self.n_lines, dtype=np.int8)
        codes[self.good] = good_codes
        return codes


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


def words(u8: np.ndarray) -> np.ndarray:
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


def _decimal8(words8: np.ndarray, pos: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` (0..8) decimal digits at ``pos`` -> (int64 values, ok mask), 8 digits per uint64 (SWAR)."""
    x = np.where(n == 0, _u64(0), words8[pos] << _SHIFT[n]) | _FILL[n]   # left-padded with '0', MSD in byte 0
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
    words8 = words(u8)
    val, ok_low = _decimal8(words8, first + n_high, ndig - n_high)
    ok &= ok_low
    long = np.nonzero(n_high)
    if long[0].size:   # more than 8 digits: the leading ones
        high, ok_high = _decimal8(words8, first[long], n_high[long])
        val[long] += high * 100_000_000
        ok[long] &= ok_high
    return np.where(neg, -val, val), ok


def parse_hex8(u8: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-hex-digit ids -> (uint32 values, ok mask, missing mask); empty fields are missing (value 0)."""
    x = words(u8)[starts]                    # byte k: character k
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


# ---------------------------------------------------------------- bad lines


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

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def check(self, where: str, lines: int, warn: float, limit: float) -> None:
        """Fail when more than ``limit`` of ``lines`` were malformed; warn above ``warn``."""
        share = self.total / lines if lines else 0.0
        if share <= warn:
            return
        reasons = ", ".join(f"{self.reasons[k]}: {n:,}" for k, n in self.counts.items() if n)
        where_first = ", ".join(f"{e['file']}:{e['line']}" for e in self.first[:3])
        detail = f"{self.total:,} of {lines:,} lines ({share:.2%}) are malformed ({reasons}; first at {where_first})"
        if share > limit:
            raise ValueError(f"{where}: {detail}, more than max_bad_share={limit:g}: is this the right file? "
                             f"(raise preprocess.max_bad_share to accept it)")
        log.warning("%s: %s, more than warn_bad_share=%g", where, detail, warn)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_reason": dict(self.counts), "first": list(self.first)}
