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


def working_set_peak(batch_rows: Iterable[np.ndarray], num_rows: int, window: int) -> tuple[int, int]:
    """The most unique rows of any W+1 consecutive batches, and the first batch of that window.

    This is the smallest scratchpad that can hold batches i..i+W at once,
    which the pipeline needs when batch i+W is admitted before batch i trains.
    """
    counts = np.zeros(num_rows, dtype=np.int32)  # [N] in how many live batches each row is
    live: deque[np.ndarray] = deque()
    distinct = peak = at = 0
    for b, rows in enumerate(batch_rows):
        u = np.unique(rows)
        counts[u] += 1
        distinct += int(np.count_nonzero(counts[u] == 1))
        live.append(u)
        if len(live) > window + 1:
            old = live.popleft()
            counts[old] -= 1
            distinct -= int(np.count_nonzero(counts[old] == 0))
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
    trains.
    """

    def __init__(self, num_rows: int, capacity: int) -> None:
        self.capacity = capacity
        self.row_to_slot = np.full(num_rows, -1, dtype=np.int64)   # [N] slot of each resident row, -1 if none
        self.slot_to_row = np.full(capacity, -1, dtype=np.int64)   # [C] row in each slot, -1 if free
        self.last_use = np.full(capacity, -1, dtype=np.int64)      # [C] admission that last needed the slot
        self.hold = np.zeros(capacity, dtype=np.int32)             # [C] admitted, untrained batches needing it
        self.seq = 0

    def admit(self, uniq: np.ndarray) -> Admission:
        """Hold the distinct rows ``uniq`` [U] of a batch; give the missing ones slots."""
        slots = self.row_to_slot[uniq]          # [U], -1 where missing
        hit = slots >= 0
        self.hold[slots[hit]] += 1
        missing = uniq[~hit]                    # [M]
        seq, self.seq = self.seq, self.seq + 1
        none = np.empty(0, dtype=np.int64)
        new_slots, victim_slots, victim_rows = none, none, none
        if missing.size:
            new_slots = self._allocate(missing.size)
            victim_slots = new_slots[self.slot_to_row[new_slots] >= 0]   # [V]
            victim_rows = self.slot_to_row[victim_slots]                  # [V]
            self.row_to_slot[victim_rows] = -1
            self.slot_to_row[new_slots] = missing
            self.row_to_slot[missing] = new_slots
            self.hold[new_slots] += 1
            slots[~hit] = new_slots
        self.last_use[slots] = seq
        return Admission(seq, slots, int(hit.sum()), missing, new_slots, victim_rows, victim_slots)

    def release(self, slots: np.ndarray) -> None:
        """A batch has trained: drop its holds."""
        self.hold[slots] -= 1

    def _allocate(self, n: int) -> np.ndarray:
        """``n`` unheld slots, free ones first, then least recently needed: int64 [n]."""
        cand = np.flatnonzero(self.hold == 0)
        if cand.size < n:
            raise InfeasibleError(
                f"scratchpipe: a batch needs {n} more slots but only {cand.size} of {self.capacity} are "
                f"free or evictable; the scratchpad is smaller than the look-ahead working set")
        key = self.last_use[cand] * self.capacity + cand  # unique: LRU stamp, then slot
        if n < cand.size:
            pick = np.argpartition(key, n - 1)[:n]
            cand, key = cand[pick], key[pick]
        return cand[np.argsort(key)]
