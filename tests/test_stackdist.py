"""The one-pass LRU curve equals the per-size simulator at every size; the grid curves equal it too."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pandas as pd
import pytest

from hotcold.config import InfeasibleError
from hotcold.trace import stackdist
from hotcold.trace.cachesim import Trace, simulate
from hotcold.policies.directory import CacheDirectory, cache_policy


def _random(seed: int, num_rows: int, steps: int, max_batch: int) -> list[np.ndarray]:
    """Batches of 1..max_batch lookups with duplicates (ids drawn with replacement, skewed)."""
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.zipf(1.3, rng.integers(1, max_batch + 1)) - 1, num_rows - 1) for _ in range(steps)]


def _long_gaps() -> list[np.ndarray]:
    """Rows 0-3 come back after hundreds of batches of other rows (forces several compactions)."""
    rng = np.random.default_rng(5)
    out = [np.array([0, 1, 2, 3, 3, 1])]
    for t in range(200):
        out.append(rng.integers(4, 60, 6))
        if t % 67 == 0:
            out.append(np.array([3, 0, 0]))
    return out + [np.array([2, 1, 0])]


def _varying() -> list[np.ndarray]:
    """Batch sizes from 1 to 40, ties of many rows sharing one last step."""
    rng = np.random.default_rng(9)
    return [rng.integers(0, 80, int(s)) for s in np.r_[1, 40, 2, 3, 35, 1, 1, 20, rng.integers(1, 40, 30)]]


TRACES = {
    "dups": (_random(0, 30, 60, 12), 30),
    "wide": (_random(1, 120, 60, 30), 120),
    "tiny-rows": (_random(2, 4, 50, 5), 4),
    "unused-rows": (_random(3, 25, 40, 6), 90),
    "long-gaps": (_long_gaps(), 60),
    "varying": (_varying(), 80),
}


def _totals(trace: Trace, policy: str, capacity: int) -> dict[str, int]:
    steps = simulate(trace, policy, capacity).steps
    return {c: int(steps[c].sum()) for c in ("lookups", "hits", "misses", "unique_rows", "unique_hits",
                                             "unique_misses", "evictions")}


@pytest.mark.parametrize("name", TRACES)
def test_lru_curve_equals_the_per_size_simulator_at_every_size(name: str) -> None:
    batches, num_rows = TRACES[name]
    trace = Trace.from_batches(batches, num_rows)
    curve = stackdist.lru_curve(trace, chunk=7)  # chunks of 7 batches: the state carries across feeds
    caps = np.arange(trace.max_unique, curve.distinct + 3)
    got = curve.at(caps).set_index("capacity")
    for c in caps:
        want = _totals(trace, "lru", int(c))
        assert {k: int(got.loc[c, k]) for k in want} == want, f"capacity {c}"
    assert got["feasible"].all()


@pytest.mark.parametrize("name,from_step", [("varying", 5), ("long-gaps", 150)])
def test_timed_steps_curve_equals_the_simulator_after_warm_up(name: str, from_step: int) -> None:
    """The curve over steps from_step on (the state carried over), as the trained runs count their timed steps."""
    batches, num_rows = TRACES[name]
    trace = Trace.from_batches(batches, num_rows)
    whole, timed = stackdist.lru_curves(trace, from_step, chunk=4)
    assert np.array_equal(whole.hits, stackdist.lru_curve(trace).hits)
    for c in range(trace.max_unique, whole.distinct + 2):
        steps = simulate(trace, "lru", c).steps
        steps = steps[steps.step >= from_step]
        got = timed.at([c]).iloc[0]
        for k in ("lookups", "hits", "unique_rows", "unique_hits", "evictions"):
            assert int(got[k]) == int(steps[k].sum()), (c, k)


def test_sizes_below_the_largest_batch_are_infeasible() -> None:
    trace = Trace.from_batches(_varying(), 80)
    curve = stackdist.lru_curve(trace)
    below = curve.at(np.arange(1, curve.max_unique))
    assert curve.max_unique == trace.max_unique and not below["feasible"].any()
    assert curve.at([curve.max_unique])["feasible"].all()
    with pytest.raises(InfeasibleError):
        simulate(trace, "lru", curve.max_unique - 1)


def test_first_accesses_never_hit_and_large_caches_miss_only_them() -> None:
    batches, num_rows = TRACES["wide"]
    trace = Trace.from_batches(batches, num_rows)
    curve = stackdist.lru_curve(trace)
    distinct = np.unique(np.concatenate(batches)).size
    assert curve.distinct == distinct
    at = curve.at([distinct, 10 * num_rows])
    assert (at["unique_misses"] == distinct).all() and (at["evictions"] == 0).all()
    assert curve.hits[0] == 0 and np.all(np.diff(curve.hits) >= 0)


def test_change_points_are_where_the_curve_steps() -> None:
    trace = Trace.from_batches(TRACES["dups"][0], 30)
    curve = stackdist.lru_curve(trace)
    points = curve.change_points()
    steps = np.flatnonzero(curve.hits[1:] != curve.hits[:-1]) + 1
    assert np.array_equal(points, steps) and points.size > 3


def test_chunking_does_not_change_the_curve() -> None:
    trace = Trace.from_batches(TRACES["long-gaps"][0], 60)
    a, b = stackdist.lru_curve(trace, chunk=1), stackdist.lru_curve(trace, chunk=10_000)
    assert np.array_equal(a.hits, b.hits) and np.array_equal(a.unique_hits, b.unique_hits)


def test_plain_python_kernel_gives_the_same_curve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module imported with numba unavailable runs the same kernel interpreted."""
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    spec = importlib.util.spec_from_file_location("stackdist_plain", stackdist.__file__)
    plain = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "stackdist_plain", plain)
    spec.loader.exec_module(plain)
    assert plain.KERNEL == "python"
    trace = Trace.from_batches(TRACES["varying"][0], 80)
    a, b = plain.lru_curve(trace, chunk=5), stackdist.lru_curve(trace)
    assert np.array_equal(a.hits, b.hits) and np.array_equal(a.unique_hits, b.unique_hits)


def test_bad_rows_are_rejected() -> None:
    sd = stackdist.StackDistances(5)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        sd.feed([np.array([1, 5])], [np.array([1, 1])])


@pytest.mark.parametrize("policy", stackdist.GRID_POLICIES)
def test_grid_curve_equals_the_per_size_simulator(policy: str) -> None:
    trace = Trace.from_batches(_varying(), 80)
    caps = [10, trace.max_unique, 50, 80]
    grid = stackdist.grid_curve(trace, policy, caps, from_step=10).set_index("capacity")
    assert not grid.loc[10, "feasible"]
    for c in caps[1:]:
        want = _totals(trace, policy, c)
        assert {k: int(grid.loc[c, k]) for k in want if k in grid} == {k: want[k] for k in want if k in grid}
        steps = simulate(trace, policy, c).steps
        late = steps[steps.step >= 10]
        assert grid.loc[c, "timed_hit_rate"] == late.hits.sum() / late.lookups.sum()


def _contents(trace: Trace, policy: str, capacity: int) -> list[set[int]]:
    pol, warm = cache_policy(policy, trace.num_rows, capacity, trace.frequencies())
    d = CacheDirectory(trace.num_rows, capacity, pol)
    out = []
    for rows, counts in zip(trace.rows, trace.counts):
        d.access(rows, counts)
        out.append(set(d.slot_row[:d.used].tolist()))
    return out


def test_lfu_is_not_a_stack_algorithm_and_lru_is() -> None:
    """The counterexample of docs/design.md: LFU at 2 slots holds a row that LFU at 3 slots has evicted."""
    trace = Trace.from_batches([np.array([0]), np.array([1]), np.array([0, 3]), np.array([2, 1]), np.array([3])], 4)
    lfu2, lfu3 = _contents(trace, "lfu", 2), _contents(trace, "lfu", 3)
    assert any(not small <= big for small, big in zip(lfu2, lfu3))
    for c in (2, 3):
        assert all(small <= big for small, big in zip(_contents(trace, "lru", c), _contents(trace, "lru", c + 1)))


def test_curves_frame_and_check_against_a_sweep() -> None:
    from hotcold.trace.cachesim import sweep

    trace = Trace.from_batches(_varying(), 80)
    swept = sweep(trace, policies=["lru", "freqcache"], capacities=[10, 40, 60], windows=())
    curve = stackdist.lru_curve(trace)
    assert stackdist.check_against(curve, swept) == 2  # the feasible lru rows
    frame = stackdist.curves_frame(curve, [1, 40, 60, 80], swept[swept.policy == "freqcache"], "toy")
    assert set(frame.policy) == {"lru", "freqcache"} and (frame.dataset == "toy").all()
    lru = frame[frame.policy == "lru"].set_index("capacity")
    assert not lru.loc[1, "feasible"] and lru.loc[40, "hits"] == swept.set_index(["policy", "capacity"]).loc[
        ("lru", 40), "hits"]
    bad = swept.copy()
    bad.loc[(bad.policy == "lru") & (bad.capacity == 60), "hits"] += 1
    with pytest.raises(AssertionError, match="differs"):
        stackdist.check_against(curve, bad)


def test_log_capacities_span_one_to_all_rows() -> None:
    caps = stackdist.log_capacities(1000, 50)
    assert caps[0] == 1 and caps[-1] == 1000 and np.all(np.diff(caps) > 0)
    assert isinstance(stackdist.log_capacities(1), np.ndarray) and pd.Series(caps).is_unique


def test_simulate_writes_the_curves_csv(small_dataset, tmp_path, capsys) -> None:
    from hotcold.cli import main

    run_config = '{"train": {"batch_size": 64, "steps": 30}}'
    main(["simulate", "--dataset", str(small_dataset.path), "--run-config", run_config, "--out",
          str(tmp_path / "sim.csv"), "--curves-out", str(tmp_path / "curves.csv"), "--policies", "lru", "lfu",
          "freqcache", "--ratios", "0.05", "0.3", "--windows", "--fae-budgets", "--curve-points", "40",
          "--curve-ratios", "0.123"])
    out = capsys.readouterr().out
    assert "M lookups/s" in out and "equal to the per-size simulator at" in out
    curves, sim = pd.read_csv(tmp_path / "curves.csv"), pd.read_csv(tmp_path / "sim.csv")
    assert {"dataset", "policy", "capacity", "cache_ratio", "hit_rate", "unique_hit_rate", "feasible"} <= set(curves)
    assert set(curves.policy) == {"lru", "lfu", "freqcache"} and (curves.dataset == small_dataset.name).all()
    lru = curves[curves.policy == "lru"]
    assert int(0.123 * sum(small_dataset.cardinalities)) in set(lru.capacity)
    assert len(lru) > 20 and lru.capacity.min() == 1 and lru.capacity.max() == sum(small_dataset.cardinalities)
    assert not lru[lru.capacity < lru.capacity_needed].feasible.any()
    assert lru[lru.feasible].hit_rate.is_monotonic_increasing
    both = lru.merge(sim[sim.policy == "lru"], on="capacity", suffixes=("", "_sim"))
    assert len(both) == 2 and (both.feasible == both.feasible_sim).all() and both.feasible.any()
    assert (both[both.feasible].hit_rate == both[both.feasible].hit_rate_sim).all()
    grid = curves[curves.policy != "lru"].merge(sim, on=["policy", "capacity"], suffixes=("", "_sim"))
    assert len(grid) == 4 and grid.hits.fillna(-1).equals(grid.hits_sim.fillna(-1))
    assert curves[curves.feasible].timed_hit_rate.notna().all()
