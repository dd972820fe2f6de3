"""Counters a step leaves on the device, read once the timed steps are over.

Reading a count on the host inside a step would make the host wait for the
device (a GPU drained every step). A store hands ``PendingCounts.add`` the
step's counts as a device tensor and a function that makes the step's
counters from them; the dict it returns is what ``step_counters`` reports,
filled in by ``settle`` (``EmbeddingStore.settle_counters``) in one transfer.
"""
from __future__ import annotations

from typing import Callable

import torch

from hotcold.counters import StepCounters


class PendingCounts:
    """Steps' counters waiting for their device-side counts."""

    def __init__(self) -> None:
        self._open: list[tuple[dict[str, int], torch.Tensor, Callable[..., StepCounters]]] = []

    def add(self, counts: torch.Tensor, make: Callable[..., StepCounters]) -> dict[str, int]:
        """counts: int64 [k] on the device; ``make(*counts)`` (as ints) gives the step's counters once read.
        Returns the step's counter dict, every field None until ``settle``."""
        out: dict[str, int] = dict.fromkeys(StepCounters().as_dict())
        self._open.append((out, counts, make))
        return out

    def settle(self) -> None:
        """Read every open step's counts in one transfer and fill in their dicts."""
        if not self._open:
            return
        values = torch.stack([counts for _, counts, _ in self._open]).tolist()
        for (out, _, make), got in zip(self._open, values):
            out.update(make(*got).as_dict())
        self._open = []
