"""Embedding stores, one module per technique, selected by method name."""
from __future__ import annotations

from hotcold.config import ConfigError
from hotcold.embedding.base import EmbeddingStore, RowOptimizer, StoreSpec
from hotcold.embedding.cache import FreqCacheStore, LFUCacheStore, LRUCacheStore
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.fae import FAEStore
from hotcold.embedding.fbgemm import FbgemmStore, PeerUnavailableError
from hotcold.embedding.hybrid import HybridStore
from hotcold.embedding.scratchpipe import ScratchPipeStore

STORES: dict[str, type[EmbeddingStore]] = {
    "device": DeviceStore,
    "hybrid": HybridStore,
    "fae": FAEStore,
    "lru": LRUCacheStore,
    "lfu": LFUCacheStore,
    "freqcache": FreqCacheStore,
    "scratchpipe": ScratchPipeStore,
    "fbgemm": FbgemmStore,  # a peer: FBGEMM's TBE, with the optional extra `peers`
}

#: peer methods: other projects' kernels run through the same loop (optional extras), measured, never modelled
PEER_METHODS: tuple[str, ...] = ("fbgemm",)

#: stores that span ranks live in ``hotcold.distributed`` (a layer above this one), imported when asked for
SCALE_OUT: dict[str, str] = {
    "sharded": "hotcold.distributed.sharded:ShardedStore",
    "proactive": "hotcold.distributed.proactive:ProactiveStore",
    "flexshard": "hotcold.distributed.sharded:FlexShardStore",
}


def store_class(method: str) -> type[EmbeddingStore]:
    """The store class of ``method``; an unknown method fails naming the known ones."""
    if method in SCALE_OUT:
        import importlib

        module, name = SCALE_OUT[method].split(":")
        return getattr(importlib.import_module(module), name)
    try:
        return STORES[method]
    except KeyError:
        raise ConfigError(f"unknown method {method!r}; known: {sorted([*STORES, *SCALE_OUT])}") from None


def build_store(method: str, spec: StoreSpec) -> EmbeddingStore:
    return store_class(method)(spec)


__all__ = ["EmbeddingStore", "PEER_METHODS", "PeerUnavailableError", "RowOptimizer", "StoreSpec", "STORES", "SCALE_OUT",
           "build_store", "store_class"]
