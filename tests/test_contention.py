"""Contention measured beside a run (``hotcold.contention``): other programs' CPU time and a fixed probe.

The issue it answers: under a sustained slowdown every step is slow alike, so
the step-time spread stays narrow, and the run still gets a fair share of CPU
time; the judgement from the run's own times called such a run ``stable``.
These tests check the measurement and the verdict on injected numbers (robust
however busy the machine is), the path from a disturbed repeat to the
summary, speed-up and claims tables, and, with real busy loops, that
competitors on the cores are seen (more load only makes that clearer). The
quiet and the end-to-end disturbed training runs are in the slow tier
(``tests/test_stability.py``).
"""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from hotcold.analysis.claims.table import claims_table
from hotcold.analysis.claims.catalog import Claim, Run
from hotcold.analysis.comparisons import speedup_table
from hotcold.analysis.summary import SUMMARY_COLUMNS, summary_frame
from hotcold.contention import (
    MAX_OTHER_CORES,
    MAX_PROBE_SLOWDOWN,
    CpuTimes,
    GpuState,
    QuietProbe,
    Watch,
    pool,
    read_cpu_times,
    read_load,
    verdict,
)
from hotcold.timing import TimedPart, summarize_repeats
from test_stability import competitors, stop

STAT = """cpu  700 0 300 1000 0 0 0 40 0 0
cpu0 100 0 50 500 0 0 0 10 0 0
cpu1 200 0 50 200 0 10 5 10 0 0
cpu2 400 0 200 300 0 0 0 20 0 0
intr 1 2 3
ctxt 5
"""


def test_cpu_times_sum_the_cores_the_process_may_use(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text(STAT)
    tick = 100.0  # USER_HZ: 100 on Linux
    every = read_cpu_times(None, path)
    assert every.cores == 3
    assert every.busy_s == pytest.approx((150 + 265 + 600) / tick)
    assert every.steal_s == pytest.approx(40 / tick)
    two = read_cpu_times({0, 1}, path)
    assert (two.cores, two.busy_s, two.steal_s) == (2, pytest.approx(415 / tick), pytest.approx(20 / tick))
    assert read_cpu_times(None, tmp_path / "missing") is None


def test_load_reads_the_runnable_tasks(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    path.write_text("1.52 0.64 0.29 3/98 7532\n")
    assert read_load(path) == (1.52, 3)
    assert read_load(tmp_path / "missing") is None


def numbers(busy_s: float, own_cpu_s: float, wall_s: float = 10.0, cores: int = 2, threads: int = 2,
            steal_s: float = 0.0, local_ranks: int = 1, probe_ms=None, probe_quiet_ms=None) -> dict:
    m = {"wall_s": wall_s, "own_cpu_s": own_cpu_s, "threads": threads, "local_ranks": local_ranks, "cores": cores,
         "busy_s": busy_s, "steal_s": steal_s}
    if probe_ms is not None:
        m.update(probe_ms=probe_ms, probe_quiet_ms=probe_quiet_ms)
    return m


def test_a_sustained_slowdown_from_other_programs_is_disturbed() -> None:
    # the case: a 2-thread run on 2 cores gets most of its CPU time (the run-internal share is 0.7),
    # while two busy loops ran 1.3 cores' worth beside it all along
    v = verdict(numbers(busy_s=20.0, own_cpu_s=14.0 - 7.0))
    assert v["disturbed"] and v["other_cores"] == pytest.approx(1.3)
    assert "other programs held 1.30 of the run's cores" in v["disturbed_reason"]
    quiet = verdict(numbers(busy_s=14.2, own_cpu_s=14.0))  # 0.02 cores of daemons
    assert not quiet["disturbed"] and quiet["disturbed_reason"] == ""
    assert quiet["other_cores"] == pytest.approx(0.02)


def test_cores_the_run_left_free_may_be_used_by_others() -> None:
    # one thread on four cores: others using up to three cores do not slow it
    assert not verdict(numbers(busy_s=38.0, own_cpu_s=10.0, cores=4, threads=1))["disturbed"]
    v = verdict(numbers(busy_s=44.0, own_cpu_s=10.0, cores=4, threads=1))
    assert v["disturbed"] and v["other_cores"] == pytest.approx(0.4)


def test_steal_counts_against_the_run() -> None:
    v = verdict(numbers(busy_s=16.0, own_cpu_s=16.0, steal_s=4.0))
    assert v["disturbed"] and v["other_cores"] == pytest.approx(0.4)


def test_the_ranks_beside_a_rank_are_the_run_not_others() -> None:
    # 4 one-thread ranks on 8 cores, each 9 s of CPU over 10 s: 36 s busy is the run itself
    assert not verdict(numbers(busy_s=36.0, own_cpu_s=9.0, cores=8, threads=1, local_ranks=4))["disturbed"]
    v = verdict(numbers(busy_s=36.0 + 50.0, own_cpu_s=9.0, cores=8, threads=1, local_ranks=4))
    assert v["disturbed"] and v["other_cores"] == pytest.approx(5.0 - 4.0)


def test_a_slow_probe_around_the_run_is_disturbed() -> None:
    slow = verdict(numbers(busy_s=14.0, own_cpu_s=14.0, probe_ms=[40.0, 100.0], probe_quiet_ms=40.0))
    assert slow["disturbed"] and slow["probe_slowdown"] == pytest.approx(2.5)
    assert f"probe took 2.50x its quiet time around the run (> {MAX_PROBE_SLOWDOWN:g})" in slow["disturbed_reason"]
    fine = verdict(numbers(busy_s=14.0, own_cpu_s=14.0, probe_ms=[40.0, 44.0], probe_quiet_ms=40.0))
    assert not fine["disturbed"] and fine["probe_slowdown"] == pytest.approx(1.1)


def test_without_proc_only_the_probe_judges() -> None:
    v = verdict({"wall_s": 10.0, "own_cpu_s": 5.0, "threads": 2, "probe_ms": [40.0, 41.0], "probe_quiet_ms": 40.0})
    assert not v["disturbed"] and v["other_cores"] != v["other_cores"]  # NaN: not measured


def test_the_quiet_probe_is_the_fastest_seen_calibrated_at_first_use() -> None:
    times = iter([50.0, 42.0, 45.0, 60.0, 40.0, 90.0])
    probe = QuietProbe(lambda threads: next(times), calibration=3)
    assert probe.measure(2) == 60.0 and probe.quiet(2) == 42.0  # calibrated by 50, 42, 45
    assert probe.measure(2) == 40.0 and probe.quiet(2) == 40.0
    assert probe.measure(2) == 90.0 and probe.quiet(2) == 40.0


def test_watch_measures_the_run_between_start_and_stop() -> None:
    stats = iter([CpuTimes(100.0, 1.0, 2), CpuTimes(120.0, 1.0, 2)])
    clock, cpu = iter([0.0, 10.0]), iter([3.0, 10.0])
    times = iter([40.0, 40.0, 40.0, 40.0, 70.0])
    watch = Watch(2, probe=QuietProbe(lambda t: next(times)), stat=lambda: next(stats),
                  own_cpu=lambda: next(cpu), clock=lambda: next(clock))
    watch.start()
    m = watch.stop()
    assert (m["wall_s"], m["own_cpu_s"], m["busy_s"], m["steal_s"]) == (10.0, 7.0, 20.0, 0.0)
    assert m["probe_ms"] == [40.0, 70.0] and m["probe_quiet_ms"] == 40.0
    assert m["other_cores"] == pytest.approx(1.3) and m["probe_slowdown"] == pytest.approx(1.75)
    assert m["disturbed"] and "other programs" in m["disturbed_reason"] and "probe" in m["disturbed_reason"]


def steady_part(contention: dict | None) -> TimedPart:
    """A repeat that its own times call stable: steps within 10%, all its CPU time."""
    steps = [(i, {"emb_fwd": 10.0 + (i % 3) * 0.5}) for i in range(30)]
    return TimedPart(steps, [], 100, "cpu", host_steps=steps, cpu_ms=[ph["emb_fwd"] for _, ph in steps],
                     contention=contention)


DISTURBED = verdict(numbers(busy_s=20.0, own_cpu_s=7.0))
QUIET = verdict(numbers(busy_s=14.1, own_cpu_s=14.0))


def test_a_disturbed_repeat_makes_a_steady_run_unstable() -> None:
    s = summarize_repeats([steady_part({**numbers(busy_s=20.0, own_cpu_s=7.0), **DISTURBED})])
    assert s["step_spread"] < 1.2 and s["cpu_share"] == pytest.approx(1.0)  # its own times see nothing
    assert s["stable"] is False and "other programs held 1.30" in s["unstable_reason"]
    assert s["other_cores"] == pytest.approx(1.3) and s["contention"]["disturbed"]
    assert s["contention"]["repeats"][0]["busy_s"] == 20.0
    quiet = summarize_repeats([steady_part(QUIET)])
    assert quiet["stable"] is True and quiet["unstable_reason"] == ""
    # a run nothing watched (train() alone) is judged as before
    assert "contention" not in summarize_repeats([steady_part(None)])


def test_repeats_name_the_disturbed_one() -> None:
    s = summarize_repeats([steady_part(QUIET), steady_part(DISTURBED), steady_part(QUIET)])
    assert s["stable"] is False and s["unstable_reason"].startswith("repeat 2: other programs held 1.30")
    assert s["other_cores"] == pytest.approx(1.3)
    assert pool([None, None]) is None


def record(method: str, variant: str, summary: dict) -> dict:
    return {"dataset": "kaggle", "method": method, "variant": variant, "seed": 0, "status": "ok",
            "summary": {**summary, "world": 1, "ranks_per_node": 1},
            "provenance": {"device": "cpu", "cpu": "TestCPU", "threads": 2, "timer": "cpu"},
            "config": {"distributed": {"world": 1, "ranks_per_node": 1}, "store": {}}, "store": {},
            "metrics": {"auc": 0.7, "logloss": 0.5}}


def test_the_tables_and_the_claim_built_on_a_disturbed_run_say_so() -> None:
    fae = record("fae", "24.8pct", summarize_repeats([steady_part(DISTURBED)]))
    hybrid = record("hybrid", "base", summarize_repeats([steady_part(QUIET)]))
    summary = summary_frame([fae, hybrid])
    assert {"other_cores", "probe_slowdown"} <= set(SUMMARY_COLUMNS)
    row = summary.set_index("method").loc["fae"]
    assert not bool(row["stable"]) and "other programs" in row["unstable_reason"]
    assert row["other_cores"] == pytest.approx(1.3)
    speed = speedup_table(summary).set_index("method")
    assert speed.loc["fae", "stable"] is False or not bool(speed.loc["fae", "stable"])
    claim = Claim("speed", "P", "faster", "x", 1.5, "1.5x", "GPU", "speed", "kaggle", Run("fae", "24.8pct"),
                  Run("hybrid", "base"), "prof")
    claims = claims_table([fae, hybrid], pd.DataFrame(), {"prof": SimpleNamespace(name="prof", scale=1.0)},
                          lambda rec, p: SimpleNamespace(samples_per_s=1.0, dominant="x"), lambda *a: {},
                          (claim,)).set_index("claim_id")
    assert claims.loc["speed", "measured_stable"] is False or not bool(claims.loc["speed", "measured_stable"])
    assert "disturbed" in claims.loc["speed", "why_they_differ"]


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat here")
def test_busy_loops_beside_a_process_are_seen() -> None:
    """Busy loops (one a core, up to 8) beside 0.5 s of this process's work, judged as a run that needs every
    core: other programs held more than ``MAX_OTHER_CORES`` of them. Other load only adds to what is seen."""
    import os

    cores = len(os.sched_getaffinity(0))
    procs = competitors(min(cores, 8))
    try:
        watch = Watch(cores, probe=None)
        watch.start()
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
        m = watch.stop()
    finally:
        stop(procs)
    assert m["disturbed"], m
    assert m["other_cores"] > MAX_OTHER_CORES


# -- a GPU run: judged by its GPU and the host load beyond its own threads, not by a CPU probe --------------------

QUIET_GPU = GpuState(other_pids=(), sm_clock_mhz=1980.0, max_sm_clock_mhz=1980.0, throttle=())


def _busy_own_threads(seconds: float, threads: int) -> None:
    """This process keeps ``threads`` cores busy (torch's matmuls free the GIL): a run's own threads."""
    import threading

    import torch

    def work():
        a = torch.rand(256, 256)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(a, a)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # one core a thread: torch's own pool would add a thread a core (16 on 16 cores)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        torch.set_num_threads(before)


def _gpu_run(gpu=lambda: QUIET_GPU) -> Watch:
    """The watch of a one-thread CUDA run, with a stand-in for the GPU's own signal (``gpu_state``)."""
    return Watch(1, gpu=gpu)


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat here")
def test_a_gpu_run_busy_with_its_own_threads_is_not_flagged() -> None:
    """The run's process keeps every core busy (its own threads beyond the one it asked for: a pipeline worker,
    copy threads): that is the run, not a disturbance. A GPU run is not judged by a CPU probe at all."""
    import os

    watch = _gpu_run()
    assert watch.probe is None
    watch.start()
    _busy_own_threads(0.5, len(os.sched_getaffinity(0)))
    m = watch.stop()
    assert not m["disturbed"], m["disturbed_reason"]
    assert m["gpu"] == [vars(QUIET_GPU)] * 2 and "probe_ms" not in m


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat here")
def test_a_gpu_run_beside_a_busy_loop_is_flagged() -> None:
    """Busy loops, two a core, beside a one-thread GPU run: the host that launches its steps was shared (the
    cores its thread left free are the others' to use: it takes more than those to disturb it)."""
    import os

    procs = competitors(2 * len(os.sched_getaffinity(0)))  # two a core on any machine (16 on 16 cores: none spare)
    try:
        watch = _gpu_run()
        watch.start()
        _busy_own_threads(0.5, 1)
        m = watch.stop()
    finally:
        stop(procs)
    assert m["disturbed"] and "other programs held" in m["disturbed_reason"]


@pytest.mark.parametrize("state, reason", [
    (GpuState((4242,), 1980.0, 1980.0, ()), "other processes computed on the GPU (pids 4242)"),
    (GpuState((), 1980.0, 1980.0, ("hw_thermal_slowdown",)), "clocks were held down (hw_thermal_slowdown)"),
    (GpuState((), 990.0, 1980.0, ()), "SM clock ran at 990 of its 1980 MHz"),
])
def test_what_disturbs_a_gpu_is_named(state, reason) -> None:
    m = verdict({"wall_s": 1.0, "gpu": [vars(QUIET_GPU), vars(state)]})
    assert m["disturbed"] and reason in m["disturbed_reason"]
    idle = verdict({"wall_s": 1.0, "gpu": [vars(GpuState((), 345.0, 1980.0, (), idle=True))]})
    assert not idle["disturbed"]  # an idle GPU's clocks are down by design


def test_a_rank_counts_the_launchers_ranks_on_its_node() -> None:
    from hotcold.devices import local_ranks

    assert local_ranks({}) == 1
    assert local_ranks({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}) == 2
    assert local_ranks({"WORLD_SIZE": "4"}) == 4
