"""RecShard: the integer program's plan against brute force, its budget, determinism, bad options, and the host tier's
lookups counted by shard-sim as an independent per-lookup count gives them (training's: tests/test_distributed.py)."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from hotcold.config import ConfigError
from hotcold.costmodel.profile import load_profile
from hotcold.distributed.host_lookups import host_codes
from hotcold.distributed.plan_types import PlanInputs
from hotcold.distributed.plans import build_plan
from hotcold.distributed.recshard import LookupCosts, check_plan_options, expected_cost, lookup_costs
from hotcold.distributed.shardsim import simulate_plan
from hotcold.distributed.sweep import ScaleSweep
from hotcold.distributed.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
PRICES = {"device_lookup_ns": 1.0, "host_lookup_ns": 5.0}


def skewed(sizes: list[int], seed: int, scale: int = 40) -> np.ndarray:
    """Zipf-like counts per table, some rows never looked up, hot rows at random ids."""
    rng = np.random.default_rng(seed)
    out = []
    for t, n in enumerate(sizes):
        c = (scale * (t + 1) / np.arange(1, n + 1) ** 1.2).astype(np.int64)
        c[rng.random(n) < 0.2] = 0
        out.append(rng.permutation(c))
    return np.concatenate(out)


def brute_force(sizes: list[int], counts: np.ndarray, world: int, budget: int, costs: LookupCosts) -> float:
    """The least most-loaded rank's cost over every table placement and every device-row count."""
    bounds = np.cumsum([0] + sizes)
    cdf = [np.concatenate([[0], np.cumsum(np.sort(counts[a:b])[::-1])]) for a, b in zip(bounds[:-1], bounds[1:])]
    best = np.inf
    for ranks in itertools.product(range(world), repeat=len(sizes)):
        for rows in itertools.product(*[range(n + 1) for n in sizes]):
            used, cost = np.zeros(world), np.zeros(world)
            for t, (g, x) in enumerate(zip(ranks, rows)):
                used[g] += x
                cost[g] += cdf[t][x] * costs.device_ns + (cdf[t][-1] - cdf[t][x]) * costs.host_ns
            if used.max() <= budget:
                best = min(best, cost.max())
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_milp_plan_is_brute_force_optimal_on_a_tiny_case(seed):
    """2 ranks, 3 tables of a few rows; a breakpoint at every row makes the modelled CDF the exact one."""
    sizes = [6, 5, 4]
    counts = skewed(sizes, seed)
    inp = PlanInputs(sizes, counts, Topology(2), 4, 1, 1.0, {**PRICES, "breakpoints": 64, "mip_rel_gap": 0.0})
    plan = build_plan("recshard", inp)
    got = expected_cost(plan, counts, LookupCosts(1.0, 5.0))
    assert got.max() == pytest.approx(brute_force(sizes, counts, 2, inp.budget_rows(), LookupCosts(1.0, 5.0)))
    assert got.tolist() == pytest.approx(plan.details["expected_cost_ns_per_rank"])


def test_plan_shape_and_budget():
    """Whole tables on ranks, each table's hottest rows on the device, device rows within the budget, host rows
    off it; a rank's leftover budget is filled, so host rows remain only where a rank's budget is full."""
    sizes = [3000, 1200, 800, 400, 200, 100]
    counts = skewed(sizes, 3, scale=5000)
    for world, headroom in [(2, 1.0), (4, 1.0), (4, 1.25), (3, 2.0)]:
        inp = PlanInputs(sizes, counts, Topology(world), 8, 1, headroom, PRICES)
        plan = build_plan("recshard", inp)
        budget = inp.budget_rows()
        assert plan.rows_held().max() <= budget
        assert plan.bytes_held(8, 1).max() <= inp.budget_bytes()
        bounds = inp.bounds
        for t, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            assert np.unique(plan.slot[a:b]).size == 1
            dev, host = counts[a:b][~plan.off_device[a:b]], counts[a:b][plan.off_device[a:b]]
            if host.size and dev.size:
                assert dev.min() >= host.max()
        device_rows = np.bincount(plan.slot[~plan.off_device], minlength=world)
        host_rows = np.bincount(plan.slot[plan.off_device], minlength=world)
        assert ((host_rows == 0) | (device_rows == budget)).all()
        assert plan.details["host_rows_per_rank"] == host_rows.tolist()
        if headroom == 1.0:
            assert plan.off_device.any()  # the 3000-row table outgrows every rank


def test_deterministic():
    sizes = [500, 300, 200, 120, 60]
    counts = skewed(sizes, 4, scale=800)
    inp = PlanInputs(sizes, counts, Topology(4, 2), 8, 1, 1.0, PRICES)
    a, b = build_plan("recshard", inp), build_plan("recshard", inp)
    assert np.array_equal(a.slot, b.slot) and np.array_equal(a.off_device, b.off_device)


@pytest.mark.parametrize("options,name", [
    ({"breakpoints": 0}, "breakpoints"),
    ({"time_limit_s": -1}, "time_limit_s"),
    ({"node_limit": 0}, "node_limit"),
    ({"mip_rel_gap": 1.5}, "mip_rel_gap"),
    ({"device_lookup_ns": 2.0}, "host_lookup_ns"),
    ({"device_lookup_ns": 0, "host_lookup_ns": 1.0}, "device_lookup_ns"),
    ({"hardware_profile": "no/such/profile.yaml"}, "hardware_profile"),
    ({"hardware_profile": str(ROOT / "workflows" / "config" / "hardware" / "h100-cluster.yaml"),
      "breakpoints": 2.5}, "breakpoints"),
])
def test_bad_options_fail_naming_the_option(options, name):
    inp = PlanInputs([10, 5], np.arange(15), Topology(2), 8, 1, 1.0, options)
    with pytest.raises(ConfigError, match=name) as err:
        build_plan("recshard", inp)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=name):
        check_plan_options("method sharded", "recshard", options)


def test_plan_options_belong_to_recshard():
    with pytest.raises(ConfigError, match="plan_options"):
        check_plan_options("method sharded", "row", {"breakpoints": 4})
    with pytest.raises(ConfigError, match="unknown option 'gap'"):
        check_plan_options("method sharded", "recshard", {"gap": 0.1})


def test_prices_come_from_the_profiles():
    """A host lookup costs more than a device lookup on every GPU profile (the hybrid path's copies and host
    scatter), and the default prices are the cluster profile's."""
    for path in sorted((ROOT / "workflows" / "config" / "hardware").glob("*.yaml")):
        c = lookup_costs(load_profile(path), 16)
        assert 0 < c.device_ns < c.host_ns, path.name
    inp = PlanInputs([10, 5], np.arange(15), Topology(2), 16, 1, 1.0, {})
    plan = build_plan("recshard", inp)
    want = lookup_costs(load_profile(ROOT / "workflows" / "config" / "hardware" / "h100-cluster.yaml"), 16)
    assert (plan.details["device_lookup_ns"], plan.details["host_lookup_ns"]) == (want.device_ns, want.host_ns)


def test_shard_sim_counts_host_lookups_as_a_per_lookup_loop():
    """simulate_plan's host lookups per step, and a ScaleSweep's totals, equal a loop over every lookup."""
    sizes = [300, 200, 100, 50]
    counts = skewed(sizes, 6, scale=500)
    topo = Topology(4, 2)
    inp = PlanInputs(sizes, counts, topo, 8, 1, 1.0, PRICES)
    plan = build_plan("recshard", inp)
    assert plan.off_device.any()
    rng = np.random.default_rng(7)
    bounds = inp.bounds
    batches = []
    for _ in range(5):
        cols = [rng.integers(bounds[t], bounds[t + 1], size=16) for t in range(len(sizes))]
        b = np.stack(cols, axis=1)
        b[rng.random(b.shape) < 0.1] = -1
        batches.append(b)
    _, steps, _ = simulate_plan(plan, iter(batches), 8, 1, 0)
    total = np.zeros(4, dtype=np.int64)
    for batch, step in zip(batches, steps):
        want = 0
        for row in batch.reshape(-1):
            if row >= 0 and plan.off_device[row]:
                want += 1
                total[plan.slot[row]] += 1
        assert step["host_lookups"] == want
        assert step["vector_bytes_h2d"] == step["grad_bytes_d2h"] == want * 8 * 4
    sweep = ScaleSweep(topo, plan.num_rows)
    i = sweep.add(plan, 8, 1, 0)
    same_routes = dataclasses.replace(plan, off_device=None)  # same owners, no host rows: booked apart
    j = sweep.add(same_routes, 8, 1, 0)
    assert i != j
    sweep.run(iter(batches))
    assert sweep.traffic[i].host.tolist() == total.tolist()
    assert sweep.traffic[j].host.sum() == 0
    assert host_codes(None, plan.slot) is None


def test_host_lookups_per_rank_count_each_lookup_of_a_host_row_for_its_owner():
    """The compiled count, its Python body and numpy's bincount against a plain loop over the lookups."""
    from hotcold.distributed import host_lookups
    from hotcold.jit import python

    rng = np.random.default_rng(3)
    world, sizes = 4, [30, 50]
    host = rng.random(sum(sizes)) < 0.4
    codes = host_lookups.host_codes(host, rng.integers(0, world, sum(sizes)))
    batch = np.stack([rng.integers(-1, n, 64) for n in sizes], axis=1)
    offsets = np.array([0, sizes[0]])
    want = np.zeros(world, dtype=np.int64)
    for s in range(batch.shape[0]):
        for k, local in enumerate(batch[s]):
            if local >= 0 and codes[local + offsets[k]]:
                want[codes[local + offsets[k]] - 1] += 1
    assert host_lookups.host_lookups_per_rank(batch, codes, world, offsets).tolist() == want.tolist()
    out = np.zeros(world + 1, dtype=np.int64)
    python(host_lookups._count_kernel)(batch, offsets, codes, out)
    assert out[1:].tolist() == want.tolist()
    rows = (batch + offsets)[batch >= 0]
    assert np.bincount(codes[rows], minlength=world + 1)[1:].tolist() == want.tolist()
