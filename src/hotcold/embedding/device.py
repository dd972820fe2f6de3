"""``device``: every row in the trainer device's memory; the upper bound."""
from __future__ import annotations

import torch

from hotcold.accel import runtime
from hotcold.counters import all_resident
from hotcold.embedding.base import EmbeddingStore, Marker, MemoryNeed, StoreSpec
from hotcold.embedding.on_device import DevicePlan, DeviceTable
from hotcold.embedding.rows import Lookup, init_table, ship, table_bytes


class DeviceStore(EmbeddingStore):
    """All rows and their optimizer state live on the trainer device.

    Only the batch's ids cross from the host; lookup and the sparse update run
    where the rows are. No embedding data moves. On a GPU (an offloaded
    runtime) the batch is planned on the device too (``DeviceTable``: fixed
    shapes, padding through a trash row) and the step's counters stay there
    until the timed steps are over (``settle_counters``). On a CPU trainer the
    host plans the batch (``plan_step``) and the update runs as one compiled
    kernel.
    """

    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.rt = runtime(self.device)
        n, extra = spec.num_rows, 1 if self.rt.offloaded else 0  # the device table's trash row
        table = init_table(spec.table_sizes, spec.dim, spec.seed, self.device, extra_rows=extra)  # [N(+1), D]
        state = self.optimizer.init_state(n + extra, spec.dim, self.device)                     # [N(+1)(, D)]
        self.weight, self.state = table[:n], state[:n]
        self.table = DeviceTable(table, state, self.optimizer, self.column_offsets, n,
                                 exact_sums=spec.exact_sums) if self.rt.offloaded else None
        self._last: tuple[Lookup, torch.Tensor] | DevicePlan | None = None

    def plan_step(self, ids: torch.Tensor, device_rows: torch.Tensor | None = None
                  ) -> tuple[Lookup, torch.Tensor, torch.Tensor] | DevicePlan:
        """On the device path the batch planned on the device (from ``device_rows``, else its rows shipped);
        else the host's plan and, on the device, its rows [L], distinct rows [U] and the plan of their sum."""
        if self.table is not None:
            return self.table.plan(self.table.rows_of(ids) if device_rows is None else device_rows)
        lk = super().plan_step(ids)
        rows, uniq = ship(lk.rows, self.device), ship(lk.groups().rows, self.device)
        if self.spec.exact_sums:
            lk.groups().plan(self.device)  # the sum on this device reads it: ship it now
        return lk, rows, uniq

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        plan = self.planned(ids)
        timer.mark("h2d")
        if isinstance(plan, DevicePlan):
            self._last = plan
            out = self.table.lookup(plan)  # [B, K, D]
        else:
            lk, rows, uniq = plan
            self._last = (lk, uniq)
            out = self.to_batch(self.weight.index_select(0, rows), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        if isinstance(self._last, DevicePlan):
            self.table.update(self._last, grad)
            self._counters = self._device_counts.add(self._last.counts(), lambda lookups, unique, _: all_resident(
                lookups, unique))
        else:
            lk, uniq = self._last
            self.optimizer.step(self.weight, self.state, uniq, lk.groups(), self.from_batch(grad, lk),
                                self.spec.exact_sums)
            self._counters = all_resident(lk.size, uniq.numel())
        self._last = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        lk = self.plan(ids)
        return self.to_batch(self.weight.index_select(0, lk.rows.to(self.device)), lk)

    @classmethod
    def memory_need(cls, spec: StoreSpec) -> MemoryNeed:
        """Every row and its state on the trainer device; on a GPU the host receives the final rows."""
        table = table_bytes(spec.num_rows, spec.dim, spec.optimizer.state_width(spec.dim))
        if spec.device.type == "cpu":
            return MemoryNeed(host=table)
        return MemoryNeed(host=table_bytes(spec.num_rows, spec.dim), device=table)

    def export(self) -> torch.Tensor:
        return self.weight.detach().to("cpu", copy=True)

    def final_rows(self) -> torch.Tensor:
        return self.weight.detach().cpu()  # the table itself on the CPU: no second copy
