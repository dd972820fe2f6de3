"""Reading the raw input files, and the manifest's record of exactly what was read.

Files are plain text or ``.gz`` (decompressed as a stream). ``read_chunks``
yields ``chunk_lines`` whole lines at a time and can hash the file's bytes as
they are consumed (``Digest``: the compressed bytes of a ``.gz``), so the
``source`` record of a manifest (``source_records``) gives the sha256 and
size of the data that went into the dataset, not of a file measured at
download time that may have changed since.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import logging
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

READ_BUFFER = 1 << 20
READ_BLOCK = 1 << 20     # bytes per read while cutting chunks of whole lines


@dataclass
class Digest:
    """sha256 and size of a file's bytes as a reader consumed them; set once the file is read to its end."""

    sha256: str | None = None
    bytes: int = 0


class _HashingRaw(io.RawIOBase):
    """A raw binary file that hashes every byte read from it."""

    def __init__(self, path: Path, hashing: bool) -> None:
        self._file = open(path, "rb", buffering=0)
        self._hash = hashlib.sha256() if hashing else None
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._file.readinto(buffer)
        if n and self._hash is not None:
            self._hash.update(memoryview(buffer)[:n])
        self.count += n or 0
        return n

    def finish(self, digest: Digest) -> None:
        """Hash what the reader left unread (nothing, for a file read to its end) into ``digest``."""
        buffer = bytearray(READ_BUFFER)
        while self.readinto(buffer):
            pass
        digest.sha256, digest.bytes = self._hash.hexdigest(), self.count

    def close(self) -> None:
        self._file.close()
        super().close()


class InputError(ValueError):
    """An input file that cannot be read as what its name says (a truncated or corrupt ``.gz``)."""


@contextmanager
def open_input(path: Path, digest: Digest | None = None) -> Iterator[IO[bytes]]:
    """The file's (decompressed) bytes; with ``digest``, hash the file's own bytes as they are read."""
    raw = _HashingRaw(path, digest is not None)
    buffered = io.BufferedReader(raw, READ_BUFFER)
    try:
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=buffered, mode="rb") as stream:
                yield stream
            if raw.count == 0:
                raise EOFError("the file is empty")
        else:
            yield buffered
        if digest is not None:
            raw.finish(digest)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{path}: truncated or corrupt gzip file ({type(e).__name__}: {e}); "
                         f"delete it and run `hotcold download` again") from e
    finally:
        buffered.close()


def _raw(stream: IO[bytes]) -> _HashingRaw:
    """The counting raw file under a stream of ``open_input``."""
    return getattr(stream, "fileobj", stream).raw    # GzipFile -> BufferedReader -> _HashingRaw


def read_chunks(path: Path, chunk_lines: int, digest: Digest | None = None,
                progress: Callable[[int], Any] | None = None) -> Iterator[tuple[int, bytes]]:
    """``(index of the chunk's first line, its lines joined)``: ``chunk_lines`` whole lines (the last chunk
    fewer; the file's last line may lack its newline). ``digest`` is filled when the file is done;
    ``progress(n)`` is told the bytes of the file itself (compressed, for a ``.gz``) consumed per chunk."""
    with open_input(path, digest) as f:
        raw = _raw(f)
        first, told = 0, 0
        pieces: list[bytes] = []
        have = 0                                     # whole lines in pieces
        while block := f.read(READ_BLOCK):
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            at, used = 0, 0                          # bytes and newlines of block already in chunks
            while have + nl.size - used >= chunk_lines:
                used += chunk_lines - have
                cut = int(nl[used - 1]) + 1
                pieces.append(block[at:cut])
                at = cut
                if progress is not None:
                    progress(raw.count - told)
                    told = raw.count
                yield first, b"".join(pieces)
                first += chunk_lines
                pieces, have = [], 0
            if at < len(block):
                pieces.append(block[at:])
            have += nl.size - used
        if pieces:
            if progress is not None:
                progress(raw.count - told)
            yield first, b"".join(pieces)


def count_lines(path: Path, progress: bool = False, block: int = READ_BUFFER) -> int:
    """Lines of a (possibly gzipped) text file; a last line without newline counts."""
    n, last = 0, b"\n"
    with open_input(path) as f, tqdm(total=path.stat().st_size if path.suffix != ".gz" else None,
                                     unit="B", unit_scale=True, desc=f"count {path.name}",
                                     disable=not progress) as bar:
        while data := f.read(block):
            n += data.count(b"\n")
            last = data[-1:]
            bar.update(len(data))
    return n + (last != b"\n")


def _extra(provenance: Mapping[str, Any], path: Path) -> dict[str, Any]:
    extra = provenance.get(path.name) or provenance.get(str(path)) or {}
    return {"sha256": extra} if isinstance(extra, str) else dict(extra)


def check_provenance(inputs: Sequence[Path], provenance: Mapping[str, Any] | None) -> None:
    """``provenance`` may only name input files (by name or path)."""
    known = {p.name for p in inputs} | {str(p) for p in inputs}
    unknown = sorted(set(provenance or {}) - known)
    if unknown:
        raise ValueError(f"provenance names files that are not inputs: {unknown}")


def source_records(inputs: Sequence[Path], digests: Sequence[Digest], provenance: Mapping[str, Any] | None,
                   expected_sha256: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One ``{"file", "bytes", "sha256", ...}`` per input, measured while reading (``digests``).

    ``provenance`` maps a file name (or path) to a sha256 string or a dict of
    fields recorded with it (url, ...); a sha256 or size measured when the file
    was fetched that differs from what was read is kept as ``fetched_sha256``
    / ``fetched_bytes`` with a warning. A file whose sha256 differs from
    ``expected_sha256`` (a configured checksum) fails.
    """
    provenance, expected = dict(provenance or {}), dict(expected_sha256 or {})
    out = []
    for path, digest in zip(inputs, digests, strict=True):
        extra = _extra(provenance, path)
        fetched = {k: extra.pop(k) for k in ("sha256", "bytes") if k in extra}
        want = expected.get(path.name)
        if want is not None and want.lower() != digest.sha256:
            raise ValueError(f"{path}: sha256 of the bytes read is {digest.sha256}, the configured checksum "
                             f"is {want.lower()}: the file changed or is not the one configured")
        record = {"file": path.name, "bytes": digest.bytes, "sha256": digest.sha256, **extra}
        if fetched.get("sha256", digest.sha256) != digest.sha256 or fetched.get("bytes", digest.bytes) != digest.bytes:
            log.warning("%s changed since it was fetched: sha256 %s (%s bytes) then, %s (%s bytes) as read",
                        path, fetched.get("sha256"), fetched.get("bytes"), digest.sha256, digest.bytes)
            record.update({f"fetched_{k}": v for k, v in fetched.items()})
        out.append(record)
    return out
