"""A run disturbed by competing processes is flagged ``stable = no``; a quiet one is not.

The recorded runs (``run_and_record``) are also watched beside their training
(``hotcold.contention``): two busy loops mark one disturbed, a quiet one is not.

Trains a tiny model through the real loop (``hotcold.train.train``, CPU timer,
one thread) once quietly and once while busy-loop processes hold every core.
The competitors are started and confirmed spinning before training begins and
are always killed afterwards. The quiet case needs a quiet machine: it is
skipped, saying so, when other processes already want every core.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch

from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.timing import MIN_CPU_SHARE, PhaseTimer, summarize
from hotcold.train import train

CPU = torch.device("cpu")
#: busy loops per core: with 3 per core a one-thread process gets about 1/4 of a core (< MIN_CPU_SHARE)
COMPETITORS_PER_CORE = 3
#: a busy loop that says it is running before it spins (``-I -S``: no site imports, fast start)
SPIN = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush()\nwhile True: pass"
#: a quiet run disturbed by someone else's job on a shared machine is retried (each try under 1 s alone)
QUIET_TRIES = 3
QUIET_STEPS, DISTURBED_STEPS = 300, 200  # ~1.5 ms a step alone; a disturbed step waits 3-10x longer
#: the quiet run's batch: steps of several ms, so that one stray context switch does not set p90/p10
QUIET_BATCH = 512


def run_cfg(steps: int, batch_size: int = 128) -> RunConfig:
    """A tiny ``hybrid`` run on the fixture dataset, CPU timer, evaluated on a few samples."""
    return RunConfig.from_dict({
        "dataset": "small", "method": "hybrid",
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"steps": steps, "warmup_steps": 20, "batch_size": batch_size, "eval_batch_size": 1024,
                  "eval_samples": 256},
        "timing": {"device": "cpu"},
    })


@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def competitors(n: int) -> list[subprocess.Popen]:
    """Start ``n`` busy loops and return once every one of them is spinning."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN], stdout=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, text=True))
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait(timeout=10)
        proc.stdout.close()


def quiet_summary(dataset: Dataset) -> dict:
    for _ in range(QUIET_TRIES):
        summary = train(run_cfg(QUIET_STEPS // 2, QUIET_BATCH), dataset, CPU, progress=False).summary
        if summary["stable"]:
            break
    return summary


def others_runnable(samples: int = 10) -> float:
    """Processes besides this one that want a core right now (median of a few looks).

    Linux: the runnable count of ``/proc/loadavg`` (which counts this process
    too); elsewhere the 1-minute load average.
    """
    path = Path("/proc/loadavg")
    if not path.is_file():
        return os.getloadavg()[0]
    counts = []
    for _ in range(samples):
        counts.append(int(path.read_text().split()[3].split("/")[0]) - 1)
        time.sleep(0.02)
    return float(sorted(counts)[len(counts) // 2])


def test_a_quiet_run_is_stable(small_dataset: Dataset, one_thread: None) -> None:
    cores = os.cpu_count() or 1
    others = others_runnable()
    if others >= cores:
        pytest.skip(f"the machine is not quiet: {others:g} other processes want its {cores} cores")
    quiet = quiet_summary(small_dataset)
    if not quiet["stable"] and os.getloadavg()[0] > cores:
        pytest.skip(f"the machine got busy during the test (1-minute load {os.getloadavg()[0]:.1f} on {cores} "
                    f"cores): {quiet['unstable_reason']}")
    assert quiet["stable"] is True, f"quiet run disturbed {QUIET_TRIES} times: {quiet['unstable_reason']}"
    assert quiet["unstable_reason"] == ""
    assert quiet["cpu_share"] >= MIN_CPU_SHARE


@pytest.mark.slow  # busy processes beside a run
def test_competing_processes_make_a_run_unstable(small_dataset: Dataset, one_thread: None) -> None:
    alone = train(run_cfg(QUIET_STEPS), small_dataset, CPU, progress=False).summary
    procs = competitors(max(4, COMPETITORS_PER_CORE * (os.cpu_count() or 1)))
    try:
        disturbed = train(run_cfg(DISTURBED_STEPS), small_dataset, CPU, progress=False).summary
    finally:
        stop(procs)
    assert all(p.returncode is not None for p in procs)
    assert disturbed["stable"] is False
    assert "CPU time" in disturbed["unstable_reason"] and "waited for the cores" in disturbed["unstable_reason"]
    assert disturbed["cpu_share"] < MIN_CPU_SHARE
    # what the test controls, however busy the machine was anyway: the competitors took most of the run's share
    assert disturbed["cpu_share"] < 0.75 * alone["cpu_share"]


class Machine:
    """A wall clock and a process CPU clock (ns) where every CPU-clock read hands the core away for ``wait_ns``.

    That is what a loaded Linux machine does: reading process CPU time updates
    the scheduler's accounting, and a process whose slice is over waits right
    there.
    """

    def __init__(self, wait_ns: int) -> None:
        self.wall = self.cpu = 0
        self.wait_ns = wait_ns

    def work(self, ns: int) -> None:
        self.wall += ns
        self.cpu += ns

    def wall_clock(self) -> int:
        return self.wall

    def cpu_clock(self) -> int:
        self.wall += self.wait_ns
        return self.cpu


def test_a_wait_that_reading_the_cpu_clock_triggers_counts_in_the_step() -> None:
    machine = Machine(wait_ns=2_000_000)
    timer = PhaseTimer("cpu", clock=machine.wall_clock, cpu_clock=machine.cpu_clock)
    for _ in range(20):
        timer.begin_step()
        for phase in ("data", "emb_fwd", "dense_fwd_bwd"):
            machine.work(1_000_000)
            timer.mark(phase)
        timer.end_step()
    summary = summarize(timer.steps, [], 64, "cpu", cpu_ms=timer.cpu_ms, threads=1)
    step_wall_ms = sum(sum(ph.values()) for _, ph in timer.steps)
    assert sum(timer.cpu_ms) == pytest.approx(machine.cpu / 1e6)
    assert step_wall_ms == pytest.approx(machine.wall / 1e6)  # no wait escapes the steps' wall time
    assert summary["cpu_share"] == pytest.approx(3 / (3 + 4 * 2))  # 3 ms of work, 4 reads of 2 ms waits
    assert summary["stable"] is False and "CPU time" in summary["unstable_reason"]


#: the issue's trial: two busy loops beside a default-style run of the run's own thread count
BUSY_LOOPS = 2


def recorded_summary(dataset: Dataset, out: Path, steps: int) -> dict:
    """A run trained and recorded as the workflow does (``run_and_record``: watched for contention)."""
    from hotcold.runs.repeats import run_and_record

    record = run_and_record(run_cfg(steps, QUIET_BATCH), Path(dataset.path), out, torch.device("cpu"), progress=False)
    return record["summary"]


@pytest.mark.slow  # busy processes beside a run
def test_two_busy_loops_beside_a_recorded_run_mark_it_disturbed(small_dataset: Dataset, tmp_path: Path) -> None:
    procs = competitors(BUSY_LOOPS)
    try:
        summary = recorded_summary(small_dataset, tmp_path / "busy", DISTURBED_STEPS)
    finally:
        stop(procs)
    assert summary["stable"] is False
    assert "other programs held" in summary["unstable_reason"], summary["unstable_reason"]
    assert summary["other_cores"] > 0.3 and summary["contention"]["repeats"][0]["busy_s"] > 0


@pytest.mark.slow  # needs a quiet machine
def test_a_quiet_recorded_run_is_not_disturbed(small_dataset: Dataset, tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if others_runnable() >= 1:
        pytest.skip(f"the machine is not quiet: {others_runnable():g} other processes want its {cores} cores")
    for attempt in range(QUIET_TRIES):
        summary = recorded_summary(small_dataset, tmp_path / f"quiet{attempt}", QUIET_STEPS)
        if not summary["contention"]["disturbed"]:
            break
    if summary["contention"]["disturbed"] and others_runnable() >= 1:
        pytest.skip(f"the machine got busy during the test: {summary['contention']['disturbed_reason']}")
    assert summary["contention"]["disturbed"] is False, summary["contention"]["disturbed_reason"]
    assert summary["other_cores"] <= 0.3
