"""The trace simulator: plain-Python references, Belady's optimality, static top-k, the stores' counters."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from hotcold import embedding
from hotcold.config import ConfigError, RunConfig
from hotcold.data.loader import batch_rows
from hotcold.embedding import RowOptimizer, StoreSpec
from hotcold.embedding.cache import FreqCacheStore, LFUCacheStore, LRUCacheStore
from hotcold.data.skew import row_counts
from hotcold.trace.cachesim import COUNTERS, Trace, dataset_trace, simulate, sweep
from hotcold.trace.policies import capacity_from_ratio
from hotcold.train import train



def zipf_trace(seed: int, steps: int = 40, batch: int = 30, num_rows: int = 200, a: float = 1.2) -> list[np.ndarray]:
    """Batches of Zipf-popular rows scattered over the row space."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_rows)
    return [perm[np.minimum(rng.zipf(a, batch) - 1, num_rows - 1)] for _ in range(steps)]


def reference(batches: list[np.ndarray], capacity: int, policy: str, freq: list[int] | None = None,
              warmup_ratio: float = 0.7) -> list[tuple[int, ...]]:
    """A plain-Python cache with dicts, one row at a time: per-step ``COUNTERS``."""
    batches = [[int(r) for r in b] for b in batches]
    n = len(freq) if freq else 0
    rank = {r: i for i, r in enumerate(sorted(range(n), key=lambda r: (-freq[r], r)))} if freq else {}
    meta: dict[int, dict[str, int]] = {}  # resident row -> last step used, lookups since insertion

    def next_use(row: int, t: int) -> int:
        return next((s for s in range(t + 1, len(batches)) if row in batches[s]), math.inf)

    def key(row: int, t: int) -> tuple:
        m = meta[row]
        return {"lru": (m["last"], row), "lfu": (m["count"], m["last"], row),
                "freqcache-lfu": (m["count"], m["last"], row), "freqcache": (-rank.get(row, 0), row),
                "belady": (-next_use(row, t), row)}[policy]

    if policy.startswith("freqcache"):
        for r in sorted(rank, key=rank.get)[: math.ceil(capacity * warmup_ratio)]:
            meta[r] = {"last": -1, "count": freq[r] if policy == "freqcache-lfu" else 0}
    out = []
    for t, batch in enumerate(batches):
        counts = Counter(batch)
        hits = [r for r in counts if r in meta]
        misses = [r for r in counts if r not in meta]
        victims = sorted((r for r in meta if r not in counts), key=lambda r: key(r, t))
        victims = victims[: max(0, len(meta) + len(misses) - capacity)]
        for r in victims:
            del meta[r]
        for r in misses:
            meta[r] = {"last": t, "count": 0}
        for r, c in counts.items():
            meta[r]["last"] = t
            meta[r]["count"] += c
        h = sum(counts[r] for r in hits)
        out.append((len(batch), len(counts), h, len(batch) - h, len(hits), len(misses), len(misses),
                    len(victims), len(victims)))
    return out


def _table(res) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in row) for row in res.steps[list(COUNTERS)].to_numpy()]


@pytest.mark.parametrize("policy", ["lru", "lfu", "freqcache", "freqcache-lfu", "belady"])
@pytest.mark.parametrize("seed,capacity", [(0, 30), (1, 45), (2, 80)])
def test_policies_match_plain_python_reference(policy, seed, capacity):
    batches = zipf_trace(seed)
    trace = Trace.from_batches(batches, 200)
    freq = trace.frequencies()
    got = simulate(trace, policy, capacity, freq)
    assert _table(got) == reference(batches, capacity, policy, freq.tolist())
    if policy.startswith("freqcache"):
        assert got.warm_rows == math.ceil(capacity * 0.7)


def test_lru_on_a_hand_worked_trace():
    trace = Trace.from_batches([[0, 1], [2], [0, 3], [4, 1], [1, 1, 3, 5]], 10)
    res = simulate(trace, "lru", 3)
    assert res.steps["evictions"].tolist() == [0, 0, 1, 2, 1]
    assert res.steps["hits"].tolist() == [0, 0, 1, 0, 3]
    assert res.summary(10)["hit_rate"] == pytest.approx(4 / 11)


@pytest.mark.parametrize("seed", range(4))
def test_belady_fetches_no_more_than_any_other_policy(seed):
    batches = zipf_trace(seed, steps=60, batch=40, num_rows=400, a=1.1 + 0.1 * seed)
    trace = Trace.from_batches(batches, 400)
    for capacity in (trace.max_unique, trace.max_unique + 20, 150):
        best = simulate(trace, "belady", capacity)
        fetched = best.steps["rows_h2d"].sum()
        for policy in ("lru", "lfu", "freqcache", "freqcache-lfu"):
            for warmup in (0.0, 0.7):
                other = simulate(trace, policy, capacity, warmup_ratio=warmup)
                # a warm fill is a fetch too: prefetching never beats the optimal demand policy
                assert fetched <= other.steps["rows_h2d"].sum() + other.warm_rows, (policy, capacity)
                if other.warm_rows == 0:
                    assert best.steps["unique_misses"].sum() <= other.steps["unique_misses"].sum()
    window = simulate(trace, "lookahead-2")
    at_window = simulate(trace, "belady", window.capacity_needed)
    assert at_window.steps["rows_h2d"].sum() <= window.steps["rows_h2d"].sum()


@pytest.mark.parametrize("k", [1, 10, 57, 200])
def test_static_topk_hit_rate_is_the_lookup_share_of_the_top_rows(k):
    trace = Trace.from_batches(zipf_trace(3), 200)
    freq = trace.frequencies()
    res = simulate(trace, "static", k)
    share = np.sort(freq)[::-1][:k].sum() / freq.sum()
    assert res.summary(200)["hit_rate"] == pytest.approx(share)
    assert res.warm_rows == k and res.steps["evictions"].sum() == 0
    assert (res.steps["rows_h2d"] == res.steps["unique_misses"]).all()


@pytest.mark.parametrize("window", [0, 1, 3])
def test_lookahead_window_holds_exactly_the_window(window):
    batches = zipf_trace(4, steps=25)
    trace = Trace.from_batches(batches, 200)
    res = simulate(trace, f"lookahead-{window}")
    sets = [set(b.tolist()) for b in batches]
    resident = [set().union(*sets[t:t + window + 1]) for t in range(len(sets))]
    assert res.capacity_needed == max(len(s) for s in resident)
    prev: set = set()
    for t, s in enumerate(resident):
        row = res.steps.iloc[t]
        assert row["rows_h2d"] == len(s - prev) and row["rows_d2h"] == len(prev - s)
        assert row["unique_hits"] == len(sets[t] & prev)
        prev = s
    if window:
        assert res.steps["unique_misses"].iloc[1:].sum() == 0


def test_too_small_capacity_fails_and_sweep_marks_it():
    trace = Trace.from_batches(zipf_trace(5), 200)
    with pytest.raises(ConfigError, match=f"at least {trace.max_unique} rows"):
        simulate(trace, "lru", trace.max_unique - 1)
    with pytest.raises(ConfigError, match="unknown cache policy"):
        simulate(trace, "fifo", 50)
    df = sweep(trace, ratios=(0.01, 0.5), windows=(1,))
    assert len(df) == 6 * 2 + 1
    small = df[df.capacity == 2]
    assert not small[small.policy != "static"].feasible.any() and small[small.policy == "static"].feasible.all()
    big = df[(df.capacity == 100) & (df.policy != "lookahead-1")]
    assert big.hit_rate.between(0, 1).all() and big.feasible.all()
    assert capacity_from_ratio(0.015, 200) == 3


def _run_cfg(method: str, store: dict) -> RunConfig:
    return RunConfig.from_dict({
        "dataset": "small", "method": method, "seed": 0, "store": store,
        "model": {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
        "train": {"steps": 30, "warmup_steps": 2, "batch_size": 64, "eval_batch_size": 1024,
                  "eval_samples": 256, "row_optimizer": "adagrad", "dense_optimizer": "sgd"},
    })


@pytest.mark.parametrize("method,policy,options", [
    ("lru", "lru", {}), ("lfu", "lfu", {}), ("freqcache", "freqcache", {"warmup_ratio": 0.5}),
    ("freqcache", "freqcache-lfu", {"evict": "lfu"}),
])
def test_simulator_counts_equal_training_counters(monkeypatch, small_dataset, method, policy, options):
    for name, cls in {"lru": LRUCacheStore, "lfu": LFUCacheStore, "freqcache": FreqCacheStore}.items():
        monkeypatch.setitem(embedding.STORES, name, cls)
    capacity = dataset_trace(small_dataset, 64, 30).max_unique + 3
    res = train(_run_cfg(method, {"cache_rows": capacity, **options}), small_dataset, torch.device("cpu"),
                progress=False)
    trace = dataset_trace(small_dataset, 64, 30, order=res.order)
    sim = simulate(trace, policy, capacity, row_counts(small_dataset, "train"), options.get("warmup_ratio", 0.7))
    store_counts = [tuple(c[k] for k in COUNTERS) for _, c in res.counters]
    assert store_counts == _table(sim)
    assert sim.warm_rows == res.store.warm_rows
    assert sum(c[-1] for c in store_counts) > 0, "the cache must evict"


def test_dataset_helpers_agree_with_the_store_spec(sequence_dataset):
    ds = sequence_dataset
    spec = StoreSpec(ds.cardinalities, 4, RowOptimizer("sgd", 0.1), torch.device("cpu"),
                     column_tables=ds.column_tables)
    assert ds.column_offsets.tolist() == spec.column_offsets().tolist()
    assert row_counts(ds, "train", chunk=500).tolist() == row_counts(ds, "train").tolist()
    trace = dataset_trace(ds, 100, 25, seed=1)  # 25 steps: two epochs of 22 batches
    start, stop = ds.split("train")
    for t, rows in enumerate(batch_rows(stop - start, 100, 25, 1, "global")):
        ids = ds.batch_ids(rows + start)  # [B, K]
        expected = np.unique((ids + spec.column_offsets().numpy())[ids >= 0], return_counts=True)
        assert trace.rows[t].tolist() == expected[0].tolist() and trace.counts[t].tolist() == expected[1].tolist()
