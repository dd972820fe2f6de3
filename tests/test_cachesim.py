"""The trace simulator: plain-Python references, Belady's optimality, static top-k, the stores' counters."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from tiers import tiered

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.data.order import batch_rows
from hotcold.embedding.base import StoreSpec
from hotcold.embedding.update import RowOptimizer
from hotcold.counters import FIELDS
from hotcold.data.skew import row_counts
from hotcold.trace.cachesim import RowSizes, Trace, dataset_trace, simulate, sweep
from hotcold.trace.faesim import fae_sweep, simulate_fae
from hotcold.options.base import capacity_from_ratio
from hotcold.train import train

#: the reference's columns, in its tuple order
COUNTERS = ("lookups", "unique_rows", "hits", "misses", "unique_hits", "unique_misses", "param_rows_h2d",
            "param_rows_d2h", "evictions")


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
        fetched = best.steps["param_rows_h2d"].sum()
        for policy in ("lru", "lfu", "freqcache", "freqcache-lfu"):
            for warmup in (0.0, 0.7):
                other = simulate(trace, policy, capacity, warmup_ratio=warmup)
                # a warm fill is a fetch too: prefetching never beats the optimal demand policy
                assert fetched <= other.steps["param_rows_h2d"].sum() + other.warm_rows, (policy, capacity)
                if other.warm_rows == 0:
                    assert best.steps["unique_misses"].sum() <= other.steps["unique_misses"].sum()
    window = simulate(trace, "scratchpipe-2")
    at_window = simulate(trace, "belady", window.capacity_needed)
    assert at_window.steps["param_rows_h2d"].sum() <= window.steps["param_rows_h2d"].sum()


@pytest.mark.parametrize("k", [1, 10, 57, 200])
def test_static_topk_hit_rate_is_the_lookup_share_of_the_top_rows(k):
    trace = Trace.from_batches(zipf_trace(3), 200)
    freq = trace.frequencies()
    res = simulate(trace, "static-topk", k, sizes=RowSizes(dim=8))
    share = np.sort(freq)[::-1][:k].sum() / freq.sum()
    assert res.summary(200)["hit_rate"] == pytest.approx(share)
    assert res.warm_rows == k and res.steps["evictions"].sum() == 0
    # misses are served per lookup from the host, as vectors and gradients, and never inserted
    assert (res.steps["vector_bytes_h2d"] == res.steps["misses"] * 8 * 4).all()
    assert (res.steps["grad_bytes_d2h"] == res.steps["vector_bytes_h2d"]).all()
    assert res.steps["param_bytes_h2d"].sum() == 0


def scratchpad_reference(batches: list[np.ndarray], window: int, capacity: int) -> list[tuple[int, int, int]]:
    """A plain-Python scratchpad: per step (rows fetched, rows evicted, batch the last fetch serves).

    Admission order as the store's: batches 0..W at step 0, then batch t+W
    at step t; a batch holds its rows until it trains; victims are unheld
    rows, least recently admitted first (free slots before any victim, by
    slot), ties by the rows they hold.
    """
    slot_row: list[int | None] = [None] * capacity
    last = [-1] * capacity
    holds: dict[int, list[int]] = {}
    seq = 0
    out = []
    for t in range(len(batches)):
        admit = list(range(min(window, len(batches) - 1) + 1)) if t == 0 else \
            ([t + window] if t + window < len(batches) else [])
        fetched = evicted = 0
        for j in admit:
            held = {s for h in holds.values() for s in h}
            rows = sorted(set(batches[j].tolist()))
            mine = [slot_row.index(row) for row in rows if row in slot_row]  # hits first: never evicted
            for row in (r for r in rows if r not in slot_row):
                free = [s for s in range(capacity) if s not in held and s not in mine]
                s = min(free, key=lambda s: (last[s], -1 if slot_row[s] is None else slot_row[s], s))
                evicted += slot_row[s] is not None
                slot_row[s] = row
                fetched += 1
                mine.append(s)
            for s_ in mine:
                last[s_] = seq
            holds[j] = mine
            seq += 1
        holds.pop(t)
        out.append((fetched, evicted, admit[-1] if admit else -1))
    return out


@pytest.mark.parametrize("window,extra", [(0, 0), (1, 0), (2, 5), (3, 40)])
def test_scratchpipe_simulation_matches_plain_python_reference(window, extra):
    batches = zipf_trace(4, steps=25)
    trace = Trace.from_batches(batches, 200)
    minimum = simulate(trace, f"scratchpipe-{window}").capacity_needed
    sets = [set(b.tolist()) for b in batches]
    assert minimum == max(len(set().union(*sets[t:t + window + 1])) for t in range(len(sets)))
    res = simulate(trace, f"scratchpipe-{window}", minimum + extra, sizes=RowSizes(dim=4, state_width=1))
    got = list(zip(res.steps["param_rows_h2d"], res.steps["evictions"], res.steps["prefetch_batch"]))
    assert got == scratchpad_reference(batches, window, minimum + extra)
    assert (res.steps["hits"] == res.steps["lookups"]).all(), "every lookup of a trained batch hits"
    assert (res.steps["param_rows_d2h"] == res.steps["evictions"]).all()
    assert (res.steps["param_bytes_h2d"] == res.steps["param_rows_h2d"] * 5 * 4).all()
    assert (res.steps["prefetch_unique_misses"] == res.steps["param_rows_h2d"]).all()
    with pytest.raises(ConfigError, match="working set"):
        simulate(trace, f"scratchpipe-{window}", minimum - 1)


def test_scratchpipe_keeps_evicted_rows_until_their_slot_is_needed():
    """Rows that left the window stay resident: a larger scratchpad fetches less."""
    trace = Trace.from_batches(zipf_trace(6, steps=40), 200)
    tight = simulate(trace, "scratchpipe-1")
    roomy = simulate(trace, "scratchpipe-1", tight.capacity + 60)
    assert roomy.steps["param_rows_h2d"].sum() < tight.steps["param_rows_h2d"].sum()
    assert roomy.steps["prefetch_unique_hits"].sum() > tight.steps["prefetch_unique_hits"].sum()


def test_too_small_capacity_fails_and_sweep_marks_it():
    trace = Trace.from_batches(zipf_trace(5), 200)
    with pytest.raises(ConfigError, match=f"at least {trace.max_unique} rows"):
        simulate(trace, "lru", trace.max_unique - 1)
    with pytest.raises(ConfigError, match="unknown cache policy"):
        simulate(trace, "fifo", 50)
    df = sweep(trace, ratios=(0.01, 0.5), windows=(1,))
    assert len(df) == 6 * 2 + 3  # scratchpipe-1 at both sizes and at its minimum
    small = df[df.capacity == 2]
    static = small.policy == "static-topk"
    assert not small[~static].feasible.any() and small[static].feasible.all()
    big = df[df.capacity == 100]
    assert big.hit_rate.between(0, 1).all() and big.feasible.all()
    window = df[df.policy == "scratchpipe-1"]
    assert sorted(window.capacity) == sorted([2, 100, window.capacity_needed.iloc[0]])
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
    ("scratchpipe", "scratchpipe-1", {"window": 1}), ("scratchpipe", "scratchpipe-2", {"window": 2}),
    ("belady", "belady", {}),
])
def test_simulator_counts_equal_training_counters(small_dataset, method, policy, options):
    """Every field of every step, trained vs simulated, for every policy with a store."""
    trace = dataset_trace(small_dataset, 64, 30)
    capacity = trace.max_unique + 3 if method != "scratchpipe" else \
        simulate(trace, policy).capacity_needed + 3
    key = "scratchpad_rows" if method == "scratchpipe" else "cache_rows"
    res = train(_run_cfg(method, {key: capacity, **options}), small_dataset, torch.device("cpu"),
                progress=False)
    trace = dataset_trace(small_dataset, 64, 30, order=res.order)
    sim = simulate(trace, policy, capacity, row_counts(small_dataset, "train"), options.get("warmup_ratio", 0.7),
                   RowSizes(dim=4, state_width=1))
    trained = pd.DataFrame([c for _, c in res.counters])
    assert list(trained.columns) == list(FIELDS)
    pd.testing.assert_frame_equal(trained, sim.steps[list(FIELDS)], check_dtype=False)
    if method != "scratchpipe":
        assert sim.warm_rows == res.store.warm_rows
    assert trained["evictions"].sum() > 0, "the store must evict"


@pytest.mark.parametrize("run_length", [1, 4, "epoch"])
def test_fae_model_counts_equal_training_counters(small_dataset, run_length):
    options = {"budget_ratio": 0.3, "sample_fraction": 1.0, "run_length": run_length}
    res = train(_run_cfg("fae", options), small_dataset, torch.device("cpu"), progress=False)
    sim, hot_share = simulate_fae(small_dataset, 64, 30, 0, 0.3, run_length, 1.0, RowSizes(dim=4, state_width=1),
                                  warmup=2)
    trained = pd.DataFrame([c for _, c in res.counters])
    pd.testing.assert_frame_equal(trained, sim.steps[list(FIELDS)], check_dtype=False)
    assert hot_share == pytest.approx(res.store.hot_fraction)
    assert 0 < trained["hot_batch"].sum() < len(trained)
    assert trained["sync_bytes"].sum() == trained["switches"].sum() * sim.capacity * 5 * 4


def test_fae_sweep_reports_switches_and_hot_shares(small_dataset):
    df = fae_sweep(small_dataset, 64, 30, 0, budgets=(0.1, 0.3), run_lengths=(1, "epoch"))
    assert list(df.policy) == ["fae-1", "fae-epoch"] * 2
    assert (df.hot_input_share[2:].to_numpy() >= df.hot_input_share[:2].to_numpy()).all()
    coarse, fine = df.iloc[3], df.iloc[2]
    assert coarse.switches <= 2 and fine.switches >= coarse.switches
    assert coarse.sync_bytes <= fine.sync_bytes
    assert df.hit_rate.between(0, 1).all()


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


def ragged_trace(seed: int, steps: int = 30, num_rows: int = 60) -> list[np.ndarray]:
    """Batches of 0 to 25 lookups, many repeated within a batch, over few rows (so ties abound)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, num_rows, size=int(rng.integers(0, 26))) ** 2 % num_rows for _ in range(steps)]


@pytest.mark.parametrize("policy", ["lru", "lfu", "freqcache", "freqcache-lfu", "belady"])
@pytest.mark.parametrize("seed", range(3))
def test_kernels_match_reference_on_ragged_traces_at_every_capacity(policy, seed):
    batches = ragged_trace(seed)
    trace = Trace.from_batches(batches, 60)
    spooled = Trace.spool(batches, 60)
    freq = trace.frequencies()
    assert freq.tolist() == spooled.frequencies().tolist()
    distinct = int((freq > 0).sum())
    for capacity in sorted({1, trace.max_unique, trace.max_unique + 1, distinct - 1, distinct, distinct + 5}):
        if capacity < max(trace.max_unique, 1):
            with pytest.raises(ConfigError, match="too small: batch .* needs a capacity of at least"):
                simulate(trace, policy, capacity, freq)
            continue
        want = reference(batches, capacity, policy, freq.tolist())
        assert _table(simulate(trace, policy, capacity, freq)) == want, capacity
        assert _table(simulate(spooled, policy, capacity, freq)) == want, capacity
    spooled.close()


def test_infeasible_batch_later_in_the_trace_names_it():
    trace = Trace.from_batches([[0, 1], [2], [3, 4, 5, 6], [1]], 10)
    with pytest.raises(ConfigError, match="batch 2 has 4 unique rows.*at least 4 rows"):
        simulate(trace, "lfu", 3)


@pytest.mark.parametrize("window,extra", [(0, 0), (1, 2), (2, 0), (3, 7)])
def test_scratchpipe_kernel_matches_reference_on_ragged_traces(window, extra):
    batches = ragged_trace(window + 10, steps=25)
    trace = Trace.spool(batches, 60)
    minimum = simulate(trace, f"scratchpipe-{window}").capacity_needed
    res = simulate(trace, f"scratchpipe-{window}", minimum + extra)
    got = list(zip(res.steps["param_rows_h2d"], res.steps["evictions"], res.steps["prefetch_batch"]))
    assert got == scratchpad_reference(batches, window, minimum + extra)
    assert res.steps["lookups"].tolist() == [len(b) for b in batches]


def test_plain_python_kernels_equal_compiled():
    from hotcold.jit import python
    from hotcold.policies import kernels, row_counts
    from hotcold.policies.directory import CacheDirectory, cache_policy

    batches = ragged_trace(7, steps=20, num_rows=40)
    trace = Trace.from_batches(batches, 40)
    rows, counts, off = trace.read(0, len(trace))
    freq = trace.frequencies()
    for name, bulk_min in (("lru", 1), ("lfu", 3), ("lfu", 100), ("freqcache-lfu", 100), ("freqcache", 1),
                           ("freqcache", 16), ("belady", 2)):
        results = []
        for fn in (kernels.demand_steps, python(kernels.demand_steps)):
            pol, warm = cache_policy(name, 40, 15, freq, 0.5, trace.next_use())
            d = CacheDirectory(40, 15, pol)
            d.bulk_min = bulk_min
            if warm.size:
                d.warm(warm)
            out = np.zeros((len(trace), 5), dtype=np.int64)
            slots = np.zeros(rows.size, dtype=np.int64)
            p = d.policy
            done = fn(p.code, rows, counts, off, trace.flat_next_use(), 40, d.row_slot, d.slot_row, p.last, p.count,
                      p.rank, p.next, d._gen, d._mark, d._heap, d._aside, d._state, out, slots,
                      np.zeros(rows.size, dtype=bool), d._victim_slots, d._victim_rows, d.bulk_min, d._link,
                      d._bucket)
            results.append((done, out, slots, d.row_slot.copy()))
        for a, b in zip(*results):
            assert np.array_equal(a, b), name
    got = []
    for fn in (row_counts.batch_uniques, python(row_counts.batch_uniques)):
        got.append(fn(rows, off, np.zeros(40, dtype=np.int32), 0))
    assert np.array_equal(*got) and got[0].tolist() == np.diff(off).tolist()


def _directory_steps(batches, num_rows, policy, capacity, freq, bulk_min=None, listed=None):
    """Per-step ``COUNTERS`` and (slots, victim slots, victim rows) of a ``CacheDirectory`` served step by step.

    ``listed``: lfu's counts kept in FIFOs rather than its heap (default ``kernels.LISTED_COUNTS``).
    """
    from hotcold.policies.directory import CacheDirectory, cache_policy

    trace = Trace.from_batches(batches, num_rows)
    pol, warm = cache_policy(policy, num_rows, capacity, freq, 0.7, trace.next_use() if policy == "belady" else None)
    d = CacheDirectory(num_rows, capacity, pol) if listed is None else CacheDirectory(num_rows, capacity, pol, listed)
    if bulk_min is not None:
        d.bulk_min = bulk_min
    if warm.size:
        d.warm(warm)
    table, plans = [], []
    for rows, counts in zip(trace.rows, trace.counts):
        a = d.access(rows, counts)
        lookups, hits = int(a.counts.sum()), int(a.counts[a.hit].sum())
        u, uh, e = a.rows.size, int(a.hit.sum()), a.victim_rows.size
        table.append((lookups, u, hits, lookups - hits, uh, u - uh, u - uh, e, e))
        plans.append((a.slots.tolist(), a.victim_slots.tolist(), a.victim_rows.tolist()))
    return table, plans


@pytest.mark.parametrize("policy", ["lru", "lfu", "freqcache", "freqcache-lfu", "belady"])
@pytest.mark.parametrize("seed", tiered(range(2), {0}))  # a second trace: the slow tier
def test_many_evictions_on_a_heavy_tail_every_victim_path_matches_the_reference(policy, seed):
    """Zipf 1.05 over 1,000 rows in a cache just above the largest batch: most steps evict many rows.

    The victims are taken by the heap, by one pass over the slots, or by
    either as each step's count decides (``bulk_min``); lru by its queue,
    compacted many times here; lfu from its per-count FIFOs, its heap or
    both (``listed``: none, counts 0-1, 0-63, all). All give the reference's
    counters and the same slots and victims, step by step.
    """
    batches = zipf_trace(seed, steps=40, batch=50, num_rows=1000, a=1.05)
    trace = Trace.from_batches(batches, 1000)
    freq = trace.frequencies()
    for capacity in (trace.max_unique, trace.max_unique + 7, 3 * trace.max_unique):
        want = reference(batches, capacity, policy, freq.tolist())
        assert sum(step[-1] for step in want) > 2 * capacity, "the trace must evict many rows"
        assert _table(simulate(trace, policy, capacity, freq)) == want
        runs = [_directory_steps(batches, 1000, policy, capacity, freq, b) for b in (None, 1, 4, capacity + 1)]
        runs += [_directory_steps(batches, 1000, policy, capacity, freq, b, listed)
                 for b in (4, capacity + 1) for listed in (0, 2, 5_000)]
        for table, plans in runs:
            assert table == want, capacity
            assert plans == runs[0][1], capacity


def test_lru_evicts_warm_rows_first_in_row_order():
    from hotcold.policies.directory import LRU, CacheDirectory

    d = CacheDirectory(10, 4, LRU())
    assert d.warm(np.array([5, 2, 7])).tolist() == [0, 1, 2]
    a = d.access(np.array([1, 3]), np.array([1, 1]))   # 1 takes the free slot 3; 3 evicts row 2 (step -1, lowest id)
    assert a.miss_slots.tolist() == [3, 1] and a.victim_rows.tolist() == [2]
    a = d.access(np.array([0, 5, 9]), np.array([1, 1, 1]))   # 5 hits; then 7 (warm), then 1 (step 0, lower id than 3)
    assert a.hit.tolist() == [False, True, False] and sorted(a.victim_rows.tolist()) == [1, 7]
    a = d.access(np.array([8]), np.array([1]))
    assert a.victim_rows.tolist() == [3]


@pytest.mark.parametrize("seed", range(3))
def test_pairing_heap_pops_in_key_order_under_mixed_pushes_and_pops(seed):
    """freqcache's pairing heap against heapq: random unique keys, pushes and pops interleaved (bursts of
    either), compiled and plain Python; every pop returns the smallest key left."""
    import heapq

    from hotcold.jit import python
    from hotcold.policies import heaps

    rng = np.random.default_rng(seed)
    n = 300
    key = rng.permutation(10 * n)[:n].astype(np.int64)
    for push, pop in ((heaps.pair_push, heaps.pair_pop), (python(heaps.pair_push), python(heaps.pair_pop))):
        h = np.full((n + 1, 2), -1, dtype=np.int64)
        ref, outside = [], list(rng.permutation(n))
        for _ in range(40):
            for _ in range(int(rng.integers(0, 25))):
                if outside:
                    s = int(outside.pop())
                    push(h, key, s)
                    heapq.heappush(ref, (int(key[s]), s))
            for _ in range(int(rng.integers(0, 20))):
                if ref:
                    s = int(pop(h, key))
                    assert (int(key[s]), s) == heapq.heappop(ref)
                    outside.insert(0, s)
        while ref:
            assert int(pop(h, key)) == heapq.heappop(ref)[1]
        assert h[n, 0] == -1


def test_freqcache_keys_order_rows_by_count_then_highest_row_first():
    from hotcold.policies.victims import row_bits, static_key, static_ranks

    freq = np.array([5, 0, 5, 2, 0, 9, 2])
    rank = static_ranks(freq)
    keys = [static_key(rank, r, row_bits(freq.size)) for r in range(freq.size)]
    assert sorted(range(freq.size), key=lambda r: keys[r]) == sorted(range(freq.size), key=lambda r: (freq[r], -r))
    with pytest.raises(ValueError, match="must not be negative"):
        static_ranks(np.array([3, -1]))


def test_freqcache_with_counts_too_large_to_pack_evicts_as_with_their_ranks():
    """Counts beside which a row id does not fit in an int64 are replaced by their dense ranks (same order):
    the same victims as counts of that order, and as the plain-Python reference."""
    batches = zipf_trace(3, steps=30, batch=20, num_rows=60, a=1.1)
    trace = Trace.from_batches(batches, 60)
    freq = trace.frequencies()
    huge = freq.astype(np.int64) + (1 << 60)          # same order, too large beside 6 bits of row id
    for capacity in (trace.max_unique, trace.max_unique + 9):
        want = reference(batches, capacity, "freqcache", freq.tolist())
        assert _table(simulate(trace, "freqcache", capacity, huge)) == want
        assert _table(simulate(trace, "freqcache", capacity, freq)) == want
