"""``belady``: Belady's optimal cache, trained: the hit-rate ceiling of the software caches at a size.

A software cache of C slots (``cache.CacheStore``: host table, device
slots, fetch and write-back) whose victims are the resident rows that the
training data uses again farthest in the future (never again first; ties by
row id). Among caches that must admit every row they miss (as ``lru``,
``lfu`` and ``freqcache`` do), no other policy hits more lookups of the
same batches (Belady 1966, MIN). It needs the whole batch order ahead, so
it is an oracle, not a technique: a reference for how far the caches' hit
rates and traffic are from the best any eviction order could do. The trace
simulator's ``belady`` policy is the same directory, so its counters equal
this store's.
"""
from __future__ import annotations

import numpy as np

from hotcold.config import require
from hotcold.embedding.base import StoreSpec
from hotcold.embedding.cache import CacheStore
from hotcold.policies.batches import Trace
from hotcold.policies.directory import Policy, cache_policy


class BeladyCacheStore(CacheStore):
    """A cache that evicts the row needed again farthest ahead; its options are ``lru``'s."""

    policy_name = "belady"
    needs_batches = True

    def make_policy(self, spec: StoreSpec, where: str) -> tuple[Policy, np.ndarray]:
        require(spec.batches is not None, where, "needs the training batches ahead (spec.batches)")
        trace = Trace.from_batches((self.plan(ids).rows.numpy() for ids in spec.batches()), spec.num_rows)
        return cache_policy("belady", spec.num_rows, self.capacity, next_use=trace.next_use())
