"""Putting a finished dataset directory in place: leftovers of killed runs, an atomic swap, fsync.

A dataset is built in a temporary sibling of its final name (``temp_dir``)
and swapped in only when complete (``swap_in``), because other jobs may open
the name at any time: it must never be without a complete dataset. A run
killed with SIGKILL cannot clean up after itself, so every writer first
removes the leftovers of dead runs on this machine (``remove_stale``).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
from pathlib import Path

from hotcold.files import fsync_dir, fsync_file, host_tag, pid_alive

RENAME_EXCHANGE = 2
AT_FDCWD = -100
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


def temp_dir(out: Path) -> Path:
    """Where the dataset ``out`` is built by this process: ``.<name>.tmp-<host>-<pid>`` beside its final name."""
    return out.parent / f".{out.name}.tmp-{host_tag()}"


def _leftover(out: Path, sibling: Path) -> tuple[str, int] | None:
    """``(kind, pid)`` of a temporary (``tmp``) or set-aside (``old``) sibling of ``out`` made on this machine."""
    for kind in ("tmp", "old"):
        prefix = f".{out.name}.{kind}-"
        if not sibling.name.startswith(prefix):
            continue
        host, _, pid = sibling.name[len(prefix):].rpartition("-")
        if pid.isdigit() and host in ("", socket.gethostname().replace("/", "_")):
            return kind, int(pid)
    return None


def remove_stale(out: Path) -> list[Path]:
    """Delete the leftovers of dead runs on this machine (restoring a set-aside dataset whose swap died).

    A run killed with SIGKILL cannot clean up after itself, so every writer
    first removes the leftovers of runs on this machine whose process is gone;
    another machine's leftovers on a shared disk are left alone, their process
    may be running there.
    """
    if not out.parent.is_dir():
        return []
    removed = []
    for sibling in sorted(out.parent.iterdir()):
        found = _leftover(out, sibling)
        if found is None or pid_alive(found[1]):
            continue
        kind, _ = found
        if kind == "old" and not out.exists() and (sibling / "manifest.json").is_file():
            os.rename(sibling, out)
            fsync_dir(out.parent)
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        removed.append(sibling)
    return removed


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fsync_file(path)
    fsync_dir(directory)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def swap_in(tmp: Path, out: Path) -> None:
    """Make the complete directory ``tmp`` the dataset ``out``, replacing any old one.

    The swap must never leave the name without a complete dataset, since
    other jobs may open it at any time. On Linux the new and the old directory
    trade names in one ``renameat2(RENAME_EXCHANGE)`` call: one atomic step,
    after which the old dataset is deleted under the temporary name. Where that
    call is missing (another OS, libc before 2.28, a file system that refuses
    the flag) the old directory is renamed aside to
    ``.<name>.old-<host>-<pid>`` and the new one renamed in: a window of two
    renames in which the name is absent, and if the process dies inside it,
    the next writer (``remove_stale``) renames the complete old dataset (it has
    its manifest) back. Rename-aside alone was not chosen as the main path
    because even its short window is visible to readers; the exchange is not.

    Before any rename the column files, the manifest and the directory are
    fsynced, and the parent directory after, so a power loss cannot leave a
    complete-looking name over unwritten data.
    """
    _fsync_tree(tmp)
    if not out.exists():
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        fsync_dir(out.parent)
        shutil.rmtree(tmp)
    else:
        old = out.parent / f".{out.name}.old-{host_tag()}"
        os.rename(out, old)
        os.rename(tmp, out)
        fsync_dir(out.parent)
        shutil.rmtree(old)
    fsync_dir(out.parent)
