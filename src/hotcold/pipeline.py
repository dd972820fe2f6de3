"""The step pipeline: step i+1 is read, planned and copied while step i trains.

What the host does for a step before the device can start it (reading the
batch, its global rows and their grouping, the store's decisions, the copies
of its inputs) is ``StepPipeline._prepare``. With the pipeline on, a worker
thread runs it for step i+1 as soon as step i is handed over, so on a GPU the
host plans while the device computes and the copies run on a copy stream, and
on a CPU the planning runs on another core. The training thread then only
waits for what is not ready yet. Off, the training thread prepares each step
itself, first thing in the step. The plans are made in training order either
way, each from the same state, so the same bits come out (tested): what a
store may do ahead is its ``plan_step`` (``hotcold.embedding.base``).

On a GPU (an offloaded runtime) a step's dense features, global rows and
labels cross in one copy, packed into one pinned buffer by the loader's
readers (``hotcold.data.packed``); the padding mask is made on the device,
and the store plans from the rows there (``EmbeddingStore.prepare``).

Each step's preparation is timed on the thread that did it (``prepared_ms``)
and the training thread's wait for it (``waited_ms``); ``hidden`` is the
share of the preparation that the training thread did not wait for.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import torch

from hotcold.accel import runtime
from hotcold.data.loader import Batch
from hotcold.data.packed import views
from hotcold.embedding.base import EmbeddingStore
from hotcold.embedding.rows import copying_on, keep_alive, ship

if TYPE_CHECKING:  # the sections of a run config it reads
    from hotcold.config import Sections


@dataclass
class Step:
    """One step's inputs, prepared: the batch on the host, its dense features, mask and labels on the device."""

    batch: Batch
    dense: torch.Tensor     # [B, num_dense]
    valid: torch.Tensor     # bool [B, K]: not padding
    labels: torch.Tensor    # [B]
    prepared_ms: float      # the host's wall time preparing it
    ready: Any = None       # offloaded: an event after its copies (on the copy stream)
    shipped: list[torch.Tensor] = field(default_factory=list)  # CUDA: what its copies made, on the copy stream


def pipeline_on(cfg: Sections, device: torch.device) -> bool:
    """``train.pipeline``: on, off, or auto (on where the trainer is a GPU, or stands in for one)."""
    mode = cfg.train.pipeline
    return mode == "on" or (mode == "auto" and runtime(device).offloaded)


class StepPipeline:
    """Hands out ``steps`` prepared steps of ``batches``; with ``ahead``, prepares the next while one trains."""

    def __init__(self, batches: Iterator[Batch], steps: int, store: EmbeddingStore, device: torch.device,
                 ahead: bool) -> None:
        self._batches, self._left = batches, steps
        self.store, self.device, self.ahead = store, device, ahead
        self.rt = runtime(device)
        self._offloaded = self.rt.offloaded
        self._copy = self.rt.stream() if self._offloaded else None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="hotcold-plan") if ahead else None
        self._next: Future | None = None
        self._holding: list[torch.Tensor] = []  # CUDA: the last handed-out step's copies
        self._in_flight: deque[tuple[list[torch.Tensor], Any]] = deque()  # earlier ones, with an event after their step
        self.prepared_ms: list[float] = []  # per step handed out, in order
        self.waited_ms: list[float] = []

    def _prepare(self) -> Step:
        t0 = time.perf_counter_ns()
        batch = next(self._batches)
        if not self._offloaded:
            if self.store.plans_ahead:
                self.store.prepare(batch.ids, batch.upcoming)
            return Step(batch, batch.dense, batch.ids >= 0, batch.labels, (time.perf_counter_ns() - t0) / 1e6)
        if batch.packed is None:
            raise RuntimeError("on a GPU the step pipeline takes packed batches (BatchLoader with buffers)")
        (b, f), k, packed = batch.dense.shape, batch.ids.shape[1], batch.packed
        with copying_on(self.rt, self._copy) as shipped:
            # the copy, also where the device is the host's memory (the buffer goes back to the pool)
            dev = ship(packed, self.device) if self.rt.cuda else packed.to(self.device, copy=True)
            dense, rows, labels = views(dev, b, f, k)
            valid = rows < self.store.spec.num_rows
            keep_alive(valid)
            if self.store.plans_ahead:
                self.store.prepare(batch.ids, batch.upcoming, rows)
            ready = self.rt.recorded(self._copy)
        batch.buffers.give_back(packed, ready)
        return Step(batch, dense, valid, labels, (time.perf_counter_ns() - t0) / 1e6, ready, shipped)

    def next(self) -> Step:
        """The next step, prepared (waiting for it where needed); with ``ahead``, the one after starts preparing."""
        if self._left <= 0:
            raise StopIteration("the step pipeline has handed out every step")
        self._left -= 1
        t0 = time.perf_counter_ns()
        if self._worker is None:
            step = self._prepare()
        else:
            step = (self._next or self._worker.submit(self._prepare)).result()
            self._next = self._worker.submit(self._prepare) if self._left else None
        if self._offloaded:
            self._hand_over(step)
        waited = (time.perf_counter_ns() - t0) / 1e6
        self.prepared_ms.append(step.prepared_ms)
        self.waited_ms.append(waited if self._worker is not None else step.prepared_ms)
        return step

    def _hand_over(self, step: Step) -> None:
        """The training stream waits for the step's copies. What they made (on the copy stream) is kept alive
        until the training stream has run the step after it, so the copy stream never reuses memory the
        training stream may still read."""
        stream = self.rt.current_stream()
        if self._holding:  # the previous step is queued in full by now
            self._in_flight.append((self._holding, self.rt.recorded(stream)))
        while self._in_flight and self._in_flight[0][1].query():
            self._in_flight.popleft()
        stream.wait_event(step.ready)
        self._holding = step.shipped

    def close(self) -> None:
        """Stop the worker (a step being prepared is finished first, and dropped)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        close = getattr(self._batches, "close", None)
        if close is not None:  # the loader's readers stop
            close()
