"""Resumable, verified HTTP downloads (standard library + tqdm).

The file is written to ``<dest>.part`` and takes its final name only once
verified: against its sha256 (and size) when known, and always, when a
format is given (``formats``), as a complete file of that format (an error
page served with status 200 or a reply cut short without a length fails).
So a file under its final name is a finished download, and nothing the user
may want is deleted (``download``).
"""
from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from hotcold.data.sources.formats import check as check_format, sniff
from hotcold.files import atomic_write_json, file_sha256, fsync_dir, fsync_file

__all__ = ["DownloadError", "download", "file_sha256"]

log = logging.getLogger(__name__)

USER_AGENT = "hotcold-downloader/0.1"
# Retried like 5xx: both codes ask the client to try again later.
_RETRY_4XX = {408, 429}
_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)")


class DownloadError(OSError):
    """A download that failed for good: fatal HTTP status, retries exhausted or bad content."""


class _Transient(Exception):
    """A failure worth retrying (reset, timeout, 5xx, short read)."""


class _Mismatch(Exception):
    """The server announces a size other than the expected one."""


class _BadContent(Exception):
    """The server sends something other than the file (an error page, another format)."""


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


def _attempt(url: str, part: Path, stream: _Stream, bar: tqdm, *, size: int | None, fmt: str | None,
             timeout: float, chunk: int) -> bool:
    """One request: append the rest of the file to ``part``; raises _Transient on a retryable failure.

    Returns whether the reply announced the file's length (else only the format can prove it complete).
    """
    resp, offset = _open(url, part, size, timeout)
    if resp is None:
        return True
    with resp:
        ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if fmt is not None and ctype.startswith("text/"):
            page = "an HTML page" if ctype == "text/html" else "text"
            raise _BadContent(f"the server returned {page} ({ctype}) instead of a {fmt} file (an error or "
                              f"login page?)")
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
    return total is not None


def _fetch(url: str, part: Path, *, size: int | None, fmt: str | None, retries: int, backoff: float,
           timeout: float, progress: bool, chunk: int) -> str:
    """Complete ``part`` with retries and resumption; returns its sha256.

    A reply without a length ends the download only when ``fmt`` shows the
    file complete; a stream that ends early is resumed like a cut connection.
    """
    stream = _Stream()
    failures, furthest = 0, _size(part)
    with tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=part.name[: -len(".part")],
              disable=not progress, leave=False) as bar:
        while True:
            try:
                if not _attempt(url, part, stream, bar, size=size, fmt=fmt, timeout=timeout, chunk=chunk) \
                        and fmt is not None:
                    problem = check_format(part, fmt)
                    if problem is not None and problem.truncated:
                        raise _Transient(f"reply without a length ended early: {problem.message}")
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


def _checksum_problem(path: Path, digest: str | None, sha256: str | None, size: int | None) -> str | None:
    """Why ``path`` does not match the configured size or sha256, or None."""
    actual = _size(path)
    if size is not None and actual != size:
        return f"size mismatch: expected {size} bytes, got {actual}"
    if sha256 is not None and digest != sha256.lower():
        return f"sha256 mismatch: expected {sha256.lower()}, got {digest}"
    return None


def _record_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified")


def _recorded(dest: Path, sha256: str | None) -> str | None:
    """The sha256 of ``dest`` from its verification record, if the file is unchanged since (and matches)."""
    try:
        rec = json.loads(_record_path(dest).read_text())
        st = dest.stat()
    except (OSError, ValueError):
        return None
    if (isinstance(rec, dict) and rec.get("bytes") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns
            and (sha256 is None or rec.get("sha256") == sha256.lower())):
        return rec.get("sha256")
    return None


def _verified(dest: Path, digest: str) -> str:
    st = dest.stat()
    atomic_write_json(_record_path(dest), {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest})
    return digest


def _kept_aside(dest: Path, digest: str) -> Path:
    return dest.with_name(f"{dest.name}.sha256-{digest[:12]}")


def _verify(path: Path, *, sha256: str | None, size: int | None, fmt: str | None,
            chunk: int, digest: str | None = None) -> tuple[str | None, str | None, bool]:
    """``(digest, problem, checksum)``: the file's sha256, why it is not the wanted file (or None), and
    whether the problem is a configured checksum or size that does not match (else a bad format)."""
    if size is not None and _size(path) != size:
        return digest, _checksum_problem(path, digest, sha256, size), True
    digest = digest or file_sha256(path, chunk)
    problem = _checksum_problem(path, digest, sha256, size)
    if problem is not None:
        return digest, problem, True
    if sha256 is None and fmt is not None:
        bad = check_format(path, fmt)
        if bad is not None:
            return digest, bad.message, False
    return digest, None, False


def _move_in(src: Path, dest: Path, digest: str) -> str:
    fsync_file(src)
    os.replace(src, dest)
    fsync_dir(dest.parent)
    return _verified(dest, digest)


def download(url: str, dest: Path, *, sha256: str | None = None, size: int | None = None,
             fmt: str | None = None, retries: int = 5, backoff: float = 1.0, timeout: float = 60,
             progress: bool = True, chunk: int = 1 << 20) -> str:
    """Download ``url`` to ``dest`` (resumable, verified); returns the file's sha256 hex.

    ``fmt`` (``"gzip"`` or ``"tar"``, see ``formats``) checks the content type
    and that the file is complete in that format whenever no sha256 is given.
    An existing ``dest`` is verified the same way (or by its record, when
    unchanged) and returned without network access. One that fails its
    checksum is left in place and raises :class:`DownloadError` naming both
    hashes; one that is not a complete ``fmt`` file (an error page saved by an
    older version, a file cut short) is kept as ``<dest>.rejected`` and
    fetched again. A fresh download that fails its checksum is kept as
    ``<dest>.sha256-<hex>`` and raises; when it resumed an older ``.part`` it
    is first fetched once more from scratch. A download whose first bytes show it
    is not the file at all (an HTML or XML error page; with ``fmt``, another
    format) fails its checksum for that reason: it is not kept, and the error
    says what the server returned rather than suggesting a checksum correction.

    Nothing the user may want is deleted: a file that does not match its
    configured sha256 stays where it is, or, fresh from the network, is kept as
    ``<dest>.sha256-<first 12 hex digits>``; the error gives both hashes, and
    once the configured sha256 names a kept file it is used without a download.
    Verification is recorded in ``<dest>.verified`` (size, mtime, sha256), sparing
    a re-read of a multi-GB file that has not changed since.
    """
    dest = Path(dest)
    part = _part_path(dest)
    if dest.exists():
        digest = _recorded(dest, sha256)
        if digest is not None:
            return digest
        digest, problem, checksum = _verify(dest, sha256=sha256, size=size, fmt=fmt, chunk=chunk)
        if problem is None:
            return _verified(dest, digest)
        not_the_file = sniff(dest, fmt) if checksum else None
        if checksum and not_the_file is None:
            raise DownloadError(f"{dest} exists but does not match: {problem}. It was left in place: if the "
                                f"configured checksum is wrong, correct it; if the file is damaged, delete it "
                                f"and download again")
        problem = not_the_file.message if not_the_file is not None else problem
        rejected = dest.with_name(dest.name + ".rejected")
        log.warning("%s is not a complete %s file (%s); keeping it as %s and fetching it again",
                    dest, fmt or "downloaded", problem, rejected.name)
        os.replace(dest, rejected)
    if sha256 is not None and _kept_aside(dest, sha256.lower()).is_file():
        kept = _kept_aside(dest, sha256.lower())
        digest, problem, _ = _verify(kept, sha256=sha256, size=size, fmt=fmt, chunk=chunk)
        if problem is None:
            log.warning("using %s, kept from an earlier download, as %s", kept.name, dest.name)
            return _move_in(kept, dest, digest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    resumed = _size(part) > 0
    while True:
        try:
            digest = _fetch(url, part, size=size, fmt=fmt, retries=retries, backoff=backoff, timeout=timeout,
                            progress=progress, chunk=chunk)
            digest, problem, checksum = _verify(part, sha256=sha256, size=size, fmt=fmt, chunk=chunk,
                                                digest=digest)
        except _Mismatch as e:
            digest, problem, checksum = None, str(e), True
        except _BadContent as e:
            digest, problem, checksum = None, str(e), False
        if problem is None:
            return _move_in(part, dest, digest)
        if resumed:   # the older part may belong to another version of the file: once more from scratch
            log.warning("%s: %s; fetching it again from scratch", url, problem)
            part.unlink(missing_ok=True)
            resumed = False
            continue
        if not checksum or digest is None:   # not the file at all: an error page, another format, size
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url}: {problem}")
        not_the_file = sniff(part, fmt)
        if not_the_file is not None:         # an error page (or another format) that cannot match any checksum
            part.unlink(missing_ok=True)
            what = f"an {not_the_file.page} page" if not_the_file.page else f"something other than a {fmt} file"
            raise DownloadError(f"{url}: the server returned {what} instead of the file, so the sha256 cannot "
                                f"match ({not_the_file.message}); nothing was kept. The configured checksum is "
                                f"not the problem: check the URL (a moved file, a login or quota page?)")
        kept = _kept_aside(dest, digest)
        os.replace(part, kept)
        raise DownloadError(f"{url}: {problem}. The download is kept as {kept}: if it is the right file, "
                            f"correct the configured sha256 and it will be used without downloading again")
