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

from dataclasses import dataclass
from typing import Any, Mapping

from hotcold.config import ConfigError
from hotcold.costmodel.techniques import (PriceFn, price_cache, price_device, price_fae, price_hybrid,
                                          price_proactive, price_scratchpipe, price_sharded)
from hotcold.distributed.proactive import ProactiveStore
from hotcold.distributed.sharded import FlexShardStore, ShardedStore
from hotcold.embedding.base import EmbeddingStore, StoreSpec
from hotcold.embedding.belady import BeladyCacheStore
from hotcold.embedding.cache import FreqCacheStore, LFUCacheStore, LRUCacheStore
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.fae import FAEStore
from hotcold.embedding.fbgemm import FbgemmStore
from hotcold.embedding.hybrid import HybridStore
from hotcold.embedding.options import StoreOptions
from hotcold.embedding.scratchpipe import ScratchPipeStore


@dataclass(frozen=True)
class Method:
    """One method: a name in configs, records and tables, and the store that runs it."""

    name: str
    store: type[EmbeddingStore]
    summary: str                  # one line: what it is
    cost: PriceFn | None = None   # its step in the cost model (``hotcold.costmodel.techniques``)
    peer: bool = False            # another project's kernel through the same loop: measured, never modelled

    @property
    def options(self) -> type[StoreOptions]:
        """The typed options class (the store's ``Options``)."""
        return self.store.Options

    @property
    def spans_ranks(self) -> bool:
        """Whether the store runs over several processes (trained at every configured scale)."""
        return self.store.spans_ranks

    def parse_options(self, data: StoreOptions | Mapping[str, Any] | None, where: str | None = None) -> StoreOptions:
        """This method's typed options from a config mapping, validated (``ConfigError`` naming the key)."""
        return self.options.parse(data, where or f"method {self.name}")

    def build(self, spec: StoreSpec) -> EmbeddingStore:
        return self.store(spec)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("device", DeviceStore, "every row in device memory: the upper bound and the exactness reference",
           price_device),
    Method("hybrid", HybridStore, "every row in host memory, lookups and updates on the CPU: the baseline",
           price_hybrid),
    Method("fae", FAEStore, "FAE: hot rows on the device, hot and cold mini-batches", price_fae),
    Method("lru", LRUCacheStore, "a software cache evicting the least recently used rows", price_cache),
    Method("lfu", LFUCacheStore, "a software cache evicting the least frequently used rows", price_cache),
    Method("freqcache", FreqCacheStore, "ColossalAI's frequency-aware cache: ranked rows, warm start", price_cache),
    Method("belady", BeladyCacheStore, "Belady's optimal cache (an oracle): the caches' hit-rate ceiling", price_cache),
    Method("scratchpipe", ScratchPipeStore, "ScratchPipe: a scratchpad filled by looking ahead, always hit",
           price_scratchpipe),
    Method("sharded", ShardedStore, "the hybrid-parallel exchange under a sharding plan", price_sharded),
    Method("proactive", ProactiveStore, "Proactive Embedding: next steps' rows looked up during communication",
           price_proactive),
    Method("flexshard", FlexShardStore, "FlexShard: per-row replicated, node-local and sharded tiers", price_sharded),
    Method("fbgemm", FbgemmStore, "FBGEMM's table-batched embedding, the kernel under TorchRec", peer=True),
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
