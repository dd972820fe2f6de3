"""shard-sim's batch routing and streamed byte accounting against plain, independent computations.

Routing: every plan kind (row, table, column, balanced, FlexShard, and random three-tier plans) at
P in {1, 2, 4, 8}, global batches with -1 padding: the compiled kernel, its plain-Python body, the numpy
form and ``Plan.serving_rank`` all give a per-lookup loop's counts. Streaming: ``ScaleSweep`` (all plans at
once, totals only) gives the sums of the per-step matrices (``step_matrices``), and ``simulate_plan``'s steps
are ``Ledger.take_step`` of them. The equality with the trained stores' counters is tests/test_distributed.py's.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hotcold.cli import main
from hotcold import model_size
from hotcold.config import InfeasibleError, ModelConfig
from hotcold.run_config import RunConfig
from hotcold.data.columns import to_global
from hotcold.data.skew import row_counts
from hotcold.distributed.plan_types import ALL, NODE, SHARDED, Plan, PlanInputs
from hotcold.distributed.plans import PLANS, build_plan
from hotcold.distributed.routing import (
    TableCounter,
    _table_kernel,
    _route_counts_kernel,
    _route_counts_numpy,
    pair_table,
    route_counts,
)
from hotcold.data.order import global_batches
from hotcold.distributed.shardsim import Scale, ScaleSweep, dense_parameters, route, shard_sim, simulate_plan, step_matrices
from hotcold.distributed.topology import Topology
from hotcold.counters import COLLECTIVES
from hotcold.distributed.traffic import Ledger
from hotcold.jit import python

SIZES = [13, 5, 40, 22]
DIM = 8
TOPOLOGIES = [Topology(1, 1), Topology(2, 1), Topology(2, 2), Topology(4, 2), Topology(4, 4), Topology(8, 2),
              Topology(8, 4)]


def random_plan(topo: Topology, rng: np.random.Generator) -> Plan:
    """Every row in a random tier, on a random owner / node slot."""
    n = sum(SIZES)
    tier = rng.integers(0, 3, n).astype(np.int8)
    slot = np.where(tier == SHARDED, rng.integers(0, topo.world, n),
                    np.where(tier == NODE, rng.integers(0, topo.ranks_per_node, n), -1)).astype(np.int32)
    return Plan("random", topo, list(SIZES), tier, slot)


def plans_of(topo: Topology, seed: int) -> list[Plan]:
    """Every named plan that fits (random row counts, roomy budget), and two random three-tier plans."""
    rng = np.random.default_rng(seed)
    counts = np.minimum(rng.zipf(1.3, sum(SIZES)), 1000).astype(np.int64)
    inputs = PlanInputs(list(SIZES), counts, topo, DIM, 1, headroom=4.0, options={"lookups_per_step": 64.0})
    out = []
    for name in PLANS:
        try:
            out.append(build_plan(name, inputs))
        except InfeasibleError:
            assert name == "table"  # the others always fit a roomy budget
    return out + [random_plan(topo, rng), random_plan(topo, rng)]


COLUMN_TABLES = [0, 1, 2, 3, 2]  # a batch's K columns and their tables (one table twice, as histories do)
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)])[COLUMN_TABLES]


def random_ids(topo: Topology, rng: np.random.Generator, per_rank: int = 3) -> np.ndarray:
    """Table ids [B, K] of the ``COLUMN_TABLES`` columns, -1 at padding."""
    ids = np.stack([rng.integers(0, SIZES[t], per_rank * topo.world) for t in COLUMN_TABLES], axis=1)
    ids[rng.random(ids.shape) < 0.2] = -1
    return ids


def random_batch(topo: Topology, rng: np.random.Generator, per_rank: int = 3) -> np.ndarray:
    """Global rows [B, K], -1 at padding."""
    return to_global(random_ids(topo, rng, per_rank), OFFSETS)


def loop_counts(plan: Plan, batch: np.ndarray) -> np.ndarray:
    """Lookup by lookup: requester = sample // (B / P); the row's tier says who serves it."""
    p, g = plan.topology.world, plan.topology.ranks_per_node
    counts = np.zeros((p, p), dtype=np.int64)
    per = batch.shape[0] // p
    for sample, ids in enumerate(batch):
        r = sample // per
        for row in ids:
            if row < 0:
                continue
            if plan.columns > 1:  # every rank holding a column shard of the row's table
                table = max(t for t in range(len(SIZES)) if sum(SIZES[:t]) <= row)
                for q in plan.column_ranks[table]:
                    counts[r, q] += 1
            elif plan.tier[row] == SHARDED:
                counts[r, plan.slot[row]] += 1
            elif plan.tier[row] == NODE:
                counts[r, (r // g) * g + plan.slot[row]] += 1
            else:
                assert plan.tier[row] == ALL
                counts[r, r] += 1
    return counts


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=lambda t: t.label())
def test_batch_routing_equals_a_per_lookup_loop(topo):
    rng = np.random.default_rng(topo.world * 10 + topo.ranks_per_node)
    plans = plans_of(topo, seed=topo.world)
    assert {p.name for p in plans} >= {"row", "column", "balanced", "flexshard", "random"}
    row_plans = [p for p in plans if p.columns == 1]
    codes = np.stack([p.route_codes() for p in row_plans], axis=1)
    table = pair_table(topo.world, topo.ranks_per_node)
    for _ in range(3):
        local = random_ids(topo, rng)
        batch = to_global(local, OFFSETS)
        want = {id(p): loop_counts(p, batch) for p in plans}
        for p in plans:
            assert np.array_equal(route(p, batch)[0], want[id(p)]), p.name  # Plan.serving_rank over the batch
        all_at_once = route_counts(batch, codes, topo.world, topo.ranks_per_node)
        from_ids = route_counts(local.astype(np.int32), codes, topo.world, topo.ranks_per_node, offsets=OFFSETS)
        per = batch.shape[0] // topo.world
        plain = np.zeros((len(row_plans), topo.world ** 2), dtype=np.int64)
        python(_route_counts_kernel)(local, OFFSETS, per, codes, table, plain)  # the kernel's body, uncompiled
        by_numpy = np.zeros_like(plain)
        _route_counts_numpy(local, OFFSETS, per, codes, topo.world, topo.ranks_per_node, by_numpy)
        for j, p in enumerate(row_plans):
            for got in (all_at_once[j], from_ids[j], plain[j].reshape(topo.world, topo.world),
                        by_numpy[j].reshape(topo.world, topo.world)):
                assert np.array_equal(got, want[id(p)]), p.name
            ids = batch.reshape(-1)
            rows, requester = ids[ids >= 0], np.flatnonzero(ids >= 0) // (per * batch.shape[1])
            served = p.serving_rank(requester, rows)
            for r in range(topo.world):  # the array form is the store's one-requester form, requester by requester
                assert np.array_equal(served[requester == r], p.serving_rank(r, rows[requester == r]))


def test_route_codes_fit_their_type_at_large_worlds():
    for world, g, dtype in [(8, 4, np.uint8), (128, 8, np.uint8), (240, 8, np.uint8), (248, 8, np.uint16)]:
        topo = Topology(world, g)
        tier = np.array([SHARDED, NODE, ALL, SHARDED], dtype=np.int8)
        slot = np.array([world - 1, g - 1, -1, 0], dtype=np.int32)
        codes = Plan("p", topo, [4], tier, slot).route_codes()
        assert codes.dtype == dtype and codes.tolist() == [world - 1, world + g - 1, world + g, 0]
        batch = np.array([[0, 1, 2, 3]] * world)
        counts = route_counts(batch, codes.reshape(-1, 1), world, g)[0]
        assert np.array_equal(counts, loop_counts(Plan("p", topo, [4], tier, slot), batch))


def test_route_codes_refuse_a_plan_outside_the_world():
    topo = Topology(4, 2)
    for tier, slot in [([SHARDED], [4]), ([SHARDED], [-1]), ([NODE], [2]), ([3], [0])]:
        with pytest.raises(ValueError, match="plan bad: a"):
            Plan("bad", topo, [1], np.array(tier, dtype=np.int8), np.array(slot, dtype=np.int32)).route_codes()


def test_bytes_held_counts_every_owned_row():
    for topo in TOPOLOGIES:
        for p in plans_of(topo, seed=3):
            want = np.array([p.owned(r).sum() for r in range(topo.world)])
            assert np.array_equal(p.rows_held(), want), p.name
            assert np.array_equal(p.bytes_held(DIM, 1), want * (DIM // p.columns + 1) * 4)


def test_lookups_and_distinct_rows_per_table_of_a_batch():
    """TableCounter (compiled and plain kernel, numpy path): each requester's lookups per table and the batch's
    distinct rows per table, against a loop over the lookups."""
    rng = np.random.default_rng(1)
    topo = Topology(4, 2)
    counter = TableCounter(list(SIZES), topo.world)
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    for _ in range(4):
        local = random_ids(topo, rng)
        batch = to_global(local, OFFSETS)
        lookups, seen_rows = np.zeros((topo.world, len(SIZES)), np.int64), [set() for _ in SIZES]
        for sample, ids in enumerate(batch):
            for row in ids[ids >= 0]:
                t = int(np.searchsorted(starts, row, side="right")) - 1
                lookups[sample // (batch.shape[0] // topo.world), t] += 1
                seen_rows[t].add(int(row))
        distinct = np.array([len(r) for r in seen_rows])
        for got in (counter(batch), counter(local, OFFSETS)):
            assert np.array_equal(got[0], lookups) and np.array_equal(got[1], distinct)
        seen = np.zeros(sum(SIZES), dtype=np.uint8)
        out = np.zeros_like(lookups), np.zeros_like(distinct)
        python(_table_kernel)(local, OFFSETS, counter.bounds, topo.world, seen, *out)
        assert np.array_equal(out[0], lookups) and np.array_equal(out[1], distinct) and not seen.any()
        counter.seen, kept = None, counter.seen  # the numpy path
        assert all(np.array_equal(a, b) for a, b in zip(counter(local, OFFSETS), (lookups, distinct)))
        counter.seen = kept


@pytest.mark.parametrize("topo", [Topology(1, 1), Topology(2, 2), Topology(8, 4)], ids=lambda t: t.label())
@pytest.mark.parametrize("state_width", [0, 1])
def test_streamed_totals_equal_per_step_sums(topo, state_width):
    """simulate_plan's steps and ledger, and ScaleSweep's totals (all plans in one pass), against step_matrices."""
    rng = np.random.default_rng(topo.world + state_width)
    plans = plans_of(topo, seed=7)
    batches = [random_batch(topo, rng) for _ in range(5)]
    dense = 1234
    sweep = ScaleSweep(topo, sum(SIZES))
    index = [sweep.add(p, DIM, state_width, dense) for p in plans]
    again = sweep.add(plans[0], DIM, state_width, dense)
    assert again == index[0] and len(sweep.traffic) <= len(plans)  # an identical plan shares its traffic
    sweep.run(iter(batches))
    for p, i in zip(plans, index):
        ledger, steps = Ledger(topo), []
        for b in batches:
            for c, m in step_matrices(p, b, DIM, state_width, dense).items():
                ledger.add(c, m)
            steps.append(ledger.take_step())
        got_ledger, got_steps, served = simulate_plan(p, iter(batches), DIM, state_width, dense)
        assert got_steps == steps, p.name
        assert np.array_equal(served, sum(route(p, b)[0] for b in batches).sum(axis=0))
        streamed = sweep.traffic[i].ledger()
        for c in COLLECTIVES:
            assert np.array_equal(got_ledger.total[c], ledger.total[c]), (p.name, c)
            assert np.array_equal(streamed.total[c], ledger.total[c]), (p.name, c)
        assert streamed.summary() == ledger.summary()
        assert np.array_equal(sweep.traffic[i].served(), served)
        if p.columns > 1 and state_width:
            assert ledger.summary()["column_allreduce"]["bytes"] > 0 or topo.world == 1


def sim_cfg(steps: int = 6, batch_size: int = 64) -> RunConfig:
    return RunConfig.from_dict({"dataset": "-", "method": "-",
                                "train": {"steps": steps, "warmup_steps": 0, "batch_size": batch_size},
                                "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM]}})


@pytest.mark.parametrize("data", ["small_dataset", "sequence_dataset"])
def test_shard_sim_weak_scaling_rows(request, data):
    """batch_per_rank: each scale's global batch is batch_per_rank x world; the rows equal simulate_plan's
    totals over those batches with the same plan, and say the batch they used."""
    ds, cfg = request.getfixturevalue(data), sim_cfg()
    scales = [Scale(1, 2), Scale(2, 2)]
    rows = shard_sim(ds, cfg, ["row", "flexshard", "column"], scales, [2.0, 3.0], batch_per_rank=8)
    assert len(rows) == 2 * 2 * 3 and all(r["status"] == "ok" for r in rows), [r.get("reason") for r in rows]
    assert {(r["world"], r["batch_size"], r["batch_per_rank"]) for r in rows} == {(2, 16, 8), (4, 32, 8)}
    counts, (start, stop) = row_counts(ds, "train"), ds.split("train")
    dense = dense_parameters(ds, cfg)
    for r in rows:
        topo = Topology(r["world"], r["ranks_per_node"])
        inputs = PlanInputs.for_training(ds.cardinalities, counts, topo, DIM, 1, r["memory_headroom"], {},
                                         r["batch_size"] / (stop - start))
        plan = build_plan(r["plan"], inputs)
        ledger, _, served = simulate_plan(plan, global_batches(ds, cfg, r["batch_size"]), DIM, 1, dense)  # adagrad
        summary = ledger.summary()
        for c in COLLECTIVES:
            assert r[f"{c}_bytes"] == summary[c]["bytes"] / cfg.train.steps, (r["plan"], c)
        assert r["load_imbalance"] == pytest.approx(served.max() / served.mean())
    fixed = shard_sim(ds, cfg, ["row"], scales, [1.0])
    assert [(r["batch_size"], r["batch_per_rank"]) for r in fixed] == [(64, 32), (64, 16)]


def test_shard_sim_bad_batches(small_dataset):
    cfg = sim_cfg()
    with pytest.raises(ValueError, match="batch_per_rank must be a positive integer"):
        shard_sim(small_dataset, cfg, ["row"], [Scale(1, 2)], [1.0], batch_per_rank=0)
    with pytest.raises(ValueError, match="not divisible by 3 ranks"):
        shard_sim(small_dataset, cfg, ["row"], [Scale(1, 3)], [1.0])
    with pytest.raises(ValueError, match="more than the 3072 training samples"):
        shard_sim(small_dataset, cfg, ["row"], [Scale(2, 2)], [1.0], batch_per_rank=1000)
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        route_counts(np.zeros((4, 2), dtype=np.int64), np.zeros((1, 1), dtype=np.uint8), 3, 1)


def test_bench_shard_sim_verb(small_dataset, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "shard-sim", "--dataset", str(small_dataset.path), "--scale", "2x2", "--plans", "row",
                 "flexshard", "--headrooms", "1.0", "2.0", "--batch-per-rank", "8", "--batches", "4",
                 "--reference-batches", "2", "--stream-repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "lookups/s" in text and "peak resident memory" in text
    result = json.loads(out.read_text())
    assert result["batch_size"] == 32 and result["plans_feasible"] == 4
    assert result["stream"]["lookups"] == sum(int((b >= 0).sum()) for b in global_batches(
        small_dataset, dataclasses.replace(sim_cfg(steps=4)), 32))
    assert result["reference"] and all(r["same_totals"] for r in result["reference"])
    assert main(["bench", "shard-sim", "--scale", "2x2"]) == 2  # no dataset
    assert main(["bench", "shard-sim", "--dataset", str(small_dataset.path), "--batches", "0"]) == 2


def test_same_rows_without_numba(small_dataset, monkeypatch):
    """Without numba (the numpy routing, np.unique for distinct and touched rows) shard-sim gives the same rows."""
    from hotcold.distributed import replica_sync, routing

    args = (small_dataset, sim_cfg(), ["row", "flexshard", "column"], [Scale(2, 2)], [2.0])
    compiled = shard_sim(*args, batch_per_rank=8)
    monkeypatch.setattr(routing, "KERNEL", "python")
    monkeypatch.setattr(replica_sync, "KERNEL", "python")
    assert shard_sim(*args, batch_per_rank=8) == compiled
    flex = next(r for r in compiled if r["plan"] == "flexshard")
    assert flex["replica_allreduce_bytes"] > 0 and 0 <= flex["replica_sparse_share"] <= 1


@pytest.mark.parametrize("data,model", [("small_dataset", {}), ("small_dataset", {"bottom_mlp": [8, 4], "embedding_dim": 4}),
                                        ("multihot_dataset", {"interaction": "dcnv2", "cross_layers": 2, "cross_rank": 5}),
                                        ("sequence_dataset", {"top_mlp": [12, 1]})])
def test_the_dense_parameter_count_is_the_built_models(request, data, model):
    """shard-sim counts the all-reduce's floats from the config (``hotcold.model_size``): the built model's, on every
    model (DLRM's dots, DCNv2's cross network, the sequence model)."""
    from hotcold.model import build_model

    ds, cfg = request.getfixturevalue(data), ModelConfig(**model)
    cfg.validate("model")
    assert model_size.dense_parameters(ds, cfg) == sum(p.numel() for p in build_model(ds, cfg).parameters())
