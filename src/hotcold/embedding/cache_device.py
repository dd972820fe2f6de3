"""A software cache's step on a GPU: the directory, the row moves and the update on the device, no host work.

``CacheStore`` on an offloaded runtime hands its batches here. The step
pipeline's worker plans a batch on the copy stream: the lookups grouped by
row, the directory's decisions (``DeviceDirectory``: the policy's exact
hits, victims and fills), each lookup's slot. The training stream then
writes the victims back and fetches the misses through the host table as the
device addresses it (``accel.Runtime.host_view``: the GPU's own loads and
stores over the bus, as FBGEMM's UVM cache moves rows; nothing is gathered
or staged by the host), gathers the lookups, and after the dense step sums
each row's gradients and updates its slot. Write-backs come before fetches
on one stream, so a row evicted in one step and missed in a later one is read
as trained. All shapes are the batch's; the counts stay on the device.

The cache has C slots, then a trash slot C (padding, empty groups: kept
zero) and a dump slot C + 1; the host table has N rows, then two dump rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hotcold.accel import Runtime
from hotcold.embedding.device_directory import DeviceAccess, DeviceDirectory
from hotcold.embedding.grouping import DeviceGroups, group_on_device
from hotcold.embedding.rows import bag_sums, keep_alive
from hotcold.embedding.update import RowOptimizer
from hotcold.policies.directory import CacheDirectory


@dataclass
class CachePlanOnDevice:
    """One batch planned on the device."""

    shape: tuple[int, int]
    groups: DeviceGroups          # over global rows (N at padding)
    access: DeviceAccess
    lookup_slots: torch.Tensor    # int64 [L] each lookup's slot (C at padding)
    next_use: torch.Tensor | None


class DeviceCache:
    """The slots [C + 2, D] (and state) on the device, the directory there, and the host table as it sees it."""

    def __init__(self, rt: Runtime, directory: CacheDirectory, weight: torch.Tensor, state: torch.Tensor,
                 host_w: torch.Tensor, host_s: torch.Tensor | None, optimizer: RowOptimizer) -> None:
        """``weight``/``state``: the cache's slots with the trash and dump slots; ``host_w``/``host_s``: the host
        table with its two dump rows (contiguous; registered with the device here, ``close`` gives it back)."""
        self.rt, self.optimizer = rt, optimizer
        self.weight, self.state = weight, state
        self.capacity, self.num_rows = directory.capacity, directory.num_rows
        self.directory = DeviceDirectory(directory, rt.device)
        self._host = [t for t in (host_w, host_s) if t is not None]
        self.host_w = rt.host_view(host_w)
        self.host_s = rt.host_view(host_s) if host_s is not None else None

    def plan(self, batch_rows: torch.Tensor) -> CachePlanOnDevice:
        """Global rows [B, K] on the device (N at padding) -> the batch's decisions, made on the device in
        training order (the directory changes with every plan)."""
        rows = batch_rows.reshape(-1).long()
        groups = group_on_device(rows, self.num_rows)
        nxt = self.directory.next_use(rows.numel())
        access = self.directory.access(groups, nxt)
        slots = self.directory.row_slot[rows]  # [L] after this batch's fills
        keep_alive(*vars(groups).values(), *vars(access).values(), slots)
        return CachePlanOnDevice(tuple(batch_rows.shape), groups, access, slots, nxt)

    def forward(self, plan: CachePlanOnDevice) -> torch.Tensor:
        """Victims written back, misses fetched, the lookups gathered: [B, K, D]."""
        a, c, n = plan.access, self.capacity, self.num_rows
        fetch_slots = torch.where(a.miss, a.slots, c + 1)
        fetch_rows = torch.where(a.miss, plan.groups.uniq, n + 1)
        for cache, host in ((self.weight, self.host_w), (self.state, self.host_s)):
            if host is None:
                continue
            host.index_copy_(0, a.victim_rows, cache.index_select(0, a.victim_slots))
            cache.index_copy_(0, fetch_slots, host.index_select(0, fetch_rows))
        return self.weight.index_select(0, plan.lookup_slots).view(*plan.shape, self.weight.shape[1])

    def update(self, plan: CachePlanOnDevice, grad: torch.Tensor) -> None:
        """Each row's gradients summed in batch order into its slot's update; the trash slot zeroed again."""
        g = plan.groups
        sums = bag_sums(g.order, g.starts, grad.reshape(-1, self.weight.shape[1]))
        self.optimizer.apply(self.weight, self.state, plan.access.slots, sums)
        self.weight[self.capacity].zero_()

    def resident(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The occupied slots' rows [U] and the slots' weights [U, D], on the host (after training)."""
        used = int(self.directory.used)
        return self.directory.slot_row[:used].cpu(), self.weight[:used].cpu()

    def lookup(self, rows: torch.Tensor, host_w: torch.Tensor) -> torch.Tensor:
        """Evaluation: rows [L] (host) from their slots where resident, else from ``host_w``; [L, D] on the
        device. Nothing changes."""
        dev_rows = rows.to(self.rt.device)
        slots = self.directory.row_slot[dev_rows]
        values = host_w.index_select(0, rows).to(self.rt.device)
        cached = self.weight.index_select(0, torch.clamp(slots, min=0))
        return torch.where((slots >= 0).unsqueeze(1), cached, values)

    def close(self) -> None:
        for t in self._host:
            self.rt.close_view(t)
        self._host = []
