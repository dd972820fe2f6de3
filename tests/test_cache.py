"""Software caches (``lru``, ``lfu``, ``freqcache``, ``belady``): same model as ``device``, counters, failures."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotcold.counters import FIELDS

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.rows import init_table
from hotcold.embedding.cache import CacheStore, FreqCacheStore, LFUCacheStore, LRUCacheStore
from hotcold.embedding.device import DeviceStore
from hotcold.trace.cachesim import dataset_trace
from hotcold.train import train

CPU = torch.device("cpu")
CACHES = {"lru": LRUCacheStore, "lfu": LFUCacheStore, "freqcache": FreqCacheStore}
VARIANTS = [("lru", {}), ("lfu", {}), ("freqcache", {}), ("freqcache", {"evict": "lfu"})]
STEPS = 30
COUNTER_KEYS = set(FIELDS)



def run_cfg(method: str, row_optimizer: str, store: dict | None = None, steps: int = STEPS) -> RunConfig:
    return RunConfig.from_dict({
        "dataset": "small", "method": method, "seed": 0, "store": store or {},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"steps": steps, "warmup_steps": 2, "batch_size": 128, "eval_batch_size": 512,
                  "row_optimizer": row_optimizer, "dense_optimizer": row_optimizer},
    })


def rel_diff(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> float:
    assert [n for n, _ in a] == [n for n, _ in b]
    num = sum(float((x - y).double().pow(2).sum()) for (_, x), (_, y) in zip(a, b))
    den = sum(float(y.double().pow(2).sum()) for _, y in b)
    return (num / den) ** 0.5


_DEVICE_RUNS: dict = {}


def _device_run(ds, row_optimizer: str):
    """The reference run, trained once per dataset and optimizer."""
    key = (str(ds.path), row_optimizer)
    if key not in _DEVICE_RUNS:
        _DEVICE_RUNS[key] = train(run_cfg("device", row_optimizer), ds, CPU, progress=False)
    return _DEVICE_RUNS[key]


#: the default tier: each cache once, each dataset with each optimizer once; the slow tier: every combination
CACHE_DEFAULT = {("small_dataset", "lru", "adagrad"), ("sequence_dataset", "lfu", "sgd"),
                 ("small_dataset", "freqcache", "sgd"), ("sequence_dataset", "freqcache-lfu", "adagrad")}


@pytest.mark.parametrize("data,method,options,row_optimizer", [
    pytest.param(data, method, options, opt, id=f"{data}-{name}-{opt}",
                 marks=() if (data, name, opt) in CACHE_DEFAULT else pytest.mark.slow)
    for data in ("small_dataset", "sequence_dataset")
    for (method, options), name in zip(VARIANTS, ["lru", "lfu", "freqcache", "freqcache-lfu"])
    for opt in ("sgd", "adagrad")])
def test_cache_trains_same_model_as_device(request, data, method, options, row_optimizer):
    ds = request.getfixturevalue(data)
    smallest = dataset_trace(ds, 128, STEPS).max_unique
    ref = _device_run(ds, row_optimizer)
    got = train(run_cfg(method, row_optimizer, {"cache_rows": smallest + 4, **options}), ds, CPU, progress=False)
    evictions = sum(c["evictions"] for _, c in got.counters)
    assert evictions > sum(ds.cardinalities) // 2, "the cache must evict a lot"
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6
    assert got.metrics["auc"] == pytest.approx(ref.metrics["auc"], abs=1e-6)


def _spec(optimizer: str = "sgd", sizes=(10,), dim: int = 2, **options) -> StoreSpec:
    return StoreSpec(table_sizes=list(sizes), dim=dim, optimizer=RowOptimizer(optimizer, lr=0.1),
                     device=CPU, seed=1, options=options)


def _step(store: CacheStore, rows: list[int]) -> dict[str, int]:
    ids = torch.tensor(rows).unsqueeze(1)  # [B, 1]: one table, so ids are rows
    store.forward(ids, NullMarker())
    store.backward(torch.ones(len(rows), 1, store.dim), NullMarker())
    return store.step_counters()


# Capacity 3, worked out by hand. LRU at step 3 evicts 2 (last used 1) then 0 (last used 2, tie
# with 3 broken by row id); LFU evicts 2 and 3 (one lookup since insertion) and keeps 0 (two).
HAND_TRACE = [[0, 1], [2], [0, 3], [4, 1], [1, 1, 3, 5]]
#        lookups unique hits misses u_hits u_misses h2d d2h evictions
HAND_LRU = [(2, 2, 0, 2, 0, 2, 2, 0, 0), (1, 1, 0, 1, 0, 1, 1, 0, 0), (2, 2, 1, 1, 1, 1, 1, 1, 1),
            (2, 2, 0, 2, 0, 2, 2, 2, 2), (4, 3, 3, 1, 2, 1, 1, 1, 1)]
HAND_LFU = HAND_LRU[:4] + [(4, 3, 2, 2, 1, 2, 2, 2, 2)]
KEYS = ("lookups", "unique_rows", "hits", "misses", "unique_hits", "unique_misses", "param_rows_h2d",
        "param_rows_d2h", "evictions")


@pytest.mark.parametrize("cls,expected", [(LRUCacheStore, HAND_LRU), (LFUCacheStore, HAND_LFU)])
@pytest.mark.parametrize("optimizer,state_floats", [("sgd", 0), ("adagrad", 1), ("elementwise-adagrad", 2)])
def test_counters_on_hand_worked_trace(cls, expected, optimizer, state_floats):
    store = cls(_spec(optimizer, cache_rows=3))
    row_bytes = (2 + state_floats) * 4  # dim 2: the weights and their state (per element: one float each)
    for rows, want in zip(HAND_TRACE, expected):
        c = _step(store, rows)
        assert set(c) == COUNTER_KEYS
        assert tuple(c[k] for k in KEYS) == want
        assert (c["param_bytes_h2d"], c["param_bytes_d2h"]) == \
            (c["param_rows_h2d"] * row_bytes, c["param_rows_d2h"] * row_bytes)
    resident = sorted(store.directory.slot_row[: store.directory.used].tolist())
    assert resident == [1, 3, 5]


def test_freqcache_warm_start_and_static_eviction():
    spec = _spec(cache_rows=4, warmup_ratio=0.5)
    spec.frequencies = torch.tensor([5, 0, 9, 1, 0, 0, 7, 0, 0, 2])  # rank: 2, 6, 0, 9, 3, then by id
    store = FreqCacheStore(spec)
    assert store.warm_rows == 2  # ceil(4 * 0.5)
    assert sorted(store.directory.slot_row[:2].tolist()) == [2, 6]
    c = _step(store, [2, 1, 4])   # 2 warm hit; 1 and 4 fill the free slots
    assert (c["hits"], c["param_rows_h2d"], c["evictions"]) == (1, 2, 0)
    c = _step(store, [0, 6])      # 0 misses; the worst-ranked resident outside the batch is 4
    assert (c["hits"], c["param_rows_h2d"], c["evictions"]) == (1, 1, 1)
    assert store.directory.row_slot[4] == -1 and store.directory.row_slot[1] >= 0


def test_current_batch_rows_are_never_evicted_and_values_stay_right():
    gen = np.random.default_rng(0)
    spec = _spec("adagrad", sizes=(60,), dim=3, cache_rows=12)
    store, ref = LRUCacheStore(spec), DeviceStore(_spec("adagrad", sizes=(60,), dim=3))
    for _ in range(40):
        rows = np.minimum(gen.zipf(1.3, 12) - 1, 59)
        rows = rows[np.unique(rows, return_index=True)[1][:12]]
        ids = torch.from_numpy(rows).unsqueeze(1)
        out = store.forward(ids, NullMarker())
        assert (store.directory.row_slot[rows] >= 0).all()
        torch.testing.assert_close(out, ref.forward(ids, NullMarker()), rtol=0, atol=0)
        grad = torch.randn(len(rows), 1, 3)
        store.backward(grad, NullMarker())
        ref.backward(grad, NullMarker())
    torch.testing.assert_close(store.export(), ref.export(), rtol=0, atol=0)


def test_lookup_reads_cache_and_host_without_changing_them():
    store = LFUCacheStore(_spec("adagrad", cache_rows=3))
    for rows in HAND_TRACE:
        _step(store, rows)
    d = store.directory

    def arrays() -> list[np.ndarray]:
        return [d.row_slot.copy(), d.slot_row.copy(), d.policy.count.copy(), d.policy.last.copy(),
                store.cache_w.numpy().copy(), store.host_w.numpy().copy()]

    exported = store.export()  # lands the last step's write-back in the host table (deferred to the next plan)
    before, counters = arrays(), store.step_counters()
    torch.testing.assert_close(store.lookup(torch.arange(10).unsqueeze(1))[:, 0], exported, rtol=0, atol=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, arrays()))
    assert store.step_counters() == counters and d.step == len(HAND_TRACE)


def test_too_small_cache_fails_with_needed_capacity():
    store = LRUCacheStore(_spec(cache_rows=3))
    with pytest.raises(ConfigError, match=r"needs a capacity of at least 4 rows"):
        store.forward(torch.tensor([[0], [1], [2], [3], [3]]), NullMarker())


def test_default_budget_is_colossalai_share():
    assert LRUCacheStore(_spec(sizes=(1000, 1000))).capacity == 30
    assert LRUCacheStore(_spec(cache_ratio=0.001)).capacity == 1  # at least one slot
    assert LRUCacheStore(_spec(cache_rows=50)).capacity == 10     # at most every row


@pytest.mark.parametrize("cls,options,match", [
    (LRUCacheStore, {"cache_ratio": 0.1, "cache_rows": 3}, "not both"),
    (LRUCacheStore, {"cache_ratio": 0.0}, "cache_ratio"),
    (LRUCacheStore, {"cache_ratio": 1.5}, "cache_ratio"),
    (LRUCacheStore, {"cache_ratio": "0.1"}, "cache_ratio"),
    (LFUCacheStore, {"cache_rows": 0}, "cache_rows"),
    (LFUCacheStore, {"cache_rows": True}, "cache_rows"),
    (LFUCacheStore, {"cache_rows": 2.5}, "cache_rows"),
    (LRUCacheStore, {"warmup_ratio": 0.5}, "unknown option"),
    (FreqCacheStore, {"warmup_ratio": 1.2}, "warmup_ratio"),
    (FreqCacheStore, {"evict": "lru"}, "evict"),
])
def test_bad_options_are_rejected(cls, options, match):
    spec = _spec(**options)
    spec.frequencies = torch.ones(10, dtype=torch.int64)
    with pytest.raises(ConfigError, match=match):
        cls(spec)


def test_freqcache_needs_frequencies():
    with pytest.raises(ConfigError, match="frequencies"):
        FreqCacheStore(_spec())
    assert FreqCacheStore.needs_frequencies and not LRUCacheStore.needs_frequencies


def test_export_is_a_copy_with_resident_rows_overlaid():
    store = LRUCacheStore(_spec(cache_rows=3))
    _step(store, [0, 1])
    out = store.export()
    assert not torch.equal(out[0], init_table([10], 2, 1)[0])  # the updated cached row, not the stale host row
    out.zero_()
    assert store.export().abs().sum() > 0


@pytest.mark.parametrize("data", ["small_dataset", "sequence_dataset"])
def test_belady_hits_at_least_as_much_as_any_cache_of_its_size(request, data):
    """Belady's cache (an oracle) never hits fewer lookups than LRU or LFU of its size on the same batches (all three
    start empty and admit every miss), and it gives the same model as ``device``."""
    ds = request.getfixturevalue(data)
    capacity = dataset_trace(ds, 128, STEPS).max_unique + 5
    hits = {}
    for method in ("belady", "lru", "lfu"):
        res = train(run_cfg(method, "adagrad", {"cache_rows": capacity}), ds, CPU, progress=False)
        hits[method] = sum(c["hits"] for _, c in res.counters)
        if method == "belady":
            assert rel_diff(res.named_parameters(), _device_run(ds, "adagrad").named_parameters()) <= 1e-6
    assert hits["belady"] >= max(hits["lru"], hits["lfu"]) > 0, hits
