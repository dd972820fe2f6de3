"""The cost model: its arithmetic by hand, overlap, collectives, profiles, and predictions from real records."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hotcold.analysis.costmodel_validation import summary_frame, validation_frame, write_validation
from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.costmodel import (
    COLLECTIVES,
    HOST_RATES,
    STEP_ORDER,
    ModelShape,
    Prediction,
    Workload,
    collective_ms,
    comm_ms,
    concurrent_ms,
    load_profile,
    oversubscription,
    predict,
    predict_record,
    price_device,
    price_hybrid,
    profile_from_dict,
    slowest_rank_ms,
)
from hotcold.counters import COLLECTIVES as TRAFFIC_COLLECTIVES
from hotcold import methods

HARDWARE = Path(__file__).resolve().parents[1] / "workflows" / "config" / "hardware"
UNITS = {**HOST_RATES}

CPU_RATES = {"host_memory_bw": 1.0, "host_gather_row_ns": 10.0, "host_scatter_row_ns": 20.0, "host_id_plan_ns": 1.0,
             "host_unique_ns": 2.0, "host_directory_row_ns": 3.0, "host_directory_slot_ns": 4.0, "host_op_us": 1.0,
             "dense_flops": 1.0, "host_cache_mib": 1.0, "host_cached_gather_row_ns": 5.0,
             "host_cached_scatter_row_ns": 7.0, "host_data_sample_ns": 100.0}
GPU_EXTRA = {"pcie_h2d_bw": 2.0, "pcie_d2h_bw": 4.0, "pcie_latency_us": 10.0, "device_memory_bw": 100.0,
             "device_gather_efficiency": 0.5, "device_kernel_us": 5.0, "collective_latency_us": 10.0,
             "intra_node_bw": 100.0, "inter_node_bw": 10.0, "gpus_per_node": 2}


def _profile_dict(kind: str = "cpu", **override) -> dict:
    from hotcold.costmodel import ALL_RATES

    values = {**CPU_RATES, **(GPU_EXTRA if kind == "gpu" else {}), **override}
    return {"name": f"test-{kind}", "description": "hand-made rates for the tests", "kind": kind,
            "rates": {k: {"value": v, "unit": ALL_RATES[k][0], "source": "a test's hand-picked value"}
                      for k, v in values.items()}}


def _profile(kind: str = "cpu", **override):
    return profile_from_dict(_profile_dict(kind, **override), "test")


SHAPE = ModelShape(num_dense=2, num_tables=100, dim=16, bottom_mlp=(16,), top_mlp=(1,))


def _predict(w: Workload, profile) -> Prediction:
    """``predict`` with the pricing of the workload's method (the registry's)."""
    return predict(w, profile, methods.price(w.method))


def _workload(method: str, counters: dict, **kw) -> Workload:
    base = {"lookups": 1000, "unique_rows": 100}
    return Workload(method=method, batch_size=10, counters={**base, **counters}, shape=SHAPE,
                    row_optimizer=kw.pop("row_optimizer", "sgd"), **kw)


# -- arithmetic against hand computations ----------------------------------------------------------------

def test_flops_of_a_tiny_dlrm_by_hand():
    # bottom 2->2: 2*2*2 = 8; top (d + f(f-1)/2 = 2 + 1) 3->1: 6; interaction 2 * f^2 * d = 16; x3 (fwd+bwd)
    assert ModelShape(2, 1, 2, (2,), (1,)).flops_per_sample() == pytest.approx(3 * (8 + 6 + 16))
    # sequence model: query 4->4 (32), top 7d=14 -> 1 (28), scores + pooling 2 * 2 * L * 2d (5 events: 80)
    assert ModelShape(0, 3, 2, (2,), (1,), history=5).flops_per_sample() == pytest.approx(3 * (32 + 28 + 80))


def test_hybrid_terms_on_a_cpu_profile_by_hand():
    """1000 lookups of 100 rows, D=16 (64-byte vectors), SGD, at 1 GB/s = 1e6 bytes per ms."""
    p = _predict(_workload("hybrid", {}), _profile())
    t = p.terms_ms
    assert t["emb_fwd.host_gather"] == pytest.approx(1000 * 10e-6 + 1000 * 64 / 1e6)          # 0.074
    assert t["emb_fwd.plan_ids"] == pytest.approx(1000 * 1e-6 + 4 * 1e-3)                    # 0.005
    assert t["emb_update.unique_ids"] == pytest.approx(1000 * 2e-6)
    # summed into a [100, 16] buffer of 6.4 kB: it fits in the 1 MiB cache, so the cached scatter rate
    assert t["emb_update.grad_sum"] == pytest.approx(100 * 64 / 1e6 + 1000 * 7e-6 + 2e-3)
    rows = (100 * 10e-6 + 100 * 64 / 1e6) + (100 * 20e-6 + 100 * 64 / 1e6)                    # gather + scatter
    assert t["emb_update.row_optimizer"] == pytest.approx(rows + 2 * 100 * 64 / 1e6 + 5e-3)
    assert t["h2d.vectors_h2d"] == pytest.approx(1e-3)  # a CPU ships nothing: one op of dispatch
    assert t["d2h.grads_d2h"] == pytest.approx(1e-3)
    flops = SHAPE.flops_per_sample() * 10
    assert t["dense_fwd_bwd.dense_compute"] == pytest.approx(flops / 1e6)  # 1 GFLOP/s = 1e6 FLOP per ms
    assert p.phases_ms["emb_fwd"] == pytest.approx(t["emb_fwd.host_gather"] + t["emb_fwd.plan_ids"])
    assert p.step_ms == pytest.approx(sum(p.phases_ms.values()))
    assert p.samples_per_s == pytest.approx(10 / (p.step_ms / 1e3))


def test_transfers_on_a_gpu_profile_by_hand():
    p = _predict(_workload("hybrid", {}), _profile("gpu"))
    moved = 1000 * 64
    kernel = 5e-3  # max(host op 1 us, kernel 5 us)
    assert p.terms_ms["h2d.vectors_h2d"] == pytest.approx(moved / 2e6 + 10e-3 + kernel)
    assert p.terms_ms["d2h.grads_d2h"] == pytest.approx(moved / 4e6 + 10e-3 + kernel)
    dev = _predict(_workload("device", {}), _profile("gpu"))
    # device gather: 1000 rows of 64 bytes at 100 GB/s x 0.5, plus two kernels
    assert dev.terms_ms["emb_fwd.device_gather"] == pytest.approx(moved / (100 * 0.5 * 1e6) + 2 * kernel)


@pytest.mark.parametrize("optimizer,state_bytes", [("adagrad", 4), ("elementwise-adagrad", 64)])
def test_cache_moves_rows_with_their_state(optimizer, state_bytes):
    """A miss is a host gather + copy + device scatter of weights and (Adagrad) state, row-wise a float, per element
    a row's worth; a CPU has no copy."""
    w = _workload("lru", {"param_rows_h2d": 50, "param_rows_d2h": 0}, row_optimizer=optimizer,
                  report={"capacity": 500})
    t = _predict(w, _profile()).terms_ms
    # a gather from the host table (size unknown: large), a scatter into 500 slots (fits: cached rate)
    per = lambda b: 50 * 10e-6 + 50 * b / 1e6 + 50 * 7e-6 + 3e-3  # noqa: E731
    assert t["h2d.fetch"] == pytest.approx(per(64) + per(state_bytes))
    assert t["d2h.write_back"] == 0
    assert t["h2d.directory"] == pytest.approx(100 * 3e-6)  # no evictions: no slot scan
    evicting = _workload("lru", {"evictions": 5}, report={"capacity": 500})
    assert _predict(evicting, _profile()).terms_ms["h2d.directory"] == pytest.approx(100 * 3e-6 + 500 * 4e-6)


def test_dominant_is_the_largest_term():
    p = _predict(_workload("hybrid", {}), _profile(dense_flops=1e-3))
    assert p.dominant == "dense_fwd_bwd.dense_compute" == max(p.terms_ms, key=p.terms_ms.get)
    q = _predict(_workload("hybrid", {"lookups": 1e7}), _profile())
    assert q.dominant == max(q.terms_ms, key=q.terms_ms.get) == "emb_fwd.host_gather"


def test_data_phase_by_hand():
    """10 samples of 2 dense floats, 100 int32 ids and a label (412 bytes): 100 ns each plus their bytes."""
    p = _predict(_workload("device", {}), _profile())
    assert SHAPE.sample_bytes == (2 + 100 + 1) * 4
    assert p.terms_ms["data.read_batch"] == pytest.approx(10 * 100e-6 + 10 * 412 / 1e6)
    assert p.phases_ms["data"] == pytest.approx(p.terms_ms["data.read_batch"])


def _shape(rows: int) -> ModelShape:
    return ModelShape(num_dense=2, num_tables=100, dim=16, bottom_mlp=(16,), top_mlp=(1,), rows=rows)


def test_the_table_size_rule_picks_the_cached_rate_for_tables_that_fit():
    """1 MiB of cache: 1000 rows of 64 bytes (64 kB) fit, 100000 (6.4 MB) do not."""
    small = Workload("device", 10, {"lookups": 1000, "unique_rows": 100}, _shape(1000), "sgd")
    large = Workload("device", 10, {"lookups": 1000, "unique_rows": 100}, _shape(100_000), "sgd")
    assert _predict(small, _profile()).terms_ms["emb_fwd.device_gather"] == pytest.approx(1000 * 5e-6 + 2e-3)
    assert _predict(large, _profile()).terms_ms["emb_fwd.device_gather"] == \
        pytest.approx(1000 * (10e-6 + 64 / 1e6) + 2e-3)
    # a cache's slots (500 of 64 bytes) fit although the table (size from the report: 500 / 0.005) does not
    lru = _workload("lru", {}, report={"capacity": 500, "cache_ratio": 0.005})
    assert Workload.table_rows(lru) == pytest.approx(100_000)
    assert _predict(lru, _profile()).terms_ms["emb_fwd.device_gather"] == pytest.approx(1000 * 5e-6 + 2e-3)
    # a GPU's device gather has one rate whatever the table's size
    gpu = _profile("gpu")
    assert _predict(small, gpu).terms_ms["emb_fwd.device_gather"] == \
        pytest.approx(_predict(large, gpu).terms_ms["emb_fwd.device_gather"])


NET = {"collective_latency_us": 10.0, "intra_node_bw": 1.0, "inter_node_bw": 1.0}


def test_ranks_on_one_machine_share_its_cache():
    """Each of 2 ranks gathers from half the table: 10000 rows (640 kB) fit as two halves of 320 kB,
    20000 rows (two halves of 640 kB, together 1.28 MB) do not, though one half alone would."""
    def gather(rows):
        w = Workload("sharded", 10, {"lookups": 1000, "unique_rows": 100, "served_lookups": 1000}, _shape(rows),
                     "sgd", world=2, ranks_per_node=1)
        return _predict(w, _profile(**NET)).terms_ms["emb_fwd.owner_gather"]
    assert gather(10_000) == pytest.approx(500 * 5e-6 + 2e-3)
    assert gather(20_000) == pytest.approx(500 * (10e-6 + 64 / 1e6) + 2e-3)


def _four_ranks(**kw) -> Workload:
    counters = {"lookups": 1000, "unique_rows": 100, "served_lookups": 1000, "input_a2a_bytes": 4e3,
                "output_a2a_bytes": 4e4, "grad_a2a_bytes": 4e4, "dense_allreduce_bytes": 4e3,
                "intra_node_bytes": 4.4e4, "inter_node_bytes": 4.4e4}
    return Workload("sharded", 40, counters, _shape(100_000), "sgd", world=4, ranks_per_node=2, **kw)


def test_four_ranks_on_two_cores_wait_for_their_peers():
    """P t / C = 4 / 2: transfers take twice as long, and before each collective a rank waits as long
    as the compute it did since the previous one; the step is twice the work of one rank."""
    alone = _predict(_four_ranks(), _profile(**NET, host_cores=4))
    shared = _predict(_four_ranks(), _profile(**NET, host_cores=2))
    assert not any(k.endswith("wait_for_peers") for k in alone.terms_ms)
    comm = {k: v for k, v in alone.terms_ms.items() if k.endswith(".comm")}
    compute = {k: v for k, v in alone.terms_ms.items() if not k.endswith(".comm")}
    for k, v in comm.items():
        assert shared.terms_ms[k] == pytest.approx(2 * v)
    for k, v in compute.items():
        assert shared.terms_ms[k] == pytest.approx(v)
    waits = {k: v for k, v in shared.terms_ms.items() if k.endswith("wait_for_peers")}
    assert sum(waits.values()) == pytest.approx(sum(compute.values()))
    t = alone.terms_ms
    assert waits["dense_allreduce.wait_for_peers"] == pytest.approx(
        t["output_a2a.reorder"] + t["dense_fwd_bwd.dense_compute"] + t["dense_fwd_bwd.dense_dispatch"])
    assert waits["output_a2a.wait_for_peers"] == pytest.approx(alone.phases_ms["emb_fwd"])
    assert shared.step_ms == pytest.approx(2 * alone.step_ms)


def test_cores_busy_side_by_side_run_at_the_calibrated_efficiency():
    """Efficiency 0.5 on 2 cores: 2 ranks (both cores busy) compute twice as slowly, without waiting;
    4 ranks also wait for their peers, on the slower compute; transfers are not slowed by it."""
    def ranks(world):
        w = _four_ranks()
        return Workload(w.method, w.batch_size, w.counters, w.shape, w.row_optimizer, world=world,
                        ranks_per_node=world // 2)
    for world in (2, 4):
        base = _predict(ranks(world), _profile(**NET, host_cores=2 * world))        # a core each, alone
        half = _predict(ranks(world), _profile(**NET, host_cores=2, host_parallel_efficiency=0.5))
        compute = {k: v for k, v in base.terms_ms.items() if not k.endswith(".comm")}
        for k, v in compute.items():
            assert half.terms_ms[k] == pytest.approx(2 * v)
        waits = sum(v for k, v in half.terms_ms.items() if k.endswith("wait_for_peers"))
        assert waits == pytest.approx((world / 2 - 1) * 2 * sum(compute.values()))
        for k in (k for k in base.terms_ms if k.endswith(".comm")):
            assert half.terms_ms[k] == pytest.approx(world / 2 * base.terms_ms[k])
    one = _four_ranks()
    assert oversubscription(one, _profile(**NET, host_cores=8, host_parallel_efficiency=0.5))[0] == \
        pytest.approx(1 + (2 - 1) * 3 / 7)  # 4 of 8 cores busy: 3/7 of the way to 1 / 0.5


def test_the_core_count_comes_from_the_profile_else_the_record():
    with_cores = _predict(_four_ranks(cores=2), _profile(**NET))
    assert any(k.endswith("wait_for_peers") for k in with_cores.terms_ms)
    assert not any("cores unknown" in a for a in with_cores.assumptions)
    unknown = _predict(_four_ranks(), _profile(**NET))
    assert not any(k.endswith("wait_for_peers") for k in unknown.terms_ms)
    assert any("cores unknown" in a for a in unknown.assumptions)
    one = _predict(_workload("device", {}), _profile(host_cores=1))
    assert not one.assumptions and not any(k.endswith("wait_for_peers") for k in one.terms_ms)


def test_a_rank_reads_and_computes_its_slice():
    one = _predict(Workload("device", 40, {"lookups": 1000, "unique_rows": 100}, _shape(100_000), "sgd"), _profile())
    four = _predict(_four_ranks(), _profile(**NET, host_cores=4))
    assert four.terms_ms["data.read_batch"] == pytest.approx(one.terms_ms["data.read_batch"] / 4)
    dense = "dense_fwd_bwd.dense_compute"
    assert four.terms_ms[dense] == pytest.approx(one.terms_ms[dense] / 4)


# -- overlap ---------------------------------------------------------------------------------------------

def _scratchpipe(rows: float) -> Workload:
    return _workload("scratchpipe", {"param_rows_h2d": rows, "param_rows_d2h": rows},
                     report={"window": 2, "capacity": 1000})


def test_scratchpipe_side_work_below_the_overlap_adds_nothing():
    p = _predict(_scratchpipe(10), _profile())
    side = 10 * 10e-6 + 10 * 64 / 1e6 + 10 * 20e-6 + 10 * 64 / 1e6  # gather + scatter of 10 rows
    assert p.terms_ms["h2d.side_wait"] == 0
    assert sum(p.hidden_ms.values()) == pytest.approx(side)


def test_scratchpipe_side_work_above_the_overlap_adds_its_excess():
    """On a GPU all four stages are side work (on a CPU the copies are inline and as large as the rest)."""
    rows = 1e6
    p = _predict(_scratchpipe(rows), _profile("gpu"))
    gather, scatter = rows * (10e-6 + 64 / 1e6), rows * (20e-6 + 64 / 1e6)
    copy_out = rows * 64 / (100 * 0.5 * 1e6) + rows * 64 / 4e6 + 10e-3
    copy_in = rows * 64 / 2e6 + 10e-3 + rows * 128 / (100 * 0.5 * 1e6)
    side = gather + scatter + copy_out + copy_in
    wait = p.terms_ms["h2d.side_wait"]
    assert wait > 0
    assert wait == pytest.approx(side - 2 * (p.step_ms - wait))  # the excess over W = 2 steps of training
    assert sum(p.hidden_ms.values()) + wait == pytest.approx(side)


# -- collectives -----------------------------------------------------------------------------------------

def test_a_collective_takes_as_long_as_its_slowest_rank():
    prof = _profile("gpu")  # intra 100 GB/s, inter 10 GB/s, latency 10 us
    # rank 0: 100 MB intra = 1 ms; rank 1: 50 MB intra = 0.5 ms, 20 MB inter = 2 ms (links in parallel)
    assert slowest_rank_ms([100e6, 50e6], [0, 20e6], prof) == pytest.approx(2.0 + 0.01)
    assert slowest_rank_ms([0, 0], [0, 0], prof) == 0


def test_comm_ms_splits_totals_evenly():
    prof = _profile("gpu")
    row = {"output_a2a_bytes": 400e6, "intra_node_bytes": 300e6, "inter_node_bytes": 100e6}
    out = comm_ms(row, world=4, ranks_per_node=2, profile=prof)
    # each rank 100 MB, a quarter inter-node: max(75e6 / 100e6, 25e6 / 10e6) = 2.5 ms
    assert out["output_a2a"] == pytest.approx(2.5 + 0.01)
    assert out["input_a2a"] == 0 and out["total"] == pytest.approx(out["output_a2a"])
    one_node = comm_ms(row, world=2, ranks_per_node=2, profile=prof)
    assert one_node["output_a2a"] == pytest.approx(200e6 / 100e6 + 0.01)
    with pytest.raises(ConfigError, match="divide"):
        comm_ms(row, world=3, ranks_per_node=2, profile=prof)
    with pytest.raises(ConfigError, match="cannot model collectives"):
        comm_ms(row, world=2, ranks_per_node=1, profile=_profile("cpu"))


def test_a_run_report_gives_each_rank_its_own_bytes():
    """From the store report's matrices over 4 steps: rank 1 sends 80 MB inter-node per step -> 8 ms."""
    matrix = [[0, 40e6 * 4], [80e6 * 4, 0]]
    w = _workload("sharded", {"grad_a2a_bytes": 120e6}, world=2, ranks_per_node=1,
                  report={"collectives": {"grad_a2a": {"bytes": 480e6, "matrix": matrix}}})
    assert collective_ms(w, _profile("gpu"))["grad_a2a"] == pytest.approx(8.0 + 0.01)


def test_proactive_early_lookups_hide_behind_the_gradient_all_to_all():
    counters = {"served_lookups": 1000, "grad_a2a_bytes": 2e6, "inter_node_bytes": 2e6}
    plain = _predict(_workload("sharded", counters, world=2, ranks_per_node=1), _profile("gpu"))
    early = _predict(_workload("proactive", {**counters, "early_lookups": 600}, world=2, ranks_per_node=1),
                    _profile("gpu"))
    a2a = plain.terms_ms["grad_a2a.comm"]
    look = early.terms_ms["early_lookup.early_gather"]
    assert 0 < look < a2a
    assert early.terms_ms["grad_a2a.comm"] == pytest.approx(a2a - look)
    assert early.hidden_ms["proactive_grad_a2a"] == pytest.approx(look)  # the only window open


def _host_tier(host_lookups: int) -> Workload:
    """Two ranks on two nodes, 500 lookups served each; ``host_lookups`` of them (over both) from host rows."""
    moved = host_lookups * 64
    counters = {"served_lookups": 1000, "host_lookups": host_lookups, "vector_bytes_h2d": moved,
                "grad_bytes_d2h": moved}
    return Workload("sharded", 10, {"lookups": 1000, "unique_rows": 100, **counters}, _shape(100_000), "sgd",
                    report={"host_rows_per_rank": [20_000, 20_000]}, world=2, ranks_per_node=1)


def test_host_rows_take_the_hybrid_stores_path():
    """Per rank 500 lookups of 50 rows, 200 lookups (and so 20 rows) in host memory (20,000 rows of 64 bytes:
    larger than the 1 MiB cache): their gather, copies and row update are the ``hybrid`` store's blocks on 200
    lookups of 20 rows; the device gathers 300 and updates 30 rows; the gradients are summed on the device."""
    prof = _profile("gpu", **NET)
    t = _predict(_host_tier(400), prof).terms_ms
    kernel = 5e-3
    assert t["emb_fwd.owner_gather"] == pytest.approx(300 * 64 / 5e7 + 2 * kernel)
    assert t["emb_fwd.host_gather"] == pytest.approx(200 * (10e-6 + 64 / 1e6))
    assert t["emb_fwd.vectors_h2d"] == pytest.approx(200 * 64 / 2e6 + 10e-3 + kernel)
    assert t["emb_update.grads_d2h"] == pytest.approx(200 * 64 / 4e6 + 10e-3 + kernel)
    assert t["emb_update.host_row_optimizer"] == pytest.approx(
        20 * (10e-6 + 64 / 1e6) + 20 * (20e-6 + 64 / 1e6) + 2 * 20 * 64 / 1e6 + 5e-3)
    assert t["emb_update.row_optimizer"] == pytest.approx(30 * 64 / 5e7 + 30 * 128 / 5e7 + 2 * 30 * 64 / 1e8
                                                          + 5 * kernel)
    assert t["emb_update.grad_sum"] == pytest.approx(50 * 64 / 1e8 + 500 * 128 / 5e7 + 2 * kernel)
    # exactly the hybrid store's blocks on the host lookups
    hybrid = _predict(Workload("hybrid", 10, {"lookups": 200, "unique_rows": 20}, _shape(100_000), "sgd"),
                      prof).terms_ms
    blocks = {"emb_fwd.host_gather": "emb_fwd.host_gather", "emb_fwd.vectors_h2d": "h2d.vectors_h2d",
              "emb_update.grads_d2h": "d2h.grads_d2h", "emb_update.host_row_optimizer": "emb_update.row_optimizer"}
    for ours, theirs in blocks.items():
        assert t[ours] == pytest.approx(hybrid[theirs]), ours
    # ... in place of the device's gather of 200 lookups and update of 20 rows
    none = _predict(_host_tier(0), prof)
    assert not any("host" in k or "d2h" in k.split(".")[1] for k in none.terms_ms)
    replaced = 200 * 64 / 5e7 + 20 * 64 / 5e7 + 20 * 128 / 5e7 + 2 * 20 * 64 / 1e8
    added = sum(hybrid[k] for k in blocks.values())
    assert _predict(_host_tier(400), prof).step_ms - none.step_ms == pytest.approx(added - replaced)


def test_a_shard_sim_row_brings_its_host_tier():
    """A ``shard-sim`` row of a plan with host rows (per step, over ranks) prices them as a trained run's counters."""
    from hotcold.costmodel.simulated import shard_sim_workload

    row = {"plan": "recshard", "world": 2, "ranks_per_node": 1, "batch_size": 10, "steps": 4, "status": "ok",
           "load_imbalance": 1.0, "host_lookups": 400.0, "vector_bytes_h2d": 400.0 * 64, "grad_bytes_d2h": 400.0 * 64}
    w = shard_sim_workload(row, _shape(100_000), lookups=1000, unique_rows=100, row_optimizer="sgd")
    assert (w.c("host_lookups"), w.c("vector_bytes_h2d"), w.c("grad_bytes_d2h")) == (400, 400 * 64, 400 * 64)
    t = _predict(w, _profile("gpu", **NET)).terms_ms
    assert t["emb_fwd.host_gather"] == pytest.approx(200 * (10e-6 + 64 / 1e6))  # the shard's 50,000 rows: large


def test_collectives_in_flight_together_share_the_links():
    """Rank 1 sends 80 MB of gradients and 10 MB of the dense all-reduce per step (4 steps in the report), all
    inter-node at 10 GB/s: alone 8 ms and 1 ms (each plus the latency), together 9 ms plus one latency."""
    grad, dense = [[0, 40e6 * 4], [80e6 * 4, 0]], [[0, 10e6 * 4], [10e6 * 4, 0]]
    w = _workload("proactive", {"grad_a2a_bytes": 120e6, "dense_allreduce_bytes": 20e6}, world=2,
                  ranks_per_node=1, report={"collectives": {"grad_a2a": {"bytes": 480e6, "matrix": grad},
                                                            "dense_allreduce": {"bytes": 80e6, "matrix": dense}}})
    prof = _profile("gpu")
    alone = collective_ms(w, prof)
    assert (alone["grad_a2a"], alone["dense_allreduce"]) == (pytest.approx(8.01), pytest.approx(1.01))
    assert concurrent_ms(w, prof, ("dense_allreduce", "grad_a2a")) == pytest.approx(9.01)
    # from totals only, each rank sends half of each: 60 + 10 MB
    totals = dataclasses.replace(w, report={})
    assert concurrent_ms(totals, prof, ("dense_allreduce", "grad_a2a")) == pytest.approx(7.01)


def _proactive(served: int, early: int, method: str = "proactive") -> Workload:
    """Two ranks on two nodes at 1 GB/s (10 us latency); per rank 1 MB of ids, 1 MB of vectors, 2 MB of the dense
    all-reduce, 4 MB of gradients; a device gather of 1.28e-4 ms a lookup (1 GB/s at 0.5) plus 10 us of kernels."""
    counters = {"lookups": served, "unique_rows": 1000, "served_lookups": served, "input_a2a_bytes": 2e6,
                "output_a2a_bytes": 2e6, "dense_allreduce_bytes": 4e6, "grad_a2a_bytes": 8e6,
                "inter_node_bytes": 16e6, **({"early_lookups": early} if early else {})}
    return Workload(method, 40, counters, _shape(100_000), "sgd", world=2, ranks_per_node=1)


#: windows by hand: input 1.01 ms; output 1.01; the dense all-reduce (2 ms alone) beside the gradients (4 ms
#: alone) share the links: 6.01 ms together, the all-reduce in flight 0.01 + 2 + 2 = 4.01 of them, the
#: gradients alone the last 2.0
WINDOWS_MS = {"input_a2a": 1.01, "output_a2a": 1.01, "dense_allreduce": 4.01, "grad_a2a": 2.0}


@pytest.mark.parametrize("served, early, hidden", [
    # own 500 lookups (0.074 ms) and early 500 (0.074) both in the ids' window
    (2000, 1000, {"input_a2a": 0.148, "output_a2a": 0, "dense_allreduce": 0, "grad_a2a": 0}),
    # own 92,000 (11.786 ms) fill the ids' window; early 8,000 (1.034) the output window and 0.024 of the next
    (200_000, 16_000, {"input_a2a": 1.01, "output_a2a": 1.01, "dense_allreduce": 0.024, "grad_a2a": 0}),
    # early 80,000 (10.25 ms): every window full, 3.23 ms exposed at the end of the gradient window
    (200_000, 160_000, WINDOWS_MS),
    # nothing early: the own lookups (1.29 ms) in the ids' window, the rest after it
    (20_000, 0, {"input_a2a": 1.01, "output_a2a": 0, "dense_allreduce": 0, "grad_a2a": 0}),
    # everything early (0.138 ms): no gather of the step's own, the early ones in the ids' window
    (2000, 2000, {"input_a2a": 0.138, "output_a2a": 0, "dense_allreduce": 0, "grad_a2a": 0}),
])
def test_proactive_hides_lookups_window_by_window(served, early, hidden):
    prof = _profile("gpu", **NET, device_memory_bw=1.0)
    p = _predict(_proactive(served, early), prof)
    got = {k.removeprefix("proactive_"): v for k, v in p.hidden_ms.items()}
    assert got == pytest.approx(hidden)
    own = (served - early) / 2 * 1.28e-4 + 0.01 if served > early else 0.0
    ahead = early / 2 * 1.28e-4 + 0.01 if early else 0.0
    for name, ms in got.items():
        assert ms <= WINDOWS_MS[name] + 1e-12
        assert p.terms_ms[f"{name}.comm"] == pytest.approx(WINDOWS_MS[name] - ms)
    assert sum(got.values()) <= own + ahead + 1e-12
    assert p.terms_ms.get("emb_fwd.owner_gather", 0.0) == pytest.approx(own)
    assert p.terms_ms.get("early_lookup.early_gather", 0.0) == pytest.approx(ahead)
    # against the blocking exchange: the pair's shared links save a latency, the windows their hidden time,
    # a second gather (early and own) costs its own kernels
    plain = _predict(_proactive(served, 0, "sharded"), prof)
    sequential = 2.01 + 4.01 - 6.01
    kernels = 0.01 if own and ahead else 0.0
    assert p.step_ms == pytest.approx(plain.step_ms - sequential - sum(got.values()) + kernels)


def test_proactive_without_windows_prices_as_the_blocking_exchange():
    """No ids sent ahead, no dense all-reduce, no early lookups: nothing to hide, the plain sharded step."""
    counters = {"served_lookups": 1000, "output_a2a_bytes": 2e6, "grad_a2a_bytes": 2e6, "inter_node_bytes": 4e6}
    for kind in ("cpu", "gpu"):
        prof = _profile(kind, **NET)
        plain = _predict(_workload("sharded", counters, world=2, ranks_per_node=1), prof)
        pro = _predict(_workload("proactive", counters, world=2, ranks_per_node=1), prof)
        assert pro.step_ms == pytest.approx(plain.step_ms) and pro.phases_ms == pytest.approx(plain.phases_ms)
        assert sum(pro.hidden_ms.values()) == 0


# -- every technique's pricing ---------------------------------------------------------------------------

EVERY = {"lookups": 2000, "unique_rows": 300, "param_rows_h2d": 40, "param_rows_d2h": 30, "evictions": 30,
         "hot_batch": 0.6, "served_lookups": 1800, "early_lookups": 500, "input_a2a_bytes": 4e3,
         "output_a2a_bytes": 6e4, "grad_a2a_bytes": 6e4, "replica_allreduce_bytes": 2e3,
         "dense_allreduce_bytes": 4e3, "intra_node_bytes": 7e4, "inter_node_bytes": 6e4}
_EXCHANGE = ("data h2d dense_fwd_bwd input_a2a emb_fwd output_a2a grad_a2a emb_update replica_allreduce "
             "dense_allreduce")
#: Proactive: the early lookups after the output all-to-all, the dense all-reduce beside the gradient all-to-all
_EARLY = ("data h2d dense_fwd_bwd input_a2a emb_fwd output_a2a early_lookup dense_allreduce grad_a2a emb_update "
          "replica_allreduce")
#: method -> (its step's phases in order, then (step ms, hidden ms) on a CPU and on a GPU profile): the
#: numbers of the cost model as one module, before it became a package; a change to the model changes them, a
#: change of its code's home never.
#: Proactive's changed with its windows (issue 20): its own lookups hide behind the input all-to-all, the
#: early ones behind the output all-to-all, the dense all-reduce runs beside the gradient all-to-all.
#: On a GPU a host tensor shipped to the device costs 3 ops (pinned, then copied) beside its copy, and
#: ScratchPipe ships its batch's slots in forward (issue 31, after the H100 and H200 runs).
PINNED = {
    "device": ("data h2d dense_fwd_bwd emb_fwd emb_update",
               (0.5252753600000001, 0), (0.58292336, 0)),
    "fae": ("data h2d dense_fwd_bwd emb_fwd emb_update d2h",
            (0.47304536, 0), (0.84771376, 0)),
    "flexshard": (_EXCHANGE,
                  (0.50133768, 0), (0.51311884, 0)),
    "freqcache": ("data h2d dense_fwd_bwd d2h emb_fwd emb_update",
                  (0.37912536, 0), (0.79313296, 0)),
    "hybrid": ("data h2d dense_fwd_bwd emb_fwd d2h emb_update",
               (0.52327536, 0), (0.87787536, 0)),
    "lfu": ("data h2d dense_fwd_bwd d2h emb_fwd emb_update",
            (0.37912536, 0), (0.79313296, 0)),
    "lru": ("data h2d dense_fwd_bwd d2h emb_fwd emb_update",
            (0.37912536, 0), (0.79313296, 0)),
    "proactive": (_EARLY,
                  (0.46026075692307694, 0.021788461538461538), (0.49270284, 0.020576)),
    "scratchpipe": ("h2d emb_fwd emb_update data dense_fwd_bwd",
                    (0.36423536, 0.00589), (0.59602336, 0.047909600000000004)),
    "sharded": (_EXCHANGE,
                (0.50133768, 0), (0.51311884, 0)),
}


def _every(method: str) -> Workload:
    """A step that does a bit of everything; a scale-out method's on 4 ranks of 2 nodes, sharing 2 cores."""
    world = 4 if method in ("sharded", "proactive", "flexshard") else 1
    return Workload(method, 40, EVERY, _shape(100_000), "adagrad", report={"capacity": 500, "hot_rows": 400,
                    "window": 2}, world=world, ranks_per_node=2 if world > 1 else 1, cores=2)


@pytest.mark.parametrize("method, kind", [(m, k) for m in sorted(PINNED) for k in ("cpu", "gpu")])
def test_every_technique_prices_its_step_as_before(method, kind):
    p = _predict(_every(method), _profile(kind, **NET, dense_flops=1000.0))
    phases, on_cpu, on_gpu = PINNED[method]
    step, hidden = on_cpu if kind == "cpu" else on_gpu
    # by value: another machine's numpy or libm may round the sums' last digit otherwise
    assert p.step_ms == pytest.approx(step, rel=1e-12, abs=1e-15)
    assert sum(p.hidden_ms.values()) == pytest.approx(hidden, rel=1e-12, abs=1e-15)
    assert " ".join(p.phases_ms) == phases


def test_pricing_reads_the_workload_never_the_method_name():
    prof = _profile("gpu", **NET)
    for method in methods.names(peer=False):
        w, price = _every(method), methods.price(method)
        assert predict(dataclasses.replace(w, method="renamed"), prof, price) == predict(w, prof, price), method


def test_every_method_but_the_peers_has_a_pricing_function():
    assert [m.name for m in methods.METHODS.values() if m.cost is not None] == methods.names(peer=False)


def test_a_record_is_priced_by_its_method_and_a_peer_is_not_modelled():
    prof = _profile()
    rec = _fake_record("hybrid", {})
    assert methods.price("hybrid") is price_hybrid
    assert predict_record(rec, prof, price_hybrid) == predict(Workload.from_record(rec), prof, price_hybrid)
    assert predict_record(rec, prof, price_device) == predict(Workload.from_record(rec), prof, price_device)
    for method in (*methods.names(peer=True), "warp_drive"):
        with pytest.raises(ConfigError, match=f"cost model: no model of method '{method}'"):
            methods.price(method)


def test_the_collectives_are_the_exchanges_and_a_step_reaches_each_once():
    assert COLLECTIVES is TRAFFIC_COLLECTIVES
    assert sorted(STEP_ORDER) == sorted(COLLECTIVES)


# -- profiles ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(HARDWARE.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads_and_names_its_sources(path):
    p = load_profile(path)
    assert p.name == path.stem and p.kind == "gpu"
    for key in ("gpus_per_node", "pcie_h2d_bw", "device_memory_bw", "dense_flops"):
        assert p.has(key)
    if p.value("gpus_per_node") > 1:  # a node of several GPUs and a cluster: the network too
        assert all(p.has(k) for k in ("intra_node_bw", "inter_node_bw", "collective_latency_us"))
    for key, rate in p.rates.items():
        assert rate.value > 0 and rate.unit
        assert any(word in rate.source for word in ("assumed", "datasheet", "paper", "setting", "product page",
                                                    "Intel ARK", "measured by hotcold calibrate")), \
            f"{path.name}: {key} does not say its source"
    assert p.value("host_cached_gather_row_ns") > 0 and p.value("host_data_sample_ns") > 0


def test_the_three_required_profiles_ship():
    assert {"v100-xeon-pcie3", "a100-dgx", "h100-cluster"} <= {p.stem for p in HARDWARE.glob("*.yaml")}


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["rates"].pop("host_memory_bw"), r"missing rate\(s\) \['host_memory_bw'\]"),
    (lambda d: d["rates"].update(warp_drive={"value": 1, "unit": "GB/s", "source": "a test's value"}),
     r"unknown rate\(s\) \['warp_drive'\]"),
    (lambda d: d["rates"]["host_op_us"].update(value=0), r"rates.host_op_us: value must be a finite number > 0"),
    (lambda d: d["rates"]["host_op_us"].update(value=-3.0), r"rates.host_op_us: value must be"),
    (lambda d: d["rates"]["host_op_us"].update(value=True), r"rates.host_op_us: value must be"),
    (lambda d: d["rates"]["host_op_us"].pop("source"), r"rates.host_op_us must be a mapping with exactly"),
    (lambda d: d["rates"]["host_op_us"].update(source=""), r"rates.host_op_us: source must say"),
    (lambda d: d["rates"]["host_memory_bw"].update(unit="MB/s"), r"rates.host_memory_bw: unit must be 'GB/s'"),
    (lambda d: d.update(kind="tpu"), r"kind must be one of"),
    (lambda d: d.pop("name"), r"name must be a non-empty string"),
])
def test_bad_profiles_fail_naming_file_and_key(tmp_path, edit, match):
    data = _profile_dict()
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_a_gpu_profile_needs_its_device_rates():
    data = _profile_dict("gpu")
    del data["rates"]["pcie_h2d_bw"]
    with pytest.raises(ConfigError, match="pcie_h2d_bw"):
        profile_from_dict(data, "x.yaml")


# -- real records ------------------------------------------------------------------------------------------

RUN = {"dataset": "small", "variant": "base", "seed": 0,
       "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"steps": 8, "warmup_steps": 2, "batch_size": 64, "eval_batch_size": 1024, "eval_samples": 256}}
METHODS = {"device": {}, "hybrid": {}, "lru": {"cache_ratio": 0.5}, "fae": {"budget_ratio": 0.1},
           "scratchpipe": {"window": 2}}


@pytest.fixture(scope="module")
def records(tmp_path_factory, small_dataset) -> list[dict]:
    out = []
    for method, store in METHODS.items():
        d = tmp_path_factory.mktemp(method)
        cfg = {**RUN, "method": method, "store": store}
        assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(cfg),
                     "--out", str(d), "--threads", "1", "--no-progress"]) == 0
        out.append(json.loads((d / "record.json").read_text()))
    return out


def test_every_measured_phase_gets_a_modelled_value(records, small_dataset):
    from hotcold.config import ModelConfig

    shape = ModelShape.of(small_dataset, ModelConfig(8, (8,), (8, 1)))
    for rec in records:
        for prof in (_profile(), load_profile(HARDWARE / "a100-dgx.yaml")):
            p = predict_record(rec, prof, methods.price(rec["method"]), shape)
            measured = rec["summary"]["phase_ms_mean"]
            assert set(measured) <= set(p.phases_ms), rec["method"]
            assert p.step_ms > 0 and p.step_ms == pytest.approx(sum(p.phases_ms.values()))
    guessed = Workload.from_record(records[0])
    assert guessed.shape.num_tables == 4 and guessed.assumptions  # 4 id columns, and it says it assumed


# -- the validation table ----------------------------------------------------------------------------------

def _fake_record(method: str, phases: dict[str, float], stable: bool = True, seed: int = 0) -> dict:
    return {"dataset": "d", "method": method, "variant": "base", "seed": seed, "status": "ok",
            "config": {"method": method, "model": {"embedding_dim": 16}, "train": {"row_optimizer": "sgd"}},
            "summary": {"timer": "cpu", "batch_size": 10, "stable": stable, "phase_ms_mean": phases,
                        "step_ms_mean": sum(phases.values()),
                        "counters_per_step": {"lookups": 1000, "unique_rows": 100}}}


def test_validation_error_arithmetic_and_the_five_percent_filter(tmp_path):
    prof = _profile(dense_flops=1000.0)
    modelled = _predict(Workload.from_record(_fake_record("hybrid", {})), prof).phases_ms
    # measured: emb_fwd twice the model, dense exactly the model, d2h tiny (< 5% of the step)
    phases = {"emb_fwd": 2 * modelled["emb_fwd"], "dense_fwd_bwd": modelled["dense_fwd_bwd"], "d2h": 1e-9}
    rows = validation_frame([_fake_record("hybrid", phases)], prof)
    by = rows.set_index("phase")
    assert by.loc["emb_fwd", "rel_error"] == pytest.approx(-0.5)
    assert by.loc["dense_fwd_bwd", "rel_error"] == pytest.approx(0.0)
    assert by.loc["step", "measured_ms"] == pytest.approx(sum(phases.values()))
    assert by.loc["step", "rel_error"] == pytest.approx(
        (by.loc["step", "modelled_ms"] - sum(phases.values())) / sum(phases.values()))
    assert by.loc["h2d", "measured_ms"] == 0  # modelled but not measured: listed, error undefined
    summary = summary_frame(rows).iloc[0]
    assert summary["phases"] == "emb_fwd, dense_fwd_bwd"  # d2h is below 5% of the step
    assert summary["median_abs_phase_error"] == pytest.approx(0.25)  # median of |-0.5| and 0
    assert summary["runs"] == 1 and summary["runs_unstable"] == 0


def test_scale_out_runs_are_validated_only_with_network_rates(tmp_path):
    one = _fake_record("hybrid", {"emb_fwd": 1.0, "dense_fwd_bwd": 1.0})
    two = _fake_record("sharded", {"emb_fwd": 1.0, "dense_fwd_bwd": 1.0, "output_a2a": 1.0})
    two["summary"].update(world=2, ranks_per_node=1)
    two["summary"]["counters_per_step"].update(served_lookups=1000, output_a2a_bytes=1e5, inter_node_bytes=1e5)
    write_validation([one, two], _profile(), tmp_path)
    rows = pd.read_csv(tmp_path / "costmodel_validation.csv")
    assert set(rows["method"]) == {"hybrid"}
    assert "1 scale-out run(s) left out" in (tmp_path / "costmodel_validation.md").read_text()
    write_validation([one, two], _profile(**NET), tmp_path)
    rows = pd.read_csv(tmp_path / "costmodel_validation.csv")
    assert set(rows["method"]) == {"hybrid", "sharded"}
    assert set(rows[rows["method"] == "sharded"]["world"]) == {2}
    assert "left out" not in (tmp_path / "costmodel_validation.md").read_text()
    by = rows[rows["method"] == "sharded"].set_index("phase")
    # each rank sends 50 kB at 1 GB/s plus 10 us, then reorders its 500 vectors (a 32 kB buffer: cached)
    assert by.loc["output_a2a", "modelled_ms"] == pytest.approx(1e5 / 2 / 1e6 + 0.01 + 500 * 5e-6 + 2e-3)


def test_unstable_runs_are_listed_but_left_out_of_the_summary(tmp_path):
    prof = _profile()
    good = _fake_record("hybrid", {"emb_fwd": 1.0, "dense_fwd_bwd": 1.0})
    bad = copy.deepcopy(_fake_record("hybrid", {"emb_fwd": 100.0, "dense_fwd_bwd": 100.0}, stable=False, seed=1))
    write_validation([good, bad], prof, tmp_path)
    rows = pd.read_csv(tmp_path / "costmodel_validation.csv")
    assert set(rows["seed"]) == {0, 1}
    alone = summary_frame(validation_frame([good], prof))
    both = pd.read_csv(tmp_path / "costmodel_validation_summary.csv")
    assert both.loc[0, "runs"] == 1 and both.loc[0, "runs_unstable"] == 1
    assert both.loc[0, "median_abs_phase_error"] == pytest.approx(alone.loc[0, "median_abs_phase_error"])
    md = (tmp_path / "costmodel_validation.md").read_text()
    assert "test-cpu" in md and "stable runs only" in md


def test_validation_verb_writes_the_tables(tmp_path, records):
    paths = []
    for i, rec in enumerate(records):
        d = tmp_path / "runs" / "small" / rec["method"] / "base" / "seed~0"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(rec))
        paths.append(str(d / "record.json"))
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(_profile_dict()))
    assert main(["costmodel-validation", *paths, "--profile", str(prof), "--out", str(tmp_path / "t"),
                 "--data", str(tmp_path / "nowhere")]) == 0
    rows = pd.read_csv(tmp_path / "t" / "costmodel_validation.csv")
    assert set(rows["method"]) == set(METHODS)
    assert main(["costmodel-validation", *paths, "--profile", str(tmp_path / "missing.yaml")]) == 2
