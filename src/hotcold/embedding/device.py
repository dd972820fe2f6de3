"""``device``: every row in the trainer device's memory; the upper bound."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hotcold.accel import runtime
from hotcold.counters import all_resident
from hotcold.embedding.base import EmbeddingStore, Marker, MemoryNeed, StoreSpec
from hotcold.embedding.grouping import DeviceGroups, group_on_device, lookup_rows
from hotcold.embedding.rows import Lookup, bag_sums, init_table, keep_alive, ship, table_bytes
from hotcold.embedding.settle import PendingCounts


@dataclass
class _OnDevice:
    """A batch planned on the device: its lookups grouped there, and its padding lookups counted there."""

    shape: tuple[int, int]
    groups: DeviceGroups
    padding: torch.Tensor  # int64 [] lookups of the trash row


class DeviceStore(EmbeddingStore):
    """All rows and their optimizer state live on the trainer device.

    Only the batch's ids cross from the host; lookup and the sparse update run
    where the rows are. No embedding data moves. On a GPU (an offloaded
    runtime) the host only ships the ids: the rows are grouped on the device
    (``grouping``), padding reads a trash row past the last (kept zero), every
    shape is the batch's whatever its ids, and the step's counters stay on
    the device until the timed steps are over (``settle_counters``). On a CPU
    trainer the host plans the batch (``plan_step``) and the update runs as one
    compiled kernel.
    """

    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.rt = runtime(self.device)
        n = spec.num_rows
        self.trash = n if self.rt.offloaded else None  # the trash row, on the device path
        extra = 1 if self.rt.offloaded else 0
        self._table = init_table(spec.table_sizes, spec.dim, spec.seed, self.device, extra_rows=extra)  # [N(+1), D]
        self._state = self.optimizer.init_state(n + extra, self.device)                               # [N(+1)]
        self.weight, self.state = self._table[:n], self._state[:n]
        self._offsets = ship(self.column_offsets, self.device) if self.rt.offloaded else None  # [K]
        self._pending = PendingCounts()
        self._last: tuple[Lookup, torch.Tensor] | _OnDevice | None = None

    def plan_step(self, ids: torch.Tensor, on_device: torch.Tensor | None = None
                  ) -> tuple[Lookup, torch.Tensor, torch.Tensor] | _OnDevice:
        """On the device path the batch's rows grouped on the device (from ``on_device``, else the ids shipped);
        else the host's plan and, on the device, its rows [L], distinct rows [U] and the plan of their sum."""
        if self.rt.offloaded:
            on_device = ship(ids, self.device) if on_device is None else on_device
            rows = lookup_rows(on_device, self._offsets, self.trash)   # [B*K]
            groups = group_on_device(rows, self.trash)
            padding = (rows == self.trash).sum()
            keep_alive(*vars(groups).values(), padding)  # made on the copy stream, read on the training stream
            return _OnDevice(tuple(ids.shape), groups, padding)
        lk = super().plan_step(ids)
        rows, uniq = ship(lk.rows, self.device), ship(lk.groups().rows, self.device)
        if self.spec.exact_sums:
            lk.groups().plan(self.device)  # the sum on this device reads it: ship it now
        return lk, rows, uniq

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        plan = self.planned(ids)
        timer.mark("h2d")
        if isinstance(plan, _OnDevice):
            self._last = plan
            out = self._table.index_select(0, plan.groups.rows).view(*plan.shape, self.dim)  # [B, K, D]
        else:
            lk, rows, uniq = plan
            self._last = (lk, uniq)
            out = self.to_batch(self.weight.index_select(0, rows), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        if isinstance(self._last, _OnDevice):
            self._backward_on_device(self._last, grad)
        else:
            lk, uniq = self._last
            self.optimizer.step(self.weight, self.state, uniq, lk.groups(), self.from_batch(grad, lk),
                                self.spec.exact_sums)
            self._counters = all_resident(lk.size, uniq.numel())
        self._last = None
        timer.mark("emb_update")

    def _backward_on_device(self, plan: _OnDevice, grad: torch.Tensor) -> None:
        """Each row's gradients summed in batch order (empty groups sum to zero and update the trash row), the
        rows updated, the trash row zeroed again; the counters left on the device."""
        g = plan.groups
        grads = grad.reshape(-1, self.dim)
        sums = bag_sums(g.order, g.starts, grads.double() if self.spec.exact_sums else grads)  # [L, D]
        self.optimizer.apply(self._table, self._state, g.uniq, sums)
        self._table[self.trash].zero_()
        lookups = g.rows.numel()
        self._counters = self._pending.add(torch.stack([g.count, plan.padding]), lambda count, padding: all_resident(
            lookups - padding, count - (1 if padding else 0)))

    def step_counters(self) -> dict[str, int]:
        return self._counters if isinstance(self._counters, dict) else self._counters.as_dict()

    def settle_counters(self) -> None:
        self._pending.settle()

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        lk = self.plan(ids)
        return self.to_batch(self.weight.index_select(0, lk.rows.to(self.device)), lk)

    @classmethod
    def memory_need(cls, spec: StoreSpec) -> MemoryNeed:
        """Every row and its state on the trainer device; on a GPU the host receives the final rows."""
        table = table_bytes(spec.num_rows, spec.dim, spec.optimizer.state_width)
        if spec.device.type == "cpu":
            return MemoryNeed(host=table)
        return MemoryNeed(host=table_bytes(spec.num_rows, spec.dim), device=table)

    def export(self) -> torch.Tensor:
        return self.weight.detach().to("cpu", copy=True)

    def final_rows(self) -> torch.Tensor:
        return self.weight.detach().cpu()  # the table itself on the CPU: no second copy
