"""Sharding plans: which rank serves each embedding row, and what each rank holds.

A plan places every global row in one of three tiers (FlexShard's names):

- ``SHARDED`` (0): one copy, on rank ``slot[row]``; every lookup goes there;
- ``NODE`` (1): one copy per node, on the rank with index ``slot[row]``
  inside the node; lookups stay inside the requester's node, and the copies
  reduce their gradients across nodes;
- ``ALL`` (2): a copy on every rank; lookups are local, and the copies
  reduce their gradients over all ranks.

Table-wise, row-wise and RecShard-like plans use the sharded tier only.
Column-wise is the one plan that splits rows: with ``columns = P`` every rank
holds columns ``[r D/P, (r+1) D/P)`` of every row, and every lookup asks every
rank for its slice.

Every plan has the same per-rank memory budget, ``memory_headroom`` times the
row-wise shard per rank; a plan that does not fit it cannot run
(``InfeasibleError``), and bad options fail before training (``ConfigError``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hotcold.config import ConfigError, InfeasibleError, is_int, is_real, require
from hotcold.counters import FLOAT_BYTES, row_bytes
from hotcold.distributed.topology import Topology

SHARDED, NODE, ALL = 0, 1, 2
TIER_NAMES = {SHARDED: "sharded", NODE: "node", ALL: "all"}
DEFAULT_HEADROOM = 1.25


@dataclass
class Plan:
    """Where every row lives. ``tier`` and ``slot`` are [N] arrays over the global rows."""

    name: str
    topology: Topology
    table_sizes: list[int]
    tier: np.ndarray            # int8 [N]
    slot: np.ndarray            # int32 [N]: owner rank (SHARDED), index in the node (NODE), -1 (ALL)
    columns: int = 1            # > 1: column-wise, every rank holds 1/columns of every row
    details: dict[str, Any] = field(default_factory=dict)  # plan-specific numbers for the record

    @property
    def num_rows(self) -> int:
        return int(self.tier.size)

    def serving_rank(self, requester: int, rows: np.ndarray) -> np.ndarray:
        """int64 [L]: the rank that serves each of ``requester``'s lookups (row plans)."""
        tier = self.tier[rows]
        slot = self.slot[rows].astype(np.int64)
        g = self.topology.ranks_per_node
        return np.where(tier == SHARDED, slot,
                        np.where(tier == NODE, self.topology.node(requester) * g + slot, requester))

    def owned(self, rank: int) -> np.ndarray:
        """bool [N]: the rows (or, column-wise, the row slices) ``rank`` holds."""
        if self.columns > 1:
            return np.ones(self.num_rows, dtype=bool)
        local = self.topology.local(rank)
        return (((self.tier == SHARDED) & (self.slot == rank)) | ((self.tier == NODE) & (self.slot == local))
                | (self.tier == ALL))

    def rows_held(self) -> np.ndarray:
        """float [P]: rows each rank holds (a column-wise slice counts ``1/columns`` of a row's weights)."""
        return np.array([self.owned(r).sum() / self.columns for r in range(self.topology.world)])

    def bytes_held(self, dim: int, state_width: int) -> np.ndarray:
        """int [P]: bytes of weights and optimizer state per rank (column-wise slices keep the whole row state)."""
        rows = np.array([self.owned(r).sum() for r in range(self.topology.world)], dtype=np.int64)
        return rows * (dim // self.columns + state_width) * FLOAT_BYTES

    def tier_rows(self) -> dict[str, int]:
        return {name: int((self.tier == t).sum()) for t, name in TIER_NAMES.items()}

    def describe(self, dim: int, state_width: int, budget: int) -> dict[str, Any]:
        """The plan's numbers for the run record."""
        held = self.bytes_held(dim, state_width)
        return {"plan": self.name, "world": self.topology.world, "ranks_per_node": self.topology.ranks_per_node,
                "columns": self.columns, "tier_rows": self.tier_rows(), "memory_bytes_per_rank": held.tolist(),
                "memory_budget_bytes": int(budget), "memory_used_share": float(held.max() / budget),
                **self.details}


@dataclass
class PlanInputs:
    """What a planner sees: the tables, their access counts and the topology."""

    table_sizes: list[int]
    counts: np.ndarray          # int64 [N] training-split lookups of every row
    topology: Topology
    dim: int
    state_width: int
    headroom: float = DEFAULT_HEADROOM
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(sum(self.table_sizes))

    @property
    def bounds(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.table_sizes)]).astype(np.int64)

    @classmethod
    def for_training(cls, table_sizes: Sequence[int], counts: np.ndarray, topology: Topology, dim: int,
                     state_width: int, headroom: float, options: Mapping[str, Any], batch_share: float) -> "PlanInputs":
        """Inputs whose counts cover the training split, of which one step reads ``batch_share``:
        planners that model a step's traffic get ``lookups_per_step``."""
        per_step = {"lookups_per_step": float(np.sum(counts)) * batch_share}
        return cls(list(table_sizes), counts, topology, dim, state_width, headroom, {**options, **per_step})

    def row_bytes(self) -> int:
        return row_bytes(self.dim, self.state_width)

    def rowwise_shard_rows(self) -> int:
        """Rows of the largest row-wise shard (TorchRec's RW: ``ceil(n/P)`` rows of each table)."""
        p = self.topology.world
        return int(sum(math.ceil(n / p) for n in self.table_sizes))

    def budget_bytes(self) -> int:
        """The per-rank memory every plan gets: ``headroom`` x the row-wise shard."""
        return int(self.headroom * self.rowwise_shard_rows() * self.row_bytes())

    def budget_rows(self) -> int:
        return self.budget_bytes() // self.row_bytes()


def sharded_plan(name: str, inputs: PlanInputs, owner: np.ndarray, **details: Any) -> Plan:
    return Plan(name, inputs.topology, list(inputs.table_sizes), np.zeros(inputs.num_rows, dtype=np.int8),
                owner.astype(np.int32), details=dict(details))


def row_wise(inputs: PlanInputs) -> Plan:
    """TorchRec's RW: each table cut into P contiguous blocks of ``ceil(n/P)`` rows, block r on rank r."""
    p = inputs.topology.world
    owner = np.concatenate([np.arange(n) // math.ceil(n / p) for n in inputs.table_sizes])
    return sharded_plan("row", inputs, owner)


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


def _planner(name: str) -> Callable[[PlanInputs], Plan]:
    if name == "recshard":
        from hotcold.distributed.recshard import recshard
        return recshard
    if name == "flexshard":
        from hotcold.distributed.flexshard import flexshard
        return flexshard
    return {"table": table_wise, "row": row_wise, "column": column_wise}[name]


PLANS = ("table", "row", "column", "recshard", "flexshard")


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
    plan = _planner(name)(inputs)
    held, budget = plan.bytes_held(inputs.dim, inputs.state_width), inputs.budget_bytes()
    worst = int(np.argmax(held))
    if held[worst] > budget:
        raise InfeasibleError(f"plan {name}: rank {worst} needs {int(held[worst])} bytes, more than the budget of "
                              f"{budget} bytes per rank (memory_headroom {inputs.headroom} x the row-wise shard)")
    plan.details.setdefault("budget_rows", inputs.budget_rows())
    return plan
