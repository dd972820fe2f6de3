"""What a killed Snakemake leaves in its working directory, and clearing it so that the workflow resumes.

Snakemake killed with SIGKILL leaves three things behind:

- its lock files (``.snakemake/locks/<n>.input.lock``, ``<n>.output.lock``: file lists, no owner), so
  that the next run stops with a ``LockException``;
- its running jobs, reparented away from it: a training job keeps running and would write into the
  same run directory as the rerun of that job;
- the temporary siblings of files being written atomically (``.<name>.tmp-<pid>``, see
  :mod:`hotcold.files`) by a job killed in turn.

The workflow marks every job it starts with the Snakemake process's id (the environment variable
:data:`MARKER`, set by the shell prefix of ``workflows/rules/common.smk``). :func:`resume` ends the
marked processes whose Snakemake is gone, removes the lock files no live Snakemake in the directory can
own (one started after a lock file was written did not write it) and the temporary files of dead
processes. Half-finished jobs then rerun (``--rerun-incomplete``). Two Snakemake runs at once in one
directory are left alone: their locks and jobs belong to live processes.
"""
from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the environment variable holding the id of the Snakemake process that started a job
MARKER = "HOTCOLD_WORKFLOW_PID"
#: Snakemake's lock files, relative to its working directory
LOCK_DIR = Path(".snakemake") / "locks"
LOCK_FILE = re.compile(r"^[0-9]+\.(input|output)\.lock$")
#: the temporary sibling of a file being written atomically (hotcold.files.atomic_write)
TEMP_FILE = re.compile(r"^\..+\.tmp-([0-9]+)$")
#: the directories the workflow writes (temporary files are looked for there only)
OUTPUT_DIRS = ("results", "paper_figs")
#: a lock file written less than this long before a live Snakemake started may still be its own
START_SLACK_S = 2.0


@dataclass
class Resumed:
    """What :func:`resume` found and did."""

    holders: list[int] = field(default_factory=list)       # live Snakemake processes in the directory
    locks_cleared: list[Path] = field(default_factory=list)
    locks_kept: list[Path] = field(default_factory=list)
    orphan_jobs: list[list[int]] = field(default_factory=list)  # per job: its processes, root first
    temp_removed: list[Path] = field(default_factory=list)

    def line(self) -> str:
        """One line saying what was done."""
        parts = []
        if self.orphan_jobs:
            pids = ", ".join(str(p) for job in self.orphan_jobs for p in job)
            n = len(self.orphan_jobs)
            parts.append(f"ended {n} orphaned job{'s' * (n != 1)} of a killed Snakemake (pids {pids})")
        if self.locks_cleared:
            parts.append(f"cleared a stale lock ({len(self.locks_cleared)} lock files no running Snakemake holds)")
        if self.locks_kept:
            parts.append(f"left the lock of the Snakemake running here (pid {', '.join(map(str, self.holders))})")
        if self.temp_removed:
            parts.append(f"removed {len(self.temp_removed)} half-written file(s) of killed jobs")
        if not parts:
            running = f"; Snakemake pid {', '.join(map(str, self.holders))} is running here" if self.holders else ""
            return f"resume: nothing to clear (no stale lock, no orphaned job){running}"
        return "resume: " + "; ".join(parts)


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:  # Snakemake depends on it, so wherever the workflow runs it is there
        raise OSError("hotcold resume needs psutil (installed with Snakemake: envs/requirements.txt)") from None
    return psutil


def _same_dir(a: str | os.PathLike[str], b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_snakemake(cmdline: Iterable[str]) -> bool:
    """Whether a command line runs Snakemake (``snakemake ...``, ``python .../bin/snakemake``,
    ``python -m snakemake``)."""
    return any(Path(arg).name == "snakemake" for arg in cmdline)


def snakemake_processes(workdir: Path) -> list[Any]:
    """Live Snakemake processes whose working directory is ``workdir`` (this process excluded)."""
    psutil = _psutil()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = proc.info
        if (proc.pid != os.getpid() and info["status"] != psutil.STATUS_ZOMBIE and info["cwd"]
                and is_snakemake(info["cmdline"] or ()) and _same_dir(info["cwd"], workdir)):
            found.append(proc)
    return found


def _alive_snakemake(pid: int, started_before: float) -> bool:
    """Whether ``pid`` is a live Snakemake process started before ``started_before`` (not a reused pid)."""
    psutil = _psutil()
    try:
        proc = psutil.Process(pid)
        return (proc.status() != psutil.STATUS_ZOMBIE and is_snakemake(proc.cmdline())
                and proc.create_time() <= started_before + 1.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def orphaned_jobs(workdir: Path) -> list[list[Any]]:
    """The processes of jobs that a Snakemake in ``workdir`` started and that outlived it, grouped per job
    (a job: a process whose parent is not among them, and its descendants among them)."""
    psutil = _psutil()
    orphans: dict[int, Any] = {}
    for proc in psutil.process_iter(["pid", "ppid", "cwd", "status", "create_time"]):
        info = proc.info
        if proc.pid == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE or not info["cwd"]:
            continue
        try:
            marker = proc.environ().get(MARKER)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if not marker or not marker.isdigit() or not _same_dir(info["cwd"], workdir):
            continue
        if not _alive_snakemake(int(marker), info["create_time"]):
            orphans[proc.pid] = proc
    jobs: dict[int, list[Any]] = {}
    for pid, proc in sorted(orphans.items()):
        root = proc
        while root.info["ppid"] in orphans:
            root = orphans[root.info["ppid"]]
        jobs.setdefault(root.pid, []).append(proc)
    return [sorted(procs, key=lambda p: (p.pid != root, p.pid)) for root, procs in sorted(jobs.items())]


def _running(proc: Any) -> bool:
    """Whether ``proc`` still runs (a zombie waiting for its parent to reap it has ended)."""
    psutil = _psutil()
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_ended(procs: list[Any], timeout_s: float) -> list[Any]:
    """Wait up to ``timeout_s`` for ``procs`` to end; those still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs = [p for p in procs if _running(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.05)


def end_processes(procs: list[Any], grace_s: float) -> None:
    """SIGTERM ``procs``, then SIGKILL whichever still runs after ``grace_s`` seconds; wait for them."""
    psutil = _psutil()
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    alive = _wait_ended(procs, grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    still = _wait_ended(alive, 5.0)
    if still:
        raise OSError(f"could not end the orphaned job processes {[p.pid for p in still]}")


def lock_files(workdir: Path) -> list[Path]:
    lock_dir = workdir / LOCK_DIR
    if not lock_dir.is_dir():
        return []
    return sorted(p for p in lock_dir.iterdir() if LOCK_FILE.match(p.name) and p.is_file())


def stale_locks(locks: list[Path], holders: list[Any]) -> list[Path]:
    """The lock files none of the live ``holders`` can have written: all of them when none runs, else
    those written before every holder started."""
    psutil = _psutil()
    starts = []
    for proc in holders:
        try:
            starts.append(proc.create_time())
        except psutil.NoSuchProcess:
            continue
    if not starts:
        return list(locks)
    first = min(starts)
    stale = []
    for lock in locks:
        try:
            if lock.stat().st_mtime < first - START_SLACK_S:
                stale.append(lock)
        except FileNotFoundError:
            continue
    return stale


def _pid_alive(pid: int) -> bool:
    return _psutil().pid_exists(pid)


def stale_temp_files(workdir: Path) -> list[Path]:
    """Temporary siblings of atomic writes whose writing process is gone, under the output directories."""
    found = []
    for top in OUTPUT_DIRS:
        for root, _, files in os.walk(workdir / top):
            for name in files:
                m = TEMP_FILE.match(name)
                if m and not _pid_alive(int(m[1])):
                    found.append(Path(root) / name)
    return sorted(found)


def resume(workdir: Path | str = ".", grace_s: float = 10.0) -> Resumed:
    """Clear what a killed Snakemake left in ``workdir``: end its orphaned jobs, remove the lock files
    no live Snakemake there holds and the temporary files of dead writers."""
    workdir = Path(workdir).resolve()
    if not workdir.is_dir():
        raise OSError(f"{workdir}: not a directory")
    done = Resumed()
    jobs = orphaned_jobs(workdir)
    if jobs:
        end_processes([p for job in jobs for p in job], grace_s)
        done.orphan_jobs = [[p.pid for p in job] for job in jobs]
    holders = snakemake_processes(workdir)
    done.holders = sorted(p.pid for p in holders)
    locks = lock_files(workdir)
    stale = stale_locks(locks, holders)
    for lock in stale:
        lock.unlink(missing_ok=True)
    done.locks_cleared = stale
    done.locks_kept = [lock for lock in locks if lock not in stale]
    for path in stale_temp_files(workdir):
        path.unlink(missing_ok=True)
        done.temp_removed.append(path)
    return done
