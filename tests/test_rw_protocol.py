"""The row plan's reduce-scatter protocol (TorchRec's pooled row-wise): bytes against a hand count at 2 and 4
ranks, shard-sim's summed form against its per-step form, exactness against the ``device`` store at 1, 2 and 4
ranks (4: the slow tier), trained counters equal to shard-sim's, and the option combinations it refuses."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_distributed import CLOSE, STEPS, WIRES, launch, reference
from test_stores import rel_diff, run_cfg

from hotcold.config import ConfigError, Wire
from hotcold.data.skew import row_counts
from hotcold.distributed.plan_types import PlanInputs
from hotcold.distributed.plans import build_plan, row_wise
from hotcold.data.order import global_batches
from hotcold.distributed.shardsim import Scale, dense_parameters, shard_sim, simulate_plan, step_matrices
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import Ledger
from hotcold.options.sharded import LOOKUP, REDUCE_SCATTER
from hotcold.train import train

CPU = torch.device("cpu")


def rs_cfg(row_optimizer: str, world: int = 1, ranks_per_node: int = 1, wire: str = "exact",
           method: str = "sharded", **store):
    cfg = run_cfg(method, row_optimizer, steps=STEPS, eval_samples=256)
    return dataclasses.replace(cfg, store={"plan": "row", "memory_headroom": 4.0, "rw_protocol": REDUCE_SCATTER,
                                           **store},
                               distributed=dataclasses.replace(cfg.distributed, world=world,
                                                               ranks_per_node=ranks_per_node, **WIRES[wire]))


@pytest.mark.parametrize("world,rpn", [(2, 1), (4, 2)])
@pytest.mark.parametrize("mode,vector,reduce", [({}, 4, 4), ({"exact": True}, 4, 8),
                                                ({"dtype": "bfloat16"}, 2, 2)], ids=["float32", "exact", "bfloat16"])
def test_reduce_scatter_bytes_by_hand(world, rpn, mode, vector, reduce):
    """Ids and lengths to the owners (lengths: one int64 per sample and column to every other rank), the pooled
    sums reduce-scattered along the ring, the pooled gradients all-gathered along it."""
    topo = Topology(world, rpn)
    sizes, dim = [8, 4], 2
    plan = row_wise(PlanInputs(sizes, np.ones(12, np.int64), topo, dim, 0))
    per_rank = 2
    rng = np.random.default_rng(world)
    batch = np.stack([rng.integers(0, 8, world * per_rank), 8 + rng.integers(0, 4, world * per_rank)], axis=1)
    batch[1, 1] = -1  # padding: no id, length 0, still a length sent
    block = -(-np.array(sizes) // world)
    ids = np.zeros((world, world), np.int64)  # lookups r sends q
    for s, sample in enumerate(batch):
        for k, row in enumerate(sample):
            if row >= 0:
                ids[s // per_rank, (row - [0, 8][k]) // block[k]] += 1
    want = {c: np.zeros((world, world), np.int64) for c in ("input_a2a", "output_a2a", "grad_a2a")}
    for r in range(world):
        nxt = (r + 1) % world
        for q in range(world):
            if q != r:
                want["input_a2a"][r, q] = 8 * ids[r, q] + 8 + 8 * per_rank * 2  # ids, split size, lengths
        # ring: every rank forwards P - 1 of the P equal blocks (a slice's samples x columns x dim)
        want["output_a2a"][r, nxt] = (world - 1) * per_rank * 2 * dim * reduce
        want["grad_a2a"][r, nxt] = (world - 1) * per_rank * 2 * dim * vector
    got = step_matrices(plan, batch, dim, 0, 0, wire=Wire(**mode), rw_protocol=REDUCE_SCATTER)
    for c, m in want.items():
        assert got[c].tolist() == m.tolist(), c
    lookup = step_matrices(plan, batch, dim, 0, 0, wire=Wire(**mode))
    assert got["dense_allreduce"].tolist() == lookup["dense_allreduce"].tolist()
    # the summed form (``PlanTraffic``) equals the per-step one
    ledger, steps, _ = simulate_plan(plan, [batch, batch[::-1].copy()], dim, 0, 0, Wire(**mode), REDUCE_SCATTER)
    twice = Ledger(topo)
    for b in (batch, batch[::-1].copy()):
        for c, m in step_matrices(plan, b, dim, 0, 0, wire=Wire(**mode), rw_protocol=REDUCE_SCATTER).items():
            twice.add(c, m)
    assert all(ledger.total[c].tolist() == twice.total[c].tolist() for c in ledger.total)
    assert steps[0]["output_a2a_bytes"] == want["output_a2a"].sum()


def test_shard_sim_reduce_scatter_rows(small_dataset):
    """shard-sim's sweep (one pass for every plan) books the protocol for the row plan only, as the per-step form."""
    cfg = run_cfg("sharded", steps=4)
    rows = shard_sim(small_dataset, cfg, ["row", "table"], [Scale(2, 2)], [4.0], batch_per_rank=16,
                     rw_protocol=REDUCE_SCATTER)
    by = {r["plan"]: r for r in rows}
    assert by["row"]["rw_protocol"] == REDUCE_SCATTER and by["table"]["rw_protocol"] == LOOKUP
    topo = Topology(4, 2)
    start, stop = small_dataset.split("train")
    inputs = PlanInputs.for_training(small_dataset.cardinalities, row_counts(small_dataset, "train"), topo,
                                     cfg.model.embedding_dim, 1 if cfg.train.row_optimizer == "adagrad" else 0, 4.0,
                                     {}, 64 / (stop - start))
    plan = build_plan("row", inputs)
    ledger, _, _ = simulate_plan(plan, global_batches(small_dataset, cfg, 64), cfg.model.embedding_dim,
                                 inputs.state_width, dense_parameters(small_dataset, cfg), Wire(), REDUCE_SCATTER)
    for c, v in ledger.summary().items():
        assert by["row"][f"{c}_bytes"] == v["bytes"] / 4, c


def test_one_rank_trains_device_model(small_dataset):
    for opt in ("sgd", "adagrad"):
        got = train(rs_cfg(opt), small_dataset, CPU, progress=False)
        assert rel_diff(got.named_parameters(), reference(small_dataset, opt).named_parameters()) <= 1e-6
        assert got.store_report["rw_protocol"] == REDUCE_SCATTER


#: 2 ranks (a ring of two, one per node) by default; the 4-rank ring over 2 nodes of 2 (each rank forwarding 3 of
#: its 4 blocks) in the slow tier: a launch of 4 ranks takes half as long again on 2 cores. Both worlds' bytes are
#: counted by hand above in the default tier.
@pytest.fixture(scope="module", params=[(2, 1), pytest.param((4, 2), marks=pytest.mark.slow)], ids=["2x1", "4x2"])
def multi_rank(request, small_dataset, tmp_path_factory):
    world, rpn = request.param
    cases = [{"name": f"{opt}/{wire}", "dataset": str(small_dataset.path), "ranks_per_node": rpn, "opt": opt,
              "wire": wire, "run_config": rs_cfg(opt, world, rpn, wire).to_dict()}
             for opt in ("sgd", "adagrad") for wire in ("exact", "float32")]
    results = launch(cases, world, tmp_path_factory.mktemp(f"rs{world}"), "cases")
    return world, rpn, cases, results


def test_reduce_scatter_trains_device_model_and_counts_shard_sim(multi_rank, small_dataset):
    """Exact mode equals the one-process replay; every step's bytes per collective and the run's [P, P] matrices
    equal shard-sim's under the same protocol; the pooled protocol sends other bytes than the lookup one."""
    world, rpn, cases, results = multi_rank
    ds = small_dataset
    start, stop = ds.split("train")
    for case in cases:
        got = results[case["name"]]
        ref = reference(ds, case["opt"], world).named_parameters()
        assert rel_diff(got["params"], ref) <= CLOSE[case["wire"], case["opt"]], case["name"]
        cfg = rs_cfg(case["opt"], world, rpn, case["wire"])
        wire = cfg.distributed.wire()
        inputs = PlanInputs.for_training(ds.cardinalities, row_counts(ds, "train"), Topology(world, rpn), 8,
                                         1 if case["opt"] == "adagrad" else 0, 4.0, {}, 128 / (stop - start),
                                         wire=wire)
        plan = build_plan("row", inputs)
        ledger, sim_steps, served = simulate_plan(plan, global_batches(ds, cfg), 8, inputs.state_width,
                                                  dense_parameters(ds, cfg), wire, REDUCE_SCATTER)
        trained = [c for _, c in got["counters"]]
        assert len(trained) == len(sim_steps) == STEPS
        for step, want in zip(trained, sim_steps):
            assert {k: step[k] for k in want} == want, case["name"]
        assert got["report"]["served_lookups_per_rank"] == served.tolist()
        for c, m in ledger.total.items():
            assert got["report"]["collectives"][c]["matrix"] == m.tolist(), (case["name"], c)
        lookup, _, _ = simulate_plan(plan, global_batches(ds, cfg), 8, inputs.state_width,
                                     dense_parameters(ds, cfg), wire, LOOKUP)
        assert lookup.total["output_a2a"].tolist() != ledger.total["output_a2a"].tolist()


def test_bad_protocol_combinations_fail_with_one_line(small_dataset, sequence_dataset):
    def run(ds, **kw):
        return train(rs_cfg("sgd", **kw), ds, CPU, progress=False)

    with pytest.raises(ConfigError, match="rw_protocol must be one of"):
        run(small_dataset, rw_protocol="alltoall")
    with pytest.raises(ConfigError, match="plan table sends lookups"):
        run(small_dataset, plan="table")
    with pytest.raises(ConfigError, match="proactive"):
        run(small_dataset, method="proactive")
    with pytest.raises(ConfigError, match="one id per sample and table") as e:
        run(sequence_dataset)
    assert "\n" not in str(e.value)
    cfg = run_cfg("sharded", steps=4)
    with pytest.raises(ConfigError, match="one id per sample and table"):
        shard_sim(sequence_dataset, cfg, ["row"], [Scale(1, 2)], [4.0], rw_protocol=REDUCE_SCATTER)
    with pytest.raises(ConfigError, match="rw_protocol must be one of"):
        shard_sim(small_dataset, cfg, ["row"], [Scale(1, 2)], [4.0], rw_protocol="pooled")
