"""Micro-benchmarks of the embedding lookup+pool and the sparse update (``make bench``).

Not part of the default test run. Sizes follow a capped Criteo-Kaggle batch:
26 tables, batch 2048, dimension 16.
"""
from __future__ import annotations

import pytest
import torch

from hotcold import methods
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.fbgemm import available as fbgemm_available

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIZES = [100_000] * 8 + [10_000] * 18
BATCH = 2048


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _zipf_ids(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    cols = []
    for n in SIZES:
        p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** 1.2
        cols.append(torch.multinomial(p, BATCH, replacement=True, generator=gen))
    return torch.stack(cols, 1)  # [B, T]


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return _zipf_ids(0)


def _store(method: str, optimizer: str):
    if method == "fbgemm" and fbgemm_available():
        pytest.skip(f"fbgemm: {fbgemm_available()}")
    # Row frequencies for the frequency-aware cache: lower ids are the popular ones, as in _zipf_ids.
    freq = torch.cat([torch.arange(n, 0, -1) for n in SIZES])
    return methods.get(method).build(StoreSpec(SIZES, 16, RowOptimizer(optimizer, 0.01), DEVICE, seed=0, frequencies=freq))


@pytest.mark.parametrize("method", methods.names(spans_ranks=False))
def test_lookup_pool(benchmark, ids, method):
    store = _store(method, "sgd")

    def run():
        store.forward(ids, NullMarker())
        _sync()

    benchmark(run)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("method", methods.names(spans_ranks=False))
def test_sparse_update(benchmark, ids, method, optimizer):
    store = _store(method, optimizer)
    grad = torch.randn(BATCH, len(SIZES), 16, device=DEVICE)

    def run():
        store.forward(ids, NullMarker())
        store.backward(grad, NullMarker())
        _sync()

    benchmark(run)
