"""Replica synchronisation (``distributed.replica_sync``): dense all-reduce or all-gather of the touched rows.

The bytes are checked against a step-by-step simulation of the two rings (chunks passed hop by hop), the
touched rows against Python sets, and shard-sim's new columns on a small dataset.
"""
from __future__ import annotations

import numpy as np
import pytest

from hotcold.config import Wire
from hotcold.distributed.plan_types import ALL, NODE, SHARDED, Plan
from hotcold.distributed.replica_sync import DENSE, SPARSE, ReplicaGroups, ReplicaTouches, sync_sends, touches_numpy
from hotcold.distributed.shardsim import Scale, shard_sim, step_matrices, touched_rows
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import ID_BYTES, SPLIT_BYTES, ring_allgather_matrix
from hotcold.jit import python


def ring_gather_sim(members: list[int], blocks: list[int], world: int) -> np.ndarray:
    """A ring all-gather run hop by hop: at hop s member i forwards block (i - s) mod g to member i + 1."""
    g = len(members)
    m = np.zeros((world, world), dtype=np.int64)
    for s in range(g - 1):
        for i in range(g):
            m[members[i], members[(i + 1) % g]] += blocks[(i - s) % g]
    return m


def ring_reduce_sim(g: int, nbytes: int) -> int:
    """Bytes one member sends in a ring all-reduce: g - 1 reduce-scatter hops and g - 1 all-gather hops of
    an n/g chunk (``ring_allreduce_matrix`` rounds the total down)."""
    return 2 * (g - 1) * nbytes // g


def test_ring_allgather_is_the_hop_by_hop_ring():
    rng = np.random.default_rng(0)
    for members in ([0, 1], [1, 3, 5, 7], [0, 2, 3, 4, 6]):
        blocks = rng.integers(0, 50, len(members)).tolist()
        assert (ring_allgather_matrix(members, blocks, 8) == ring_gather_sim(members, blocks, 8)).all()
    assert ring_allgather_matrix([4], [10], 8).sum() == 0


@pytest.mark.parametrize("touched,rows", [([0, 0, 0, 0], 10), ([1, 2, 0, 3], 10), ([9, 10, 10, 8], 10),
                                          ([5, 1], 3), ([40, 40, 40], 50)])
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("elem", [2, 4, 8], ids=["bfloat16", "float32", "float64"])
def test_sync_sends_pick_the_cheaper_ring(touched, rows, width, elem):
    g = len(touched)
    members = list(range(g))
    exchange = ring_gather_sim(members, [SPLIT_BYTES] * g, g).sum(axis=1)
    dense = np.full(g, ring_reduce_sim(g, rows * width * elem)) + exchange
    sparse = ring_gather_sim(members, [t * (ID_BYTES + width * elem) for t in touched], g).sum(axis=1) \
        + exchange
    how, sends = sync_sends(np.array(touched), rows, width, elem)
    assert how == (SPARSE if sparse.sum() < dense.sum() else DENSE)
    assert sends.tolist() == (sparse if how == SPARSE else dense).tolist()
    assert sends.sum() == min(sparse.sum(), dense.sum())


def test_a_lone_member_or_an_empty_tier_sends_nothing():
    assert sync_sends(np.array([3]), 10, 4, 4)[1].tolist() == [0]
    assert sync_sends(np.array([0, 0]), 0, 4, 4)[1].tolist() == [0, 0]


def tiered_plan() -> Plan:
    """4 ranks on 2 nodes: rows 0-3 on every rank, rows 4-9 once per node (slot row % 2), rows 10-19 sharded."""
    topo = Topology(4, 2)
    tier = np.array([ALL] * 4 + [NODE] * 6 + [SHARDED] * 10, dtype=np.int8)
    slot = np.array([-1] * 4 + [r % 2 for r in range(4, 10)] + [r % 4 for r in range(10, 20)], dtype=np.int32)
    return Plan("tiers", topo, [20], tier, slot)


@pytest.mark.parametrize("batch,all_touched,node_touched,choices", [
    # one sample of three lookups per rank (global rows; -1: padding)
    ([[0, 4, 10], [0, 1, 6], [2, 5, 7], [0, 9, -1]], [1, 2, 1, 1], [2, 0, 0, 3], [SPARSE, SPARSE, SPARSE]),
    ([[0, 1, 2], [1, 2, 3], [0, 2, 3], [4, 6, 8]], [3, 3, 3, 0], [0, 0, 3, 0], [DENSE, SPARSE, SPARSE]),
])
def test_a_step_of_replica_sync_against_sets_and_hop_by_hop_rings(batch, all_touched, node_touched, choices):
    """In exact mode (float64 reductions: 8-byte elements, written out)."""
    plan = tiered_plan()
    elem = 8
    dim = 4
    batch = np.array(batch)
    want = np.zeros((4, 4), dtype=np.int64)
    # ALL tier over ranks 0-3: each rank's distinct ALL rows
    touched_all = [len({r for r in s if 0 <= r < 4}) for s in batch.tolist()]
    assert touched_all == all_touched
    # NODE tier: rank n*2 + j serves node n's lookups of NODE rows with row % 2 == j
    node_sets = [set() for _ in range(4)]
    for r, s in enumerate(batch.tolist()):
        for row in s:
            if 4 <= row < 10:
                node_sets[r // 2 * 2 + row % 2].add(row)
    touched_node = [len(x) for x in node_sets]
    assert touched_node == node_touched
    groups = [(list(range(4)), 4, touched_all), ([0, 2], 3, [touched_node[0], touched_node[2]]),
              ([1, 3], 3, [touched_node[1], touched_node[3]])]
    picked = []
    for members, rows, touched in groups:
        g = len(members)
        exchange = ring_gather_sim(members, [SPLIT_BYTES] * g, 4)
        dense = np.zeros((4, 4), dtype=np.int64)
        for i, src in enumerate(members):
            dense[src, members[(i + 1) % g]] = ring_reduce_sim(g, rows * dim * elem)
        sparse = ring_gather_sim(members, [t * (ID_BYTES + dim * elem) for t in touched], 4)
        picked.append(SPARSE if sparse.sum() < dense.sum() else DENSE)
        want += exchange + (sparse if picked[-1] == SPARSE else dense)
    assert picked == choices
    got = step_matrices(plan, batch, dim, 0, dense_params=0, wire=Wire(exact=True))["replica_allreduce"]
    assert (got == want).all()


def test_touched_counts_agree_kernel_numpy_and_plain():
    rng = np.random.default_rng(1)
    topo = Topology(8, 4)
    n = 60
    tier = rng.choice([SHARDED, NODE, ALL], n).astype(np.int8)
    slot = np.where(tier == SHARDED, rng.integers(0, 8, n), np.where(tier == NODE, rng.integers(0, 4, n), -1))
    plan = Plan("random", topo, [n], tier, slot.astype(np.int32))
    codes = plan.route_codes()
    touches = ReplicaTouches(n, 8, 4)
    for _ in range(3):
        batch = rng.integers(-1, n, (16, 5))
        requests = [s.reshape(-1)[s.reshape(-1) >= 0] for s in np.split(batch, 8)]
        want = touched_rows(plan, requests)
        offsets = np.zeros(5, dtype=np.int64)
        for got in (touches(batch, codes.reshape(-1, 1)), touches_numpy(batch, offsets, codes, 8, 4)):
            assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        a, b = np.zeros((1, 8), np.int64), np.zeros((1, 8), np.int64)
        seen = np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=np.uint32)
        from hotcold.distributed import replica_sync
        python(replica_sync._touch_kernel)(batch, offsets, 2, codes.reshape(-1, 1), np.zeros(1, np.int64), 8, 4,
                                           *seen, 1, a, b)
        assert a[0].tolist() == want[0].tolist() and b[0].tolist() == want[1].tolist()


def test_touched_counts_of_many_plans_in_one_pass_are_each_plans_own():
    """Plans side by side (``ScaleSweep``'s stacked codes), counted in one pass: each plan's counts are those of
    the plain count of that plan alone, batch after batch (the marks of one batch never leak into the next)."""
    rng = np.random.default_rng(2)
    topo = Topology(8, 4)
    n = 80
    plans = []
    for _ in range(4):
        tier = rng.choice([SHARDED, NODE, ALL], n).astype(np.int8)
        slot = np.where(tier == SHARDED, rng.integers(0, 8, n), np.where(tier == NODE, rng.integers(0, 4, n), -1))
        plans.append(Plan("random", topo, [n], tier, slot.astype(np.int32)))
    codes = np.stack([p.route_codes() for p in plans], axis=1)
    touches = ReplicaTouches(n, 8, 4)
    for _ in range(5):
        batch = rng.integers(-1, n, (32, 3))
        requests = [s.reshape(-1)[s.reshape(-1) >= 0] for s in np.split(batch, 8)]
        touched_all, touched_node = touches.many(batch, codes, [3, 0, 2])
        for row, j in enumerate([3, 0, 2]):
            want = touched_rows(plans[j], requests)
            assert touched_all[row].tolist() == want[0].tolist() and touched_node[row].tolist() == want[1].tolist()


def test_replica_groups_of_a_plan_without_replicas_is_none():
    plan = tiered_plan()
    plan.tier[:] = SHARDED
    plan.slot[:] = 0
    assert ReplicaGroups.of(plan, 4) is None


def test_shard_sim_reports_total_and_sync_free_columns(small_dataset):
    from test_shardsim import sim_cfg

    rows = shard_sim(small_dataset, sim_cfg(), ["row", "flexshard", "flexshard-device"], [Scale(2, 2)], [1.0, 2.0],
                     batch_per_rank=8)
    for r in rows:
        assert r["inter_node_embedding_bytes"] == pytest.approx(
            r["inter_node_bytes"] - r["inter_node_dense_bytes"])
        assert r["inter_node_embedding_bytes"] >= r["inter_node_a2a_bytes"] + r["inter_node_replica_bytes"] - 1e-9
        if r["plan"] == "row":
            assert r["syncfree_inter_node_a2a_bytes"] is None and r["replica_sparse_share"] is None
            assert r["host_bytes_per_rank_max"] == 0
        else:
            # the plan with replicas priced at zero replicates at least as much: no more all-to-all bytes
            assert r["syncfree_inter_node_a2a_bytes"] <= r["inter_node_a2a_bytes"] * 1.05
    by = {(r["plan"], r["memory_headroom"]): r for r in rows}
    assert by[("flexshard", 1.0)]["host_bytes_per_rank_max"] > 0      # the fixture has never-seen rows
    assert by[("flexshard-device", 1.0)]["host_bytes_per_rank_max"] == 0
    assert by[("flexshard", 1.0)]["memory_bytes_per_rank_max"] <= by[("flexshard", 1.0)]["memory_budget_bytes"]
