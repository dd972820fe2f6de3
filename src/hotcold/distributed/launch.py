"""``hotcold train --nproc P``: start P ranks with torchrun, each running the same ``hotcold train``; and keep
them tied to the launcher.

A launch leaves nothing running when it ends, however it ends:

- the launcher gives torchrun a parent-death signal (``SIGTERM``, which
  torchrun forwards to its ranks) and each rank one of its own (``SIGKILL``,
  should torchrun die): ``die_with_parent``, Linux's ``PR_SET_PDEATHSIG``;
- on ``SIGTERM``, ``SIGINT`` or ``SIGHUP`` the launcher stops torchrun and
  every rank (each rank writes its pid into the launch's private directory
  when it starts, so even a stopped rank is killed), and removes the run's
  record: a launch that was stopped has no record;
- a rank writes a record only while its launcher lives (``launcher_alive``,
  checked by ``records.write_run``), so a rank orphaned by ``kill -9`` writes
  none;
- a rank that fails with a message for the user (``report_failure``, e.g. a
  rank that did not answer within ``distributed.timeout_s``) has the launcher
  stop the others at once and end with that message.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

LAUNCHER_PID = "HOTCOLD_LAUNCHER_PID"   # the launcher's pid, in every rank's environment
LAUNCH_DIR = "HOTCOLD_LAUNCH_DIR"       # the launch's private directory: ranks' pids and failure messages
FAILURE = "failure"                     # a rank's one-line message, in the launch directory
STOP_GRACE_S = 5.0                      # how long torchrun gets to stop its ranks before they are killed
FAILED_GRACE_S = 1.0                    # the same once a rank has said the run failed
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


class LaunchStopped(ChildProcessError):
    """The launcher got a signal that ends the launch (its ranks are stopped; no record)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}: torchrun and every rank were stopped, "
                         "no record was written")
        self.signum = signum


def torchrun_command(nproc: int, verb_args: Sequence[str]) -> list[str]:
    """torchrun on this machine (``--standalone``: a free port, no rendezvous server) running ``hotcold``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "hotcold", *verb_args]


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux; False elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parent_of(pid: int) -> int | None:
    """``pid``'s parent from ``/proc`` (None where it cannot be read: no such process, or no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def launcher_alive() -> bool:
    """Whether this process is not a rank of a launch, or its launcher still runs (its parent's parent).

    A rank's parent is torchrun, whose parent is the launcher; once the
    launcher is gone torchrun is someone else's child. Without ``/proc``,
    whether a process of the launcher's pid exists.
    """
    pid = os.environ.get(LAUNCHER_PID)
    if not pid:
        return True
    if Path("/proc/self/stat").exists():
        return _parent_of(os.getppid()) == int(pid)
    try:
        os.kill(int(pid), 0)
    except OSError:
        return False
    return True


def join_launch(rank: int) -> None:
    """In a rank: die with torchrun, and tell the launcher this rank's pid (it kills the ranks when stopped)."""
    die_with_parent(signal.SIGKILL)
    if not launcher_alive():  # the launcher died before the death signal was set
        os._exit(1)
    where = os.environ.get(LAUNCH_DIR)
    if where:
        _write_line(Path(where) / f"rank-{rank}.pid", str(os.getpid()))


def report_failure(message: str) -> None:
    """In a rank: leave a one-line failure message for the launcher (the first one written is kept)."""
    where = os.environ.get(LAUNCH_DIR)
    if where:
        try:
            fd = os.open(Path(where) / FAILURE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(" ".join(message.split()) + "\n")


def _write_line(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.rename(path)


def _preexec() -> None:
    die_with_parent(signal.SIGTERM)  # torchrun stops its ranks on SIGTERM


def launch_ranks(nproc: int, verb_args: Sequence[str]) -> int:
    """Run the ranks to completion and return torchrun's exit status (non-zero when any rank failed)."""
    return run_ranks(nproc, verb_args)[0]


def run_ranks(nproc: int, verb_args: Sequence[str], on_stop: Callable[[], None] | None = None) -> tuple[int, str]:
    """Run the ranks to completion: torchrun's exit status (non-zero when any rank failed) and a rank's failure
    message ("" when none left one).

    Each rank gets one intra-op thread unless told otherwise; torchrun stops
    the others when one rank fails. On ``SIGTERM``, ``SIGINT`` or ``SIGHUP``
    the launch is stopped (torchrun and every rank), ``on_stop`` runs, and
    ``LaunchStopped`` is raised.
    """
    with tempfile.TemporaryDirectory(prefix="hotcold-launch-") as where:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env[LAUNCHER_PID], env[LAUNCH_DIR] = str(os.getpid()), where
        stopped: list[int] = []

        def stop(signum: int, frame: object) -> None:
            stopped.append(signum)
            raise LaunchStopped(signum)

        signals = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
        if threading.current_thread() is not threading.main_thread():
            signals = []  # only the main thread may handle signals; the parent-death signals still hold
        previous = {s: signal.signal(s, stop) for s in signals}
        proc = None
        try:
            proc = subprocess.Popen(torchrun_command(nproc, verb_args), env=env, start_new_session=True,
                                    preexec_fn=_preexec if sys.platform.startswith("linux") else None)
            failure = Path(where) / FAILURE
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if failure.exists():  # a rank failed with a message: the others need not wait torchrun's 30 s
                    rc = _stop(proc, Path(where), signal.SIGTERM, FAILED_GRACE_S)
                    break
            message = failure.read_text().strip() if failure.exists() else ""
            return rc, message
        except LaunchStopped:
            pass
        finally:
            if stopped or (proc is not None and proc.poll() is None):
                for s in signals:  # a second signal must not interrupt the stopping
                    signal.signal(s, signal.SIG_IGN)
                if proc is not None:
                    _stop(proc, Path(where), signal.SIGTERM, STOP_GRACE_S)
                if on_stop is not None:
                    on_stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        raise LaunchStopped(stopped[0])


def _our_ranks(where: Path) -> list[int]:
    """The pids of this launch's ranks that still run (checked by their environment, so a reused pid is never hit)."""
    pids = []
    mark = f"{LAUNCH_DIR}={where}".encode()
    for path in where.glob("rank-*.pid"):
        try:
            pid = int(path.read_text())
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ValueError):
            continue
        if mark in environ.split(b"\0") and _state(pid) not in ("", "Z"):
            pids.append(pid)
    return pids


def _stop(proc: subprocess.Popen, where: Path, signum: int, grace_s: float) -> int:
    """Stop torchrun (``signum``; it stops its ranks), kill the ranks still there after ``grace_s`` (a stopped or
    hung rank ignores ``SIGTERM``), then torchrun; torchrun's exit status."""
    if proc.poll() is None:
        proc.send_signal(signum)
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _our_ranks(where):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]
