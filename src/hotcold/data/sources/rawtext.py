"""What a raw text file may hold besides its data lines: a byte-order mark, a header line, zero-filled blocks.

None of them is data, and each would otherwise cost one counted malformed line
without a word: an editor or a spreadsheet export puts a UTF-8 byte-order mark
(BOM) before the first line and often a header line naming the columns; a file
damaged while it was written (a crash, a full disk, a copy cut short and
resumed) holds a block of NUL bytes. ``leading`` strips a BOM and a header line
from the start of a file, with a warning each; ``nul_lines`` finds the lines
holding NUL bytes of a chunk, so the preprocessor counts them under their own
reason and warns with the file name (``NulReport``). These run on the first
chunk of a file, and on a chunk that has malformed lines, never on every line.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

BOM = b"\xef\xbb\xbf"
NUL_REASON = "a NUL byte (a zero-filled block: the file was damaged while written or copied?)"


@dataclass
class Leading:
    """What ``leading`` removed from the start of a file."""

    bom: bool = False
    header: bool = False

    @property
    def lines(self) -> int:
        """Lines removed (the header line)."""
        return int(self.header)


def _first_line(buf: bytes) -> bytes:
    end = buf.find(b"\n")
    return buf if end < 0 else buf[:end + 1]


def leading(buf: bytes, file: str) -> tuple[bytes, Leading]:
    """The first chunk of ``file`` without a UTF-8 BOM and a header line -> (the rest, what was removed).

    A header line is a first line starting with an ASCII letter: no data line of
    the formats read here does (Criteo's starts with its 0/1 label, Taobao's with
    a user id)."""
    found = Leading()
    if buf.startswith(BOM):
        buf, found.bom = buf[len(BOM):], True
        log.warning("%s starts with a UTF-8 byte-order mark; it was stripped", file)
    first = _first_line(buf)
    if first[:1].isalpha():
        buf, found.header = buf[len(first):], True
        shown = first.rstrip(b"\r\n")[:80].decode("utf-8", "replace")
        log.warning("%s: line 1 is a header, not data (%r); it was skipped", file, shown)
    return buf, found


def nul_lines(buf: bytes | np.ndarray) -> np.ndarray:
    """int64 indices of the lines of ``buf`` (bytes or uint8; 0-based, ``\\n``-separated) that hold a NUL byte."""
    if isinstance(buf, bytes) and b"\0" not in buf:
        return np.zeros(0, dtype=np.int64)
    u8 = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, bytes) else buf
    zeros = np.flatnonzero(u8 == 0)
    if not zeros.size:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.searchsorted(np.flatnonzero(u8 == 10), zeros)).astype(np.int64)


@dataclass
class NulReport:
    """Lines holding NUL bytes per file (1-based line numbers of the first few), warned about once per file."""

    lines: dict[str, int] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)

    def add(self, file: str, first_line: int, lines: np.ndarray) -> None:
        """``lines``: indices of NUL lines in a chunk whose first line is ``first_line`` (0-based) of ``file``."""
        if lines.size:
            self.lines[file] = self.lines.get(file, 0) + int(lines.size)
            self.first.setdefault(file, int(first_line + lines[0] + 1))

    def warn(self, file: str) -> None:
        n = self.lines.get(file, 0)
        if n:
            log.warning("%s: %d line(s) hold NUL bytes, the first at line %d (a zero-filled block: the file may "
                        "have been damaged while written or copied); counted as malformed", file, n, self.first[file])
