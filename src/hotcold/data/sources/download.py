"""Resumable, verified HTTP downloads (standard library + tqdm).

The file is written to ``<dest>.part`` and renamed to ``dest`` only once it is complete and matches
the expected size and sha256, so a file under its final name is always a finished download.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from hotcold.files import file_sha256

__all__ = ["DownloadError", "download", "file_sha256"]

log = logging.getLogger(__name__)

USER_AGENT = "hotcold-downloader/0.1"
# Retried like 5xx: both codes ask the client to try again later.
_RETRY_4XX = {408, 429}
_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)")


class DownloadError(RuntimeError):
    """A download that failed for good: fatal HTTP status, retries exhausted or bad content."""


class _Transient(Exception):
    """A failure worth retrying (reset, timeout, 5xx, short read)."""


class _Mismatch(Exception):
    """The server announces a size other than the expected one."""


def _part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _truncate(path: Path) -> None:
    with open(path, "wb"):
        pass


def _parse_content_range(value: str | None) -> tuple[int | None, int | None]:
    """(start, total) of a ``Content-Range`` header; None where absent or ``*``."""
    m = _CONTENT_RANGE.fullmatch((value or "").strip())
    if not m:
        return None, None
    start = int(m.group(1)) if m.group(1) is not None else None
    total = int(m.group(3)) if m.group(3) != "*" else None
    return start, total


def _open(url: str, part: Path, size: int | None, timeout: float):
    """Open ``url`` resuming ``part``; returns ``(response or None when complete, offset)``."""
    for _ in range(2):
        offset = _size(part)
        if size is not None and offset > size:
            _truncate(part)
            offset = 0
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as e:
            code, content_range = e.code, e.headers.get("Content-Range")
            e.close()
            if code == 416 and offset:
                total = _parse_content_range(content_range)[1]
                total = size if total is None else total
                if total == offset:
                    return None, offset
                _truncate(part)  # the part is larger than the file, or its size is unknown
                continue
            if code >= 500 or code in _RETRY_4XX:
                raise _Transient(f"HTTP {code}") from e
            raise DownloadError(f"{url}: HTTP {code} {e.reason}") from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, OSError):
                raise _Transient(f"{type(e.reason).__name__}: {e.reason}") from e
            raise DownloadError(f"{url}: {e.reason}") from e
        except (OSError, http.client.HTTPException) as e:
            raise _Transient(f"{type(e).__name__}: {e}") from e
        if resp.status == 206 and _parse_content_range(resp.headers.get("Content-Range"))[0] != offset:
            resp.close()
            _truncate(part)
            continue
        return resp, offset
    raise _Transient("server answered the range request inconsistently")


class _Stream:
    """Incremental sha256 of the bytes written to the part, valid while it covers the whole part."""

    def __init__(self) -> None:
        self.hasher: hashlib._Hash | None = None
        self.count = 0

    def start(self, offset: int) -> None:
        if offset == 0:
            self.hasher, self.count = hashlib.sha256(), 0
        elif self.count != offset:
            self.hasher = None

    def update(self, data: bytes) -> None:
        if self.hasher is not None:
            self.hasher.update(data)
            self.count += len(data)

    def digest(self, part: Path, chunk: int) -> str:
        if self.hasher is not None and self.count == _size(part):
            return self.hasher.hexdigest()
        return file_sha256(part, chunk)


def _attempt(url: str, part: Path, stream: _Stream, bar: tqdm, *, size: int | None, timeout: float,
             chunk: int) -> None:
    """One request: append the rest of the file to ``part``; raises _Transient on a retryable failure."""
    resp, offset = _open(url, part, size, timeout)
    if resp is None:
        return
    with resp:
        if resp.status != 206:
            offset = 0  # 200: the server ignored Range and sends the whole file
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        total = _parse_content_range(resp.headers.get("Content-Range"))[1] if resp.status == 206 else None
        if total is None and expected is not None:
            total = offset + expected
        if size is not None and total is not None and total != size:
            raise _Mismatch(f"size mismatch: expected {size} bytes, server announces {total}")
        stream.start(offset)
        bar.reset(total=total)
        bar.update(offset)
        received = 0
        with open(part, "ab" if offset else "wb") as f:
            while True:
                try:
                    data = resp.read1(chunk)  # what has arrived: a timeout loses nothing
                except (OSError, http.client.HTTPException) as e:
                    raise _Transient(f"{type(e).__name__}: {e}") from e
                if not data:
                    break
                f.write(data)
                stream.update(data)
                bar.update(len(data))
                received += len(data)
    if expected is not None and received < expected:
        raise _Transient(f"short read: {received} of {expected} bytes")


def _fetch(url: str, part: Path, *, size: int | None, retries: int, backoff: float, timeout: float,
           progress: bool, chunk: int) -> str:
    """Complete ``part`` with retries and resumption; returns its sha256."""
    stream = _Stream()
    failures, furthest = 0, _size(part)
    with tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=part.name[: -len(".part")],
              disable=not progress, leave=False) as bar:
        while True:
            try:
                _attempt(url, part, stream, bar, size=size, timeout=timeout, chunk=chunk)
                return stream.digest(part, chunk)
            except _Transient as e:
                reached = _size(part)
                if reached > furthest:  # progress was made: only consecutive idle failures count
                    failures, furthest = 0, reached
                failures += 1
                if failures > retries:
                    raise DownloadError(f"{url}: giving up after {retries} retries: {e}") from e
                delay = backoff * 2 ** (failures - 1)
                log.warning("%s: %s; retry %d/%d in %.1f s", url, e, failures, retries, delay)
                time.sleep(delay)


def _problem(path: Path, digest: str | None, sha256: str | None, size: int | None) -> str | None:
    """Why ``path`` does not match the expectations, or None."""
    actual = _size(path)
    if size is not None and actual != size:
        return f"size mismatch: expected {size} bytes, got {actual}"
    if sha256 is not None and digest != sha256.lower():
        return f"sha256 mismatch: expected {sha256.lower()}, got {digest}"
    return None


def download(url: str, dest: Path, *, sha256: str | None = None, size: int | None = None,
             retries: int = 5, backoff: float = 1.0, timeout: float = 60, progress: bool = True,
             chunk: int = 1 << 20) -> str:
    """Download ``url`` to ``dest`` (resumable, verified); returns the file's sha256 hex.

    An existing ``dest`` that matches ``sha256``/``size`` (or any existing ``dest`` when neither is
    known: it only appears once complete) is returned without network access. A mismatching file is
    deleted and fetched once more from scratch; a second mismatch raises :class:`DownloadError`.
    """
    dest = Path(dest)
    part = _part_path(dest)
    if dest.exists():
        wrong_size = size is not None and _size(dest) != size
        digest = None if wrong_size else file_sha256(dest, chunk)
        if _problem(dest, digest, sha256, size) is None:
            return digest
        log.warning("%s is corrupted; fetching it again", dest)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    problem = None
    for _ in range(2):
        try:
            digest = _fetch(url, part, size=size, retries=retries, backoff=backoff, timeout=timeout,
                            progress=progress, chunk=chunk)
            problem = _problem(part, digest, sha256, size)
        except _Mismatch as e:
            problem = str(e)
        if problem is None:
            os.replace(part, dest)
            return digest
        log.warning("%s: %s; deleting it and fetching from scratch", url, problem)
        part.unlink(missing_ok=True)
    raise DownloadError(f"{url}: {problem} (after fetching it again from scratch)")
