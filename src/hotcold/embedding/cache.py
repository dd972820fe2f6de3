"""Software embedding caches: ``lru``, ``lfu`` and ``freqcache``.

Every row and its optimizer state live in host memory; the device holds a
cache of C slots (weights [C, D], state [C]). Before each forward the host
plans the batch with ``hotcold.trace.policies.CacheDirectory`` (the trace
simulator's own directory, so its counts are the stores'): hits stay,
victims outside the batch are written back (weights and state), misses are
fetched. Lookups and the sparse update then run on the cached slots. Budget
and options: ``CacheOptions``, ``FreqCacheOptions`` and docs/methods.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotcold.config import is_real, require
from hotcold.counters import StepCounters, row_bytes
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.options import StoreOptions, budget_rows, check_budget, check_choice
from hotcold.embedding.rows import Lookup, init_table, ship
from hotcold.trace.policies import CacheDirectory, Policy, cache_policy

DEFAULT_CACHE_RATIO = 0.015


@dataclass(frozen=True)
class CacheOptions(StoreOptions):
    """``lru`` and ``lfu``: the cache's size, and whether to pin the host table.

    Budget: ``cache_ratio`` (share of all rows, default 0.015, ColossalAI's 1.5%
    headline setting) or ``cache_rows``; C = ``max(1, floor(ratio * N))``, at
    most N. A batch with more unique rows than C fails with the capacity it
    needs.
    """

    cache_ratio: float | None = None   # share of all rows (default DEFAULT_CACHE_RATIO)
    cache_rows: int | None = None      # or a number of rows
    #: pin the whole host table (GPU runs). Copies already go through pinned staging
    #: buffers; pinning tens of GB of host table (Terabyte at paper scale) is an experiment.
    pin_host: bool = False

    def validate(self, where: str) -> None:
        check_budget(where, "cache_rows", self.cache_rows, "cache_ratio", self.cache_ratio)
        require(isinstance(self.pin_host, bool), where, f"pin_host must be true or false, got {self.pin_host!r}")

    def capacity(self, num_rows: int) -> int:
        """Cache slots: ``max(1, floor(ratio * N))`` or ``cache_rows``, at most N."""
        return budget_rows(self.cache_rows, self.cache_ratio, num_rows, default_ratio=DEFAULT_CACHE_RATIO)

    def device_share(self) -> float | None:
        return self.cache_ratio


@dataclass(frozen=True)
class FreqCacheOptions(CacheOptions):
    """``freqcache``: a cache's options, the share preloaded with the most frequent rows, and the eviction.

    ``warmup_ratio`` (default 0.7) and ``evict`` (``"static"``: worst dataset
    rank first; ``"lfu"``: ColossalAI's LFU). Its warm fill happens at
    construction, is no training step and is reported as the ``warm_rows``
    attribute, not in step counters. Policies and their tie rules are
    documented in ``hotcold.trace.policies``.
    """

    warmup_ratio: float = 0.7   # ColossalAI warms 70%
    evict: str = "static"       # static: worst dataset rank first; lfu: ColossalAI's LFU

    def validate(self, where: str) -> None:
        super().validate(where)
        w = self.warmup_ratio
        require(is_real(w) and 0 <= w <= 1, where, f"warmup_ratio must be in [0, 1], got {w!r}")
        check_choice(where, "evict", self.evict, ("static", "lfu"))


class CacheStore(EmbeddingStore):
    """A host table with a device cache of C slots; subclasses choose the policy.

    The host table is pinned on a GPU only with ``pin_host: true``; copies go
    through pinned staging buffers. Phases: planning and fetch are ``h2d``,
    write-back is ``d2h``, the gather is ``emb_fwd``, the update ``emb_update``.
    """

    Options = CacheOptions
    policy_name = ""

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        n, where = spec.num_rows, f"store {type(self).__name__}"
        self.capacity = self.options.capacity(n)
        policy, warm = self.make_policy(spec, where)
        self.directory = CacheDirectory(n, self.capacity, policy)
        self._cuda = self.device.type == "cuda"
        weight = init_table(spec.table_sizes, spec.dim, spec.seed)  # [N, D]
        state = self.optimizer.init_state(n)                          # [N]
        pin = self.options.pin_host and self._cuda
        self.host_w = weight.pin_memory() if pin else weight
        self.host_s = state.pin_memory() if pin else state
        self.cache_w = torch.zeros(self.capacity, spec.dim, device=self.device)  # [C, D]
        self.cache_s = self.optimizer.init_state(self.capacity, self.device)     # [C]
        self._with_state = self.optimizer.state_width > 0
        self.row_bytes = row_bytes(spec.dim, self.optimizer.state_width)
        self._row_slot = torch.from_numpy(self.directory.row_slot)  # [N], shares the directory's memory
        self._slot_row = torch.from_numpy(self.directory.slot_row)  # [C]
        self._staging: dict[str, torch.Tensor] = {}                 # pinned buffers (GPU only)
        self._fetched: torch.cuda.Event | None = None               # last copy out of the fetch buffers
        self._last: tuple[Lookup, torch.Tensor, torch.Tensor] | None = None
        self._pending = StepCounters()
        self.warm_rows = int(warm.size)
        if warm.size:
            self._fetch(torch.from_numpy(warm), torch.from_numpy(self.directory.warm(warm)))

    def report(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "cache_ratio": self.capacity / self.spec.num_rows,
                "warm_rows": self.warm_rows}

    def make_policy(self, spec: StoreSpec, where: str) -> tuple[Policy, np.ndarray]:
        """The eviction policy and the rows to preload."""
        return cache_policy(self.policy_name, spec.num_rows, self.capacity)

    def _stage(self, name: str, n: int, width: int) -> torch.Tensor:
        """Pinned buffer ``name`` of at least n rows: [n, width] (width 0: [n])."""
        buf = self._staging.get(name)
        if buf is None or buf.shape[0] < n:
            shape = (max(n, 1), width) if width else (max(n, 1),)
            buf = self._staging[name] = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        return buf[:n]

    def _copy_rows(self, dst: tuple[torch.Tensor, torch.Tensor], dst_index: torch.Tensor,
                   src: tuple[torch.Tensor, torch.Tensor], src_index: torch.Tensor) -> None:
        """``dst[dst_index] = src[src_index]`` for the (weights, state) pairs, in one memory (CPU)."""
        dst[0].index_copy_(0, dst_index, src[0].index_select(0, src_index))
        if self._with_state:
            dst[1].index_copy_(0, dst_index, src[1].index_select(0, src_index))

    def _fetch(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy host rows (weights and state) into cache slots; rows, slots: int64 [M] on the CPU."""
        if not self._cuda:
            self._copy_rows((self.cache_w, self.cache_s), slots, (self.host_w, self.host_s), rows)
            return
        if self._fetched is not None:
            self._fetched.synchronize()  # the previous copy out of the staging buffers is done
        dev_slots = slots.to(self.device, non_blocking=True)
        w = torch.index_select(self.host_w, 0, rows, out=self._stage("fetch_w", rows.numel(), self.dim))
        self.cache_w.index_copy_(0, dev_slots, w.to(self.device, non_blocking=True))
        if self._with_state:
            s = torch.index_select(self.host_s, 0, rows, out=self._stage("fetch_s", rows.numel(), 0))
            self.cache_s.index_copy_(0, dev_slots, s.to(self.device, non_blocking=True))
        self._fetched = torch.cuda.Event()
        self._fetched.record(torch.cuda.current_stream(self.device))

    def _write_back(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy cache slots (weights and state) back to their host rows; int64 [E] on the CPU."""
        if not self._cuda:
            self._copy_rows((self.host_w, self.host_s), rows, (self.cache_w, self.cache_s), slots)
            return
        dev_slots = slots.to(self.device, non_blocking=True)
        w = self._stage("back_w", rows.numel(), self.dim)
        w.copy_(self.cache_w.index_select(0, dev_slots), non_blocking=True)
        if self._with_state:
            s = self._stage("back_s", rows.numel(), 0)
            s.copy_(self.cache_s.index_select(0, dev_slots), non_blocking=True)
        # Enqueued before this step's fetch overwrites the slots; the host needs the rows now.
        torch.cuda.current_stream(self.device).synchronize()
        self.host_w.index_copy_(0, rows, w)
        if self._with_state:
            self.host_s.index_copy_(0, rows, s)

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        lk = self.plan(ids)
        uniq, inverse, counts = lk.unique()  # [U], [L], [U]
        acc = self.directory.access(uniq.numpy(), counts.numpy())
        timer.mark("h2d")
        if acc.victim_rows.size:
            self._write_back(torch.from_numpy(acc.victim_rows), torch.from_numpy(acc.victim_slots))
        timer.mark("d2h")
        if acc.miss_rows.size:
            self._fetch(torch.from_numpy(acc.miss_rows), torch.from_numpy(acc.miss_slots))
        uslots = torch.from_numpy(acc.slots)                                  # [U] slot of each unique row
        lookup_slots = ship(uslots.index_select(0, inverse), self.device)     # [L]
        self._last = (lk, ship(uslots, self.device), lk.groups().plan(self.device))
        self._pending = acc.counters(self.row_bytes)
        timer.mark("h2d")
        out = self.to_batch(self.cache_w.index_select(0, lookup_slots), lk)  # [B, K, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        lk, uslots, inverse = self._last
        self.optimizer.step(self.cache_w, self.cache_s, uslots, lk.groups(), self.from_batch(grad, lk))
        self._counters = self._pending
        self._last = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Resident rows from the cache, the others from the host; the cache is not changed."""
        lk = self.plan(ids)
        slots = self._row_slot.index_select(0, lk.rows)  # [L], -1: not resident
        resident = slots >= 0
        hot = resident.nonzero().squeeze(1)
        cold = (~resident).nonzero().squeeze(1)
        out = torch.empty(lk.size, self.dim, device=self.device)
        out.index_copy_(0, hot.to(self.device), self.cache_w.index_select(0, slots[hot].to(self.device)))
        out.index_copy_(0, cold.to(self.device), self.host_w.index_select(0, lk.rows[cold]).to(self.device))
        return self.to_batch(out, lk)

    def export(self) -> torch.Tensor:
        out = self.host_w.clone()
        used = self.directory.used
        out.index_copy_(0, self._slot_row[:used], self.cache_w[:used].to("cpu"))
        return out

    def final_rows(self) -> torch.Tensor:
        """``export``'s rows without a second table: the cached rows written into the host table."""
        used = self.directory.used
        self.host_w.index_copy_(0, self._slot_row[:used], self.cache_w[:used].to("cpu"))
        return self.host_w


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
