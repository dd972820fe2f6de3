"""Per-table plans as TorchRec plans them: ``data-parallel`` tables, ``twrw`` (table-row-wise) and ``auto``.

Each table gets one plan type, mapped onto the plan tiers (``plan_types``):

- ``row``: TorchRec's RW, the table cut into P contiguous blocks of
  ``ceil(n/P)`` rows, block r on rank r (``SHARDED``);
- ``table``: the whole table on one rank (``SHARDED``);
- ``twrw``: TorchRec's table-row-wise, the table on one node, its rows in G
  contiguous blocks of ``ceil(n/G)`` over that node's ranks (``SHARDED`` with
  owners inside the node): a lookup crosses nodes only to that node;
- ``data-parallel``: a copy of the whole table on every rank (``ALL``):
  lookups are local and the copies all-reduce their gradients (the replica
  all-reduce, ``replica_sync``).

Three planners use them, all under the per-rank memory budget every plan
gets (``PlanInputs.budget_rows``; every table's rows count on each rank that
holds them):

- ``data-parallel``: the tables in ``data_parallel_tables``, else the smallest
  tables, smallest first, as long as their copies fit beside the row-wise
  rest (TorchRec's rule of thumb: small tables data-parallel); the rest row-wise.
- ``twrw``: every table on one node, largest first (by its rows per rank),
  each to the node with the fewest expected lookups that has room; a table
  that fits no node makes the plan infeasible.
- ``auto``: a plan type per table, minimising the modelled communication per
  step (``table_costs``: FlexShard's pricing, ``flexshard.unit_bytes`` on
  the wire and ``Bandwidths``, with each table's expected lookups from the
  profile counts). A greedy: start from row-wise; every (table, type) move
  that saves modelled time is ranked by its saving per extra row on the
  fullest rank it adds, and applied in that order where it fits (a table
  moves at most once). Every applied move saves time, so no table costs more
  than under row-wise and neither does the plan. Under the per-lookup
  protocol with ranks asking uniformly, a table-wise or TWRW table sends the
  same expected bytes as a row-wise one (a lookup leaves its node with
  probability (M-1)/M either way), so today only data-parallel moves save;
  the others tie and row-wise is kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hotcold.config import ConfigError, InfeasibleError, is_int, is_real
from hotcold.distributed.flexshard import (
    DEFAULT_INTER_GBPS,
    DEFAULT_INTRA_GBPS,
    Bandwidths,
    expected_lookups,
    unit_bytes,
)
from hotcold.distributed.plan_types import ALL, SHARDED, Plan, PlanInputs
from hotcold.distributed.traffic import ID_BYTES

ROW, TABLE, TWRW, DP = "row", "table", "twrw", "data-parallel"
KINDS = (ROW, TABLE, TWRW, DP)          # auto's plan types, in the order ties are broken
ALTERNATIVES = (TABLE, TWRW, DP)        # auto's ``plan_types`` default: every move away from row-wise
#: every plan's options (``plan_options``), by plan name
OPTIONS: dict[str, tuple[str, ...]] = {
    "data-parallel": ("data_parallel_tables",),
    "twrw": (),
    "auto": ("plan_types", "intra_node_gbps", "inter_node_gbps"),
}
#: a move saves time only if it saves more than this share of the table's row-wise time (float rounding)
TIE = 1e-9


def _err(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: plan_options: {msg}")


def check_options(where: str, plan: str, options: Mapping[str, Any] | None, tables: int | None = None) -> None:
    """``plan``'s ``plan_options``, one line naming the option on error (``tables``: check table indices too)."""
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: plan_options must map option names to values, got {options!r}")
    known = OPTIONS[plan]
    options = {k: v for k, v in options.items() if v is not None}   # null: the default
    for key in options:
        if key not in known:
            raise _err(where, f"unknown option {key!r} for plan {plan}; known: {list(known)}")
    if "data_parallel_tables" in options:
        _tables(where, options["data_parallel_tables"], tables)
    if "plan_types" in options:
        value = options["plan_types"]
        if isinstance(value, str) or not isinstance(value, Sequence) or not all(
                isinstance(k, str) and k in ALTERNATIVES for k in value):
            raise _err(where, f"plan_types must be a list of {list(ALTERNATIVES)}, got {value!r}")
    for key in ("intra_node_gbps", "inter_node_gbps"):
        if key in options:
            v = options[key]
            if not (is_real(v) and math.isfinite(v) and v > 0):
                raise _err(where, f"{key} must be a positive number of GB/s, got {v!r}")


def _tables(where: str, value: Any, tables: int | None) -> list[int]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(is_int(t) and t >= 0 for t in value):
        raise _err(where, f"data_parallel_tables must be a list of table indices, got {value!r}")
    if len(set(value)) != len(value):
        raise _err(where, f"data_parallel_tables names a table twice: {list(value)!r}")
    if tables is not None and any(t >= tables for t in value):
        raise _err(where, f"data_parallel_tables names unknown table {max(value)}; the dataset has tables "
                          f"0..{tables - 1}")
    return [int(t) for t in value]


def block_rows(n: int, parts: int) -> np.ndarray:
    """int64 [parts]: rows of each of ``parts`` contiguous blocks of ``ceil(n/parts)`` rows (the last ones short)."""
    block = max(-(-n // parts), 1)
    return np.clip(n - np.arange(parts, dtype=np.int64) * block, 0, block)


@dataclass
class Layout:
    """A plan type and a place per table, and the rows every rank holds under them."""

    inputs: PlanInputs
    kinds: list[str]
    where: list[int]              # rank (table), node (twrw), -1 (row, data-parallel)
    used: np.ndarray              # int64 [P]

    @classmethod
    def row_wise(cls, inputs: PlanInputs) -> "Layout":
        t = len(inputs.table_sizes)
        layout = cls(inputs, [ROW] * t, [-1] * t, np.zeros(inputs.topology.world, dtype=np.int64))
        for n in inputs.table_sizes:
            layout.used += block_rows(n, inputs.topology.world)
        return layout

    def usage(self, kind: str, n: int, where: int) -> np.ndarray:
        """int64 [P]: the rows a table of ``n`` rows puts on every rank as ``kind`` at ``where``."""
        topo = self.inputs.topology
        out = np.zeros(topo.world, dtype=np.int64)
        if kind == ROW:
            out += block_rows(n, topo.world)
        elif kind == TABLE:
            out[where] = n
        elif kind == TWRW:
            out[topo.node_ranks(where)] = block_rows(n, topo.ranks_per_node)
        else:
            out += n
        return out

    def room(self, t: int, kind: str, where: int) -> bool:
        """Whether table ``t`` moved to ``kind`` at ``where`` keeps every rank within the budget."""
        n = self.inputs.table_sizes[t]
        after = self.used - self.usage(self.kinds[t], n, self.where[t]) + self.usage(kind, n, where)
        return bool(after.max() <= self.inputs.budget_rows())

    def move(self, t: int, kind: str, where: int = -1) -> None:
        n = self.inputs.table_sizes[t]
        self.used += self.usage(kind, n, where) - self.usage(self.kinds[t], n, self.where[t])
        self.kinds[t], self.where[t] = kind, where

    def plan(self, name: str, **details: Any) -> Plan:
        """The plan: every row's tier and slot (owner rank; -1 for the copies on every rank)."""
        inputs, topo = self.inputs, self.inputs.topology
        tier = np.full(inputs.num_rows, SHARDED, dtype=np.int8)
        slot = np.full(inputs.num_rows, -1, dtype=np.int32)
        for t, (start, n) in enumerate(zip(inputs.bounds[:-1].tolist(), inputs.table_sizes)):
            rows = slice(start, start + n)
            local = np.arange(n, dtype=np.int64)
            kind, where = self.kinds[t], self.where[t]
            if kind == ROW:
                slot[rows] = local // max(-(-n // topo.world), 1)
            elif kind == TABLE:
                slot[rows] = where
            elif kind == TWRW:
                slot[rows] = where * topo.ranks_per_node + local // max(-(-n // topo.ranks_per_node), 1)
            else:
                tier[rows] = ALL
        counts = {k: self.kinds.count(k) for k in KINDS}
        return Plan(name, topo, list(inputs.table_sizes), tier, slot,
                    details={"table_plan_types": list(self.kinds), "table_places": list(self.where),
                             "tables_per_plan_type": counts, **details})


def table_lookups(inputs: PlanInputs) -> np.ndarray:
    """float [T]: every table's expected lookups in one global step (``flexshard.expected_lookups``, per table)."""
    per_row = expected_lookups(inputs)
    bounds = inputs.bounds
    return np.array([per_row[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.float64)


def table_costs(inputs: PlanInputs, bw: Bandwidths) -> dict[str, np.ndarray]:
    """Modelled (intra, inter) bytes [T, 2] and seconds [T] per step of every table under every plan type.

    A lookup costs ``unit_bytes``' per-lookup bytes (an id out, a vector back,
    a gradient out; sends to self free) on the links its requester (any rank,
    uniformly) and server sit on; a data-parallel table costs its rows' ring
    all-reduce over all P ranks (the dense price: the store sends the cheaper
    of that and an all-gather of the touched rows, so it is an upper bound).
    """
    topo = inputs.topology
    p, g, m = topo.world, topo.ranks_per_node, topo.nodes
    u = unit_bytes(topo, inputs.dim, inputs.wire)
    lookups = table_lookups(inputs)
    sizes = np.asarray(inputs.table_sizes, dtype=np.float64)
    per_lookup = ID_BYTES + 2 * inputs.dim * inputs.wire.vector_bytes   # as ``unit_bytes`` prices a lookup
    sharded = np.outer(lookups, u.lookup_sharded)
    # TWRW: asked from its own node (1/M) it is served inside the node unless by the asker itself (1/G);
    # asked from any other node ((M-1)/M), across nodes
    twrw = np.outer(lookups, [per_lookup * (g - 1) / g / m, per_lookup * (m - 1) / m])
    dp = np.outer(sizes, u.ring_all)
    out = {}
    for kind, b in ((ROW, sharded), (TABLE, sharded), (TWRW, twrw), (DP, dp)):
        out[kind] = np.asarray(bw.seconds(b[:, 0], b[:, 1], p), dtype=np.float64)
        out[kind + ":bytes"] = b
    return out


def _budget_error(plan: str, inputs: PlanInputs, what: str) -> InfeasibleError:
    return InfeasibleError(f"{plan}: {what} under the budget of {inputs.budget_rows()} rows per rank "
                           f"(memory_headroom {inputs.headroom} x the row-wise shard)")


def data_parallel(inputs: PlanInputs) -> Plan:
    """Chosen tables on every rank (``data_parallel_tables``, else the smallest that fit), the rest row-wise."""
    where = "plan data-parallel"
    check_options(where, "data-parallel", _own(inputs, "data-parallel"), len(inputs.table_sizes))
    layout = Layout.row_wise(inputs)
    sizes = inputs.table_sizes
    chosen = inputs.options.get("data_parallel_tables")
    if chosen is not None:
        for t in _tables(where, chosen, len(sizes)):
            layout.move(t, DP)
        if layout.used.max() > inputs.budget_rows():
            raise _budget_error("data-parallel", inputs, f"tables {list(chosen)} on every rank do not fit")
        rule = "data_parallel_tables"
    else:
        for t in sorted(range(len(sizes)), key=lambda t: (sizes[t], t)):
            if not layout.room(t, DP, -1):
                break   # the smallest tables first: a larger one fits no better
            layout.move(t, DP)
        rule = "smallest tables that fit"
    return layout.plan("data-parallel", data_parallel_rule=rule)


def twrw(inputs: PlanInputs) -> Plan:
    """TorchRec's table-row-wise: each table on one node (lookups balanced over the nodes), rows over its ranks."""
    check_options("plan twrw", "twrw", _own(inputs, "twrw"))
    topo, sizes = inputs.topology, inputs.table_sizes
    g = topo.ranks_per_node
    lookups = table_lookups(inputs)
    layout = Layout.row_wise(inputs)
    load = np.zeros(topo.nodes)
    layout.used[:] = 0
    layout.kinds = [TWRW] * len(sizes)
    layout.where = [0] * len(sizes)
    per_rank = [int(block_rows(n, g)[0]) for n in sizes]
    order = sorted(range(len(sizes)), key=lambda t: (-per_rank[t], -lookups[t], t))   # largest first
    for t in order:
        rows = block_rows(sizes[t], g)
        room = [m for m in range(topo.nodes)
                if (layout.used[topo.node_ranks(m)] + rows).max() <= inputs.budget_rows()]
        if not room:
            raise _budget_error("twrw", inputs, f"table {t} ({sizes[t]} rows, {int(rows[0])} per rank) fits on no "
                                                f"node")
        m = min(room, key=lambda m: (load[m], m))
        layout.used[topo.node_ranks(m)] += rows
        layout.where[t] = m
        load[m] += lookups[t]
    return layout.plan("twrw", expected_lookups_per_node=load.tolist())


def auto(inputs: PlanInputs) -> Plan:
    """A plan type per table (row-wise, table-wise, TWRW, data-parallel): the greedy of the module's docstring."""
    opts = _own(inputs, "auto")
    check_options("plan auto", "auto", opts)
    topo, sizes = inputs.topology, inputs.table_sizes
    p, g = topo.world, topo.ranks_per_node
    bw = Bandwidths(float(opts.get("intra_node_gbps", DEFAULT_INTRA_GBPS)) * 1e9,
                    float(opts.get("inter_node_gbps", DEFAULT_INTER_GBPS)) * 1e9)
    types = [k for k in ALTERNATIVES if k in opts.get("plan_types", ALTERNATIVES)]
    costs = table_costs(inputs, bw)
    lookups = table_lookups(inputs)
    extra = {TABLE: lambda n: n - -(-n // p), TWRW: lambda n: -(-n // g) - -(-n // p), DP: lambda n: n - -(-n // p)}
    moves = []
    for t, n in enumerate(sizes):
        base = costs[ROW][t]
        for kind in types:
            saving = base - costs[kind][t]
            if saving > TIE * base:
                moves.append((-saving / max(extra[kind](n), 1), t, KINDS.index(kind), kind))
    layout = Layout.row_wise(inputs)
    rank_load = np.full(p, lookups.sum() / p) if p else np.zeros(0)   # row-wise spreads every table's lookups
    for _, t, _, kind in sorted(moves):
        if layout.kinds[t] != ROW:
            continue
        if kind == DP:
            places = [-1]
        elif kind == TABLE:
            places = sorted(range(p), key=lambda r: (rank_load[r], r))
        else:
            places = sorted(range(topo.nodes), key=lambda m: (rank_load[topo.node_ranks(m)].sum(), m))
        place = next((w for w in places if layout.room(t, kind, w)), None)
        if place is None:
            continue
        layout.move(t, kind, place)
        if kind == TABLE:   # a data-parallel table's lookups stay on their askers, spread as under row-wise
            rank_load -= lookups[t] / p
            rank_load[place] += lookups[t]
        elif kind == TWRW:
            rank_load -= lookups[t] / p
            rank_load[topo.node_ranks(place)] += lookups[t] / g
    chosen = np.array([costs[k][t] for t, k in enumerate(layout.kinds)])
    intra = sum(costs[k + ":bytes"][t, 0] for t, k in enumerate(layout.kinds))
    inter = sum(costs[k + ":bytes"][t, 1] for t, k in enumerate(layout.kinds))
    return layout.plan("auto", plan_types_considered=types, modelled_seconds_per_step=float(chosen.sum()),
                       row_wise_seconds_per_step=float(costs[ROW].sum()),
                       modelled_intra_node_bytes_per_step=float(intra),
                       modelled_inter_node_bytes_per_step=float(inter),
                       intra_node_gbps=bw.intra / 1e9, inter_node_gbps=bw.inter / 1e9,
                       priced_wire=inputs.wire.record())


def _own(inputs: PlanInputs, plan: str) -> dict[str, Any]:
    """The options of ``inputs`` that are ``plan``'s own (the rest are every plan's: headroom, pins, step size)."""
    shared = {"table_ranks", "lookups_per_step", "steps"}
    return {k: v for k, v in inputs.options.items() if k not in shared and v is not None}


PLANNERS = {"data-parallel": data_parallel, "twrw": twrw, "auto": auto}
