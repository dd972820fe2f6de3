"""``device``: every row in the trainer device's memory; the upper bound."""
from __future__ import annotations

import torch

from hotcold.counters import all_resident
from hotcold.embedding.base import EmbeddingStore, Marker, MemoryNeed, StoreSpec
from hotcold.embedding.rows import Lookup, init_table, ship, table_bytes


class DeviceStore(EmbeddingStore):
    """All rows and their optimizer state live on the trainer device.

    Only the planned rows cross from the host; lookup and the sparse update
    run where the rows are. No embedding data moves.
    """

    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.weight = init_table(spec.table_sizes, spec.dim, spec.seed, self.device)  # [N, D], drawn in place
        self.state = self.optimizer.init_state(spec.num_rows, self.device)                # [N]
        self._last: tuple[Lookup, torch.Tensor] | None = None

    def plan_step(self, ids: torch.Tensor) -> tuple[Lookup, torch.Tensor, torch.Tensor]:
        """The batch's plan and, on the device, its rows [L], distinct rows [U] and the plan of their sum."""
        lk = super().plan_step(ids)
        rows, uniq = ship(lk.rows, self.device), ship(lk.groups().rows, self.device)
        if self.device.type != "cpu" or self.spec.exact_sums:
            lk.groups().plan(self.device)  # the sum on this device reads it: ship it now
        return lk, rows, uniq

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        lk, rows, uniq = self.planned(ids)
        timer.mark("h2d")
        self._last = (lk, uniq)
        out = self.to_batch(self.weight.index_select(0, rows), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        lk, uniq = self._last
        self.optimizer.step(self.weight, self.state, uniq, lk.groups(), self.from_batch(grad, lk), self.spec.exact_sums)
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
        table = table_bytes(spec.num_rows, spec.dim, spec.optimizer.state_width)
        if spec.device.type == "cpu":
            return MemoryNeed(host=table)
        return MemoryNeed(host=table_bytes(spec.num_rows, spec.dim), device=table)

    def export(self) -> torch.Tensor:
        return self.weight.detach().to("cpu", copy=True)

    def final_rows(self) -> torch.Tensor:
        return self.weight.detach().cpu()  # the table itself on the CPU: no second copy
