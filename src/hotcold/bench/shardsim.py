"""``hotcold bench shard-sim``: lookups per second of shard-sim on a dataset, and its peak memory.

Phases are timed apart: the row counts and the planners (once per plan x
headroom, whatever the number of batches), then the stream (each batch read
from the memory-mapped dataset once and routed through every distinct plan,
``ScaleSweep.run``), then the same stream through each distinct plan alone.
Lookups are the batches' non-padding ids, duplicates included, as the
training store counts them. The plain per-step path (``route`` +
``step_matrices`` + ``Ledger``, the form the stream sums) runs on the first
``reference_batches`` batches of the same trace, interleaved, and must give the
same totals. The numba kernel is compiled before timing (``compile_s``).
"""
from __future__ import annotations

import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any, Callable

import numpy as np

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.data.skew import row_counts
from hotcold.distributed.plans import PLANS, build_plan
from hotcold.distributed.routing import route_counts
from hotcold.data.order import global_batches, table_batches
from hotcold.distributed.shardsim import Scale, ScaleSweep, dense_parameters, plan_scale, route, step_matrices
from hotcold.distributed.traffic import Ledger
from hotcold.jit import KERNEL


@dataclass
class ShardSimBenchConfig:
    scale: str = "16x8"
    plans: tuple[str, ...] = ("row", "balanced", "flexshard")
    headrooms: tuple[float, ...] = (1.25,)
    batch_per_rank: int = 512
    batches: int = 20
    reference_batches: int = 2     # batches of the plain per-step path (0: skip)
    repeats: int = 3               # timed passes of each stream (the median is reported)
    run_config: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        Scale.parse(self.scale)
        for name in ("batch_per_rank", "batches", "repeats"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"bench shard-sim: {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not (isinstance(self.reference_batches, int) and 0 <= self.reference_batches <= self.batches):
            raise ConfigError(f"bench shard-sim: reference_batches must be in [0, batches={self.batches}], "
                              f"got {self.reference_batches!r}")
        bad = [p for p in self.plans if p not in PLANS]
        if bad or not self.plans:
            raise ConfigError(f"bench shard-sim: plans must be some of {list(PLANS)}, got {list(self.plans)}")


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _warm_up() -> float:
    """Compile the routing kernel (both code widths) outside the timings; seconds taken."""
    t = time.perf_counter()
    for dtype in (np.uint8, np.uint16):
        route_counts(np.array([[0, -1], [1, 0]]), np.zeros((2, 1), dtype=dtype), 2, 1)
    return time.perf_counter() - t


def run_bench(ds: Dataset, config: ShardSimBenchConfig) -> dict[str, Any]:
    """Time shard-sim's phases on ``ds``; the result's ``stream`` and ``single`` give lookups/s."""
    from hotcold.embedding.update import RowOptimizer

    config.validate()
    train = {**config.run_config.get("train", {}), "steps": config.batches, "warmup_steps": 0}
    cfg = RunConfig.from_dict({"dataset": "-", "method": "-", **config.run_config, "train": train})
    topo = Scale.parse(config.scale).topology()
    batch = config.batch_per_rank * topo.world
    t = cfg.train
    dim = cfg.model.embedding_dim
    state = RowOptimizer(t.row_optimizer, t.lr).state_width(dim)
    out: dict[str, Any] = {"config": asdict(config), "dataset": str(ds.path), "rows": int(sum(ds.cardinalities)),
                           "batch_size": batch, "kernel": KERNEL, "compile_s": _warm_up()}
    clock = time.perf_counter()
    counts = row_counts(ds, "train")
    dense = dense_parameters(ds, cfg)
    out["row_counts_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    sweep, entries = plan_scale(ds, topo, list(config.plans), list(config.headrooms), counts, batch, dim, state,
                                dense, t.steps, {})
    out["planning_s"] = time.perf_counter() - clock
    out["plans_feasible"] = sum(e.traffic >= 0 for e in entries)
    out["plans_distinct"] = len(sweep.traffic)
    out["rss_before_stream"] = peak_rss_bytes()
    batches = lambda: table_batches(ds, cfg, batch)  # noqa: E731  (the same trace every time)
    offsets = ds.column_offsets
    lookups = sum(int((b >= 0).sum()) for b in batches())
    read_s = _median(config.repeats, lambda: sum(1 for _ in batches()))
    stream_s = _median(config.repeats, lambda: sweep.route_all(batches(), offsets))
    out["read"] = {"seconds": read_s, "lookups_per_s": lookups / read_s}
    out["stream"] = {"lookups": lookups, "seconds": stream_s, "lookups_per_s": lookups / stream_s,
                     "plan_lookups_per_s": lookups * len(sweep.traffic) / stream_s}
    # each distinct plan alone (its codes out of the sweep's), then the booking of the whole stream
    out["single"], out["reference"] = [], []
    first = {}
    for e in entries:
        if e.traffic >= 0 and e.traffic not in first:
            first[e.traffic] = e
    alone = {i: sweep.only(i) for i in first}
    for i, e in first.items():
        seconds = _median(config.repeats, lambda: alone[i].route_all(batches(), offsets))
        alone[i].run(batches(), offsets)
        out["single"].append({"plan": e.key["plan"], "memory_headroom": e.key["memory_headroom"],
                              "traffic": i, "seconds": seconds, "lookups_per_s": lookups / seconds})
    sweep.run(batches(), offsets)
    for i, e in first.items():
        assert np.array_equal(alone[i].traffic[0].counts, sweep.traffic[i].counts), "routed differently alone"
    del alone
    # the plain per-step path on the first batches of the same trace (replans each plan: reads its tiers)
    for i, e in first.items():
        if not config.reference_batches:
            break
        plan = build_plan(e.key["plan"], _inputs(ds, topo, counts, batch, dim, state, e.key["memory_headroom"]))
        ref_lookups, ref_s, same = _reference(plan, ds, cfg, batch, dim, state, dense, config.reference_batches)
        out["reference"].append({"plan": e.key["plan"], "memory_headroom": e.key["memory_headroom"],
                                 "lookups": ref_lookups, "seconds": ref_s,
                                 "lookups_per_s": ref_lookups / ref_s, "same_totals": same})
        del plan
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def _median(repeats: int, fn: Callable[[], object]) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        fn()
        times.append(time.perf_counter() - clock)
    return float(np.median(times))


def _inputs(ds: Dataset, topo, counts, batch: int, dim: int, state: int, headroom: float):
    from hotcold.distributed.plan_types import PlanInputs

    start, stop = ds.split("train")
    return PlanInputs.for_training(ds.cardinalities, counts, topo, dim, state, headroom, {},
                                   batch / max(1, stop - start))


def _reference(plan, ds: Dataset, cfg: RunConfig, batch: int, dim: int, state: int, dense: int,
               batches: int) -> tuple[int, float, bool]:
    """The plain per-step path over the first ``batches`` batches: (lookups, seconds, same totals as the stream)."""
    ledger, lookups, seconds = Ledger(plan.topology), 0, 0.0
    sweep = ScaleSweep(plan.topology, plan.num_rows)
    sweep.add(plan, dim, state, dense)
    for b in islice(global_batches(ds, cfg, batch), batches):
        lookups += int((b >= 0).sum())
        clock = time.perf_counter()
        for c, m in step_matrices(plan, b, dim, state, dense, route(plan, b)).items():
            ledger.add(c, m)
        ledger.take_step()
        seconds += time.perf_counter() - clock
    sweep.run(islice(table_batches(ds, cfg, batch), batches), ds.column_offsets)
    same = all(np.array_equal(ledger.total[c], m) for c, m in sweep.traffic[0].matrices().items())
    return lookups, seconds, same


def render(result: dict[str, Any]) -> str:
    c = result["config"]
    s = result["stream"]
    lines = [f"shard-sim on {result['dataset']} ({result['rows']:,} rows) at {c['scale']}, "
             f"{c['batch_per_rank']} samples per rank (global batch {result['batch_size']:,}), {c['batches']} batches, "
             f"kernel {result['kernel']} (compile {result['compile_s']:.1f} s)",
             f"  row counts + dense size: {result['row_counts_s']:.1f} s; planning {len(c['plans'])} plan(s) x "
             f"{len(c['headrooms'])} headroom(s): {result['planning_s']:.1f} s "
             f"({result['plans_feasible']} feasible, {result['plans_distinct']} distinct)",
             f"  reading the batches alone: {result['read']['lookups_per_s'] / 1e6:.1f}M lookups/s",
             f"  stream, every distinct plan: {s['lookups']:,} lookups in {s['seconds']:.2f} s = "
             f"{s['lookups_per_s'] / 1e6:.1f}M lookups/s ({s['plan_lookups_per_s'] / 1e6:.1f}M plan-lookups/s)"]
    for one in result["single"]:
        lines.append(f"  {one['plan']} (headroom {one['memory_headroom']}) alone: "
                     f"{one['lookups_per_s'] / 1e6:.1f}M lookups/s; a 1.2B-lookup epoch: "
                     f"{1.2e9 / one['lookups_per_s']:.0f} s")
    for ref in result["reference"]:
        lines.append(f"  plain per-step path (reads not timed), {ref['plan']} (headroom {ref['memory_headroom']}), "
                     f"{ref['lookups']:,} lookups: {ref['lookups_per_s'] / 1e6:.2f}M lookups/s "
                     f"(same totals: {ref['same_totals']})")
    lines.append(f"  peak resident memory: {result['peak_rss_bytes'] / 2**30:.2f} GiB "
                 f"(before the stream: {result['rss_before_stream'] / 2**30:.2f} GiB)")
    return "\n".join(lines)


__all__ = ["ShardSimBenchConfig", "peak_rss_bytes", "render", "run_bench"]
