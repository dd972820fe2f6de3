"""The options of the ``sharded``, ``proactive`` and ``flexshard`` stores, and their checks.

``ShardedOptions``: the plan, the per-rank memory budget, pinned tables and
the row plan's output protocol; ``ProactiveOptions`` adds how many steps
ahead rows are looked up early; ``FlexShardOptions``: FlexShard's budget and
the link bandwidths its solver prices traffic with. The stores that take
them: ``distributed/sharded.py`` and ``distributed/proactive.py``. The plans'
names and the defaults are data here; each plan's own ``plan_options`` are
checked by the plans (``distributed.plans.check_store_plan``, which the
registry runs after these checks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from hotcold.config import is_int, is_positive_int, is_real, require
from hotcold.options.base import DEFAULT_HEADROOM, StoreOptions

#: every sharding plan by name, in the order they are listed to users (``distributed.plans.PLANNERS``' keys)
PLANS = ("table", "row", "column", "balanced", "recshard", "flexshard", "flexshard-device", "data-parallel", "twrw",
         "auto")
#: the row-wise plan's output protocols (the sharded store's ``rw_protocol``): ``lookup`` sends each lookup's
#: vector back in an all-to-all (TorchRec's sequence tables); ``reduce_scatter`` pools partial sums per sample and
#: table on the owners and reduce-scatters them, the gradients coming back by an all-gather (TorchRec's pooled
#: row-wise, ``PooledEmbeddingsReduceScatter``), with per-sample lengths in the input all-to-all
RW_PROTOCOLS = ("lookup", "reduce_scatter")
LOOKUP, REDUCE_SCATTER = RW_PROTOCOLS
#: FlexShard's solver prices traffic at these link bandwidths by default
DEFAULT_INTRA_GBPS = 300.0   # GB/s per GPU, NVLink-class
DEFAULT_INTER_GBPS = 25.0    # GB/s per GPU, a 200 Gb/s NIC
UNACCESSED = ("host", "device")   # ``unaccessed_rows``: where rows the profile never saw are kept (first: default)
REPLICA_SYNC = ("priced", "free")  # ``replica_sync``: the solver's price of keeping replicas in sync (first: default)


def _check_headroom(where: str, headroom: Any) -> None:
    require(is_real(headroom) and math.isfinite(headroom) and headroom >= 1.0, where,
            f"memory_headroom must be a number >= 1.0 (1.0: the row-wise shard), got {headroom!r}")


@dataclass(frozen=True)
class ShardedOptions(StoreOptions):
    """The hybrid-parallel exchange under one plan, in a per-rank memory budget."""

    plan: str = "row"                          # a sharding plan (``PLANS``)
    memory_headroom: float = DEFAULT_HEADROOM  # per-rank budget, as a multiple of the row-wise shard
    table_ranks: Mapping[str, int] | None = None  # table index -> rank, pinned before the table-wise planner
    plan_options: Mapping[str, Any] | None = None  # recshard's (``recshard.OPTIONS``) or ``table_plans.OPTIONS``
    #: the row plan's output protocol (``RW_PROTOCOLS``): ``lookup`` (each lookup's vector by all-to-all)
    #: or ``reduce_scatter`` (TorchRec's pooled row-wise: partial sums reduce-scattered, lengths sent)
    rw_protocol: str = LOOKUP

    def validate(self, where: str) -> None:
        require(self.plan in PLANS, where, f"unknown plan {self.plan!r}; known: {list(PLANS)}")
        require(self.rw_protocol in RW_PROTOCOLS, where,
                f"rw_protocol must be one of {list(RW_PROTOCOLS)}, got {self.rw_protocol!r}")
        require(self.rw_protocol == LOOKUP or self.plan == "row", where,
                f"rw_protocol {self.rw_protocol} is the row plan's protocol; plan {self.plan} sends lookups "
                f"(set plan row or rw_protocol lookup)")
        _check_headroom(where, self.memory_headroom)
        require(self.plan_options is None or isinstance(self.plan_options, Mapping), where,
                f"plan_options must map option names to values, got {self.plan_options!r}")
        pins = self.table_ranks
        require(pins is None or isinstance(pins, Mapping), where, "table_ranks must map table indices to ranks")
        for key, rank in (pins or {}).items():
            require((is_int(key) and key >= 0) or (isinstance(key, str) and key.isdigit()), where,
                    f"table_ranks: {key!r} is not a table index")
            require(is_int(rank) and rank >= 0, where, f"table_ranks[{key}] must be a rank >= 0, got {rank!r}")

    def planner_options(self) -> dict[str, Any]:
        """What the planner takes besides the headroom (``PlanInputs.options``)."""
        return {**({} if self.table_ranks is None else {"table_ranks": dict(self.table_ranks)}),
                **dict(self.plan_options or {})}


@dataclass(frozen=True)
class ProactiveOptions(ShardedOptions):
    """The sharded exchange with the rows of ``depth`` steps ahead looked up early."""

    depth: int = 1

    def validate(self, where: str) -> None:
        super().validate(where)
        require(is_positive_int(self.depth), where, f"depth must be a positive integer, got {self.depth!r}")
        require(self.rw_protocol == LOOKUP, where, f"proactive looks each lookup's row up early; rw_protocol "
                f"{self.rw_protocol} pools them on the owners (use method sharded, or rw_protocol lookup)")


@dataclass(frozen=True)
class FlexShardOptions(StoreOptions):
    """FlexShard's tiers: the budget, and the link bandwidths its solver prices traffic with."""

    plan: ClassVar[str] = "flexshard"
    memory_headroom: float = DEFAULT_HEADROOM
    intra_node_gbps: float = DEFAULT_INTRA_GBPS   # GB/s per rank inside a node
    inter_node_gbps: float = DEFAULT_INTER_GBPS   # GB/s per rank between nodes
    unaccessed_rows: str = UNACCESSED[0]          # rows the profile never saw: "host" (off the budget) or "device"
    replica_sync: str = REPLICA_SYNC[0]           # "free": train the sync-free plan (replicas priced at zero)

    def validate(self, where: str) -> None:
        _check_headroom(where, self.memory_headroom)
        for key, known in (("unaccessed_rows", UNACCESSED), ("replica_sync", REPLICA_SYNC)):
            require(getattr(self, key) in known, where, f"{key} must be one of {list(known)}, "
                    f"got {getattr(self, key)!r}")
        for key in ("intra_node_gbps", "inter_node_gbps"):
            v = getattr(self, key)
            require(is_real(v) and math.isfinite(v) and v > 0, where, f"{key} must be a positive number of GB/s, "
                    f"got {v!r}")

    def planner_options(self) -> dict[str, Any]:
        return {"intra_node_gbps": self.intra_node_gbps, "inter_node_gbps": self.inter_node_gbps,
                "unaccessed_rows": self.unaccessed_rows, "replica_sync": self.replica_sync}
