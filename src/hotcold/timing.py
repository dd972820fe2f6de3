"""Per-phase step timing (CUDA events or the CPU clock) and step summaries.

``PhaseTimer`` cuts each step into consecutive phases that add up to the
step, with CUDA events on a GPU and the CPU clock elsewhere, so that a
technique's time is charged to the phase that spent it. ``time_ms`` and
``median_ms`` time one callable the same two ways (CUDA events on a GPU,
``perf_counter_ns`` on a CPU) for the micro-benchmarks of ``hotcold
calibrate`` and ``hotcold bench``; the summaries and the stability mark
follow.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hotcold.contention import pool

PHASES = ("data", "h2d", "emb_fwd", "dense_fwd_bwd", "d2h", "emb_update")
#: a CPU-timed run is disturbed when its process got less CPU time than this share of wall time x threads
MIN_CPU_SHARE = 0.5
#: ... or when its step times spread wider than this (p90 / p10; quiet runs here: 1.3 to 2.0)
MAX_STEP_SPREAD = 3.0
#: ... or when its repeats' throughputs spread wider than this (max / min; quiet identical runs here differ ~20%)
MAX_REPEAT_SPREAD = 1.5


def time_ms(fn: Callable[[], Any], device: Any = "cpu") -> float:
    """Run ``fn`` once and return its milliseconds.

    On a CUDA ``device`` (a ``torch.device`` or its type's name): between two
    CUDA events recorded on the current stream around the call, after a
    synchronisation (earlier work is not counted), waiting for the end event.
    Anywhere else: ``perf_counter_ns`` around the call.
    """
    if getattr(device, "type", device) == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e6


def median_ms(fn: Callable[[], Any], repeats: int, device: Any = "cpu") -> float:
    """Median ``time_ms`` of ``fn`` over ``repeats`` calls, after one untimed warm-up call."""
    fn()
    return statistics.median(time_ms(fn, device) for _ in range(repeats))


class PhaseTimer:
    """Collects per-step phase durations in milliseconds.

    A step is cut into consecutive phases by ``mark(phase)`` calls: each mark
    closes the interval that began at the previous boundary, so the phases of a
    step always add up to the step. A phase may be marked several times in one
    step (the hybrid store moves data host-to-device twice); its intervals add.

    The CUDA back end records events allocated up front and synchronises once per
    window of steps; the CPU back end reads ``perf_counter_ns`` (or an injected
    clock, for tests). Warm-up steps are dropped from the results.

    Events sit on the training stream, so a phase that runs only on the CPU (the
    hybrid store's gather and update, a cache's planning) shows in event time
    only where the GPU had to wait for it. The CUDA back end therefore also reads
    the host clock at every mark: ``host_steps`` holds those durations (on the
    CPU back end they are ``steps``).
    """

    def __init__(
        self,
        kind: str = "cpu",
        warmup: int = 0,
        window: int = 50,
        max_marks: int = 32,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
    ) -> None:
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"timer kind must be 'cpu' or 'cuda', got {kind!r}")
        self.kind = kind
        self.warmup = warmup
        self.window = window
        self.max_marks = max_marks
        self._clock = clock
        self._cpu_clock = cpu_clock
        self.cpu_ms: list[float] = []  # the process's CPU time of every step after warm-up (all its threads)
        self._step = -1
        self._names: list[str] = []          # phase names of the open step
        self._pending: list[tuple[int, list[str], int]] = []  # (step, names, slot) awaiting sync
        self.steps: list[tuple[int, dict[str, float]]] = []   # (step, {phase: ms}) after warm-up
        self._host_steps: list[tuple[int, dict[str, float]]] = []  # the host clock's, CUDA only
        self._stamps: list[int] = []
        if kind == "cuda":
            import torch

            # One row of boundary events per step of a window: start + max_marks.
            self._events = [
                [torch.cuda.Event(enable_timing=True) for _ in range(max_marks + 1)]
                for _ in range(window)
            ]

    def begin_step(self) -> None:
        self._step += 1
        self._names = []
        if self.kind == "cuda":
            self._slot = len(self._pending)
            self._events[self._slot][0].record()
        self._stamps = [self._clock()]
        self._cpu0 = self._cpu1 = self._cpu_clock()

    def mark(self, phase: str) -> None:
        """Close the interval since the last boundary and charge it to ``phase``."""
        if len(self._names) >= self.max_marks:
            raise RuntimeError(f"more than {self.max_marks} phase marks in one step")
        self._names.append(phase)
        if self.kind == "cuda":
            self._events[self._slot][len(self._names)].record()
        # CPU clock before wall clock: reading process CPU time can hand the core to a waiting process,
        # and that wait must fall inside the step's wall time, not after its last stamp
        self._cpu1 = self._cpu_clock()
        self._stamps.append(self._clock())

    def end_step(self) -> None:
        if self._step >= self.warmup:
            self.cpu_ms.append((self._cpu1 - self._cpu0) / 1e6)
        host_ms = [(b - a) / 1e6 for a, b in zip(self._stamps, self._stamps[1:])]
        if self.kind == "cuda":
            self._store(self._host_steps, self._step, self._names, host_ms)
            self._pending.append((self._step, self._names, self._slot))
            if len(self._pending) == self.window:
                self.flush()
        else:
            self._store(self.steps, self._step, self._names, host_ms)

    @property
    def host_steps(self) -> list[tuple[int, dict[str, float]]]:
        """(step, {phase: ms}) by the host clock, after warm-up."""
        return self._host_steps if self.kind == "cuda" else self.steps

    def flush(self) -> None:
        """Synchronise once and convert the pending CUDA events to durations."""
        if self.kind != "cuda" or not self._pending:
            return
        step, names, slot = self._pending[-1]
        self._events[slot][len(names)].synchronize()
        for step, names, slot in self._pending:
            ev = self._events[slot]
            self._store(self.steps, step, names, [ev[i].elapsed_time(ev[i + 1]) for i in range(len(names))])
        self._pending = []

    def _store(self, into: list, step: int, names: list[str], ms: list[float]) -> None:
        if step < self.warmup:
            return
        phases: dict[str, float] = {}
        for name, dt in zip(names, ms):
            phases[name] = phases.get(name, 0.0) + dt
        into.append((step, phases))


@dataclass
class TimedPart:
    """The samples of one repeat of a run's timed part: what its summary is computed from.

    ``steps`` and ``host_steps`` are the timer's (the same list on the CPU),
    ``counters`` the timed steps' counters, ``cpu_ms`` the process's CPU time
    per timed step; ``judge_cpu``: whether CPU time below wall time x
    ``threads`` means a disturbed run (see ``stability``). ``contention``:
    what ``contention.Watch`` measured beside the repeat (other programs' CPU
    time, the fixed probe), None where nothing watched it.
    """

    steps: list[tuple[int, dict[str, float]]]
    counters: list[tuple[int, dict[str, int]]]
    batch_size: int
    timer: str
    host_steps: list[tuple[int, dict[str, float]]] | None = None
    cpu_ms: list[float] = field(default_factory=list)
    threads: int = 1
    judge_cpu: bool = True
    contention: dict | None = None
    #: the step pipeline's per timed step: the host's ms preparing the step, the training thread's ms waiting for
    #: it, and whether a worker prepared it ahead (``hotcold.pipeline``)
    prepared_ms: list[float] = field(default_factory=list)
    waited_ms: list[float] = field(default_factory=list)
    pipelined: bool = False

    @property
    def samples_per_s(self) -> float:
        total_ms = sum(sum(ph.values()) for _, ph in self.steps)
        return float(self.batch_size * len(self.steps) / (total_ms / 1e3)) if total_ms > 0 else float("nan")


def summarize_repeats(parts: list[TimedPart]) -> dict:
    """The summary of R repeats of one timed part (R >= 1), from the samples of all of them.

    Step and phase percentiles, counters and stability are over the pooled
    steps of all repeats; ``samples_per_s`` is the median of the repeats'
    (``repeat_samples_per_s``), ``repeat_spread`` their max / min. Repeats
    that disagree beyond ``MAX_REPEAT_SPREAD`` make the run unstable, and so
    does a repeat that ``contention.Watch`` found disturbed: other programs
    held the run's cores, or the fixed probe around it ran slow (``contention``
    in the summary keeps the numbers; ``other_cores`` and ``probe_slowdown``
    the worst repeat's). ``prepare_ms_p50``, ``prepare_wait_ms_p50`` and
    ``prepare_hidden``: the step pipeline's preparation of a step, the
    training thread's wait for it, and the share of it hidden (0 with the
    pipeline off: the training thread prepared every step itself).
    """
    if not parts:
        raise ValueError("no repeats to summarise")
    first = parts[0]
    if any((p.batch_size, p.timer, p.threads, p.judge_cpu) != (first.batch_size, first.timer, first.threads,
                                                                first.judge_cpu) for p in parts):
        raise ValueError("repeats of one run must share batch size, timer, threads and CPU judgement")
    steps = [s for p in parts for s in p.steps]
    host = None if first.host_steps is None or first.host_steps is first.steps else \
        [s for p in parts for s in (p.host_steps or [])]
    summary = summarize(steps, [c for p in parts for c in p.counters], first.batch_size, first.timer,
                        host_steps=host, cpu_ms=[ms for p in parts for ms in p.cpu_ms], threads=first.threads,
                        judge_cpu=first.judge_cpu)
    per_repeat = [p.samples_per_s for p in parts]
    finite = [x for x in per_repeat if not np.isnan(x)]
    spread = float("nan") if len(finite) < len(per_repeat) else \
        float(max(finite) / min(finite)) if min(finite) > 0 else float("inf")
    summary.update(repeats=len(parts), repeat_samples_per_s=per_repeat, repeat_spread=spread,
                   samples_per_s=float(np.median(per_repeat)))
    if spread > MAX_REPEAT_SPREAD:
        _unstable(summary, f"repeats' samples/s spread max/min = {spread:.2f} (> {MAX_REPEAT_SPREAD:g})")
    prepared, waited = [ms for p in parts for ms in p.prepared_ms], [ms for p in parts for ms in p.waited_ms]
    if prepared:
        summary.update(pipeline=first.pipelined, prepare_ms_p50=float(np.median(prepared)),
                       prepare_wait_ms_p50=float(np.median(waited)),
                       prepare_hidden=float(1 - sum(waited) / sum(prepared)) if sum(prepared) > 0 else float("nan"))
    watched = pool([p.contention for p in parts])
    if watched is not None:
        summary.update(contention=watched, other_cores=watched["other_cores"],
                       probe_slowdown=watched["probe_slowdown"])
        if watched["disturbed"]:
            _unstable(summary, watched["disturbed_reason"])
    return summary


def _unstable(summary: dict, reason: str) -> None:
    summary["stable"] = False
    summary["unstable_reason"] = "; ".join(r for r in (summary["unstable_reason"], reason) if r)


def phase_order(seen: set[str]) -> list[str]:
    """Known phases in pipeline order, then any others alphabetically."""
    return [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))


def _phase_table(steps: list[tuple[int, dict[str, float]]]) -> tuple[list[str], np.ndarray]:
    names = phase_order({p for _, ph in steps for p in ph})
    return names, np.array([[ph.get(p, 0.0) for p in names] for _, ph in steps])  # [steps, phases]


def summarize(
    steps: list[tuple[int, dict[str, float]]],
    counters: list[tuple[int, dict[str, int]]],
    batch_size: int,
    timer: str,
    host_steps: list[tuple[int, dict[str, float]]] | None = None,
    cpu_ms: list[float] | None = None,
    threads: int = 1,
    judge_cpu: bool = True,
) -> dict:
    """Median, p10, p90 and mean of step and phase times, throughput and mean counters.

    ``host_steps`` (CUDA runs): the same steps by the host clock, summarised
    as ``host_step_ms_p50`` and ``host_phase_ms_p50``. ``cpu_ms``: the
    process's CPU time per step, for ``stability`` (``judge_cpu``: whether
    CPU time below wall time x ``threads`` means a disturbed run).
    """
    if not steps:
        raise ValueError("no timed steps to summarise (are all steps warm-up?)")
    names, table = _phase_table(steps)
    total = table.sum(axis=1)
    counter_names = list(dict.fromkeys(c for _, cs in counters for c in cs))
    host: dict = {}
    if host_steps and host_steps is not steps:
        host_names, host_table = _phase_table(host_steps)
        host = {"host_step_ms_p50": float(np.percentile(host_table.sum(axis=1), 50)),
                "host_phase_ms_p50": {p: float(np.percentile(host_table[:, i], 50))
                                      for i, p in enumerate(host_names)}}
    return {
        "timer": timer,
        "batch_size": batch_size,
        "steps_timed": len(steps),
        "samples_per_s": float(batch_size * len(steps) / (total.sum() / 1e3)) if total.sum() > 0 else float("nan"),
        "step_ms_p50": float(np.percentile(total, 50)),
        "step_ms_p10": float(np.percentile(total, 10)),
        "step_ms_p90": float(np.percentile(total, 90)),
        "step_ms_mean": float(total.mean()),
        "phase_ms_p50": {p: float(np.percentile(table[:, i], 50)) for i, p in enumerate(names)},
        "phase_ms_mean": {p: float(table[:, i].mean()) for i, p in enumerate(names)},
        "counters_per_step": {
            c: float(np.mean([cs.get(c, 0) for _, cs in counters])) for c in counter_names
        },
        **host,
        **stability(total, host_steps or steps, cpu_ms, threads, judge_cpu),
    }


def stability(step_ms: np.ndarray, host_steps: list[tuple[int, dict[str, float]]], cpu_ms: list[float] | None,
              threads: int, judge_cpu: bool) -> dict:
    """Whether a run's times can be trusted: ``stable``, with the ``unstable_reason`` when not.

    Disturbed: step times spread beyond ``MAX_STEP_SPREAD`` (p90 / p10), or,
    where the CPU does the work (``judge_cpu``: CPU-timed runs in one
    process), the process got less than ``MIN_CPU_SHARE`` of wall time x
    threads: it waited for cores other programs held. A GPU run waits on the
    device and a rank on its peers by design, so neither is judged by CPU time.
    """
    p10, p90 = np.percentile(step_ms, [10, 90])
    spread = float(p90 / p10) if p10 > 0 else float("inf")
    reasons = []
    if spread > MAX_STEP_SPREAD:
        reasons.append(f"step times spread p90/p10 = {spread:.1f} (> {MAX_STEP_SPREAD:g})")
    share = float("nan")
    if cpu_ms:
        wall = sum(sum(ph.values()) for _, ph in host_steps)
        share = float(sum(cpu_ms) / (wall * threads)) if wall > 0 else float("nan")
        if judge_cpu and share < MIN_CPU_SHARE:
            reasons.append(f"CPU time {share:.0%} of wall time x {threads} thread(s) (< {MIN_CPU_SHARE:.0%}): "
                           "the run waited for the cores")
    return {"step_spread": spread, "cpu_share": share, "stable": not reasons, "unstable_reason": "; ".join(reasons)}
