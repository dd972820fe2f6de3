"""Software embedding caches: ``lru``, ``lfu`` and ``freqcache``.

Every row and its optimizer state live in host memory; the device holds a
cache of C slots (weights [C, D], state [C] or per element [C, D]). Before each forward the
batch is planned by ``hotcold.policies.directory.CacheDirectory`` (the trace
simulator's own directory, so its counts are the stores'): hits stay,
victims outside the batch are written back (weights and state), misses are
fetched. Lookups and the sparse update then run on the cached slots. On a
GPU the same decisions are made on the device and the rows move without the
host (``cache_device``). Budget and options: ``CacheOptions``,
``FreqCacheOptions`` and docs/methods.md.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotcold.accel import runtime
from hotcold.config import require
from hotcold.counters import StepCounters, row_bytes
from hotcold.config import InfeasibleError
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.cache_device import CachePlanOnDevice, DeviceCache
from hotcold.embedding.on_device import device_rows_of
from hotcold.options.stores import CacheOptions, FreqCacheOptions
from hotcold.embedding.rows import Lookup, init_table, ship
from hotcold.policies.directory import Access, CacheDirectory, Policy, cache_policy, cache_step_counters

@dataclass
class _CachePlan:
    """One batch, planned on the host: the directory's decisions and what its forward reads on the device."""

    lookup: Lookup
    access: Access
    lookup_slots: torch.Tensor        # int64 [L] slot of each lookup, on the device
    uslots: torch.Tensor              # int64 [U] slot of each distinct row, on the device
    miss_slots: torch.Tensor          # int64 [M] slots to fill, on the device
    victim_slots: torch.Tensor        # int64 [E] slots to write back, on the device
    fetched: tuple[torch.Tensor, torch.Tensor | None]  # the missed rows' weights [M, D] and state [M(, D)], on the device


@dataclass
class _WriteBack:
    """Rows copied out of their slots by a forward, on their way to the host table."""

    rows: torch.Tensor                     # int64 [E]
    weight: torch.Tensor                   # [E, D] (pinned on a GPU)
    state: torch.Tensor | None             # [E(, D)]
    done: Any = None                       # offloaded: an event after the copies


class CacheStore(EmbeddingStore):
    """A host table with a device cache of C slots; subclasses choose the policy.

    The host table is pinned on a GPU only with ``pin_host: true``; copies go
    through pinned staging. A step's host work is its plan (``plan_step``,
    made a step ahead by the step pipeline): the directory's decisions, the
    write-back of the previous step's victims into the host table, the gather
    of this step's misses from it and their copy to the device (on the copy
    stream). Its forward then copies the victims out of their slots (on a GPU
    without waiting for them: the next plan lands them), writes the fetched
    rows into their slots, and gathers the lookups. A miss is always gathered
    after every earlier write-back has landed, so no row is read stale.
    Phases: waiting for the plan is ``h2d``, the copy-out ``d2h``, the
    fill and the gather ``emb_fwd``, the update ``emb_update``.

    On an offloaded runtime (a GPU) the directory starts as the host's (its
    warm start) and then lives on the device (``cache_device.DeviceCache``):
    the host plans nothing and moves nothing; write-back and fetch are in
    ``emb_fwd``.
    """

    Options = CacheOptions
    policy_name = ""
    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        n, where = spec.num_rows, f"store {type(self).__name__}"
        self.capacity = self.options.capacity(n)
        policy, warm = self.make_policy(spec, where)
        self.directory = CacheDirectory(n, self.capacity, policy)
        self.rt = runtime(self.device)
        self._with_state = self.optimizer.adagrad
        extra = 2 if self.rt.offloaded else 0  # the device path's dump rows and slots (``cache_device``)
        weight = init_table(spec.table_sizes, spec.dim, spec.seed, extra_rows=extra)       # [N(+2), D]
        state = self.optimizer.init_state(n + extra, spec.dim)                              # [N(+2)(, D)]
        pin = self.options.pin_host
        weight, state = (self.rt.pin(weight), self.rt.pin(state)) if pin else (weight, state)
        self.host_w, self.host_s = weight[:n], state[:n]
        cache_w = torch.zeros(self.capacity + extra, spec.dim, device=self.device)         # [C(+2), D]
        cache_s = self.optimizer.init_state(self.capacity + extra, spec.dim, self.device)  # [C(+2)(, D)]
        self.cache_w, self.cache_s = cache_w[:self.capacity], cache_s[:self.capacity]
        self.row_bytes = row_bytes(spec.dim, self.optimizer.state_width(spec.dim))
        self._row_slot = torch.from_numpy(self.directory.row_slot)  # [N], shares the directory's memory
        self._slot_row = torch.from_numpy(self.directory.slot_row)  # [C]
        self._written: _WriteBack | None = None   # the last forward's victims, not in the host table yet
        self._copied_out = threading.Event()      # set once the last forward has copied its victims out
        self._copied_out.set()
        self._closed = False
        self._last: tuple[Lookup, torch.Tensor] | None = None
        self._pending = StepCounters()
        self.warm_rows = int(warm.size)
        if warm.size:
            slots = torch.from_numpy(self.directory.warm(warm)).to(self.device)
            w, s = self._gather_host(torch.from_numpy(warm))
            self._fill(slots, (ship(w, self.device), None if s is None else ship(s, self.device)))
        self.device_cache: DeviceCache | None = None
        self.directory_note = "host"
        if self.rt.offloaded:
            try:
                self.device_cache = DeviceCache(self.rt, self.directory, cache_w, cache_s, weight,
                                                state if self._with_state else None, self.optimizer)
                self.directory_note = "device"
            except Exception as e:  # noqa: BLE001 - the host table cannot be addressed by the device: host plans
                self.directory_note = f"host: {type(e).__name__}: {' '.join(str(e).split())[:200]}"

    def report(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "cache_ratio": self.capacity / self.spec.num_rows,
                "warm_rows": self.warm_rows, "directory": self.directory_note}

    def make_policy(self, spec: StoreSpec, where: str) -> tuple[Policy, np.ndarray]:
        """The eviction policy and the rows to preload."""
        return cache_policy(self.policy_name, spec.num_rows, self.capacity)

    # -- host side: the plan, a step ahead ---------------------------------------------------------------

    def _gather_host(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Host rows' weights [M, D] and state [M(, D)] (None for SGD)."""
        return self.host_w.index_select(0, rows), self.host_s.index_select(0, rows) if self._with_state else None

    def _land(self) -> None:
        """Write the last forward's victims into the host table (waiting for their copies on a GPU)."""
        wb, self._written = self._written, None
        if wb is None:
            return
        if wb.done is not None:
            self.rt.wait(wb.done, "cache write-back")
        self.host_w.index_copy_(0, wb.rows, wb.weight)
        if wb.state is not None:
            self.host_s.index_copy_(0, wb.rows, wb.state)

    def plan_step(self, ids: torch.Tensor, device_rows: torch.Tensor | None = None
                  ) -> _CachePlan | CachePlanOnDevice:
        """The directory's decisions for the batch, then its misses fetched: gathered on the host, copied over.

        The misses are gathered once the previous forward copied its victims
        out and they landed in the host table (a row evicted last step and
        missed now is read as trained). With the directory on the device:
        its plan there, from ``device_rows`` (else the batch's rows shipped).
        """
        if self.device_cache is not None:
            if device_rows is None:
                device_rows = device_rows_of(ids, self.column_offsets, self.spec.num_rows, self.device)
            return self.device_cache.plan(device_rows)
        lk = self.plan(ids)
        uniq, inverse, counts = lk.unique()  # [U], [L], [U]
        acc = self.directory.access(uniq.numpy(), counts.numpy())
        while not self._copied_out.wait(0.1):  # the previous forward has not run yet (planned ahead)
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} closed while a step was being planned")
        self._copied_out.clear()
        self._land()
        w, s = self._gather_host(torch.from_numpy(acc.miss_rows))
        uslots = torch.from_numpy(acc.slots)                                  # [U] slot of each unique row
        dev = self.device
        lk.groups().plan(dev)
        lk.positions_on(dev)
        return _CachePlan(lk, acc, ship(uslots.index_select(0, inverse), dev), ship(uslots, dev),
                          ship(torch.from_numpy(acc.miss_slots), dev), ship(torch.from_numpy(acc.victim_slots), dev),
                          (ship(w, dev), None if s is None else ship(s, dev)))

    # -- device side: the step --------------------------------------------------------------------------

    def _copy_out(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy victims' slots out toward the host (offloaded: into pinned memory, not waited for)."""
        w = self.cache_w.index_select(0, slots)
        s = self.cache_s.index_select(0, slots) if self._with_state else None
        done = None
        if self.rt.offloaded:
            rt = self.rt
            w = rt.copy_to_host(rt.empty_host(*w.shape), w)
            s = None if s is None else rt.copy_to_host(rt.empty_host(*s.shape), s)
            done = rt.recorded()
        self._written = _WriteBack(rows, w, s, done)

    def _fill(self, slots: torch.Tensor, fetched: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        """Write fetched rows (weights and state, on the device) into their slots."""
        self.cache_w.index_copy_(0, slots, fetched[0])
        if fetched[1] is not None:
            self.cache_s.index_copy_(0, slots, fetched[1])

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        p = self.planned(ids)
        timer.mark("h2d")
        if isinstance(p, CachePlanOnDevice):
            self._last = p
            out = self.device_cache.forward(p)  # [B, K, D]
            timer.mark("emb_fwd")
            return out
        acc = p.access
        if acc.victim_rows.size:
            self._copy_out(torch.from_numpy(acc.victim_rows), p.victim_slots)
        self._copied_out.set()
        timer.mark("d2h")
        if acc.miss_rows.size:
            self._fill(p.miss_slots, p.fetched)
        self._last = (p.lookup, p.uslots)
        self._pending = acc.counters(self.row_bytes)
        out = self.to_batch(self.cache_w.index_select(0, p.lookup_slots), p.lookup)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        if isinstance(self._last, CachePlanOnDevice):
            self.device_cache.update(self._last, grad)
            counts = self._last.access.counts(self._last.groups, self.spec.num_rows, self.capacity)
            self._counters = self._device_counts.add(counts, self._step_counters)
            self._last = None
            timer.mark("emb_update")
            return
        lk, uslots = self._last
        self.optimizer.step(self.cache_w, self.cache_s, uslots, lk.groups(), self.from_batch(grad, lk))
        self._counters = self._pending
        self._last = None
        timer.mark("emb_update")

    def _step_counters(self, *counts: int) -> StepCounters:
        """A step's counters from the device directory's counts; a batch it could not hold ends the run."""
        if counts[-1]:
            raise InfeasibleError(f"cache of {self.capacity} rows is too small: a batch had more distinct rows than "
                                  "that, all of which must be resident (found by the directory on the device)")
        return cache_step_counters(*counts[:-1], self.row_bytes)

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Resident rows from the cache, the others from the host; the cache is not changed."""
        if self.device_cache is not None:
            lk = self.plan(ids)
            return self.to_batch(self.device_cache.lookup(lk.rows, self.host_w), lk)
        self._land()
        lk = self.plan(ids)
        slots = self._row_slot.index_select(0, lk.rows)  # [L], -1: not resident
        resident = slots >= 0
        hot = resident.nonzero().squeeze(1)
        cold = (~resident).nonzero().squeeze(1)
        out = torch.empty(lk.size, self.dim, device=self.device)
        out.index_copy_(0, hot.to(self.device), self.cache_w.index_select(0, slots[hot].to(self.device)))
        out.index_copy_(0, cold.to(self.device), self.host_w.index_select(0, lk.rows[cold]).to(self.device))
        return self.to_batch(out, lk)

    def _resident(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached rows [U] and their weights [U, D] on the host."""
        if self.device_cache is not None:
            return self.device_cache.resident()
        self._land()
        used = self.directory.used
        return self._slot_row[:used], self.cache_w[:used].to("cpu")

    def export(self) -> torch.Tensor:
        rows, weights = self._resident()  # the last victims landed in the host table first
        out = self.host_w.clone()
        out.index_copy_(0, rows, weights)
        return out

    def final_rows(self) -> torch.Tensor:
        """``export``'s rows without a second table: the cached rows written into the host table."""
        rows, weights = self._resident()
        self.host_w.index_copy_(0, rows, weights)
        return self.host_w

    def close(self) -> None:
        self._closed = True
        if self.device_cache is not None:
            self.device_cache.close()


class LRUCacheStore(CacheStore):
    """Evicts the least recently used rows."""

    policy_name = "lru"


class LFUCacheStore(CacheStore):
    """Evicts the rows with the fewest lookups since they entered the cache (ColossalAI's LFU)."""

    policy_name = "lfu"


class FreqCacheStore(CacheStore):
    """ColossalAI's frequency-aware cache: dataset-ranked rows, warm start, static-rank or LFU eviction."""

    Options = FreqCacheOptions
    needs_frequencies = True

    def make_policy(self, spec: StoreSpec, where: str) -> tuple[Policy, np.ndarray]:
        freq = spec.frequencies
        require(freq is not None and freq.numel() == spec.num_rows, where,
                f"needs spec.frequencies, the access count of each of the {spec.num_rows} rows")
        name = "freqcache" if self.options.evict == "static" else "freqcache-lfu"
        return cache_policy(name, spec.num_rows, self.capacity, freq.numpy(), float(self.options.warmup_ratio))
