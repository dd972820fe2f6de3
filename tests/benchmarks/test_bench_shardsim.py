"""Throughput of shard-sim's batch routing (``make bench``; not in the default run).

The trace is a generated Criteo-Kaggle-style dataset at the real table sizes
(26 tables, ~33.8M rows, 1M samples) read in training order at 16x8 ranks
with 512 samples per rank (global batch 65,536), 12 batches (~20M lookups).
Plans: row-wise, lookup-balanced and FlexShard at headroom 1.25, planned once
outside the timings. Timed: reading the batches, the stream through all three
plans at once (``ScaleSweep.route_all``, reads included), and through each
plan alone. ``extra_info["lookups_per_s"]`` is lookups over the median round;
the issue asks for at least 20M lookups/s on one core. ``hotcold bench
shard-sim`` prints the same numbers on any dataset, with peak memory.
"""
from __future__ import annotations

import numpy as np
import pytest

from hotcold.run_config import RunConfig
from hotcold.data.skew import row_counts
from hotcold.distributed.routing import route_counts
from hotcold.data.order import table_batches
from hotcold.distributed.shardsim import Scale, dense_parameters, plan_scale
from hotcold.jit import KERNEL

PER_RANK, BATCHES, SCALE = 512, 12, Scale(16, 8)
PLANS = ["row", "balanced", "flexshard"]


@pytest.fixture(scope="module")
def setup(kaggle):
    cfg = RunConfig.from_dict({"dataset": "-", "method": "-", "train": {"steps": BATCHES, "warmup_steps": 0}})
    topo = SCALE.topology()
    batch = PER_RANK * topo.world
    sweep, entries = plan_scale(kaggle, topo, PLANS, [1.25], row_counts(kaggle, "train"), batch,
                                cfg.model.embedding_dim, 1, dense_parameters(kaggle, cfg), BATCHES, {})
    assert len(sweep.traffic) == len(PLANS) + 1  # flexshard's sync-free twin (``SYNC_FREE``) is routed too
    lookups = sum(int((b >= 0).sum()) for b in table_batches(kaggle, cfg, batch))
    route_counts(np.zeros((2, 1), dtype=np.int64), np.zeros((1, 1), dtype=np.uint8), 2, 1)  # compile first
    return kaggle, cfg, sweep, batch, lookups


def _info(benchmark, lookups: int, plans: int) -> None:
    benchmark.extra_info.update(kernel=KERNEL, lookups=lookups, plans=plans, scale="16x8", batch_per_rank=PER_RANK)
    benchmark.extra_info["lookups_per_s"] = lookups / benchmark.stats.stats.median
    benchmark.extra_info["plan_lookups_per_s"] = plans * lookups / benchmark.stats.stats.median


def test_read_batches(benchmark, setup):
    ds, cfg, _, batch, lookups = setup
    benchmark.pedantic(lambda: sum(1 for _ in table_batches(ds, cfg, batch)), rounds=3, iterations=1)
    _info(benchmark, lookups, 0)


def test_stream_every_plan(benchmark, setup):
    ds, cfg, sweep, batch, lookups = setup
    benchmark.pedantic(lambda: sweep.route_all(table_batches(ds, cfg, batch), ds.column_offsets), rounds=3,
                       iterations=1)
    _info(benchmark, lookups, len(sweep.traffic))


@pytest.mark.parametrize("index", range(len(PLANS)), ids=PLANS)
def test_stream_one_plan(benchmark, setup, index):
    ds, cfg, sweep, batch, lookups = setup
    alone = sweep.only(index)
    counts = benchmark.pedantic(lambda: alone.route_all(table_batches(ds, cfg, batch), ds.column_offsets)[0],
                                rounds=3, iterations=1)
    assert counts.sum() > 0
    _info(benchmark, lookups, 1)
