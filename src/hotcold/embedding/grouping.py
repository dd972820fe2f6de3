"""A batch's lookups grouped by row on the device: fixed shapes, nothing read back by the host.

The host groups a batch by a radix sort (``rows.RowGroups``). A store whose
gradient sums run on a GPU groups them there instead, in a dozen kernels
whose outputs have the batch's length whatever its ids (as FBGEMM's backward
does, by a stable device sort): the lookups sorted by row, each row's in
batch order, so that the sums keep ``rows.sum_by_index``'s order and bits;
the distinct rows and each one's first lookup, padded to the batch's length;
the number of distinct rows left on the device. Padding lookups read the
store's trash row (``trash``, one past its last row): its group comes after
every real row's, and the stores keep it zero (``DeviceStore``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DeviceGroups:
    """The lookups of a batch grouped by row, on the device; every tensor has the batch's L lookups.

    Group g (g < ``count``) is distinct row ``uniq[g]``; its lookups are
    ``order[starts[g]:starts[g + 1]]`` (to the end for the last). Past
    ``count``, ``uniq`` is ``trash`` and ``starts`` is L: empty groups, whose
    gradient sums are zero (``rows.bag_sums``).
    """

    rows: torch.Tensor      # int64 [L] each lookup's row (``trash`` at padding)
    order: torch.Tensor     # int64 [L] the lookups row by row, each row's in batch order
    uniq: torch.Tensor      # int64 [L] the distinct rows ascending, then ``trash``
    starts: torch.Tensor    # int64 [L] each group's first position in ``order``, then L
    group: torch.Tensor     # int64 [L] the group of each lookup in ``order``'s order

    @property
    def count(self) -> torch.Tensor:
        """int64 []: the number of groups (the trash row's included where the batch has padding)."""
        return self.group[-1] + 1


_POSITIONS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _positions(n: int, device: torch.device) -> torch.Tensor:
    """int64 [n]: 0 .. n - 1 on ``device``, made once (read only)."""
    key = (n, device)
    if key not in _POSITIONS:
        _POSITIONS[key] = torch.arange(n, dtype=torch.int64, device=device)
    return _POSITIONS[key]


def group_on_device(rows: torch.Tensor, trash: int) -> DeviceGroups:
    """Group int64 rows [L] (0 <= row <= ``trash``) by row, on their device, without a host read.

    A stable sort (the same order on every processor: a stable sort has one
    result), the first lookup of each run of equal rows marked, the groups
    numbered by a prefix sum, and the distinct rows and starts scattered to
    their group (later lookups of a group to a spare slot past the end).
    """
    n = rows.numel()
    dev = rows.device
    ordered, order = torch.sort(rows, stable=True)                       # [L], [L]
    first = torch.ones(n, dtype=torch.bool, device=dev)
    torch.ne(ordered[1:], ordered[:-1], out=first[1:])
    group = torch.cumsum(first, 0).sub_(1)                               # [L] group of each sorted lookup
    slot = torch.where(first, group, n)                                  # [L] its group at a run's start, else n
    uniq = torch.full((n + 1,), trash, dtype=torch.int64, device=dev).scatter_(0, slot, ordered)[:n]
    starts = torch.full((n + 1,), n, dtype=torch.int64, device=dev).scatter_(0, slot, _positions(n, dev))[:n]
    return DeviceGroups(rows, order, uniq, starts, group)
