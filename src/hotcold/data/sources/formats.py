"""Is a downloaded file what it claims to be, and all of it? Magic numbers and compressed-stream checks.

An error page served with status 200, or a reply cut short that announced no
length, looks like any other file to HTTP. A compressed stream knows its own
end: gzip, bzip2 and xz end with a trailer (gzip's holds the CRC and length
of the data), so decompressing to the trailer proves a file complete
(``check``). ``gzip`` is a ``.gz`` file; ``tar`` an archive, plain or
compressed with any of the three.
"""
from __future__ import annotations

import bz2
import lzma
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

FORMATS = ("gzip", "tar")
TAR_MAGIC_AT, TAR_BLOCK = 257, 512
_INPUT = 1 << 16    # compressed bytes per step: bounds the decompressed output held at once
_COMPRESSIONS: list[tuple[bytes, str, Callable[[], Any]]] = [
    (b"\x1f\x8b", "gzip", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)),
    (b"BZh", "bzip2", bz2.BZ2Decompressor),
    (b"\xfd7zXZ\x00", "xz", lzma.LZMADecompressor),
]


@dataclass(frozen=True)
class Problem:
    """Why a file is not a complete ``fmt`` file; ``truncated`` when it may just need the rest."""

    message: str
    truncated: bool = False
    page: str | None = None      # "HTML" or "XML": an error or login page served in place of the file


def _is_tar(block: bytes) -> bool:
    return block[TAR_MAGIC_AT:TAR_MAGIC_AT + 5] == b"ustar"


def _describe(head: bytes) -> str:
    text = head[:60].decode("utf-8", "replace").replace("\n", " ").strip()
    return f"it starts with {text!r}" if head else "it is empty"


def _stream(path: Path, new: Callable[[], Any], name: str) -> tuple[Problem | None, bytes]:
    """Decompress ``path`` to its end -> (problem or None, the first decompressed block)."""
    first, d, pending = b"", new(), b""
    with open(path, "rb") as f:
        while data := pending or f.read(_INPUT):
            pending = b""
            if d.eof:
                if not data.strip(b"\0"):       # zero padding after the last member
                    continue
                d = new()                       # another member (concatenated streams)
            try:
                out = d.decompress(data)
            except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
                return Problem(f"corrupt {name} stream ({e})"), first
            if len(first) < TAR_BLOCK:
                first += out[:TAR_BLOCK - len(first)]
            if d.eof:
                pending = d.unused_data
    if not d.eof:
        return Problem(f"the {name} stream ends before its trailer (cut short)", truncated=True), first
    return None, first


_HTML = re.compile(rb"\s*(<!doctype\s+html|<html|<head|<body|<!--)", re.IGNORECASE)
_XML = re.compile(rb"\s*<\?xml", re.IGNORECASE)


def markup(head: bytes) -> str | None:
    """``"HTML"`` or ``"XML"`` when bytes that start a file look like such a page (an error or login page,
    a cloud store's XML error), else None."""
    head = head.removeprefix(b"\xef\xbb\xbf")
    if _HTML.match(head) or (_XML.match(head) and b"<html" in head.lower()):
        return "HTML"
    return "XML" if _XML.match(head) else None


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(TAR_BLOCK)


def _compression(head: bytes) -> tuple[str, Callable[[], Any]] | None:
    return next(((name, new) for magic, name, new in _COMPRESSIONS if head.startswith(magic)), None)


def _head_problem(head: bytes, fmt: str) -> Problem | None:
    """Why a file starting with ``head`` cannot be a ``fmt`` file, judging by these bytes alone."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {FORMATS}")
    page = markup(head)
    if page is not None:
        return Problem(f"an {page} page, not a {fmt} file: {_describe(head)}", page=page)
    compression = _compression(head)
    if compression is None:
        if fmt == "tar" and _is_tar(head):
            return None
        return Problem(f"not a {fmt} file: {_describe(head)} (an error page?)")
    if fmt == "gzip" and compression[0] != "gzip":
        return Problem(f"not a gzip file but {compression[0]}")
    return None


def sniff(path: Path, fmt: str | None) -> Problem | None:
    """Why ``path`` cannot be a ``fmt`` file judging by its first bytes alone (an HTML or XML page, another
    format's magic number), or None; with ``fmt`` None only such a page is a problem. Reads one block."""
    head = _head(path)
    if fmt is None:
        page = markup(head)
        return None if page is None else Problem(f"an {page} page: {_describe(head)}", page=page)
    return _head_problem(head, fmt)


def check(path: Path, fmt: str) -> Problem | None:
    """None when ``path`` is a complete ``fmt`` file (reads and decompresses all of it)."""
    head = _head(path)
    problem = _head_problem(head, fmt)
    if problem is not None:
        return problem
    compression = _compression(head)
    if compression is None:      # a plain tar archive
        size = path.stat().st_size
        return None if size % TAR_BLOCK == 0 else Problem("the tar archive is cut short", truncated=True)
    name, new = compression
    problem, first = _stream(path, new, name)
    if problem is None and fmt == "tar" and not _is_tar(first):
        return Problem(f"the {name} file does not hold a tar archive")
    return problem
