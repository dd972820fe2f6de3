"""ScratchPipe's scratchpad directory, shared by the ``scratchpipe`` store and its trace simulation.

ScratchPipe (Kwon and Rhu, ISCA 2022) knows the training batches ahead: when
batch i+W becomes visible it is *admitted*: its rows already in the
scratchpad are held, its missing rows get slots, free ones first, then the
least recently needed unheld ones (whose rows are evicted and written back).
A batch holds its slots from admission until it has trained, so the
scratchpad must hold the rows of W+1 consecutive batches at once
(``working_set_peak``). One directory serves the store and the simulator, so
their counters agree by construction.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hotcold.config import InfeasibleError
from hotcold.counters import StepCounters
from hotcold.policies import row_counts, scratch_kernels


def working_set_peak(batch_rows: Iterable[np.ndarray], num_rows: int, window: int) -> tuple[int, int]:
    """The most unique rows of any W+1 consecutive batches, and the first batch of that window.

    This is the smallest scratchpad that can hold batches i..i+W at once,
    which the pipeline needs when batch i+W is admitted before batch i trains.
    """
    counts = np.zeros(num_rows, dtype=np.int32)  # [N] in how many live batches each row is
    live: deque[np.ndarray] = deque()
    distinct = peak = at = 0
    for b, rows in enumerate(batch_rows):
        u = np.asarray(rows, dtype=np.int64)
        if u.size > 1 and not (u[1:] > u[:-1]).all():
            u = np.unique(u)
        distinct += row_counts.window_add(counts, u, 1)
        live.append(u)
        if len(live) > window + 1:
            distinct += row_counts.window_add(counts, live.popleft(), -1)
        if distinct > peak:
            peak, at = distinct, b - len(live) + 1
    return peak, at


@dataclass
class Admission:
    """What admitting one batch does to the scratchpad."""

    seq: int                   # admission number, also the LRU stamp of its slots
    slots: np.ndarray          # int64 [U] slots of the batch's unique rows (ascending rows), held
    hits: int                  # unique rows already resident
    missing: np.ndarray        # int64 [M] rows to fetch
    new_slots: np.ndarray      # int64 [M] their slots
    victim_rows: np.ndarray    # int64 [V] rows evicted (to write back)
    victim_slots: np.ndarray   # int64 [V] their slots

    def book(self, c: StepCounters, batch: int, row_bytes: int) -> None:
        """Add this admission's fetch and write-back to a step's counters (the step it happens in)."""
        c.prefetch_batch = batch
        c.prefetch_unique_hits += self.hits
        c.prefetch_unique_misses += self.missing.size
        c.evictions += self.victim_rows.size
        c.set_param_traffic(c.param_rows_h2d + self.missing.size, c.param_rows_d2h + self.victim_rows.size,
                            row_bytes)


class ScratchpadDirectory:
    """Which row sits in which of C slots, which slots are held, and when each was last needed.

    Evicted rows stay resident until their slot is needed, unlike a window
    that drops rows as soon as no batch in it needs them.

    Admission order: the first step admits batches 0..W in order; step i >= 1
    admits batch i+W (when there is one); batch i's holds are released after it
    trains. The store and the simulator both plan with
    ``scratch_kernels.scratch_admit`` and ``scratch_kernels.scratch_release``
    (a queue of the unheld slots, least recently needed first, stale entries
    skipped).
    """

    def __init__(self, num_rows: int, capacity: int) -> None:
        self.capacity = capacity
        self.row_to_slot = np.full(num_rows, -1, dtype=np.int64)   # [N] slot of each resident row, -1 if none
        self.slot_to_row = np.full(capacity, -1, dtype=np.int64)   # [C] row in each slot, -1 if free
        self.last_use = np.full(capacity, -1, dtype=np.int64)      # [C] admission that last needed the slot
        self.hold = np.zeros(capacity, dtype=np.int32)             # [C] admitted, untrained batches needing it
        self._queue = scratch_kernels.scratch_queue(capacity)      # unheld slots, next victim first
        self._state = np.array([0, 0, 0, capacity], dtype=np.int64)  # admissions, held slots, queue head, tail
        self._victim_slots = np.zeros(capacity, dtype=np.int64)
        self._victim_rows = np.zeros(capacity, dtype=np.int64)

    @property
    def seq(self) -> int:
        return int(self._state[0])

    @property
    def held(self) -> int:
        """Slots held by admitted, untrained batches."""
        return int(self._state[1])

    def admit(self, uniq: np.ndarray) -> Admission:
        """Hold the distinct rows ``uniq`` [U] of a batch; give the missing ones slots."""
        uniq = np.ascontiguousarray(uniq, dtype=np.int64)
        slots = np.empty(uniq.size, dtype=np.int64)
        hit = np.empty(uniq.size, dtype=bool)
        seq = self.seq
        hits, victims = scratch_kernels.scratch_admit(uniq, self.row_to_slot, self.slot_to_row, self.last_use,
                                                      self.hold, self._queue, self._state, slots, hit,
                                                      self._victim_slots, self._victim_rows)
        if hits < 0:
            raise InfeasibleError(
                f"scratchpipe: a batch needs {int(uniq.size - np.count_nonzero(self.row_to_slot[uniq] >= 0))} more "
                f"slots but only {victims} of {self.capacity} are free or evictable; the scratchpad is smaller "
                f"than the look-ahead working set")
        miss = ~hit
        return Admission(seq, slots, int(hits), uniq[miss], slots[miss], self._victim_rows[:victims].copy(),
                         self._victim_slots[:victims].copy())

    def release(self, slots: np.ndarray) -> None:
        """A batch has trained: drop its holds (``slots``: its ``Admission.slots``, in their order)."""
        scratch_kernels.scratch_release(np.ascontiguousarray(slots, dtype=np.int64), self.last_use, self.hold,
                                        self._queue, self._state)
