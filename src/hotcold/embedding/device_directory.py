"""The cache directory on the device: ``CacheDirectory``'s decisions, made by fixed-shape kernels, read by nobody.

A software cache on a GPU decides each batch's hits, victims and fills; on
the host that decision is ``trace.policies.CacheDirectory`` (compiled
heaps and queues, the trace simulator's own), whose cost grows with the
batch's distinct rows and which needs the rows on the host. Here the same
decisions are made where the batch already is, in kernels whose shapes are
the batch's lookups L whatever its ids (FBGEMM's cache does its LRU this way,
set-associatively; this one keeps the policy's exact global order):

1. each distinct row's slot (``row_slot``), so its hit;
2. the number of victims needed (misses beyond the free slots) and each
   resident slot's eviction key (the policy's, as ``trace.victims.demand_key``
   orders it: smallest first, unique), the slots of the batch and the free
   ones keyed last; the L smallest keys (``topk``; two stable sorts for
   ``lfu``'s key of two parts), of which the first ``need`` are victims;
3. the misses, in row order, into the free slots from ``used`` up, then into
   the victims' slots in slot order;
4. the maps and each slot's policy state written back.

Everything that depends on how many rows hit or miss is a mask over
fixed-length tensors; writes that a mask turns off go to a dump slot (C + 1)
or dump row (N + 1). Slot C is the trash slot: padding and empty groups
point at it, it is never a victim and the stores keep it zero. The host
directory stays the oracle (tests compare them step by step) and the CPU
trainer's path; ``DeviceDirectory`` starts from its state (after a warm
start) and is exact for batches of at most C distinct rows, which the store
checks once training is over (``overflow``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hotcold.embedding.grouping import DeviceGroups
from hotcold.policies.directory import CacheDirectory
from hotcold.policies.victims import BELADY, LFU, LRU, STATIC, row_bits

INT64_MAX = torch.iinfo(torch.int64).max


def static_keys(rank: np.ndarray, bits: int) -> np.ndarray:
    """freqcache's key of every row (``victims.static_key``): ``rank << B | (2**B - 1 - row)``."""
    rows = np.arange(rank.size, dtype=np.int64)
    return (np.asarray(rank, dtype=np.int64) << bits) | (((1 << bits) - 1) - rows)


@dataclass
class DeviceAccess:
    """One batch's decisions, on the device; every tensor of the batch's length L or of ``k`` = min(L, C)."""

    slots: torch.Tensor          # int64 [L] each group's slot once filled (C: padding and empty groups)
    miss: torch.Tensor           # bool [L] the group's row was fetched
    victim_slots: torch.Tensor   # int64 [k] the victims' slots ascending, then C + 1
    victim_rows: torch.Tensor    # int64 [k] their rows, then N + 1
    evictions: torch.Tensor      # int64 []

    def counts(self, groups: DeviceGroups, num_rows: int, capacity: int) -> torch.Tensor:
        """int64 [6]: lookups, distinct rows, hits, distinct hits, evictions, and 1 where the batch had more
        distinct rows than the cache has slots (then the decisions are not the policy's: the run is void)."""
        real = groups.uniq < num_rows
        hit = real & ~self.miss
        lookups = group_lookups(groups)
        unique = real.sum()
        return torch.stack([torch.where(real, lookups, 0).sum(), unique, torch.where(hit, lookups, 0).sum(),
                            hit.sum(), self.evictions, (unique > capacity).long()])


def group_lookups(groups: DeviceGroups) -> torch.Tensor:
    """int64 [L]: each group's lookups (0 past the distinct count)."""
    big = groups.rows.numel()
    return torch.cat([groups.starts[1:], groups.starts.new_full((1,), big)]) - groups.starts


class DeviceDirectory:
    """``CacheDirectory``'s state and step on the device (see the module); built from a host directory's state.

    ``next_use`` (``belady``): each step's next uses, as ``CacheDirectory``'s
    policy holds them (``Belady.next_use``).
    """

    def __init__(self, host: CacheDirectory, device: torch.device) -> None:
        n, c, p = host.num_rows, host.capacity, host.policy
        self.num_rows, self.capacity, self.code, self.device = n, c, p.code, device
        self.bits = row_bits(n)
        self._policy = p

        def padded(a: np.ndarray, size: int, fill: int) -> torch.Tensor:
            out = torch.full((size,), fill, dtype=torch.int64)
            out[:a.size] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
            return out.to(device)

        self.row_slot = padded(host.row_slot, n + 2, -1)   # [N + 2]: row N (padding) -> the trash slot C
        self.row_slot[n] = c
        self.slot_row = padded(host.slot_row, c + 2, n + 1)  # [C + 2]: C trash, C + 1 dump
        self.slot_row[c] = n
        self.last = padded(p.last, c + 2, 0)
        self.count = padded(p.count, c + 2, 0)
        self.next = padded(p.next, c + 2, 0)
        #: freqcache: every row's key (``victims.static_key``), made once
        self.static_keys = padded(static_keys(p.rank, self.bits), n + 2, 0) if self.code == STATIC else None
        self.used = torch.tensor(host.used, dtype=torch.int64, device=device)
        self.step = torch.tensor(host.step, dtype=torch.int64, device=device)
        self._step = host.step  # the host's count of steps (belady's next uses are per step)
        self._slot_ids = torch.arange(c + 2, dtype=torch.int64, device=device)
        self._ranks: dict[int, torch.Tensor] = {}  # k -> arange(k), made once
        #: belady: the next use of a row never used again, as a key: a step count no run reaches
        self._never = (1 << (62 - self.bits)) - 1

    def _keys(self) -> torch.Tensor:
        """int64 [C + 2]: each slot's eviction key (smallest first) where the policy packs it into one int64."""
        row = self.slot_row
        if self.code == LRU:
            return ((self.last + 1) << self.bits) | row
        if self.code == STATIC:
            return self.count
        assert self.code == BELADY
        return ((self._never - torch.clamp(self.next, max=self._never)) << self.bits) | row

    def _candidates(self, excluded: torch.Tensor, k: int) -> torch.Tensor:
        """The ``k`` slots of smallest key, in key order (``excluded`` slots last)."""
        if self.code == LFU:  # (count, (last + 1) * N + row): two stable sorts, the minor key first
            minor = torch.where(excluded, INT64_MAX, (self.last + 1) * self.num_rows + self.slot_row)
            major = torch.where(excluded, INT64_MAX, self.count)
            by_minor = torch.sort(minor, stable=True).indices
            order = by_minor[torch.sort(major[by_minor], stable=True).indices]
            return order[:k]
        keys = torch.where(excluded, INT64_MAX, self._keys())
        return torch.topk(keys, k, largest=False, sorted=True).indices

    def access(self, groups: DeviceGroups, next_use: torch.Tensor | None = None) -> DeviceAccess:
        """Serve one batch: ``groups`` over global rows (``grouping.group_on_device`` with trash N).

        ``next_use`` [L] (``belady``): each group's next use, in ``groups.uniq``'s order.
        """
        n, c = self.num_rows, self.capacity
        uniq, big = groups.uniq, groups.rows.numel()
        k = min(big, c)
        slot = self.row_slot[uniq]                                        # [L] -1: not resident
        miss = slot < 0
        misses = miss.sum()
        free = c - self.used
        need = torch.clamp(misses - free, min=0)
        # resident slots outside the batch are the candidates (used <= C: the trash and dump slots are out)
        excluded = self._slot_ids >= self.used
        excluded.index_fill_(0, torch.where(miss, c, slot), True)
        cand = self._candidates(excluded, k)                              # [k] in key order
        if k not in self._ranks:
            self._ranks[k] = torch.arange(k, device=self.device)
        taken = self._ranks[k] < need
        victims = torch.sort(torch.where(taken, cand, c + 1)).values      # [k] ascending, C + 1 past the victims
        vrows = torch.where(taken, self.slot_row[victims], n + 1)        # [k], N + 1 past them
        # the misses, in row order: the free slots first, then the victims' slots
        j = torch.cumsum(miss, 0) - 1
        from_free = j < free
        fill = torch.where(from_free, self.used + j, victims[torch.clamp(j - free, 0, k - 1)])
        slots = torch.where(miss, fill, slot)                             # [L]
        # the maps: victims out, misses in (a victim is never a row of the batch)
        self.row_slot.index_fill_(0, vrows, -1)
        self.row_slot.index_copy_(0, torch.where(miss, uniq, n + 1), slots)
        self.slot_row.index_copy_(0, torch.where(miss, slots, c + 1), uniq)
        # the policy's state of the batch's slots
        mine = torch.where(uniq < n, slots, c + 1)
        if self.code == LFU:
            self.count.index_copy_(0, mine, torch.where(miss, 0, self.count[slots]) + group_lookups(groups))
        if self.code in (LRU, LFU):
            self.last.index_copy_(0, mine, self.step.expand(big))
        elif self.code == STATIC:
            self.count.index_copy_(0, torch.where(miss, slots, c + 1), self.static_keys[uniq])
        else:
            self.next.index_copy_(0, mine, next_use)
        self.used.add_(torch.minimum(misses, free))
        self.step.add_(1)
        self._step += 1
        return DeviceAccess(slots, miss, victims, vrows, need)

    def next_use(self, big: int) -> torch.Tensor | None:
        """``belady``: the next uses of the coming step's distinct rows (ascending), padded to ``big``; else None."""
        if self.code != BELADY:
            return None
        nu = self._policy.step_next_use(self._step)
        out = torch.zeros(big, dtype=torch.int64)
        out[:nu.size] = torch.from_numpy(np.minimum(nu, self._never))
        return out.to(self.device)
