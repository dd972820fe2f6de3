"""Plan types: where every embedding row lives, and what a planner sees (the planners are in ``plans.py``).

A plan places every global row in one of three tiers (FlexShard's names:
``SHARDED``, ``NODE``, ``ALL``; see ``Plan``), and every plan gets the same
per-rank memory budget (``PlanInputs.budget_bytes``). The types live apart
from the planning algorithms (as torchrec's ``planner/types.py`` does):
every planner imports them, and ``plans.py`` imports every planner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from hotcold import counters
from hotcold.config import Wire
from hotcold.distributed.topology import Topology
from hotcold.options.base import DEFAULT_HEADROOM

SHARDED, NODE, ALL = 0, 1, 2
TIER_NAMES = {SHARDED: "sharded", NODE: "node", ALL: "all"}


@dataclass
class Plan:
    """Where every row lives. ``tier`` and ``slot`` are [N] arrays over the global rows.

    A plan places every global row in one of three tiers (FlexShard's names):

    - ``SHARDED`` (0): one copy, on rank ``slot[row]``; every lookup goes there;
    - ``NODE`` (1): one copy per node, on the rank with index ``slot[row]``
      inside the node; lookups stay inside the requester's node, and the copies
      reduce their gradients across nodes;
    - ``ALL`` (2): a copy on every rank; lookups are local, and the copies
      reduce their gradients over all ranks.

    Column-wise is the one plan that splits rows (``columns`` > 1): each
    table's columns are cut into ``columns`` shards of ``D / columns``, and
    shard j of table t lives on rank ``column_ranks[t, j]`` (a table's shards
    on distinct ranks, a subset of the world when ``columns`` < P, as
    TorchRec places column shards).
    """

    name: str
    topology: Topology
    table_sizes: list[int]
    tier: np.ndarray            # int8 [N]
    slot: np.ndarray            # int32 [N]: owner rank (SHARDED), index in the node (NODE), -1 (ALL)
    columns: int = 1            # > 1: column-wise, each table cut into ``columns`` column shards
    column_ranks: np.ndarray | None = None  # int32 [T, columns]: the rank of each table's column shard j
    details: dict[str, Any] = field(default_factory=dict)  # plan-specific numbers for the record
    #: bool [N] or None: sharded rows kept in their owner's host memory, off the device budget (``rows_held``)
    off_device: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.tier.size)

    def serving_rank(self, requester: int | np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [L]: the rank that serves each lookup of ``rows`` [L] (row plans).

        ``requester`` is the asking rank: one int (the training store, which
        routes its own lookups) or an int array [L] (``shard-sim``, which
        routes a whole global batch at once): the one definition of routing.
        """
        tier = self.tier[rows]
        slot = self.slot[rows].astype(np.int64)
        requester = np.asarray(requester, dtype=np.int64)
        g = self.topology.ranks_per_node
        return np.where(tier == SHARDED, slot,
                        np.where(tier == NODE, self.topology.node(requester) * g + slot, requester))

    def route_codes(self) -> np.ndarray:
        """[N] one small unsigned code per row that routes it as ``serving_rank`` does (row plans).

        ``slot`` (< P) for a sharded row, ``P + slot`` (< P + G) for a node
        row, ``P + G`` for a row on every rank: one gather per lookup instead
        of two, in the smallest unsigned type that holds ``P + G``.
        """
        p, g = self.topology.world, self.topology.ranks_per_node
        dtype = route_code_dtype(p, g)
        codes = np.full(self.num_rows, p + g, dtype=dtype)
        sharded, node = self.tier == SHARDED, self.tier == NODE
        for mask, top, what in ((sharded, p, "a sharded row's owner"), (node, g, "a node row's slot")):
            if mask.any() and not (0 <= self.slot[mask].min() and self.slot[mask].max() < top):
                raise ValueError(f"plan {self.name}: {what} is outside 0..{top - 1}")
        if not np.isin(self.tier, (SHARDED, NODE, ALL)).all():
            raise ValueError(f"plan {self.name}: a row's tier is none of {sorted(TIER_NAMES)}")
        codes[sharded] = self.slot[sharded]
        codes[node] = self.slot[node] + p
        return codes

    def holds(self) -> np.ndarray:
        """bool [P, T]: whether each rank holds a column shard of each table (column-wise plans)."""
        assert self.column_ranks is not None, "a column-wise plan places its column shards"
        out = np.zeros((self.topology.world, len(self.table_sizes)), dtype=bool)
        out[self.column_ranks, np.arange(len(self.table_sizes))[:, None]] = True
        return out

    def shard_index(self, rank: int) -> np.ndarray:
        """int64 [T]: the column shard of each table ``rank`` holds, -1 for none (column-wise plans)."""
        assert self.column_ranks is not None, "a column-wise plan places its column shards"
        hit = self.column_ranks == rank
        return np.where(hit.any(axis=1), hit.argmax(axis=1), -1).astype(np.int64)

    def column_counts(self, lookups: np.ndarray) -> np.ndarray:
        """int64 [P, P]: lookups each requester sends each rank under a column-wise plan, from the requesters'
        lookups per table ``lookups`` [P, T] (each lookup goes to every shard owner of its table)."""
        return lookups @ self.holds().T.astype(np.int64)

    def column_exchange(self, distinct: np.ndarray, element: int) -> np.ndarray:
        """int64 [P, P]: bytes of the row-wise state's exchange (``column_exchange``) of ``distinct`` [T]."""
        return column_exchange(self.holds(), distinct, element)

    def owned(self, rank: int) -> np.ndarray:
        """bool [N]: the rows (or, column-wise, the row slices) ``rank`` holds."""
        if self.columns > 1:
            return np.repeat(self.holds()[rank], self.table_sizes)
        local = self.topology.local(rank)
        return (((self.tier == SHARDED) & (self.slot == rank)) | ((self.tier == NODE) & (self.slot == local))
                | (self.tier == ALL))

    def rows_held(self) -> np.ndarray:
        """int64 [P]: the rows (column-wise: row slices) every rank holds, ``owned(r).sum()`` for all r in one pass."""
        topo = self.topology
        p = topo.world
        if self.columns > 1:
            return self.holds().astype(np.int64) @ np.asarray(self.table_sizes, dtype=np.int64)
        on_device = self.tier == SHARDED if self.off_device is None else (self.tier == SHARDED) & ~self.off_device
        sharded = np.bincount(self.slot[on_device], minlength=p)[:p]
        node = np.bincount(self.slot[self.tier == NODE], minlength=topo.ranks_per_node)[:topo.ranks_per_node]
        everywhere = int((self.tier == ALL).sum())
        return (sharded + node[np.arange(p) % topo.ranks_per_node] + everywhere).astype(np.int64)

    def host_rows_held(self) -> np.ndarray:
        """int64 [P]: the rows every rank keeps in host memory (``off_device``), outside ``rows_held``."""
        if self.off_device is None:
            return np.zeros(self.topology.world, dtype=np.int64)
        return np.bincount(self.slot[self.off_device], minlength=self.topology.world).astype(np.int64)

    def bytes_held(self, dim: int, state_width: int) -> np.ndarray:
        """int [P]: bytes of weights and optimizer state per rank (a column shard keeps its rows' whole row-wise
        state, its columns' per-element state: ``counters.shard_state_floats``)."""
        floats = dim // self.columns + counters.shard_state_floats(state_width, self.columns)
        return self.rows_held() * floats * counters.FLOAT_BYTES

    def tier_rows(self) -> dict[str, int]:
        return {name: int((self.tier == t).sum()) for t, name in TIER_NAMES.items()}

    def describe(self, dim: int, state_width: int, budget: int) -> dict[str, Any]:
        """The plan's numbers for the run record."""
        held = self.bytes_held(dim, state_width)
        return {"plan": self.name, "world": self.topology.world, "ranks_per_node": self.topology.ranks_per_node,
                "columns": self.columns, "tier_rows": self.tier_rows(), "memory_bytes_per_rank": held.tolist(),
                "memory_budget_bytes": int(budget), "memory_used_share": float(held.max() / budget),
                "host_rows_per_rank": self.host_rows_held().tolist(), **self.details}


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
    wire: Wire = field(default_factory=Wire)   # what the collectives send: a planner pricing traffic reads it
    #: the rows by count, hottest first (``descending(counts)``): given where several plans share the counts
    #: (shard-sim's plans, headrooms and scales), computed at first use otherwise
    order: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def num_rows(self) -> int:
        return int(sum(self.table_sizes))

    @property
    def bounds(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.table_sizes)]).astype(np.int64)

    @classmethod
    def for_training(cls, table_sizes: Sequence[int], counts: np.ndarray, topology: Topology, dim: int,
                     state_width: int, headroom: float, options: Mapping[str, Any], batch_share: float,
                     wire: Wire | None = None, order: np.ndarray | None = None) -> "PlanInputs":
        """Inputs whose counts cover the training split, of which one step reads ``batch_share``:
        planners that model a step's traffic get ``lookups_per_step``."""
        per_step = {"lookups_per_step": float(np.sum(counts)) * batch_share}
        return cls(list(table_sizes), counts, topology, dim, state_width, headroom, {**options, **per_step},
                   wire or Wire(), order)

    def hottest_first(self) -> np.ndarray:
        """int64 [N]: the rows by count, hottest first (``descending``)."""
        if self.order is None:
            self.order = descending(self.counts)
        return self.order

    def row_bytes(self) -> int:
        return counters.row_bytes(self.dim, self.state_width)

    def rowwise_shard_rows(self) -> int:
        """Rows of the largest row-wise shard (TorchRec's RW: ``ceil(n/P)`` rows of each table)."""
        p = self.topology.world
        return int(sum(math.ceil(n / p) for n in self.table_sizes))

    def budget_bytes(self) -> int:
        """The per-rank memory every plan gets, the same for every plan: ``headroom`` x the row-wise shard."""
        return int(self.headroom * self.rowwise_shard_rows() * self.row_bytes())

    def budget_rows(self) -> int:
        return self.budget_bytes() // self.row_bytes()


def descending(counts: np.ndarray) -> np.ndarray:
    """Row order by count, hottest first (stable, so ties keep row order and plans are deterministic)."""
    return np.argsort(-np.asarray(counts, dtype=np.int64), kind="stable")


def column_exchange(holds: np.ndarray, distinct: np.ndarray, element: int) -> np.ndarray:
    """int64 [P, P]: bytes of a column-wise plan's row-wise state exchange: every shard owner of a table (``holds``
    [P, T]) sends every other owner one partial squared-gradient sum (``element`` bytes) per distinct row of the
    table updated, ``distinct`` [T] (summed over steps, the run's)."""
    h = holds.astype(np.int64)
    out = (h * np.asarray(distinct, dtype=np.int64)) @ h.T * element
    np.fill_diagonal(out, 0)
    return out


def rowwise_owner(table_sizes: Sequence[int], world: int, rows: np.ndarray) -> np.ndarray:
    """int64 [L]: the rank of global ``rows`` under TorchRec's RW (each table in ``world`` blocks of ``ceil(n/P)``)."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    table = np.searchsorted(bounds, rows, side="right") - 1
    block = -(-sizes // world)
    return ((np.asarray(rows, dtype=np.int64) - bounds[table]) // np.maximum(block[table], 1)).astype(np.int64)


def route_code_dtype(world: int, ranks_per_node: int) -> np.dtype:
    """The smallest unsigned type of ``Plan.route_codes`` at ``world`` ranks of ``ranks_per_node`` per node."""
    top = world + ranks_per_node
    return np.dtype(np.uint8 if top <= np.iinfo(np.uint8).max else np.uint16 if top <= np.iinfo(np.uint16).max
                    else np.uint32)


def sharded_plan(name: str, inputs: PlanInputs, owner: np.ndarray, **details: Any) -> Plan:
    """A plan of the sharded tier only: row ``i`` on rank ``owner[i]``."""
    return Plan(name, inputs.topology, list(inputs.table_sizes), np.zeros(inputs.num_rows, dtype=np.int8),
                owner.astype(np.int32), details=dict(details))
