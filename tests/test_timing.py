"""The phase timer on a fake clock, and step summaries."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotcold.timing import MAX_REPEAT_SPREAD, PhaseTimer, TimedPart, median_ms, summarize, summarize_repeats, time_ms


class FakeClock:
    """Advances by the next scripted amount (in ns) on every read."""

    def __init__(self, steps_ns):
        self.t, self.steps = 0, iter(steps_ns)

    def __call__(self) -> int:
        self.t += next(self.steps)
        return self.t


def run_steps(timer: PhaseTimer, n: int, phases) -> None:
    for _ in range(n):
        timer.begin_step()
        for p in phases:
            timer.mark(p)
        timer.end_step()


def test_phases_add_up_and_warmup_is_dropped():
    # per step: begin, then data 1 ms, h2d 2 ms, emb_fwd 3 ms, h2d again 4 ms
    clock = FakeClock([10_000_000] + [1_000_000, 2_000_000, 3_000_000, 4_000_000, 7_000_000] * 5)
    timer = PhaseTimer("cpu", warmup=2, clock=clock)
    for _ in range(5):
        timer.begin_step()
        for p in ("data", "h2d", "emb_fwd", "h2d"):
            timer.mark(p)
        timer.end_step()
    assert [s for s, _ in timer.steps] == [2, 3, 4]
    for _, ph in timer.steps:
        assert ph == {"data": 1.0, "h2d": 6.0, "emb_fwd": 3.0}
    summary = summarize(timer.steps, [(s, {"lookups": 10}) for s in (2, 3, 4)], batch_size=100, timer="cpu")
    assert summary["step_ms_p50"] == pytest.approx(10.0)
    assert sum(summary["phase_ms_p50"].values()) == pytest.approx(10.0)
    assert list(summary["phase_ms_p50"]) == ["data", "h2d", "emb_fwd"]  # pipeline order
    assert summary["samples_per_s"] == pytest.approx(100 / 0.010)
    assert summary["counters_per_step"] == {"lookups": 10.0}
    assert summary["steps_timed"] == 3


def test_percentiles_over_steps():
    durations = [1, 2, 3, 4, 100]  # ms of one phase per step
    clock = FakeClock([x for d in durations for x in (1, d * 1_000_000)])
    timer = PhaseTimer("cpu", clock=clock)
    run_steps(timer, 5, ["dense_fwd_bwd"])
    s = summarize(timer.steps, [], batch_size=1, timer="cpu")
    assert s["step_ms_p50"] == pytest.approx(3.0)
    assert s["step_ms_p90"] > s["step_ms_p50"] > s["step_ms_p10"]


def test_summary_needs_timed_steps():
    timer = PhaseTimer("cpu", warmup=3, clock=FakeClock([1] * 100))
    run_steps(timer, 3, ["data"])
    with pytest.raises(ValueError, match="no timed steps"):
        summarize(timer.steps, [], batch_size=1, timer="cpu")


def test_time_ms_times_one_call_and_median_ms_warms_up_first():
    import time

    calls = []
    assert time_ms(lambda: time.sleep(0.02)) >= 19.0
    assert median_ms(lambda: calls.append(1), 5) >= 0 and len(calls) == 6  # one warm-up call, then 5 timed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA-event back end needs a GPU")
def test_time_ms_on_a_gpu_counts_the_kernels_it_waits_for():
    x = torch.randn(2048, 2048, device="cuda")
    one = median_ms(lambda: x @ x, 3, torch.device("cuda"))
    ten = median_ms(lambda: [x @ x for _ in range(10)], 3, "cuda")
    assert 0 < one < ten


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA-event back end needs a GPU")
def test_cuda_events_add_up():
    timer = PhaseTimer("cuda", warmup=1, window=4)
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(10):
        timer.begin_step()
        for p in ("data", "dense_fwd_bwd"):
            x = x @ x.T / 1024
            timer.mark(p)
        timer.end_step()
    timer.flush()
    assert [s for s, _ in timer.steps] == list(range(1, 10))
    assert all(ph["data"] > 0 and ph["dense_fwd_bwd"] > 0 for _, ph in timer.steps)


def test_cpu_host_steps_are_the_steps():
    timer = PhaseTimer("cpu", clock=FakeClock([1_000_000] * 20))
    run_steps(timer, 3, ["data", "h2d"])
    assert timer.host_steps is timer.steps
    s = summarize(timer.steps, [], batch_size=1, timer="cpu", host_steps=timer.host_steps)
    assert "host_step_ms_p50" not in s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA-event back end needs a GPU")
def test_cuda_timer_reads_the_host_clock_too():
    """A CPU-only phase shows by the host clock even when the GPU never waits for it."""
    import time

    timer = PhaseTimer("cuda", window=4)
    for _ in range(4):
        timer.begin_step()
        time.sleep(0.02)  # host work, nothing on the stream
        timer.mark("emb_update")
        timer.end_step()
    timer.flush()
    assert all(ph["emb_update"] >= 19.0 for _, ph in timer.host_steps)
    s = summarize(timer.steps, [], batch_size=1, timer="cuda", host_steps=timer.host_steps)
    assert s["host_phase_ms_p50"]["emb_update"] >= 19.0


def timed_run(step_ms: list[float], cpu_share: float, threads: int = 1, judge_cpu: bool = True) -> dict:
    """A CPU-timed run whose steps take ``step_ms`` of wall time and ``cpu_share`` x that of CPU time per thread."""
    wall, cpu = FakeClock([]), FakeClock([])
    timer = PhaseTimer("cpu", clock=wall, cpu_clock=cpu)
    for ms in step_ms:  # each clock is read at the step's start, then at its one mark (wall) or its end (CPU)
        wall.steps = iter([0, int(ms * 1e6)])
        cpu.steps = iter([0, int(ms * 1e6 * cpu_share * threads)])
        timer.begin_step()
        timer.mark("emb_fwd")
        timer.end_step()
    return summarize(timer.steps, [], 64, "cpu", cpu_ms=timer.cpu_ms, threads=threads, judge_cpu=judge_cpu)


def test_a_steady_busy_run_is_stable():
    s = timed_run([10, 11, 12, 10, 13] * 4, cpu_share=0.97, threads=2)
    assert s["stable"] and s["unstable_reason"] == ""
    assert s["cpu_share"] == pytest.approx(0.97)


def test_a_run_that_waited_for_the_cores_is_not():
    s = timed_run([10, 11, 12, 10, 13] * 4, cpu_share=0.3)
    assert not s["stable"] and "CPU time 30% of wall time" in s["unstable_reason"]
    # a GPU run or a rank waits by design: not judged by CPU time
    assert timed_run([10, 11, 12, 10, 13] * 4, cpu_share=0.3, judge_cpu=False)["stable"]


def test_widely_spread_steps_are_not_stable():
    s = timed_run([10] * 10 + [60] * 10, cpu_share=1.0)
    assert not s["stable"] and "spread p90/p10 = 6.0" in s["unstable_reason"]


def part(step_ms: list[float], cpu_share: float = 1.0, lookups: int = 10) -> TimedPart:
    """One repeat of a CPU-timed run: one phase per step, ``cpu_share`` of wall time as CPU time."""
    steps = [(i, {"emb_fwd": ms}) for i, ms in enumerate(step_ms)]
    return TimedPart(steps, [(i, {"lookups": lookups}) for i in range(len(step_ms))], 100, "cpu",
                     host_steps=steps, cpu_ms=[ms * cpu_share for ms in step_ms])


def test_repeats_pool_their_steps_and_report_the_median_throughput():
    parts = [part([10, 12, 11]), part([20, 22, 21]), part([12, 13, 11])]
    s = summarize_repeats(parts)
    pooled = [10, 12, 11, 20, 22, 21, 12, 13, 11]
    assert s["repeats"] == 3 and s["steps_timed"] == 9
    assert s["step_ms_p50"] == pytest.approx(np.percentile(pooled, 50))
    assert s["step_ms_p90"] == pytest.approx(np.percentile(pooled, 90))
    per = [300 / 0.033, 300 / 0.063, 300 / 0.036]  # 3 steps of 100 samples over each repeat's seconds
    assert s["repeat_samples_per_s"] == pytest.approx(per)
    assert s["samples_per_s"] == pytest.approx(300 / 0.036)  # the median repeat, not the pooled mean
    assert s["repeat_spread"] == pytest.approx(63 / 33)
    assert s["counters_per_step"] == {"lookups": 10.0}
    assert summarize_repeats([parts[0]])["samples_per_s"] == pytest.approx(summarize(
        parts[0].steps, parts[0].counters, 100, "cpu")["samples_per_s"])


def test_repeats_that_disagree_make_a_run_unstable():
    agree = summarize_repeats([part([10, 11, 12]), part([11, 12, 13])])
    assert agree["stable"] and agree["repeat_spread"] < MAX_REPEAT_SPREAD
    apart = summarize_repeats([part([10, 11, 12]), part([10, 11, 12]), part([20, 22, 24])])
    assert not apart["stable"]
    assert apart["unstable_reason"] == f"repeats' samples/s spread max/min = 2.00 (> {MAX_REPEAT_SPREAD:g})"
    both = summarize_repeats([part([10, 11, 12], cpu_share=0.2), part([20, 22, 24], cpu_share=0.2)])
    assert "CPU time 20% of wall time" in both["unstable_reason"] and "repeats' samples/s" in both["unstable_reason"]


def test_repeats_of_one_run_share_their_settings():
    other = part([10, 11])
    other.batch_size = 50
    with pytest.raises(ValueError, match="share batch size"):
        summarize_repeats([part([10, 11]), other])
    with pytest.raises(ValueError, match="no repeats"):
        summarize_repeats([])
