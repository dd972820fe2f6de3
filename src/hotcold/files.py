"""File helpers: atomic writes and content hashes.

Each writer fills a temporary sibling and renames it into place, so a file
appears under its name only when complete and a job killed half-way leaves
nothing that looks finished.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any, Callable


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write`` on a temporary sibling of ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path | str, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def file_sha256(path: Path | str, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
