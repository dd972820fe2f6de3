"""``scratchpipe``: ScratchPipe (Kwon and Rhu, ISCA 2022), a scratchpad that always hits.

The full table (weights and optimizer state) lives in host memory; the
device holds a scratchpad of C slots. Training data is known ahead, so when
batch i+W becomes visible (``prefetch``) its missing rows are fetched into
free or evicted slots while batches i..i+W-1 train; by the time a batch
trains, every row it needs is in the scratchpad and forward and backward run
at device-memory speed. Rows needed by a batch in flight (i..i+W) are held
and never evicted; among the rest the least recently needed go first, and
their (trained) values are written back to the host.

Data movement runs off the training path, in admission order, on one worker
thread (host gather and scatter) and, on a GPU, one side stream (copies):

- write-back before fetch: a job scatters its evicted rows into the host
  table before it gathers, and jobs run one at a time in order, so a row
  evicted by one admission and fetched by a later one is never read stale;
- a slot is overwritten only after the training that last used it: on a GPU
  the side stream waits for an event recorded on the training stream at
  admission (the slot was not held, so its last user was already enqueued),
  and the evicted values are copied out before the fetch lands, in stream
  order; on a CPU the copy-out happens on the training thread at admission;
- a fetched slot is read only after it landed: ``forward`` of batch j joins
  the jobs up to j (on a GPU the training stream waits for their copy
  events; on a CPU the training thread copies the staged rows into the
  slots), and charges the wait to ``h2d``.

Bookkeeping (row->slot maps, holds, LRU stamps) is done synchronously on the
training thread, so counters and results are deterministic.
"""
from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from hotcold.config import ConfigError, InfeasibleError
from hotcold.counters import StepCounters, all_resident, row_bytes
from hotcold.embedding.base import EmbeddingStore, Lookup, Marker, StoreSpec, budget_rows, init_table, ship, sum_by_index
from hotcold.trace.scratchpad import Admission, ScratchpadDirectory, working_set_peak

@dataclass
class _Admitted:
    """A batch whose rows are held in the scratchpad until it has trained."""

    ids: torch.Tensor    # [B, K] as prefetched, to check that forward sees the same batch
    lookup: Lookup
    admission: Admission

    @property
    def seq(self) -> int:
        return self.admission.seq


@dataclass
class _Job:
    """The data movement of one admission, running on the worker."""

    seq: int
    step: int            # training step that issued it (counters and side times)
    slots: np.ndarray    # int64 [M] slots being filled
    future: Future


class ScratchPipeStore(EmbeddingStore):
    """Host table plus a device scratchpad filled W batches ahead.

    Options: ``window`` W (batches of look-ahead, default 2), and the
    scratchpad size as ``scratchpad_rows`` or ``scratchpad_ratio`` (fraction
    of all rows); without either, the minimum capacity computed from the
    batches (the whole table when the batches are not known). A scratchpad
    smaller than the minimum capacity fails at construction.

    ``side_times`` holds (step, fetch ms, write-back ms) per admission: CUDA
    event times of the side-stream copies on a GPU (resolved lazily, all of
    them by ``close``), worker wall time on a CPU (``side_timer`` says
    which). ``host_times`` holds the worker's wall time for the host gather
    and scatter in the same form on both.
    """

    option_names = ("window", "scratchpad_rows", "scratchpad_ratio")
    needs_batches = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.window = _window(spec.options.get("window", 2))
        self.lookahead = self.window
        n = spec.num_rows
        self.host_weight = init_table(spec.table_sizes, spec.dim, spec.seed)  # [N, D]
        self.host_state = self.optimizer.init_state(n)                        # [N]
        self._has_state = self.optimizer.state_width > 0
        self.row_bytes = row_bytes(spec.dim, self.optimizer.state_width)
        self.min_capacity: int | None = None
        start = 0
        if spec.batches is not None:
            rows = (self.plan(ids).rows.numpy() for ids in spec.batches())
            self.min_capacity, start = working_set_peak(rows, n, self.window)
        self.capacity = _capacity(spec.options, n, self.min_capacity)
        if self.min_capacity is not None and self.capacity < self.min_capacity:
            m = self.min_capacity
            raise InfeasibleError(
                f"scratchpipe: a scratchpad of {self.capacity} rows cannot hold the look-ahead "
                f"working set; the minimum capacity is {m} rows (unique rows of batches "
                f"{start}..{start + self.window}, window={self.window}); set scratchpad_rows >= {m} "
                f"or scratchpad_ratio >= {math.ceil(m / n * 1e6) / 1e6:g}"
            )
        c = self.capacity
        self.slot_weight = torch.zeros(c, spec.dim, dtype=torch.float32, device=self.device)  # [C, D]
        self.slot_state = self.optimizer.init_state(c, self.device)                            # [C]
        self.directory = ScratchpadDirectory(n, c)
        self.row_to_slot = self.directory.row_to_slot       # [N] slot of each resident row, -1 if none
        self.slot_to_row = self.directory.slot_to_row       # [C] row in each slot, -1 if free
        self._queue: deque[_Admitted] = deque()             # admitted, untrained, in training order
        self._deferred: list[torch.Tensor] = []             # first step: upcoming batches, admitted after it
        self._jobs: deque[_Job] = deque()
        self._step = 0
        self._pending = StepCounters()                      # this step's admissions
        self._last: tuple[Lookup, torch.Tensor, torch.Tensor, _Admitted] | None = None
        self._cuda = self.device.type == "cuda"
        self._side = torch.cuda.Stream(self.device) if self._cuda else None
        self.side_timer = "cuda" if self._cuda else "cpu"
        self.host_times: list[tuple[int, float, float]] = []
        self.side_times: list[tuple[int, float, float]] = [] if self._cuda else self.host_times
        self._pending_times: deque[tuple[int, list[Any], tuple[Any, ...]]] = deque()
        self.wait_times: list[float] = []  # ms the training step waited for fetches (CPU: wall time)
        self._wait_events: list[tuple[Any, Any]] = []  # CUDA: events around the training stream's wait
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="scratchpipe")
        self._closed = False

    # -- admission: bookkeeping on the training thread, data movement queued -------------------

    def prefetch(self, upcoming: Sequence[torch.Tensor]) -> None:
        """Admit the batches of ``upcoming`` not admitted yet (normally just the last one).

        On the first step nothing is admitted yet and the current batch must
        come first, so the upcoming ones wait for ``forward``.
        """
        if not self._queue:
            self._deferred = list(upcoming)
            return
        for ids in upcoming[len(self._queue) - 1:]:
            self._queue.append(self._admit(ids))

    def _admit(self, ids: torch.Tensor) -> _Admitted:
        """Hold the rows of a batch, give its missing rows slots and queue their movement."""
        lk = self.plan(ids)
        uniq, _, _ = lk.unique()
        adm = self.directory.admit(uniq.numpy())
        if adm.missing.size:
            self._submit(adm)
        adm.book(self._pending, self._step + len(self._queue), self.row_bytes)
        return _Admitted(ids, lk, adm)

    def _submit(self, adm: Admission) -> None:
        vrows, mrows = torch.from_numpy(adm.victim_rows), torch.from_numpy(adm.missing)
        if self._cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))  # after the evicted slots' last use
            future = self._worker.submit(self._cuda_job, ready, adm.victim_slots, vrows, adm.new_slots, mrows)
        else:
            vs = torch.from_numpy(adm.victim_slots)
            wb_w = self.slot_weight.index_select(0, vs)                              # [V, D]
            wb_s = self.slot_state.index_select(0, vs) if self._has_state else None  # [V]
            future = self._worker.submit(self._host_job, vrows, wb_w, wb_s, mrows)
        self._jobs.append(_Job(adm.seq, self._step, adm.new_slots, future))

    # -- worker side ------------------------------------------------------------------------------

    def _write_back_host(self, rows: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> None:
        """Scatter evicted rows ([V], [V, D], [V]) into the host table."""
        self.host_weight.index_copy_(0, rows, weight)
        if state is not None:
            self.host_state.index_copy_(0, rows, state)

    def _gather_host(self, rows: torch.Tensor, pin: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gather rows [M] of the host table: weights [M, D] and state [M] (pinned for a GPU)."""
        w = torch.empty(rows.numel(), self.dim, dtype=torch.float32, pin_memory=pin)
        torch.index_select(self.host_weight, 0, rows, out=w)
        if not self._has_state:
            return w, None
        s = torch.empty(rows.numel(), dtype=torch.float32, pin_memory=pin)
        torch.index_select(self.host_state, 0, rows, out=s)
        return w, s

    def _host_job(self, vrows: torch.Tensor, wb_w: torch.Tensor, wb_s: torch.Tensor | None,
                  mrows: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor | None], tuple[float, float]]:
        """CPU: write back, then gather (so a re-fetched row is never stale)."""
        t0 = time.perf_counter_ns()
        self._write_back_host(vrows, wb_w, wb_s)
        t1 = time.perf_counter_ns()
        fetched = self._gather_host(mrows, pin=False)
        t2 = time.perf_counter_ns()
        return fetched, ((t2 - t1) / 1e6, (t1 - t0) / 1e6)

    def _cuda_job(self, ready: "torch.cuda.Event", victim_slots: np.ndarray, vrows: torch.Tensor,
                  new_slots: np.ndarray, mrows: torch.Tensor) -> tuple[Any, ...]:
        """GPU: D2H of the evicted slots, host scatter, host gather, H2D into the new slots.

        Returns the event the training stream waits for, the four timing
        events, the staging buffers and the host times (gather ms, scatter ms).
        """
        side = self._side
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        with torch.cuda.device(self.device), torch.cuda.stream(side):
            side.wait_event(ready)
            ev[0].record(side)
            wb_w = wb_s = None
            if victim_slots.size:
                vs = torch.from_numpy(victim_slots).to(self.device, non_blocking=True)
                wb_w = torch.empty(vs.numel(), self.dim, dtype=torch.float32, pin_memory=True)
                wb_w.copy_(self.slot_weight.index_select(0, vs), non_blocking=True)
                if self._has_state:
                    wb_s = torch.empty(vs.numel(), dtype=torch.float32, pin_memory=True)
                    wb_s.copy_(self.slot_state.index_select(0, vs), non_blocking=True)
            ev[1].record(side)
            t0 = time.perf_counter_ns()
            if wb_w is not None:
                ev[1].synchronize()  # the evicted values are in pinned staging
                self._write_back_host(vrows, wb_w, wb_s)
            t1 = time.perf_counter_ns()
            fw, fs = self._gather_host(mrows, pin=True)
            t2 = time.perf_counter_ns()
            ev[2].record(side)
            slots = torch.from_numpy(new_slots).to(self.device, non_blocking=True)
            self.slot_weight.index_copy_(0, slots, fw.to(self.device, non_blocking=True))
            if fs is not None:
                self.slot_state.index_copy_(0, slots, fs.to(self.device, non_blocking=True))
            ev[3].record(side)
        # The staging buffers travel with the events and are dropped once the copies are done.
        return ev[3], ev, (fw, fs, wb_w, wb_s), ((t2 - t1) / 1e6, (t1 - t0) / 1e6)

    # -- joining ----------------------------------------------------------------------------------

    def _complete(self, upto: float = math.inf) -> None:
        """Land the jobs of admissions up to ``upto`` before training reads their slots."""
        while self._jobs and self._jobs[0].seq <= upto:
            job = self._jobs.popleft()
            if self._cuda:
                done, events, staging, host = job.future.result()
                torch.cuda.current_stream(self.device).wait_event(done)
                self._pending_times.append((job.step, events, staging))
            else:
                (fw, fs), host = job.future.result()
                slots = torch.from_numpy(job.slots)
                self.slot_weight.index_copy_(0, slots, fw)
                if fs is not None:
                    self.slot_state.index_copy_(0, slots, fs)
            self.host_times.append((job.step, *host))
        self._resolve_times(block=False)

    def _resolve_times(self, block: bool) -> None:
        """Turn finished side-stream events into ``side_times`` without synchronising (unless ``block``)."""
        while self._pending_times:
            step, ev, _ = self._pending_times[0]
            if block:
                ev[3].synchronize()
            elif not ev[3].query():
                return
            self.side_times.append((step, ev[2].elapsed_time(ev[3]), ev[0].elapsed_time(ev[1])))
            self._pending_times.popleft()

    # -- training ---------------------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        if not self._queue:  # first step (or nothing prefetched): admit it now, then what prefetch saw
            self._queue.append(self._admit(ids))
            for upcoming in self._deferred:
                self._queue.append(self._admit(upcoming))
            self._deferred = []
        rec = self._queue.popleft()
        if not (rec.ids is ids or torch.equal(rec.ids, ids)):
            raise RuntimeError("scratchpipe: forward got a batch other than the one prefetched for this step")
        if self._cuda:
            before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            before.record()
            self._complete(rec.seq)
            after.record()
            self._wait_events.append((before, after))
        else:
            t0 = time.perf_counter_ns()
            self._complete(rec.seq)
            self.wait_times.append((time.perf_counter_ns() - t0) / 1e6)
        timer.mark("h2d")
        lk = rec.lookup
        _, inverse, _ = lk.unique()
        uslots = torch.from_numpy(rec.admission.slots)  # [U] slot of each unique row
        lookup_slots = ship(uslots.index_select(0, inverse), self.device)  # [L]
        self._last = (lk, ship(uslots, self.device), ship(inverse, self.device), rec)
        out = self.to_batch(self.slot_weight.index_select(0, lookup_slots), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        lk, uslots, inverse, rec = self._last
        summed = sum_by_index(inverse, self.from_batch(grad, lk), uslots.numel())  # [U, D]
        self.optimizer.apply(self.slot_weight, self.slot_state, uslots, summed)
        self.directory.release(rec.admission.slots)
        c = self._pending
        trained = all_resident(lk.size, uslots.numel())
        for name in ("lookups", "unique_rows", "hits", "unique_hits"):
            setattr(c, name, getattr(trained, name))
        self._counters, self._pending = c, StepCounters()
        self._last = None
        self._step += 1
        timer.mark("emb_update")

    # -- evaluation, export, shutdown -------------------------------------------------------------

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Resident rows from the scratchpad, the rest from the host; no holds, stamps or counters move."""
        self._complete()
        lk = self.plan(ids)
        slots = self.row_to_slot[lk.rows.numpy()]  # [L]
        values = self.host_weight.index_select(0, lk.rows).to(self.device)  # [L, D]
        res = np.flatnonzero(slots >= 0)
        if res.size:
            src = self.slot_weight.index_select(0, torch.from_numpy(slots[res]).to(self.device))
            values.index_copy_(0, torch.from_numpy(res).to(self.device), src)
        return self.to_batch(values, lk)

    def export(self) -> torch.Tensor:
        """The host table with the resident rows overlaid, float32 [N, D] on the CPU."""
        self._complete()
        out = self.host_weight.clone()
        occupied = np.flatnonzero(self.slot_to_row >= 0)
        if occupied.size:
            rows = torch.from_numpy(self.slot_to_row[occupied])
            src = self.slot_weight.index_select(0, torch.from_numpy(occupied).to(self.device))
            out.index_copy_(0, rows, src.to("cpu"))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._complete()
        self._worker.shutdown(wait=True)
        self._resolve_times(block=True)
        for before, after in self._wait_events:
            after.synchronize()
            self.wait_times.append(before.elapsed_time(after))
        self._wait_events.clear()
        self._closed = True

    def report(self) -> dict[str, Any]:
        """Scratchpad size and how much of the side work (fetch, write-back) training did not wait for.

        ``hidden_fraction`` = 1 - (time training waited) / (side work time),
        over the whole run; side time is CUDA-event time of the side stream on
        a GPU and the worker's wall time on a CPU (``side_timer``).
        """
        fetch = sum(t[1] for t in self.side_times)
        write_back = sum(t[2] for t in self.side_times)
        side, wait = fetch + write_back, sum(self.wait_times)
        return {
            "capacity": self.capacity, "min_capacity": self.min_capacity, "window": self.window,
            "side_timer": self.side_timer, "side_ms_fetch": fetch, "side_ms_write_back": write_back,
            "wait_ms": wait, "hidden_fraction": max(0.0, 1.0 - wait / side) if side > 0 else None,
        }


def _window(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"scratchpipe: window must be a non-negative integer, got {value!r}")
    return value


def _capacity(options: dict[str, Any], num_rows: int, minimum: int | None) -> int:
    """Scratchpad slots from the options (see ``ScratchPipeStore``), at most the table."""
    rows = budget_rows(options, "scratchpipe", num_rows, rows_key="scratchpad_rows", ratio_key="scratchpad_ratio")
    if rows is not None:
        return rows
    return minimum if minimum else num_rows
