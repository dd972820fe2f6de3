"""The typed options of the one-process stores that take any: the caches, FAE, ScratchPipe and the FBGEMM peer.

They live apart from the stores (which need torch) so that the method
registry, the workflow and the analysis read and check a method's options
without importing a store. Each is a ``StoreOptions`` (``options``): parsed
once from a config's mapping, a bad key named in one line.
"""
from __future__ import annotations

from dataclasses import dataclass

from hotcold.config import is_int, is_real, require
from hotcold.counters import row_bytes
from hotcold.options.base import (DEFAULT_BUDGET_RATIO, DEFAULT_SAMPLE_FRACTION, EPOCH, StoreOptions, budget_rows,
                                  check_budget, check_choice, check_run_length)

DEFAULT_CACHE_RATIO = 0.015
CACHES = ("lru", "lfu")  # FBGEMM's managed caches


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
    documented in ``hotcold.policies.directory``.
    """

    warmup_ratio: float = 0.7   # ColossalAI warms 70%
    evict: str = "static"       # static: worst dataset rank first; lfu: ColossalAI's LFU

    def validate(self, where: str) -> None:
        super().validate(where)
        w = self.warmup_ratio
        require(is_real(w) and 0 <= w <= 1, where, f"warmup_ratio must be in [0, 1], got {w!r}")
        check_choice(where, "evict", self.evict, ("static", "lfu"))


@dataclass(frozen=True)
class FAEOptions(StoreOptions):
    """FAE's profile sample, device budget (bytes or a share of the rows) and hot/cold run length.

    Budget. As FAE's profiler counts it: ``budget_bytes`` of device memory holds
    ``budget_bytes // (4 * D)`` rows of float32 weights. Row-wise Adagrad's
    state (one float a row) lives beside the hot rows and is not charged to the
    budget; it is moved with them and counted in the sync bytes.
    ``budget_ratio`` is the same knob as a share of all rows, which is how it
    scales with the dataset: FAE's 128, 256 and 512 MiB on full Criteo Kaggle
    (33.76M rows, D=16, 64 B a row, 2061 MiB of weights) are ratios 0.062, 0.124
    and 0.248. The default is 0.124 (FAE's middle budget). The hot set fills the
    budget: the rows with the highest sampled counts, ties by row index.

    ``run_length`` (default ``"epoch"``: an epoch's cold batches, then its hot
    ones, as the authors' loop) sets how often the hot set is copied across.
    """

    sample_fraction: float = DEFAULT_SAMPLE_FRACTION  # share of the training inputs profiled
    budget_bytes: int | None = None    # device bytes of hot weights: budget_bytes // (4 D) rows
    budget_ratio: float | None = None  # or a share of all rows (default DEFAULT_BUDGET_RATIO)
    run_length: int | str = EPOCH      # batches of one kind in a row, or "epoch"

    def validate(self, where: str) -> None:
        f = self.sample_fraction
        require(is_real(f) and 0 < f <= 1, where, f"sample_fraction must be in (0, 1], got {f!r}")
        check_budget(where, "budget_bytes", self.budget_bytes, "budget_ratio", self.budget_ratio, allow_zero=True)
        check_run_length(self.run_length)

    def hot_rows(self, num_rows: int, dim: int) -> int:
        """Rows the device budget holds: ``budget_bytes // (4 D)`` or ``floor(ratio * N)``, at most N."""
        return budget_rows(self.budget_bytes, self.budget_ratio, num_rows, default_ratio=DEFAULT_BUDGET_RATIO,
                           unit_bytes=row_bytes(dim, 0), allow_zero=True)

    def device_share(self) -> float | None:
        return self.budget_ratio


@dataclass(frozen=True)
class ScratchPipeOptions(StoreOptions):
    """ScratchPipe's look-ahead window and scratchpad size (default: the window's largest working set)."""

    window: int = 2                        # batches the scratchpad is filled ahead
    scratchpad_rows: int | None = None     # scratchpad size in rows
    scratchpad_ratio: float | None = None  # or as a share of all rows

    def validate(self, where: str) -> None:
        require(is_int(self.window) and self.window >= 0, where,
                f"window must be a non-negative integer, got {self.window!r}")
        check_budget(where, "scratchpad_rows", self.scratchpad_rows, "scratchpad_ratio", self.scratchpad_ratio)

    def capacity(self, num_rows: int, minimum: int | None) -> int:
        """Scratchpad slots: the given size, else ``minimum`` (the whole table when it is unknown), at most N."""
        rows = budget_rows(self.scratchpad_rows, self.scratchpad_ratio, num_rows)
        if rows is not None:
            return rows
        return minimum if minimum else num_rows

    def device_share(self) -> float | None:
        return self.scratchpad_ratio


@dataclass(frozen=True)
class FbgemmOptions(StoreOptions):
    """FBGEMM's placement: ``cache`` none (host or device), or its managed cache (lru, lfu) of a size."""

    cache: str = "none"
    cache_ratio: float | None = None   # with a cache: share of all rows (default DEFAULT_CACHE_RATIO)
    cache_rows: int | None = None      # or rows

    def validate(self, where: str) -> None:
        check_choice(where, "cache", self.cache, ("none", *CACHES))
        require(self.cache != "none" or (self.cache_ratio is None and self.cache_rows is None), where,
                "cache_ratio and cache_rows need cache: lru or lfu")
        check_budget(where, "cache_rows", self.cache_rows, "cache_ratio", self.cache_ratio)

    def cache_share(self, num_rows: int) -> float | None:
        """The managed cache's share of all rows; None without a cache."""
        if self.cache == "none":
            return None
        return budget_rows(self.cache_rows, self.cache_ratio, num_rows, default_ratio=DEFAULT_CACHE_RATIO) / num_rows

    def device_share(self) -> float | None:
        return self.cache_ratio

    def infeasible_on(self, device: str) -> str | None:
        return managed_cache_infeasible(device) if self.cache != "none" else None


def managed_cache_infeasible(device: str) -> str | None:
    """FBGEMM's managed cache lives in UVM: only on a GPU."""
    if device == "cuda":
        return None
    return f"FBGEMM's managed cache (MANAGED_CACHING, UVM) needs a GPU; this run is on {device}"
