"""Lookup-balanced and FlexShard plans: budgets, valid tiers, balance, and the solver's modelled optimality.

The modelled cost is recomputed here from the plan itself (``Plan.serving_rank``
for every requester and the ring matrices of ``traffic.py``), not from the
solver's prefix sums, so the tests check the model against the store's
byte accounting as well as the search.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from hotcold.config import ConfigError, Wire
from hotcold.distributed.plan_types import ALL, NODE, SHARDED, Plan, PlanInputs
from hotcold.distributed.plans import build_plan, row_wise
from hotcold.distributed.balanced import balance
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import ring_allreduce_matrix

SIZES = [4000, 2400, 1600]           # divisible by every world below: headroom 1.0 leaves no spare row
DIM, STATE = 16, 1
PER_STEP = 3 * 4096                  # lookups of one global batch
TOPOLOGIES = [Topology(4, 2), Topology(8, 4), Topology(8, 2), Topology(1)]
HEADROOMS = [1.0, 1.25, 1.5, 2.0]
INTRA, INTER = 300e9, 25e9
#: wire modes and the bytes of (an all-to-all element, an all-reduce element) they send, written out here
WIRES = {"float32": (Wire(), 4, 4), "exact": (Wire("float32", True), 4, 8), "bfloat16": (Wire("bfloat16"), 2, 2)}


def zipf_counts(sizes: list[int], per_table: int, s: float = 1.1, seed: int = 0) -> np.ndarray:
    """Zipf(s) lookups per table, hot rows at random ids (as hashed categorical ids are)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        p = 1.0 / np.arange(1, n + 1) ** s
        out.append(rng.permutation(rng.multinomial(per_table, p / p.sum())))
    return np.concatenate(out).astype(np.int64)


def inputs(topo: Topology, headroom: float, sizes: list[int] = SIZES, counts: np.ndarray | None = None,
           wire: Wire | None = None, **options) -> PlanInputs:
    counts = zipf_counts(sizes, 100_000) if counts is None else counts
    return PlanInputs(list(sizes), counts, topo, DIM, STATE, headroom, {"lookups_per_step": PER_STEP, **options},
                      wire or Wire())


def modelled_seconds(plan: Plan, counts: np.ndarray, per_step: float = PER_STEP, vector: int = 4,
                     reduce: int = 4) -> float:
    """Expected time per step of ``plan``: every rank requests 1/P of each row's expected lookups
    (``vector``, ``reduce``: bytes of an all-to-all and of an all-reduce element; default the float32 wire)."""
    topo, p = plan.topology, plan.topology.world
    lookups = counts / counts.sum() * per_step
    per_lookup = 8 + 2 * DIM * vector
    matrix = np.zeros((p, p))
    rows = np.arange(plan.num_rows)
    for r in range(p):
        dest = plan.serving_rank(r, rows)
        matrix[r] += np.bincount(dest, weights=lookups / p * per_lookup, minlength=p)
    np.fill_diagonal(matrix, 0.0)
    held = plan.tier == ALL
    matrix += ring_allreduce_matrix(range(p), int(held.sum()) * DIM * reduce, p)
    for j in range(topo.ranks_per_node):
        n_j = int(((plan.tier == NODE) & (plan.slot == j)).sum())
        matrix += ring_allreduce_matrix(topo.cross_node_group(j), n_j * DIM * reduce, p)
    inter_mask = topo.inter_mask()
    intra = matrix[~inter_mask].sum()       # the diagonal is zero
    inter = matrix[inter_mask].sum()
    return float((intra / INTRA + inter / INTER) / p)


def simplest(inp: PlanInputs) -> Plan:
    """No row on every rank; the hottest rows once per node, as many as a budget-feasible plan holds."""
    topo, budget, n = inp.topology, inp.budget_rows(), inp.num_rows
    g, p = topo.ranks_per_node, topo.world

    def fits(w: int) -> bool:
        node_rows = np.bincount(np.arange(w) % g, minlength=g)
        room = budget - node_rows[np.arange(p) % g]
        return bool(room.min() >= 0 and room.sum() >= n - w)

    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    order = np.argsort(-inp.counts, kind="stable")
    tier = np.full(n, SHARDED, dtype=np.int8)
    slot = np.zeros(n, dtype=np.int32)
    tier[order[:lo]] = NODE
    slot[order[:lo]] = np.arange(lo) % g
    slot[order[lo:]] = np.arange(n - lo) % p      # owners do not change the expected bytes
    return Plan("simplest", topo, list(inp.table_sizes), tier, slot)


def check_valid(plan: Plan, inp: PlanInputs) -> None:
    topo = inp.topology
    assert plan.num_rows == inp.num_rows
    assert set(np.unique(plan.tier).tolist()) <= {SHARDED, NODE, ALL}
    sh, nd, al = plan.tier == SHARDED, plan.tier == NODE, plan.tier == ALL
    assert ((plan.slot[sh] >= 0) & (plan.slot[sh] < topo.world)).all()
    assert ((plan.slot[nd] >= 0) & (plan.slot[nd] < topo.ranks_per_node)).all()
    assert (plan.slot[al] == -1).all()
    assert plan.bytes_held(inp.dim, inp.state_width).max() <= inp.budget_bytes()


def fits_cases() -> list:
    """Every topology x batch x place of the unaccessed rows x wire; the default tier: each of the first three with
    one wire (in turn), the slow tier the other two."""
    cases = []
    for i, topo in enumerate(TOPOLOGIES):
        for j, (per_step, batch) in enumerate([(PER_STEP, "small-batch"), (64 * PER_STEP, "big-batch")]):
            for k, unaccessed in enumerate(["host", "device"]):
                for w, wire in enumerate(WIRES):
                    cases.append(pytest.param(topo, per_step, unaccessed, wire,
                                              id=f"{topo.label()}-{batch}-{unaccessed}-{wire}",
                                              marks=() if (i + j + k) % len(WIRES) == w else pytest.mark.slow))
    return cases


@pytest.mark.parametrize("topo,per_step,unaccessed,wire", fits_cases())
def test_flexshard_fits_and_beats_simplest_and_sharded(topo: Topology, per_step: int, unaccessed: str,
                                                       wire: str) -> None:
    """Small batches: the best tiering fits with room to spare; big batches: the memory budget binds.
    The solver prices each element as the wire sends it (float32 by default, float64 reductions in exact mode)."""
    previous = math.inf
    mode, vector, reduce = WIRES[wire]
    for headroom in HEADROOMS:
        inp = inputs(topo, headroom, lookups_per_step=per_step, wire=mode, unaccessed_rows=unaccessed)
        plan = build_plan("flexshard", inp)
        unseen = inp.counts == 0
        assert unseen.any()  # the fixture has never-seen rows
        if unaccessed == "host":  # they sit on their row-wise owner, off the device budget
            assert (plan.off_device == unseen).all() and (plan.tier[unseen] == SHARDED).all()
            assert (plan.slot[unseen] == row_wise(inp).slot[unseen]).all()
            assert plan.host_rows_held().sum() == unseen.sum()
            assert plan.rows_held().sum() == inp.num_rows - unseen.sum() + (topo.nodes - 1) * (
                plan.tier == NODE).sum() + (topo.world - 1) * (plan.tier == ALL).sum()
        else:
            assert plan.off_device is None
        check_valid(plan, inp)
        cost = modelled_seconds(plan, inp.counts, per_step, vector, reduce)
        assert cost == pytest.approx(plan.details["tiering"]["modelled_seconds_per_step"], rel=1e-6, abs=1e-15)
        assert plan.details["priced_wire"] == mode.record()
        assert cost <= modelled_seconds(simplest(inp), inp.counts, per_step, vector, reduce) * (1 + 1e-9) + 1e-15
        assert cost <= modelled_seconds(row_wise(inp), inp.counts, per_step, vector, reduce) * (1 + 1e-9) + 1e-15
        assert cost <= previous * (1 + 1e-9) + 1e-15       # more headroom never costs more
        previous = cost
        if headroom == 1.0 and unaccessed == "device":  # no room for a copy: the row-wise shard is full
            assert plan.tier_rows() == {"sharded": inp.num_rows, "node": 0, "all": 0}
        if headroom == 1.0 and unaccessed == "host" and topo.world > 1 and per_step == PER_STEP:
            assert plan.tier_rows()["sharded"] < inp.num_rows  # the unseen rows' room holds replicas


@pytest.mark.parametrize("topo", [Topology(4, 2), Topology(8, 4)], ids=lambda t: t.label())
def test_flexshard_replicates_hot_rows_when_memory_allows(topo: Topology) -> None:
    inp = inputs(topo, 1.5)
    plan = build_plan("flexshard", inp)
    rows = plan.tier_rows()
    assert rows["all"] + rows["node"] > 0
    order = np.argsort(-inp.counts, kind="stable")
    hot = rows["all"] + rows["node"]
    assert (plan.tier[order[:hot]] != SHARDED).all()          # the replicated rows are the hottest
    assert plan.details["tiering"]["inter_node_bytes_per_step"] < plan.details["row_wise"]["inter_node_bytes_per_step"]


def test_world_one_is_all_sharded_and_free() -> None:
    inp = inputs(Topology(1), 2.0)
    plan = build_plan("flexshard", inp)
    assert plan.tier_rows()["sharded"] == inp.num_rows and (plan.slot == 0).all()
    assert modelled_seconds(plan, inp.counts) == 0.0


def test_uneven_tables_and_no_counts() -> None:
    sizes = [1001, 37, 5]
    topo = Topology(4, 2)
    for counts in (zipf_counts(sizes, 5000), np.zeros(sum(sizes), dtype=np.int64)):
        for headroom in HEADROOMS:
            for name in ("flexshard", "balanced"):
                inp = inputs(topo, headroom, sizes, counts)
                check_valid(build_plan(name, inp), inp)


def test_bad_bandwidth_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="inter_node_gbps"):
        build_plan("flexshard", inputs(Topology(4, 2), 1.25, inter_node_gbps=0))


def served(owner: np.ndarray, counts: np.ndarray, p: int) -> np.ndarray:
    return np.bincount(owner, weights=counts, minlength=p)


@pytest.mark.parametrize("topo", TOPOLOGIES[:3], ids=lambda t: t.label())
def test_balanced_balances_lookups_better_than_row_wise(topo: Topology) -> None:
    for headroom in (1.0, 1.25):
        inp = inputs(topo, headroom)
        plan = build_plan("balanced", inp)
        check_valid(plan, inp)
        assert (plan.tier == SHARDED).all()
        mine = served(plan.slot, inp.counts, topo.world)
        rows = served(row_wise(inp).slot, inp.counts, topo.world)
        assert mine.max() / mine.mean() < rows.max() / rows.mean()
        assert plan.details["expected_lookup_imbalance"] == pytest.approx(mine.max() / mine.mean())


def test_balance_respects_room_and_evens_load_and_memory() -> None:
    rng = np.random.default_rng(1)
    loads = np.sort(rng.pareto(1.5, 20_000))[::-1]
    loads[-3000:] = 0.0
    for room in (np.full(4, 6000), np.array([6000, 6000, 5000, 4000])):
        owner = balance(loads, room, head=500)
        load = np.bincount(owner, weights=loads, minlength=4)
        rows = np.bincount(owner, minlength=4)
        assert (rows <= room).all() and rows.sum() == loads.size
        assert rows.max() - rows.min() <= 1 or (rows == room).any()      # memory as even as the room allows
        assert load.max() / load.mean() < 1.01
    even = balance(loads, np.full(4, 6000), head=500)
    load = np.bincount(even, weights=loads, minlength=4)
    assert load.max() - load.min() <= 2 * loads[500]                   # within two tail items


def test_the_head_goes_by_least_load_then_fewest_items_then_lowest_bin() -> None:
    """The exact head of ``balance``: each item, heaviest first, to the bin of least load, then fewest items,
    then lowest index, among the bins with room; here computed with a heap, on loads with many ties."""
    rng = np.random.default_rng(3)
    for bins in (1, 3, 8):
        loads = np.sort(rng.integers(1, 5, 40).astype(np.float64))[::-1]
        room = rng.integers(40 // bins + 1, 40 // bins + 4, bins)
        initial = rng.integers(0, 3, bins).astype(np.float64)
        heap = [(initial[b], 0, b) for b in range(bins)]
        heapq.heapify(heap)
        want = []
        for x in loads:
            load, used, b = heapq.heappop(heap)
            want.append(b)
            if used + 1 < room[b]:
                heapq.heappush(heap, (load + x, used + 1, b))
        assert balance(loads, room, initial=initial, head=loads.size).tolist() == want


def test_balance_leaves_a_giant_item_alone() -> None:
    """An item heavier than the mean: its bin takes only the lightest items, the others share the rest."""
    loads = np.concatenate([[1000.0], np.full(3000, 0.5), np.zeros(1000)])
    owner = balance(loads, np.full(4, 1500), head=10)
    load = np.bincount(owner, weights=loads, minlength=4)
    assert load[owner[0]] == 1000.0
    others = np.delete(load, owner[0])
    assert others.max() - others.min() <= 1.0


def test_a_million_rows_plan_quickly() -> None:
    sizes = [500_000, 300_000, 200_000]
    rng = np.random.default_rng(2)
    counts = np.concatenate([rng.permutation(np.floor(2e6 / np.arange(1, n + 1) ** 1.1)) for n in sizes])
    inp = PlanInputs(sizes, counts.astype(np.int64), Topology(8, 4), DIM, STATE, 1.25,
                     {"lookups_per_step": 65536})
    for name in ("balanced", "flexshard"):
        assert build_plan(name, inp).bytes_held(DIM, STATE).max() <= inp.budget_bytes()
