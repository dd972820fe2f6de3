"""The method registry: every method named once, with everything the rest of hotcold needs to know of it.

A method is a store class (one module per technique, ``hotcold.embedding``
and ``hotcold.distributed``), the typed options it takes (the store's
``Options``), whether it spans ranks, whether it is a peer (another
project's kernel, measured and never modelled) and its pricing function in
the cost model. The training loop, the workflow's run matrix, the analysis
and the CLI read method lists and options from here; nothing else lists
methods. ``docs/adding-a-method.md`` walks through adding one.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from hotcold.config import ConfigError
from hotcold.options.sharded import FlexShardOptions, ProactiveOptions, ShardedOptions
from hotcold.options.base import NoOptions, StoreOptions
from hotcold.options.stores import (CacheOptions, FAEOptions, FbgemmOptions, FreqCacheOptions,
                                             ScratchPipeOptions)

#: how a method's runs are held to the invariant: the ``device`` store's bits (the harness's own stores, whose sums
#: and updates add in one order on every device), or a lock-step check per step against the ``device`` store fed
#: the same inputs (a peer: another project's kernels round their own way; ``hotcold.runs.lockstep``)
CHECK_BITS = "bits"
CHECK_LOCKSTEP = "lockstep"

if TYPE_CHECKING:  # the stores need torch; the registry is read where none is (Snakemake, the analysis)
    from hotcold.costmodel.techniques import PriceFn
    from hotcold.embedding.base import EmbeddingStore, StoreSpec


def _load(path: str) -> Any:
    """``module:name`` imported and looked up."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Method:
    """One method: a name in configs, records and tables, and the store that runs it.

    The store class and the pricing function are named as ``module:name`` and imported when first asked for,
    so that reading the registry imports no torch (a test holds the names to the stores' own ``Options``
    and ``spans_ranks``)."""

    name: str
    store_path: str               # ``module:class`` of the store
    options: type[StoreOptions]   # its typed options (the store's ``Options``)
    summary: str                  # one line: what it is
    cost_path: str | None = None  # ``module:function``: its step in the cost model (``costmodel.techniques``)
    peer: bool = False            # another project's kernel through the same loop: measured, never modelled
    spans_ranks: bool = False     # the store runs over several processes (trained at every configured scale)
    #: ``module:function(options, where)``: checks of the options that need the technique's algorithms (a plan's
    #: own ``plan_options``), run after the options' own; the options themselves import no algorithm
    check_path: str | None = None

    @property
    def store(self) -> type[EmbeddingStore]:
        return _load(self.store_path)

    @property
    def cost(self) -> PriceFn | None:
        return _load(self.cost_path) if self.cost_path else None

    @property
    def check(self) -> str:
        """``CHECK_LOCKSTEP`` for a peer, else ``CHECK_BITS``."""
        return CHECK_LOCKSTEP if self.peer else CHECK_BITS

    def parse_options(self, data: StoreOptions | Mapping[str, Any] | None, where: str | None = None) -> StoreOptions:
        """This method's typed options from a config mapping, validated (``ConfigError`` naming the key)."""
        where = where or f"method {self.name}"
        options = self.options.parse(data, where)
        if self.check_path is not None and options is not data:
            _load(self.check_path)(options, where)
        return options

    def build(self, spec: StoreSpec) -> EmbeddingStore:
        return self.store(spec)


_E, _D, _T = "hotcold.embedding.", "hotcold.distributed.", "hotcold.costmodel.techniques:"
_PLAN = _D + "plans:check_store_plan"
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("device", _E + "device:DeviceStore", NoOptions,
           "every row in device memory: the upper bound and the exactness reference", _T + "price_device"),
    Method("hybrid", _E + "hybrid:HybridStore", NoOptions,
           "every row in host memory, lookups and updates on the CPU: the baseline", _T + "price_hybrid"),
    Method("fae", _E + "fae:FAEStore", FAEOptions, "FAE: hot rows on the device, hot and cold mini-batches",
           _T + "price_fae"),
    Method("lru", _E + "cache:LRUCacheStore", CacheOptions, "a software cache evicting the least recently used rows",
           _T + "price_cache"),
    Method("lfu", _E + "cache:LFUCacheStore", CacheOptions,
           "a software cache evicting the least frequently used rows", _T + "price_cache"),
    Method("freqcache", _E + "cache:FreqCacheStore", FreqCacheOptions,
           "ColossalAI's frequency-aware cache: ranked rows, warm start", _T + "price_cache"),
    Method("belady", _E + "belady:BeladyCacheStore", CacheOptions,
           "Belady's optimal cache (an oracle): the caches' hit-rate ceiling", _T + "price_cache"),
    Method("scratchpipe", _E + "scratchpipe:ScratchPipeStore", ScratchPipeOptions,
           "ScratchPipe: a scratchpad filled by looking ahead, always hit", _T + "price_scratchpipe"),
    Method("sharded", _D + "sharded:ShardedStore", ShardedOptions,
           "the hybrid-parallel exchange under a sharding plan", _T + "price_sharded", spans_ranks=True,
           check_path=_PLAN),
    Method("proactive", _D + "proactive:ProactiveStore", ProactiveOptions,
           "Proactive Embedding: next steps' rows looked up during communication", _T + "price_proactive",
           spans_ranks=True, check_path=_PLAN),
    Method("flexshard", _D + "sharded:FlexShardStore", FlexShardOptions,
           "FlexShard: per-row replicated, node-local and sharded tiers", _T + "price_sharded", spans_ranks=True),
    Method("fbgemm", _E + "fbgemm:FbgemmStore", FbgemmOptions, "FBGEMM's table-batched embedding, the kernel under "
           "TorchRec", peer=True),
)}


def get(name: str) -> Method:
    """The method ``name``; an unknown one fails naming the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None


def price(name: str) -> PriceFn:
    """The cost model's pricing of method ``name``; a peer or an unknown method has none."""
    method = METHODS.get(name)
    if method is None or method.cost is None:
        raise ConfigError(f"cost model: no model of method {name!r}")
    return method.cost


def names(*, spans_ranks: bool | None = None, peer: bool | None = None) -> list[str]:
    """Method names in registry order, optionally only those that do (not) span ranks or are (not) peers."""
    return [m.name for m in METHODS.values()
            if (spans_ranks is None or m.spans_ranks == spans_ranks) and (peer is None or m.peer == peer)]
