"""Workloads from the simulators' counters, for runs that are simulated rather than trained.

``hotcold simulate`` writes one row per policy and size with the same
counter fields as a trained store's (``hotcold.counters.FIELDS``), summed
over its ``steps``; ``hotcold shard-sim`` one row per plan, scale and
headroom with every collective's bytes per step. ``simulated_workload`` and
``shard_sim_workload`` turn such a row, with the model's ``ModelShape`` and
the batch it was simulated at, into the ``Workload`` that
``Workload.from_record`` gives for a trained run of the same store: the
same per-step counters and the store report fields the pricing reads
(``capacity``, ``hot_rows``, ``window``, ``load_imbalance``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from hotcold.config import ConfigError
from hotcold.costmodel.workload import ModelShape, Workload
from hotcold.counters import FIELDS

#: ``hotcold simulate`` policies -> the method whose store they model (FAE and ScratchPipe by prefix)
CACHE_POLICIES = {"lru": "lru", "lfu": "lfu", "freqcache": "freqcache"}


def method_of_policy(policy: str) -> str:
    """The method a simulated policy models: ``lru``, ``lfu``, ``freqcache``, ``scratchpipe-W`` and ``fae-R``."""
    if policy in CACHE_POLICIES:
        return CACHE_POLICIES[policy]
    for prefix in ("scratchpipe", "fae"):
        if policy.startswith(prefix + "-"):
            return prefix
    raise ConfigError(f"simulated policy {policy!r} models no trained method (known: {sorted(CACHE_POLICIES)}, "
                      f"scratchpipe-W, fae-R)")


def _number(row: Mapping[str, Any], key: str) -> float:
    value = row.get(key, 0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(value) else value


def simulated_workload(row: Mapping[str, Any], shape: ModelShape, batch_size: int,
                       row_optimizer: str = "adagrad") -> Workload:
    """The workload of one ``hotcold simulate`` row (totals over ``steps`` -> per-step means, as a trained
    run's ``counters_per_step``), with the report its store would give."""
    policy = str(row["policy"])
    method = method_of_policy(policy)
    steps = _number(row, "steps")
    if steps <= 0:
        raise ConfigError(f"simulated {policy}: no steps in the row")
    if not bool(row.get("feasible", True)):
        raise ConfigError(f"simulated {policy} at {int(_number(row, 'capacity'))} rows is infeasible")
    counters = {f: _number(row, f) / steps for f in FIELDS if f in row and f != "prefetch_batch"}
    capacity = int(_number(row, "capacity"))
    ratio = _number(row, "cache_ratio")
    if method == "fae":
        report: dict[str, Any] = {"hot_rows": capacity, "hot_ratio": ratio}
        if not math.isnan(float(row.get("hot_input_share", math.nan) or math.nan)):
            report["hot_fraction"] = float(row["hot_input_share"])
        store = {"run_length": policy.split("-", 1)[1]}
    elif method == "scratchpipe":
        window = int(policy.split("-", 1)[1])
        report, store = {"capacity": capacity, "window": window}, {"window": window}
    else:
        report, store = {"capacity": capacity, "cache_ratio": ratio, "warm_rows": int(_number(row, "warm_rows"))}, \
            {"cache_ratio": ratio}
    return Workload(method=method, batch_size=int(batch_size), counters=counters, shape=shape,
                    row_optimizer=row_optimizer, store=store, report=report,
                    assumptions=(f"counters simulated ({policy}, {int(steps)} steps)",))


def lookup_workload(method: str, counters: Mapping[str, float], shape: ModelShape, batch_size: int,
                    row_optimizer: str = "adagrad") -> Workload:
    """``device`` or ``hybrid`` from a trace's per-step lookups and unique rows: every row on the device
    (all hits), or every lookup served from the host (vectors over, gradients back)."""
    lookups, unique = float(counters["lookups"]), float(counters["unique_rows"])
    c = {f: 0.0 for f in FIELDS if f != "prefetch_batch"}
    c.update(lookups=lookups, unique_rows=unique)
    if method == "device":
        c.update(hits=lookups, unique_hits=unique)
    elif method == "hybrid":
        c.update(misses=lookups, unique_misses=unique, vector_bytes_h2d=lookups * shape.dim * 4,
                 grad_bytes_d2h=lookups * shape.dim * 4)
    else:
        raise ConfigError(f"lookup_workload: {method!r} is neither device nor hybrid")
    return Workload(method=method, batch_size=int(batch_size), counters=c, shape=shape, row_optimizer=row_optimizer,
                    assumptions=("counters from the simulated trace's lookups and unique rows",))


def shard_sim_workload(row: Mapping[str, Any], shape: ModelShape, lookups: float, unique_rows: float,
                       early_lookups: float = 0.0, method: str = "sharded",
                       row_optimizer: str = "adagrad") -> Workload:
    """The workload of one ``hotcold shard-sim`` row (bytes per step, summed over ranks) at its global batch:
    ``lookups``, ``unique_rows`` and ``early_lookups`` (Proactive) per step come from the trace, which the
    row does not carry; the row's ``load_imbalance`` is the report's."""
    if str(row.get("status", "ok")) != "ok":
        raise ConfigError(f"shard-sim {row.get('plan')} at {row.get('world')} ranks: {row.get('status')}")
    counters = {f: 0.0 for f in FIELDS if f != "prefetch_batch"}
    for f in FIELDS:
        if f.endswith("_bytes") and f in row:
            counters[f] = _number(row, f)
    counters.update(lookups=float(lookups), unique_rows=float(unique_rows), served_lookups=float(lookups),
                    early_lookups=float(early_lookups))
    imbalance = _number(row, "load_imbalance") or 1.0
    return Workload(method=method, batch_size=int(_number(row, "batch_size")), counters=counters, shape=shape,
                    row_optimizer=row_optimizer, store={"plan": row.get("plan")},
                    report={"load_imbalance": imbalance}, world=int(_number(row, "world")),
                    ranks_per_node=int(_number(row, "ranks_per_node")),
                    assumptions=(f"counters from shard-sim ({row.get('plan')}, {int(_number(row, 'world'))} ranks)",))
