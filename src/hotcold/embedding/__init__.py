"""Embedding stores, one module per technique, selected by method name."""
from __future__ import annotations

from hotcold.config import ConfigError
from hotcold.embedding.base import EmbeddingStore, RowOptimizer, StoreSpec
from hotcold.embedding.cache import FreqCacheStore, LFUCacheStore, LRUCacheStore
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.fae import FAEStore
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
}


def store_class(method: str) -> type[EmbeddingStore]:
    """The store class of ``method``; an unknown method fails naming the known ones."""
    try:
        return STORES[method]
    except KeyError:
        raise ConfigError(f"unknown method {method!r}; known: {sorted(STORES)}") from None


def build_store(method: str, spec: StoreSpec) -> EmbeddingStore:
    return store_class(method)(spec)


__all__ = ["EmbeddingStore", "RowOptimizer", "StoreSpec", "STORES", "build_store", "store_class"]
