"""ScratchPipe's data movement: a staged pipeline between the host table and the scratchpad.

Each admission is a job of four stages (copy-out, gather, scatter, copy-in),
each timed on its own, so that the work moved off the training path and the
part of it the training path waited for are measured apart. The stages, on
a GPU and on a CPU, and what ``side`` and ``waited`` hold: ``MovePipeline``.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hotcold.accel import runtime


@dataclass
class SideWork:
    """Side work of one admission in ms: the same four stages on both back ends."""

    step: int
    copy_out: float = 0.0
    gather: float = 0.0
    scatter: float = 0.0
    copy_in: float = 0.0

    @property
    def total(self) -> float:
        return self.copy_out + self.gather + self.scatter + self.copy_in


@dataclass
class _Job:
    seq: int
    work: SideWork
    new_slots: np.ndarray          # int64 [M]
    victim_rows: torch.Tensor      # int64 [V]
    out: tuple[torch.Tensor, torch.Tensor | None] | None = None  # copy-out staging: [V, D], [V]
    out_done: Any = None           # CUDA: event after the D2H
    out_events: Any = None         # CUDA: timing events of the D2H
    gathered: Future | None = None
    scattered: Future | None = None
    keep: list[Any] = field(default_factory=list)  # CUDA: buffers in flight and H2D events


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


class MovePipeline:
    """Moves rows between a host table and device slots off the training path.

    Each admission is a job of four stages, each timed on its own:

    1. *copy-out*: the evicted slots (weights and state) into a staging buffer,
       at admission. On a GPU a D2H copy on the side stream, after an event the
       training stream records at admission (the slots were not held, so their
       last use is already enqueued); on a CPU an inline copy on the training
       thread.
    2. *gather*: the missing rows from the host table into a staging buffer, on
       the gather worker, started at admission. A missing row whose earlier
       eviction has not reached the host table yet is taken from that job's
       copy-out staging (on a GPU after that D2H finished), so a gather never
       waits for an earlier job's scatter and never reads a stale row.
    3. *scatter*: the evicted rows from staging into the host table, on the
       scatter worker, in admission order (a row evicted twice lands in order).
    4. *copy-in*: the gathered rows into their slots. On a GPU an H2D copy on
       the side stream (issued by the gather worker) that the training stream
       waits for before reading the slots; on a CPU a copy on the training
       thread when the batch is about to train.

    ``side`` work is all four stages on both back ends (CUDA-event time for the
    two copies on a GPU, wall time otherwise); ``waited`` is what the training
    path spent on it: on a GPU the training stream's stall (event time around
    the join), on a CPU the inline copies and the join's wall time.
    """

    def __init__(self, host: tuple[torch.Tensor, torch.Tensor], slots: tuple[torch.Tensor, torch.Tensor],
                 with_state: bool, device: torch.device) -> None:
        self.host_w, self.host_s = host      # [N, D], [N] (per element [N, D])
        self.slot_w, self.slot_s = slots     # [C, D], [C] (per element [C, D]) on ``device``
        self.with_state = with_state
        self.device = device
        self.rt = runtime(device)
        self.offloaded = self.rt.offloaded
        self.side = self.rt.stream() if self.offloaded else None
        num_rows = self.host_w.shape[0]
        self._wb_job = np.full(num_rows, -1, dtype=np.int64)   # [N] job whose staged write-back holds the row
        self._wb_pos = np.full(num_rows, 0, dtype=np.int64)    # [N] its index in that job's staging (touched now: a
        # first write to each page of a lazily zeroed array would fault inside the timed steps)
        self._staged: dict[int, _Job] = {}                     # jobs whose scatter may not have landed
        self._landing: deque[_Job] = deque()                   # jobs whose rows are not in their slots yet
        self._timing: deque[_Job] = deque()                    # CUDA: jobs with unresolved copy events
        self._gatherer = ThreadPoolExecutor(1, thread_name_prefix="scratchpipe-gather")
        self._scatterer = ThreadPoolExecutor(1, thread_name_prefix="scratchpipe-scatter")
        self.work: list[SideWork] = []
        self.waited: list[float] = []          # ms of the training path spent on side work
        self._wait_events: list[tuple[Any, Any]] = []
        #: held while the staging's bookkeeping changes: ``submit`` may run on a planning thread (GPU)
        self._lock = threading.Lock()
        #: the stream the training thread's kernels run on: what a copy-out waits for
        self._train_stream = self.rt.current_stream()

    # -- admission (training thread) --------------------------------------------------------------

    def submit(self, seq: int, step: int, victim_slots: np.ndarray, victim_rows: np.ndarray,
               new_slots: np.ndarray, missing: np.ndarray) -> None:
        """Start the movement of one admission: copy-out now, gather and scatter on the workers."""
        with self._lock:
            self._submit(seq, step, victim_slots, victim_rows, new_slots, missing)

    def _submit(self, seq: int, step: int, victim_slots: np.ndarray, victim_rows: np.ndarray,
                new_slots: np.ndarray, missing: np.ndarray) -> None:
        job = _Job(seq, SideWork(step), new_slots, torch.from_numpy(victim_rows))
        self.work.append(job.work)
        if victim_rows.size:
            self._copy_out(job, torch.from_numpy(victim_slots))
        sources = self._sources(missing)
        if victim_rows.size:
            self._wb_job[victim_rows] = seq
            self._wb_pos[victim_rows] = np.arange(victim_rows.size)
            self._staged[seq] = job
            job.scattered = self._scatterer.submit(self._scatter, job)
        job.gathered = self._gatherer.submit(self._gather, job, torch.from_numpy(missing), sources)
        self._landing.append(job)

    def _copy_out(self, job: _Job, vs: torch.Tensor) -> None:
        if not self.offloaded:
            t0 = time.perf_counter_ns()
            job.out = (self.slot_w.index_select(0, vs),
                       self.slot_s.index_select(0, vs) if self.with_state else None)
            job.work.copy_out = _ms(t0)
            self.waited.append(job.work.copy_out)
            return
        rt = self.rt
        ready = rt.recorded(self._train_stream)  # the victims' last use is queued there (from any thread)
        ev = [rt.event(timing=True) for _ in range(2)]
        w = rt.empty_host(vs.numel(), self.slot_w.shape[1])
        s = rt.empty_host(vs.numel(), *self.slot_s.shape[1:]) if self.with_state else None
        with rt.on(self.side):
            self.side.wait_event(ready)
            ev[0].record(self.side)
            dev_vs = rt.pin(vs).to(self.device, non_blocking=rt.cuda)
            rt.copy_to_host(w, self.slot_w.index_select(0, dev_vs))
            if s is not None:
                rt.copy_to_host(s, self.slot_s.index_select(0, dev_vs))
            ev[1].record(self.side)
        job.out, job.out_done, job.out_events = (w, s), ev[1], ev

    def _sources(self, missing: np.ndarray) -> list[tuple[torch.Tensor, _Job, torch.Tensor]]:
        """Missing rows whose write-back is still staged: (positions in ``missing``, job, staging index)."""
        src = self._wb_job[missing]
        out = []
        for seq in np.unique(src[src >= 0]).tolist():
            pos = np.flatnonzero(src == seq)
            out.append((torch.from_numpy(pos), self._staged[seq], torch.from_numpy(self._wb_pos[missing[pos]])))
        return out

    # -- workers ----------------------------------------------------------------------------------

    def _scatter(self, job: _Job) -> float:
        if job.out_done is not None:
            self.rt.wait(job.out_done, "scratchpipe copy-out")  # the D2H of the evicted values finished
        t0 = time.perf_counter_ns()
        w, s = job.out
        self.host_w.index_copy_(0, job.victim_rows, w)
        if s is not None:
            self.host_s.index_copy_(0, job.victim_rows, s)
        return _ms(t0)

    def _gather(self, job: _Job, missing: torch.Tensor,
                sources: list[tuple[torch.Tensor, _Job, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Missing rows [M] from the host table, or from an earlier job's staging; then (GPU) the H2D."""
        t0 = time.perf_counter_ns()
        m = missing.numel()
        w = self.rt.empty_host(m, self.host_w.shape[1])
        s = self.rt.empty_host(m, *self.host_s.shape[1:]) if self.with_state else None
        from_host = torch.ones(m, dtype=torch.bool)
        for pos, _, _ in sources:
            from_host[pos] = False
        host_pos = from_host.nonzero().squeeze(1)
        rows = missing.index_select(0, host_pos)
        w.index_copy_(0, host_pos, self.host_w.index_select(0, rows))
        if s is not None:
            s.index_copy_(0, host_pos, self.host_s.index_select(0, rows))
        for pos, src, idx in sources:
            if src.out_done is not None:
                self.rt.wait(src.out_done, "scratchpipe copy-out")
            w.index_copy_(0, pos, src.out[0].index_select(0, idx))
            if s is not None:
                s.index_copy_(0, pos, src.out[1].index_select(0, idx))
        job.work.gather = _ms(t0)
        if self.offloaded:
            self._copy_in_side(job, w, s)
        return w, s

    def _copy_in_side(self, job: _Job, w: torch.Tensor, s: torch.Tensor | None) -> None:
        rt = self.rt
        ev = [rt.event(timing=True) for _ in range(2)]
        device = torch.cuda.device(self.device) if rt.cuda else contextlib.nullcontext()
        with device, rt.on(self.side):
            ev[0].record(self.side)
            slots = rt.pin(torch.from_numpy(job.new_slots)).to(self.device, non_blocking=rt.cuda)
            self.slot_w.index_copy_(0, slots, w.to(self.device, non_blocking=rt.cuda))
            if s is not None:
                self.slot_s.index_copy_(0, slots, s.to(self.device, non_blocking=rt.cuda))
            ev[1].record(self.side)
        job.keep = [ev, w, s]  # the staging stays alive until the copy is done

    # -- joining (training thread) ----------------------------------------------------------------

    def land(self, upto: float) -> None:
        """Rows of admissions up to ``upto`` in their slots before training reads them."""
        if self.offloaded:
            before, after = self.rt.event(timing=True), self.rt.event(timing=True)
            before.record(self.rt.current_stream())
        t0 = time.perf_counter_ns()
        with self._lock:
            jobs = []
            while self._landing and self._landing[0].seq <= upto:
                jobs.append(self._landing.popleft())
        for job in jobs:
            w, s = job.gathered.result()
            if self.offloaded:
                self.rt.current_stream().wait_event(job.keep[0][1])
                self._timing.append(job)
            else:
                t1 = time.perf_counter_ns()
                slots = torch.from_numpy(job.new_slots)
                self.slot_w.index_copy_(0, slots, w)
                if s is not None:
                    self.slot_s.index_copy_(0, slots, s)
                job.work.copy_in = _ms(t1)
        if self.offloaded:
            after.record(self.rt.current_stream())
            self._wait_events.append((before, after))
        else:
            self.waited.append(_ms(t0))
        with self._lock:
            self._retire(block=False)
            self._resolve(block=False)

    def _retire(self, block: bool) -> None:
        """Forget staged write-backs whose scatter landed: later gathers read the host table again."""
        for seq, job in list(self._staged.items()):
            if not (block or job.scattered.done()):
                continue
            job.work.scatter = job.scattered.result()
            rows = job.victim_rows.numpy()
            mine = rows[self._wb_job[rows] == seq]
            self._wb_job[mine] = -1
            del self._staged[seq]

    def _resolve(self, block: bool) -> None:
        """CUDA copy times of landed jobs, without synchronising unless ``block``."""
        while self._timing:
            job = self._timing[0]
            ev_in = job.keep[0]
            if block:
                self.rt.wait(ev_in[1], "scratchpipe copy-in timing")
            elif not ev_in[1].query():
                return
            job.work.copy_in = ev_in[0].elapsed_time(ev_in[1])
            if job.out_events is not None:
                job.work.copy_out = job.out_events[0].elapsed_time(job.out_events[1])
            job.keep = []
            self._timing.popleft()

    def drain(self) -> None:
        """Every job landed and every write-back in the host table (export, evaluation, shutdown)."""
        self.land(float("inf"))
        with self._lock:
            for job in self._staged.values():
                job.scattered.result()
            self._retire(block=True)

    def close(self) -> None:
        self.drain()
        self._gatherer.shutdown(wait=True)
        self._scatterer.shutdown(wait=True)
        with self._lock:
            self._resolve(block=True)
        for before, after in self._wait_events:
            self.rt.wait(after, "scratchpipe wait timing")
            self.waited.append(before.elapsed_time(after))
        self._wait_events.clear()

    @property
    def side_timer(self) -> str:
        """What timed the side work: CUDA events, the CPU clock, or nothing (a stand-in device's copies: 0 ms)."""
        return "cuda" if self.rt.cuda else "stand-in" if self.offloaded else "cpu"

    def report(self) -> dict[str, Any]:
        """Side work by stage, what training waited for it, and the share hidden."""
        side = sum(w.total for w in self.work)
        wait = sum(self.waited)
        stages = {f"side_ms_{k}": sum(getattr(w, k) for w in self.work)
                  for k in ("copy_out", "gather", "scatter", "copy_in")}
        return {**stages, "side_ms": side, "wait_ms": wait,
                "hidden_fraction": max(0.0, 1.0 - wait / side) if side > 0 else None}
