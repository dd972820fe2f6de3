"""The options of the ``sharded``, ``proactive`` and ``flexshard`` stores, and their checks.

``ShardedOptions``: the plan, the per-rank memory budget, pinned tables and
the row plan's output protocol; ``ProactiveOptions`` adds how many steps
ahead rows are looked up early; ``FlexShardOptions``: FlexShard's budget and
the link bandwidths its solver prices traffic with. The stores that take
them: ``sharded.py`` and ``proactive.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from hotcold.config import is_int, is_positive_int, is_real, require
from hotcold.distributed.flexshard import DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS, REPLICA_SYNC, UNACCESSED
from hotcold.distributed.plan_types import DEFAULT_HEADROOM
from hotcold.distributed.plans import PLANS, check_plan_options
from hotcold.distributed.traffic import LOOKUP, RW_PROTOCOLS
from hotcold.embedding.options import StoreOptions


def _check_headroom(where: str, headroom: Any) -> None:
    require(is_real(headroom) and math.isfinite(headroom) and headroom >= 1.0, where,
            f"memory_headroom must be a number >= 1.0 (1.0: the row-wise shard), got {headroom!r}")


@dataclass(frozen=True)
class ShardedOptions(StoreOptions):
    """The hybrid-parallel exchange under one plan, in a per-rank memory budget."""

    plan: str = "row"                          # a sharding plan (``plans.PLANS``)
    memory_headroom: float = DEFAULT_HEADROOM  # per-rank budget, as a multiple of the row-wise shard
    table_ranks: Mapping[str, int] | None = None  # table index -> rank, pinned before the table-wise planner
    plan_options: Mapping[str, Any] | None = None  # recshard's (``recshard.OPTIONS``) or ``table_plans.OPTIONS``
    #: the row plan's output protocol (``traffic.RW_PROTOCOLS``): ``lookup`` (each lookup's vector by all-to-all)
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
        pins = self.table_ranks
        require(pins is None or isinstance(pins, Mapping), where, "table_ranks must map table indices to ranks")
        for key, rank in (pins or {}).items():
            require((is_int(key) and key >= 0) or (isinstance(key, str) and key.isdigit()), where,
                    f"table_ranks: {key!r} is not a table index")
            require(is_int(rank) and rank >= 0, where, f"table_ranks[{key}] must be a rank >= 0, got {rank!r}")
        check_plan_options(where, self.plan, self.plan_options)

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
