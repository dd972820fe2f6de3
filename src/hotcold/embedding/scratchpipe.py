"""``scratchpipe``: ScratchPipe (Kwon and Rhu, ISCA 2022), a scratchpad that always hits.

The full table (weights and optimizer state) lives in host memory; the
device holds a scratchpad of C slots. Training data is known ahead, so when
batch i+W becomes visible (``prefetch``) its missing rows are fetched into
free or evicted slots while batches i..i+W-1 train; by the time a batch
trains, every row it needs is in the scratchpad and forward and backward run
at device-memory speed. Eviction, the movement pipeline and the
bookkeeping: ``ScratchPipeStore``.
"""
from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from hotcold.accel import runtime
from hotcold.config import InfeasibleError
from hotcold.counters import all_resident, row_bytes
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.on_device import DevicePlan, DeviceTable
from hotcold.options.stores import ScratchPipeOptions
from hotcold.embedding.rows import Lookup, copying_on, init_table, ship
from hotcold.embedding.scratchpipe_pipeline import MovePipeline
from hotcold.policies.scratchpad import Admission, ScratchpadDirectory, working_set_peak


@dataclass
class _Admitted:
    """A batch whose rows are held in the scratchpad until it has trained."""

    ids: torch.Tensor    # [B, K] as prefetched, to check that forward sees the same batch
    lookup: Lookup
    admission: Admission
    served: int          # the batch it serves (its step)
    #: (GPU) its lookups' slots grouped on the device, the tensors made for it and the event after them
    slots: tuple[DevicePlan, list[torch.Tensor], Any] | None = None

    @property
    def seq(self) -> int:
        return self.admission.seq


class ScratchPipeStore(EmbeddingStore):
    """Host table plus a device scratchpad filled W batches ahead.

    Rows needed by a batch in flight (i..i+W) are held and never evicted;
    among the rest the least recently needed go first, and their (trained)
    values are written back to the host.

    Data movement runs off the training path as a staged pipeline
    (``hotcold.embedding.scratchpipe_pipeline``): at admission the evicted slots
    are copied out and the missing rows' host gather starts at once (a row whose
    eviction is still on its way to the host is taken from that staging); the
    write-back into the host table and the copy into the slots follow, each
    stage timed. A fetched slot is read only after it landed: ``forward`` of
    batch j joins the jobs up to j and charges the wait to ``h2d``.

    Bookkeeping (row->slot maps, holds, LRU stamps) is done in the training
    thread's order, so counters and results are deterministic: on a CPU
    trainer on the training thread; on a GPU (an offloaded runtime) by a
    planning thread of its own, as the paper's pipeline plans (admissions
    and releases run there in the order the training thread asks for them).
    There the planner also plans the batch: its distinct rows on the host
    (admission needs them), each lookup's slot shipped, and the lookups
    grouped by slot on the device on the movers' stream (``DeviceTable``
    over the scratchpad, with a trash slot for padding). A forward waits
    only for its own batch's admission, made W steps before, and for the
    event after its plan; the step pipeline's worker does nothing for it.

    Options: ``window`` W (batches of look-ahead, default 2), and the
    scratchpad size as ``scratchpad_rows`` or ``scratchpad_ratio`` (fraction
    of all rows); without either, the minimum capacity computed from the
    batches (the whole table when the batches are not known). A scratchpad
    smaller than the minimum capacity fails at construction.

    ``pipeline.work`` holds each admission's side work by stage
    (``SideWork``): CUDA-event times of the copies on a GPU (resolved
    lazily, all of them by ``close``), wall times otherwise.
    """

    Options = ScratchPipeOptions
    needs_batches = True
    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.window = self.options.window
        self.lookahead = self.window
        n = spec.num_rows
        self.host_weight = init_table(spec.table_sizes, spec.dim, spec.seed)  # [N, D]
        self.host_state = self.optimizer.init_state(n, spec.dim)              # [N(, D)]
        self._has_state = self.optimizer.adagrad
        self.row_bytes = row_bytes(spec.dim, self.optimizer.state_width(spec.dim))
        self.min_capacity: int | None = None
        start = 0
        if spec.batches is not None:
            rows = (self.plan(ids).rows.numpy() for ids in spec.batches())
            self.min_capacity, start = working_set_peak(rows, n, self.window)
        self.capacity = self.options.capacity(n, self.min_capacity)
        if self.min_capacity is not None and self.capacity < self.min_capacity:
            m = self.min_capacity
            raise InfeasibleError(
                f"scratchpipe: a scratchpad of {self.capacity} rows cannot hold the look-ahead "
                f"working set; the minimum capacity is {m} rows (unique rows of batches "
                f"{start}..{start + self.window}, window={self.window}); set scratchpad_rows >= {m} "
                f"or scratchpad_ratio >= {math.ceil(m / n * 1e6) / 1e6:g}"
            )
        c = self.capacity
        offloaded = runtime(self.device).offloaded
        trash = 1 if offloaded else 0  # the device table's trash slot (C), for padding
        weight = torch.zeros(c + trash, spec.dim, dtype=torch.float32, device=self.device)
        state = self.optimizer.init_state(c + trash, spec.dim, self.device)
        self.slot_weight, self.slot_state = weight[:c], state[:c]  # [C, D], [C]
        #: (GPU) the scratchpad as a device table: each batch planned, looked up and updated on the device
        self._table = DeviceTable(weight, state, self.optimizer, self.column_offsets, c) if offloaded else None
        self.directory = ScratchpadDirectory(n, c)
        self.row_to_slot = self.directory.row_to_slot       # [N] slot of each resident row, -1 if none
        self.slot_to_row = self.directory.slot_to_row       # [C] row in each slot, -1 if free
        self._queue: deque[Future] = deque()               # admitted (``_Admitted``), untrained, in training order
        self._deferred: list[torch.Tensor] = []             # first step: upcoming batches, admitted after it
        self._step = 0
        self._last: tuple[Lookup, torch.Tensor, torch.Tensor, _Admitted] | None = None
        self.pipeline = MovePipeline((self.host_weight, self.host_state), (self.slot_weight, self.slot_state),
                                     self._has_state, self.device)
        #: the planning stage on a GPU: admissions and releases, in order, off the training thread
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="scratchpipe-plan") if offloaded else None
        self._admitting: list[Future] = []                   # this step's admissions
        self._late: list[tuple[dict[str, int], Any, list[Future]]] = []  # steps whose admissions were not done
        self._plan_ms: list[float] = []                      # each admission's wall time on its thread
        self._closed = False
        self._ahead: dict[int, tuple[torch.Tensor, Lookup]] = {}  # id(ids) -> (ids, plan) made by ``prepare``
        self._known = 0                                            # batches ``prepare`` planned so far
        self._calls = 0                                            # ``prepare`` calls so far

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

    def prepare(self, ids: torch.Tensor, upcoming: Sequence[torch.Tensor] = (),
                device_rows: torch.Tensor | None = None) -> None:
        """Plan the batches admission has not seen, a step ahead: the newest of ``upcoming`` (at the first step,
        this batch and all of them). Admission itself stays in ``prefetch``: it waits for the step before, whose
        holds are released when it has trained. On a GPU the planner plans each batch as it admits it."""
        if self._planner is not None:
            return
        batches = [ids, *upcoming]  # batches calls .. calls + len(upcoming)
        for b in batches[max(0, self._known - self._calls):]:
            self._ahead[id(b)] = (b, self._plan_rows(b))
        self._known = max(self._known, self._calls + len(batches))
        self._calls += 1

    def _plan_rows(self, ids: torch.Tensor) -> Lookup:
        lk = self.plan(ids)
        lk.unique()
        lk.groups().plan(self.device)
        lk.positions_on(self.device)
        return lk

    def _admit(self, ids: torch.Tensor) -> Future:
        """Admit a batch (``_admit_now``): here, or queued to the planning thread; its ``_Admitted`` to come."""
        args = (ids, self._step, self._step + len(self._queue))
        if self._planner is not None:
            got = self._planner.submit(self._admit_now, *args)
        else:
            got = Future()
            got.set_result(self._admit_now(*args))
        self._admitting.append(got)
        return got

    def _admit_now(self, ids: torch.Tensor, step: int, served: int) -> _Admitted:
        """Hold the rows of a batch, give its missing rows slots and queue their movement."""
        t0 = time.perf_counter_ns()
        got = self._ahead.pop(id(ids), None)
        if got is not None and got[0] is ids:
            lk = got[1]
        else:  # on a GPU the device part of the plan is ``_plan_slots``'s
            lk = self.plan(ids) if self._table is not None else self._plan_rows(ids)
        uniq, _, _ = lk.unique()
        adm = self.directory.admit(uniq.numpy())
        if adm.missing.size:
            self.pipeline.submit(adm.seq, step, adm.victim_slots, adm.victim_rows, adm.new_slots, adm.missing)
        slots = self._plan_slots(lk, adm) if self._table is not None else None
        self._plan_ms.append((time.perf_counter_ns() - t0) / 1e6)
        return _Admitted(ids, lk, adm, served, slots)

    def _plan_slots(self, lk: Lookup, adm: Admission) -> tuple[DevicePlan, list[torch.Tensor], Any]:
        """The batch's lookups as slots [B, K] (the trash slot at padding), shipped and grouped on the device on
        the movers' stream: the plan, the tensors made for it and the event after them."""
        b, k = lk.shape
        per_lookup = torch.from_numpy(adm.slots).index_select(0, lk.unique()[1])  # [L]
        if lk.positions is None:
            slots = per_lookup
        else:
            slots = torch.full((b * k,), self.capacity, dtype=torch.int64).index_copy_(0, lk.positions, per_lookup)
        rt = self.pipeline.rt
        with copying_on(rt, self.pipeline.side) as made:
            plan = self._table.plan(ship(slots, self.device).view(b, k))
        return plan, made, rt.recorded(self.pipeline.side)

    def _release(self, slots: Any) -> None:
        """A batch has trained: its holds go, after every admission asked for before (on the planner, if any)."""
        if self._planner is not None:
            self._planner.submit(self.directory.release, slots)
        else:
            self.directory.release(slots)

    def _settle_planner(self) -> None:
        """Every queued admission and release done (the planning thread idle)."""
        if self._planner is not None:
            self._planner.submit(lambda: None).result()

    # -- training ---------------------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        if not self._queue:  # first step (or nothing prefetched): admit it now, then what prefetch saw
            self._queue.append(self._admit(ids))
            for upcoming in self._deferred:
                self._queue.append(self._admit(upcoming))
            self._deferred = []
        rec = self._queue.popleft().result()  # admitted W steps ago (on a GPU by the planning thread)
        if not (rec.ids is ids or torch.equal(rec.ids, ids)):
            raise RuntimeError("scratchpipe: forward got a batch other than the one prefetched for this step")
        self.pipeline.land(rec.seq)
        timer.mark("h2d")
        lk = rec.lookup
        if rec.slots is not None:  # planned by the planning thread, on the movers' stream
            plan, made, planned = rec.slots
            stream = self.pipeline.rt.current_stream()
            stream.wait_event(planned)
            for t in made:  # their memory is not reused before this stream has read them
                t.record_stream(stream)
            self._last = (plan, rec)
            out = self._table.lookup(plan)  # [B, K, D]
        else:
            uslots = torch.from_numpy(rec.admission.slots)  # [U] slot of each unique row
            lookup_slots = ship(uslots.index_select(0, lk.unique()[1]), self.device)  # [L]
            self._last = (ship(uslots, self.device), rec)
            out = self.to_batch(self.slot_weight.index_select(0, lookup_slots), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        plan, rec = self._last
        lk = rec.lookup
        if isinstance(plan, DevicePlan):
            self._table.update(plan, grad)
        else:
            self.optimizer.step(self.slot_weight, self.slot_state, plan, lk.groups(), self.from_batch(grad, lk))
        self._release(rec.admission.slots)
        counters, admitted = all_resident(lk.size, rec.admission.slots.size), self._admitting
        self._admitting = []
        if all(f.done() for f in admitted):
            self._book(counters, admitted)
            self._counters = counters
        else:  # booked once the planner has made them (``settle_counters``)
            self._counters = counters.as_dict()
            self._late.append((self._counters, counters, admitted))
        self._last = None
        self._step += 1
        timer.mark("emb_update")

    def _book(self, counters: Any, admitted: list[Future]) -> None:
        """A step's admissions added to its counters: booked at the step they happened in, as the simulator does."""
        for f in admitted:
            a = f.result()
            a.admission.book(counters, a.served, self.row_bytes)

    def settle_counters(self) -> None:
        """The steps whose admissions the planner had not made by their end: booked now."""
        self._settle_planner()
        for out, counters, admitted in self._late:
            self._book(counters, admitted)
            out.update(counters.as_dict())
        self._late = []
        super().settle_counters()

    # -- evaluation, export, shutdown -------------------------------------------------------------

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Resident rows from the scratchpad, the rest from the host; no holds, stamps or counters move."""
        self._settle_planner()
        self.pipeline.drain()
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
        self._settle_planner()
        self.pipeline.drain()
        out = self.host_weight.clone()
        occupied = np.flatnonzero(self.slot_to_row >= 0)
        if occupied.size:
            rows = torch.from_numpy(self.slot_to_row[occupied])
            src = self.slot_weight.index_select(0, torch.from_numpy(occupied).to(self.device))
            out.index_copy_(0, rows, src.to("cpu"))
        return out

    def final_rows(self) -> torch.Tensor:
        """``export``'s rows without a second table: the resident rows written into the host table."""
        self._settle_planner()
        self.pipeline.drain()
        occupied = np.flatnonzero(self.slot_to_row >= 0)
        if occupied.size:
            src = self.slot_weight.index_select(0, torch.from_numpy(occupied).to(self.device))
            self.host_weight.index_copy_(0, torch.from_numpy(self.slot_to_row[occupied]), src.to("cpu"))
        return self.host_weight

    def close(self) -> None:
        if self._closed:
            return
        if self._planner is not None:
            self._planner.shutdown(wait=True)
        self.pipeline.close()
        self._closed = True

    def report(self) -> dict[str, Any]:
        """Scratchpad size and its side work: ms by stage, ms training waited, the share hidden.

        ``hidden_fraction`` = 1 - waited / side work, over the whole run; the
        side work is copy-out, gather, scatter and copy-in on both back ends
        (``side_timer``: CUDA events for the copies on a GPU, wall time on a CPU).
        """
        return {"capacity": self.capacity, "min_capacity": self.min_capacity, "window": self.window,
                "side_timer": self.pipeline.side_timer, "planner": "thread" if self._planner else "training thread",
                "plan_ms": sum(self._plan_ms), **self.pipeline.report()}

