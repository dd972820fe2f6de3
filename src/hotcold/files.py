"""File helpers: atomic writes, durable renames and content hashes.

Each writer fills a temporary sibling and renames it into place, so a file
appears under its name only when complete and a job killed half-way leaves
nothing that looks finished. Data is fsynced before the rename and the
directory after it, so a crash of the machine cannot leave a complete-looking
name over lost bytes.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
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
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
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


def fsync_file(path: Path | str) -> None:
    """Flush a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path | str) -> None:
    """Flush a directory's entries (renames, new files) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def host_tag() -> str:
    """``<host>-<pid>``: names a temporary file of this process, told apart from other machines' on a shared disk."""
    return f"{socket.gethostname().replace('/', '_')}-{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a process of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def tree_sha256(root: Path | str, pattern: str = "*.py") -> str:
    """sha256 of the files matching ``pattern`` under ``root``, by relative path, contents only.

    Of the package's source it says which code made a record (``records.source_sha256``), and it is a
    parameter of the workflow's training rules, so that a code edit reruns them.
    """
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted(root.rglob(pattern), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.read_bytes())
    return digest.hexdigest()
