"""Sharding plans: one planner per plan, and ``build_plan``, which runs one and checks it.

Table-wise, row-wise and lookup-balanced plans use the sharded tier only;
``data-parallel``, ``twrw`` and ``auto`` give each table a plan type
(``table_plans``: data-parallel tables in the ``ALL`` tier);
FlexShard places rows in all three tiers (``plan_types``: ``SHARDED``,
``NODE``, ``ALL``). Column-wise is the one plan that splits rows: each table's
columns are cut into shards placed on distinct ranks (``column_wise``), and
every lookup asks each of its table's shard owners for its slice.

Every plan has the same per-rank memory budget, ``memory_headroom`` times the
row-wise shard per rank; a plan that does not fit it cannot run
(``InfeasibleError``), and bad options fail before training (``ConfigError``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from hotcold import counters
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
           "COLUMN_OPTIONS", "COLUMN_STATES", "build_plan", "check_options", "check_plan_options", "column_wise", "row_wise", "sharded_plan", "table_wise"]


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


#: the column-wise plan's options (``plan_options``): each shard's width in columns (TorchRec's
#: ``min_partition``; default the narrowest divisor of the dimension at least ``max(4, D / P)`` wide), and the
#: row-wise Adagrad state of a shard: ``row`` (every shard keeps the whole row's state, its owners exchanging
#: each row's squared-gradient partial sums: the ``device`` model) or ``shard`` (TorchRec/FBGEMM's: each shard's
#: own row-wise state over its columns, nothing exchanged; a different model under Adagrad, the same under SGD)
COLUMN_OPTIONS = ("width", "state")
COLUMN_STATES = ("row", "shard")
MIN_COLUMN_WIDTH = 4


def column_width(dim: int, world: int, width: int | None = None) -> int:
    """Columns per shard: the narrowest divisor of ``dim`` at least ``width`` (default ``max(4, ceil(D/P))``)."""
    low = width if width is not None else max(MIN_COLUMN_WIDTH, -(-dim // world))
    return next((w for w in range(max(1, low), dim + 1) if dim % w == 0), dim)


def column_wise(inputs: PlanInputs) -> Plan:
    """TorchRec's CW: each table's columns cut into shards of ``width`` columns, the shards of a table on
    distinct ranks: tables by expected lookups (most first), each table's shards to the ranks with the fewest
    expected lookups (then the fewest bytes held) that have room for a shard under the budget."""
    p, d, sizes = inputs.topology.world, inputs.dim, np.asarray(inputs.table_sizes, dtype=np.int64)
    width = column_width(d, p, inputs.options.get("width"))
    shards = d // width
    if shards > p:
        raise InfeasibleError(f"column-wise: {shards} column shards of {width} columns per table need {shards} "
                              f"ranks, the world has {p} (set plan_options width to at least {-(-d // p)})")
    lookups = np.add.reduceat(inputs.counts, inputs.bounds[:-1]) if inputs.num_rows else np.zeros(0)
    lookups = np.where(sizes > 0, lookups, 0)
    shard_bytes = sizes * (width + counters.shard_state_floats(inputs.state_width, shards)) * counters.FLOAT_BYTES
    budget = inputs.budget_bytes()
    used, load = np.zeros(p, dtype=np.int64), np.zeros(p, dtype=np.int64)
    ranks = np.zeros((sizes.size, shards), dtype=np.int32)
    for t in sorted(range(sizes.size), key=lambda t: (-lookups[t], -sizes[t], t)):
        room = np.flatnonzero(used + shard_bytes[t] <= budget)
        if room.size < shards:
            raise InfeasibleError(f"column-wise: table {t}'s {shards} shards ({int(shard_bytes[t])} bytes each) fit "
                                  f"on {room.size} ranks under the budget of {budget} bytes per rank (headroom "
                                  f"{inputs.headroom} x the row-wise shard)")
        pick = np.sort(room[np.lexsort((room, used[room], load[room]))][:shards])
        ranks[t] = pick
        used[pick] += shard_bytes[t]
        load[pick] += lookups[t]
    state = inputs.options.get("state", COLUMN_STATES[0])
    if shards == 1:  # one shard of every column: whole tables on ranks, routed as the table-wise plan
        return sharded_plan("column", inputs, np.repeat(ranks[:, 0], sizes), column_width=width, column_state=state)
    plan = sharded_plan("column", inputs, np.zeros(inputs.num_rows), column_width=width, column_state=state)
    plan.columns, plan.column_ranks = shards, ranks
    return plan


def check_column_options(where: str, options: Mapping | None) -> None:
    """The column plan's ``plan_options`` (``COLUMN_OPTIONS``), one line naming the option on error."""
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: plan_options must map option names to values, got {options!r}")
    for key, value in options.items():
        if key not in COLUMN_OPTIONS:
            raise ConfigError(f"{where}: plan_options: unknown option {key!r} of plan column; known: "
                              f"{list(COLUMN_OPTIONS)}")
        if key == "width":
            require(is_int(value) and value > 0, where, f"plan_options: width must be a positive number of "
                    f"columns, got {value!r}")
        if key == "state":
            require(value in COLUMN_STATES, where, f"plan_options: state must be one of {list(COLUMN_STATES)}, "
                    f"got {value!r}")


#: every planner by name, in the order the plans are listed to users
PLANNERS: dict[str, Callable[[PlanInputs], Plan]] = {"table": table_wise, "row": row_wise, "column": column_wise,
                                                    "balanced": balanced, "recshard": recshard,
                                                    "flexshard": flexshard, "flexshard-device": flexshard_on_device,
                                                    **table_plans.PLANNERS}
PLANS = tuple(PLANNERS)  # the options check names against ``options.sharded.PLANS``, the same list as data


def check_store_plan(options: Any, where: str) -> None:
    """The plan-specific ``plan_options`` of a sharded store's options (the registry runs it after the
    options' own checks, which know the plans by name only)."""
    check_plan_options(where, options.plan, getattr(options, "plan_options", None))


def check_plan_options(where: str, plan: str, options: Mapping | None) -> None:
    """A store's ``plan_options``, given to the plan that takes them: recshard's or a per-table plan's."""
    if plan in table_plans.OPTIONS:
        table_plans.check_options(where, plan, options)
    elif plan == "column":
        check_column_options(where, options)
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
