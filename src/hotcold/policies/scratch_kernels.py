"""Compiled kernels of ScratchPipe's scratchpad (``ScratchpadDirectory``, ``hotcold.policies.scratchpad``).

A batch's rows are admitted into slots held until the batch has trained
(``scratch_admit``), then released (``scratch_release``); the unheld slots
wait in a queue (``scratch_queue``), least recently admitted first, and
missing rows take their slots from its front. The store and the trace
simulator both plan with these kernels, so the two give the same counters by
construction.
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit


def scratch_queue(capacity: int) -> np.ndarray:
    """The unheld slots' queue: int64 [2C + 2, 2] (last admission, slot); every slot, never used, in slot order."""
    q = np.full((2 * capacity + 2, 2), 0, dtype=np.int64)   # written through now, as ``new_heap``
    q[:capacity, 0] = -1
    q[:capacity, 1] = np.arange(capacity)
    return q


@jit
def _scratch_compact(queue, head, tail, last_use, hold):
    """Move the current entries of ``queue[head:tail]`` to its front, in order; returns their count."""
    n = 0
    for i in range(head, tail):
        s = queue[i, 1]
        if hold[s] == 0 and last_use[s] == queue[i, 0]:
            queue[n, 0], queue[n, 1] = queue[i, 0], s
            n += 1
    return n


@jit
def scratch_admit(uniq, row_to_slot, slot_to_row, last_use, hold, queue, state, slots, hit, victim_slots,
                  victim_rows):
    """Admit a batch's distinct rows ``uniq``: hold the resident ones, give the missing ones slots.

    ``state``: [admissions so far, held slots, queue head, queue tail]. Fills
    ``slots`` and ``hit`` [U], and ``victim_slots``/``victim_rows`` with the
    evicted slots in the order they were taken. Returns (unique hits,
    victims), or (-1, slots free or evictable) without changing anything when
    the missing rows outnumber the unheld slots. Missing rows (ascending)
    take the unheld slots from the queue's front: never-used slots first (by
    slot), then by (last admission, row that admission gave the slot).

    A slot released by batch t is needed by no later admitted batch, so its
    last admission is t's: releases come in admission order, and a queue to
    which each release appends its slots (in its rows' order) is sorted by
    that key. An entry whose slot was held again since is stale (its slot's
    last admission moved on, or it is held) and skipped.
    """
    capacity = hold.size
    seq = state[0]
    uh = 0
    newly_held = 0
    for i in range(uniq.size):
        s = row_to_slot[uniq[i]]
        slots[i] = s
        if s >= 0:
            uh += 1
            if hold[s] == 0:
                newly_held += 1
    missing = uniq.size - uh
    available = capacity - state[1] - newly_held
    if missing > available:
        return -1, available
    for i in range(uniq.size):  # hold the hits first: no missing row may take their slots
        s = slots[i]
        hit[i] = s >= 0
        if s >= 0:
            if hold[s] == 0:
                state[1] += 1
            hold[s] += 1
            last_use[s] = seq
    head = state[2]
    nv = 0
    for i in range(uniq.size):
        if hit[i]:
            continue
        while True:
            lu, s = queue[head, 0], queue[head, 1]
            head += 1
            if hold[s] == 0 and last_use[s] == lu:
                break
        old = slot_to_row[s]
        if old >= 0:
            victim_slots[nv] = s
            victim_rows[nv] = old
            nv += 1
            row_to_slot[old] = -1
        slot_to_row[s] = uniq[i]
        row_to_slot[uniq[i]] = s
        hold[s] = 1
        last_use[s] = seq
        state[1] += 1
        slots[i] = s
    state[0] = seq + 1
    state[2] = head
    return uh, nv


@jit
def scratch_release(slots, last_use, hold, queue, state):
    """A batch has trained: drop its holds (``slots`` in its admission's order); a slot no batch holds
    becomes evictable again, at the queue's back."""
    head, tail = state[2], state[3]
    if tail + slots.size > queue.shape[0]:
        tail = _scratch_compact(queue, head, tail, last_use, hold)
        head = 0
    for s in slots:
        hold[s] -= 1
        if hold[s] == 0:
            state[1] -= 1
            queue[tail, 0], queue[tail, 1] = last_use[s], s
            tail += 1
    state[2], state[3] = head, tail
