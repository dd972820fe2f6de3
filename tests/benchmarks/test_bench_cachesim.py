"""Throughput of the cache simulator on a 1M-lookup trace (``make bench``; not in the default run).

The trace imitates a capped Criteo-Kaggle batch stream: 40 batches of
2048 x 13 power-law lookups over 1M rows (~1.06M lookups). Lookups per
second = ``extra_info["lookups"]`` / the benchmark's mean time.
"""
from __future__ import annotations

import numpy as np
import pytest

from hotcold.trace.cachesim import POLICIES, Trace, simulate
from hotcold.trace.policies import capacity_from_ratio

NUM_ROWS = 1_000_000
BATCHES, LOOKUPS_PER_BATCH = 40, 2048 * 13


@pytest.fixture(scope="module")
def batches() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    perm = rng.permutation(NUM_ROWS)
    return [perm[np.minimum(rng.zipf(1.2, LOOKUPS_PER_BATCH) - 1, NUM_ROWS - 1)] for _ in range(BATCHES)]


@pytest.fixture(scope="module")
def trace(batches) -> Trace:
    return Trace.from_batches(batches, NUM_ROWS)


def test_prepare_trace(benchmark, batches):
    benchmark.extra_info["lookups"] = BATCHES * LOOKUPS_PER_BATCH
    benchmark(Trace.from_batches, batches, NUM_ROWS)


@pytest.mark.parametrize("policy", POLICIES + ("lookahead-1",))
def test_simulate(benchmark, trace, policy):
    capacity = max(capacity_from_ratio(0.015, NUM_ROWS), trace.max_unique)
    trace.next_use()  # Belady's look-ahead is part of preparing the trace
    benchmark.extra_info["lookups"] = trace.lookups
    res = benchmark(simulate, trace, policy, capacity)
    benchmark.extra_info["hit_rate"] = res.summary(NUM_ROWS)["hit_rate"]
