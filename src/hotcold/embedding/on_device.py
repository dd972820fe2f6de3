"""A table of rows on the device planned, looked up and updated there: fixed shapes, nothing read back.

On a GPU a store whose batch is wholly in one device table (``device``'s
rows, FAE's hot rows) needs nothing of the host but the batch's ids there:
``DeviceTable.plan`` turns them into slots of the table and groups the
lookups by slot on the device (``grouping``), ``lookup`` gathers, ``update``
sums each slot's gradients in batch order and applies the row optimizer.
The table has one trash row past its last: padding lookups read it and its
update is thrown away (it is zeroed again), so every shape is the batch's
whatever its ids, as a CUDA graph needs. The step's lookups and distinct
rows stay on the device (``counts``) until the timed steps are over.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hotcold.data.packed import global_rows
from hotcold.embedding.grouping import DeviceGroups, group_on_device
from hotcold.embedding.rows import bag_sums, keep_alive, ship
from hotcold.embedding.update import RowOptimizer


def device_rows_of(ids: torch.Tensor, column_offsets: torch.Tensor | np.ndarray, num_rows: int,
                   device: torch.device) -> torch.Tensor:
    """ids [B, K] on the host (-1 at padding) -> their global rows (int32, N at padding) on ``device``, as the
    step pipeline ships them (for a plan made without it: a lock-step check, a benchmark)."""
    offsets = column_offsets.numpy() if isinstance(column_offsets, torch.Tensor) else column_offsets
    return ship(torch.from_numpy(global_rows(ids.numpy(), offsets, num_rows).astype(np.int32)), device)


@dataclass
class DevicePlan:
    """A batch planned on the device: its lookups' slots grouped, and its padding lookups counted."""

    shape: tuple[int, int]    # (B, K)
    groups: DeviceGroups      # over the table's slots (``groups.rows``: each lookup's slot)
    trash: int                # the trash slot: padding's

    def counts(self) -> torch.Tensor:
        """int64 [3]: the batch's lookups, distinct rows (the trash row apart) and padding lookups, on the device."""
        padding = (self.groups.rows == self.trash).sum()
        lookups = self.groups.rows.numel() - padding
        return torch.stack([lookups, self.groups.count - (padding > 0).long(), padding])


class DeviceTable:
    """Rows [R, D] and their optimizer state [R] (per element [R, D]) on the device, with a trash row (slot R) past them.

    ``weight`` [R + 1, D] and ``state`` [R + 1]: the trash row last, zero.
    ``column_offsets`` [K] (CPU): the global row of each id column's id 0;
    ``num_rows`` N: the global rows (N stands for padding). ``hot_rows``:
    int64 [R] ascending on the device, the global row in each slot (FAE's
    hot set); None: slot = global row (R = N).
    """

    def __init__(self, weight: torch.Tensor, state: torch.Tensor, optimizer: RowOptimizer,
                 column_offsets: torch.Tensor, num_rows: int, hot_rows: torch.Tensor | None = None,
                 exact_sums: bool = False) -> None:
        self.weight, self.state, self.optimizer = weight, state, optimizer
        self.trash = weight.shape[0] - 1
        self.offsets, self.num_rows, self.hot_rows = column_offsets.numpy(), num_rows, hot_rows
        self.exact_sums = exact_sums

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, K] on the host (-1 at padding) -> their global rows on the device (``device_rows_of``)."""
        return device_rows_of(ids, self.offsets, self.num_rows, self.weight.device)

    def plan(self, batch_rows: torch.Tensor) -> DevicePlan:
        """The batch's global rows [B, K] on the device (int32 or int64, N at padding) -> its plan, made there.

        Inside the step pipeline's ``copying_on`` its tensors are kept alive
        until the step that reads them has run.
        """
        rows = batch_rows.reshape(-1).long()                              # [L], N at padding
        # every row of a hot batch is hot: its slot is its place among the hot rows (N's is R, the trash)
        slots = rows if self.hot_rows is None else torch.searchsorted(self.hot_rows, rows)
        groups = group_on_device(slots, self.trash)
        keep_alive(*vars(groups).values())
        return DevicePlan(tuple(batch_rows.shape), groups, self.trash)

    def lookup(self, plan: DevicePlan) -> torch.Tensor:
        """The batch's rows [B, K, D] (zeros at padding)."""
        return self.weight.index_select(0, plan.groups.rows).view(*plan.shape, self.weight.shape[1])

    def update(self, plan: DevicePlan, grad: torch.Tensor) -> None:
        """Each slot's gradients summed in batch order, the rows updated, the trash row zeroed again.

        grad [B, K, D]. Empty groups (past the distinct count) sum to zero and
        update the trash row, as do the padding lookups.
        """
        g = plan.groups
        grads = grad.reshape(-1, self.weight.shape[1])
        sums = bag_sums(g.order, g.starts, grads.double() if self.exact_sums else grads)  # [L, D]
        self.optimizer.apply(self.weight, self.state, g.uniq, sums)
        self.weight[self.trash].zero_()
