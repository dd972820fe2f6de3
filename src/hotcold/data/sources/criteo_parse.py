"""Parsing of a chunk of Criteo TSV lines: each line's reason code and the good lines' label, integers and
hexadecimal ids.

A line is ``label \\t I1..I13 \\t C1..C26`` (``NUM_FIELDS`` fields). With
numba the chunk goes through one compiled kernel (``kernels.parse_criteo``),
without it through vectorised numpy (``textparse``); the two give the same
result (``_parse_criteo`` picks by ``hotcold.jit.KERNEL``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotcold.data.sources import kernels
from hotcold.data.sources.textparse import parse_hex8, parse_ints, tokenize
from hotcold.jit import KERNEL

NUM_DENSE, NUM_TABLES = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_TABLES


@dataclass
class _Parsed:
    """Good lines of a chunk: their indices in the chunk and parsed fields."""

    codes: np.ndarray    # int8 [lines] 0 = good, else 1 + index into criteo.REASONS
    lines: np.ndarray    # int64 [G]
    labels: np.ndarray   # float32 [G]
    ints: np.ndarray     # int64 [G, 13]
    hexv: np.ndarray     # uint32 [G, 26]
    missing: np.ndarray  # bool [G, 26]


def _parse_criteo_numpy(buf: bytes) -> _Parsed:
    tok = tokenize(buf, b"\t", NUM_FIELDS)
    u8, s, n = tok.u8, tok.starts, tok.lens
    first = u8[s[:, 0]]
    label_ok = (n[:, 0] == 1) & ((first == ord("0")) | (first == ord("1")))
    ints, int_ok = parse_ints(u8, s[:, 1:1 + NUM_DENSE], n[:, 1:1 + NUM_DENSE])
    hexv, hex_ok, missing = parse_hex8(u8, s[:, 1 + NUM_DENSE:], n[:, 1 + NUM_DENSE:])
    code = np.select([~label_ok, ~int_ok.all(1), ~hex_ok.all(1)], [2, 3, 4], 0).astype(np.int8)
    keep = code == 0
    return _Parsed(tok.line_codes(code), tok.good[keep], (first[keep] == ord("1")).astype(np.float32),
                   ints[keep], hexv[keep], missing[keep])


def _parse_criteo_compiled(buf: bytes, max_lines: int) -> _Parsed:
    if not buf.endswith(b"\n"):
        buf += b"\n"
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    m = max_lines
    codes, good = np.empty(m, dtype=np.int8), np.empty(m, dtype=np.int64)
    labels = np.empty(m, dtype=np.float32)
    ints = np.empty((m, NUM_DENSE), dtype=np.int64)
    hexv = np.empty((m, NUM_TABLES), dtype=np.uint32)
    missing = np.empty((m, NUM_TABLES), dtype=bool)
    n, g = kernels.parse_criteo(np.frombuffer(buf, dtype=np.uint8), codes, labels, ints, hexv, missing, good)
    if n < 0:
        raise ValueError(f"a chunk holds more than {max_lines} lines")
    return _Parsed(codes[:n], good[:g], labels[:g], ints[:g], hexv[:g], missing[:g])


def _parse_criteo(buf: bytes, max_lines: int) -> _Parsed:
    """Parse a chunk of at most ``max_lines`` whole lines: the compiled kernel with numba, else vectorised
    numpy (the same result)."""
    return _parse_criteo_compiled(buf, max_lines) if KERNEL == "numba" else _parse_criteo_numpy(buf)
