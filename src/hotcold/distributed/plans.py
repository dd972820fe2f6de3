"""Sharding plans: one planner per plan, and ``build_plan``, which runs one and checks it.

Table-wise, row-wise and lookup-balanced plans use the sharded tier only;
``data-parallel``, ``twrw`` and ``auto`` give each table a plan type
(``table_plans``: data-parallel tables in the ``ALL`` tier);
FlexShard places rows in all three tiers (``plan_types``: ``SHARDED``,
``NODE``, ``ALL``). Column-wise is the one plan that splits rows: with
``columns = P`` every rank holds columns ``[r D/P, (r+1) D/P)`` of every row,
and every lookup asks every rank for its slice.

Every plan has the same per-rank memory budget, ``memory_headroom`` times the
row-wise shard per rank; a plan that does not fit it cannot run
(``InfeasibleError``), and bad options fail before training (``ConfigError``).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from hotcold.config import ConfigError, InfeasibleError, is_int, is_real, require
from hotcold.distributed.flexshard import flexshard, flexshard_on_device
from hotcold.distributed.plan_types import (
    ALL,
    DEFAULT_HEADROOM,
    NODE,
    SHARDED,
    TIER_NAMES,
    Plan,
    PlanInputs,
    rowwise_owner,
    sharded_plan,
)
from hotcold.distributed.balanced import balanced
from hotcold.distributed import table_plans
from hotcold.distributed.recshard import check_plan_options as check_recshard_options, recshard

#: the plan types are re-exported: their home is ``plan_types``, and callers may still take them from here
__all__ = ["ALL", "DEFAULT_HEADROOM", "NODE", "PLANNERS", "PLANS", "SHARDED", "TIER_NAMES", "Plan", "PlanInputs",
           "build_plan", "check_options", "check_plan_options", "column_wise", "row_wise", "sharded_plan", "table_wise"]


def row_wise(inputs: PlanInputs) -> Plan:
    """TorchRec's RW: each table cut into P contiguous blocks of ``ceil(n/P)`` rows, block r on rank r."""
    return sharded_plan("row", inputs, rowwise_owner(inputs.table_sizes, inputs.topology.world,
                                                     np.arange(inputs.num_rows, dtype=np.int64)))


def table_wise(inputs: PlanInputs) -> Plan:
    """Whole tables on ranks: largest first, each to the rank with the fewest expected lookups that has room.

    ``table_ranks`` ({table index: rank}) pins tables before the greedy pass.
    """
    p, sizes, bounds = inputs.topology.world, inputs.table_sizes, inputs.bounds
    budget = inputs.budget_rows()
    lookups = np.add.reduceat(inputs.counts, bounds[:-1]) if inputs.num_rows else np.zeros(0)
    lookups = np.where(np.asarray(sizes) > 0, lookups, 0)
    rank_of = np.full(len(sizes), -1)
    used, load = np.zeros(p, dtype=np.int64), np.zeros(p)
    for key, rank in dict(inputs.options.get("table_ranks") or {}).items():
        t = int(key)
        rank_of[t] = rank
        used[rank] += sizes[t]
        load[rank] += lookups[t]
    for t in sorted(range(len(sizes)), key=lambda t: (-sizes[t], -lookups[t], t)):
        if rank_of[t] >= 0:
            continue
        room = np.flatnonzero(used + sizes[t] <= budget)
        if room.size == 0:
            raise InfeasibleError(f"table-wise: table {t} ({sizes[t]} rows) fits on no rank under the budget of "
                                  f"{budget} rows per rank (headroom {inputs.headroom} x the row-wise shard)")
        r = int(room[np.argmin(load[room])])
        rank_of[t], used[r], load[r] = r, used[r] + sizes[t], load[r] + lookups[t]
    owner = np.repeat(rank_of, sizes)
    return sharded_plan("table", inputs, owner, table_ranks=rank_of.tolist())


def column_wise(inputs: PlanInputs) -> Plan:
    """Every table's columns split evenly over all P ranks (``D/P`` columns each)."""
    p, d = inputs.topology.world, inputs.dim
    if d % p:  # TorchRec would place column blocks on a subset of ranks; this plan spans them all
        raise InfeasibleError(f"column-wise: embedding_dim {d} is not divisible by world {p}")
    plan = sharded_plan("column", inputs, np.zeros(inputs.num_rows))  # slot unused when columns > 1
    plan.columns = p
    return plan


#: every planner by name, in the order the plans are listed to users
PLANNERS: dict[str, Callable[[PlanInputs], Plan]] = {"table": table_wise, "row": row_wise, "column": column_wise,
                                                    "balanced": balanced, "recshard": recshard,
                                                    "flexshard": flexshard, "flexshard-device": flexshard_on_device,
                                                    **table_plans.PLANNERS}
PLANS = tuple(PLANNERS)


def check_plan_options(where: str, plan: str, options: Mapping | None) -> None:
    """A store's ``plan_options``, given to the plan that takes them: recshard's or a per-table plan's."""
    if plan in table_plans.OPTIONS:
        table_plans.check_options(where, plan, options)
    else:
        check_recshard_options(where, plan, options)


def check_options(inputs: PlanInputs, where: str = "plan") -> None:
    """Options every plan shares: ``memory_headroom`` and ``table_ranks``."""
    h = inputs.headroom
    require(is_real(h) and math.isfinite(h) and h >= 1.0, where,
            f"memory_headroom must be a number >= 1.0 (1.0: the row-wise shard), got {h!r}")
    pins = inputs.options.get("table_ranks") or {}
    require(isinstance(pins, Mapping), where, "table_ranks must map table indices to ranks")
    for key, rank in pins.items():
        t = int(key) if is_int(key) or (isinstance(key, str) and key.isdigit()) else None
        require(t is not None and 0 <= t < len(inputs.table_sizes), where,
                f"table_ranks names unknown table {key!r}; the dataset has tables 0..{len(inputs.table_sizes) - 1}")
        require(is_int(rank) and 0 <= rank < inputs.topology.world, where,
                f"table_ranks[{key}] must be a rank in 0..{inputs.topology.world - 1}, got {rank!r}")


def build_plan(name: str, inputs: PlanInputs) -> Plan:
    """The plan ``name`` for ``inputs``, checked against the memory budget."""
    if name not in PLANS:
        raise ConfigError(f"unknown plan {name!r}; known: {list(PLANS)}")
    check_options(inputs, f"plan {name}")
    plan = PLANNERS[name](inputs)
    held, budget = plan.bytes_held(inputs.dim, inputs.state_width), inputs.budget_bytes()
    worst = int(np.argmax(held))
    if held[worst] > budget:
        raise InfeasibleError(f"plan {name}: rank {worst} needs {int(held[worst])} bytes, more than the budget of "
                              f"{budget} bytes per rank (memory_headroom {inputs.headroom} x the row-wise shard)")
    plan.details.setdefault("budget_rows", inputs.budget_rows())
    return plan
