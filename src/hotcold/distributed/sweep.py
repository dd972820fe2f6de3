"""A plan's collectives summed over a run, and one pass over each batch for every plan of a scale.

Every collective's bytes in a step are linear in one [P, P] matrix, the
lookups requester r sends server q, plus terms fixed by the plan (replica and
dense all-reduces) and the batch's distinct rows (the column-wise plan's
all-reduce). ``PlanTraffic`` keeps that matrix summed over steps, so a run's
totals take memory independent of its number of batches; ``ScaleSweep``
routes each batch through every plan x headroom of a scale in one pass over
its lookups (``routing.route_counts``). ``shardsim.step_matrices`` is the
per-step form they sum; tests/test_shardsim.py checks the two agree.
"""
from __future__ import annotations

import copy
from typing import Iterable

import numpy as np

from hotcold.config import Wire
from hotcold.counters import exchanges_row_squares
from hotcold.distributed.host_lookups import host_codes, host_counts, host_lookups_per_rank
from hotcold.distributed.plan_types import ALL, NODE, Plan, column_exchange
from hotcold.distributed.replica_sync import ReplicaGroups, ReplicaTouches
from hotcold.distributed.routing import TableCounter, route_counts
from hotcold.distributed.topology import Topology
from hotcold.options.sharded import LOOKUP, REDUCE_SCATTER
from hotcold.distributed.traffic import (
    COLLECTIVES,
    ID_BYTES,
    SPLIT_BYTES,
    Ledger,
    ring_allreduce_matrix,
    ring_edges,
    split_intra_inter,
)


def replica_matrix(plan: Plan, dim: int, wire: Wire | None = None) -> np.ndarray:
    """[P, P] bytes of one step's dense replica all-reduces: the ``ALL`` tier over every rank, each ``NODE`` slot's
    rows across the nodes (the whole tier, touched or not; without the count exchange), each element
    ``wire.reduce_bytes`` (default: the float32 wire). The training store and shard-sim send the cheaper of this
    and the touched rows' all-gather each step (``replica_sync``)."""
    topo = plan.topology
    p, width, element = topo.world, dim // plan.columns, (wire or Wire()).reduce_bytes
    out = ring_allreduce_matrix(range(p), int((plan.tier == ALL).sum()) * width * element, p)
    node_rows = np.bincount(plan.slot[plan.tier == NODE], minlength=topo.ranks_per_node)
    for local in range(topo.ranks_per_node):
        out += ring_allreduce_matrix(topo.cross_node_group(local), int(node_rows[local]) * width * element, p)
    return out


class PlanTraffic:
    """One plan's collectives over a run, kept as the lookups matrix summed over steps (``step_matrices``, summed).

    ``add_step(counts, distinct)`` books one step: ``counts`` [P, P] from
    ``route`` / ``routing.route_counts``, ``distinct`` [T] the batch's distinct
    rows per table (``routing.TableCounter``; read only by a column-wise plan
    whose shards exchange a row-wise state).
    ``keep_steps`` also keeps every step's bytes (``StepCounters`` names), as
    the training store's counters give them. ``wire``: what the collectives send (default: the float32 wire).

    ``rw_protocol`` ``reduce_scatter`` (the row plan, TorchRec's pooled row-wise): the input all-to-all adds every
    (sample, column) length of the requester's slice to every other rank (``ID_BYTES`` each), the output is a
    ring reduce-scatter of every slice's pooled sums (``dim`` x ``wire.reduce_bytes`` per slot) and the gradient a
    ring all-gather of them (``dim`` x ``wire.vector_bytes``): linear in the (sample, column) slots of the run's
    batches (``slots``), not in the routing.
    """

    def __init__(self, plan: Plan, dim: int, state_width: int, dense_params: int, keep_steps: bool = False,
                 wire: Wire | None = None, rw_protocol: str = LOOKUP) -> None:
        topo = self.topology = plan.topology
        p = topo.world
        self.rw_protocol = rw_protocol
        self.pooled = rw_protocol == REDUCE_SCATTER
        if self.pooled and (plan.columns > 1 or not (plan.tier == 0).all() or plan.off_device is not None):
            raise ValueError(f"plan {plan.name}: rw_protocol {rw_protocol} needs a plan of sharded device rows")
        self.slots = 0  # (sample, column) slots of the global batches booked
        self.wire = wire or Wire()
        self.columns = plan.columns
        self.holds = plan.holds() if plan.columns > 1 else None  # [P, T] the column shards' ranks
        self.vector_bytes = dim // plan.columns * self.wire.vector_bytes
        #: the column shards exchange each updated row's squared-gradient partial sums (``column_exchange``)
        self.exchanges = (plan.columns > 1 and exchanges_row_squares(state_width)
                          and plan.details.get("column_state", "row") == "row")
        self.off = ~np.eye(p, dtype=bool)
        self.inter = topo.inter_mask()
        self.groups = ReplicaGroups.of(plan, dim, self.wire)  # None: no replicated rows, nothing to synchronise
        self.replica_sends = np.zeros((2, p), dtype=np.int64)  # ALL-ring and NODE-ring sends per rank, summed
        self.replica_syncs = np.zeros(2, dtype=np.int64)        # (sparse, all) group syncs over the run
        self.dense = ring_allreduce_matrix(range(p), dense_params * self.wire.reduce_bytes, p)
        self.ring = ring_edges(range(p), p)
        self.pairs = split_intra_inter(self.off.astype(np.int64), topo) if p > 1 else (0, 0)
        self.fixed = {"dense_allreduce": split_intra_inter(self.dense, topo)}
        self.ring_edges = split_intra_inter(self.ring, topo)
        self.counts = np.zeros((p, p), dtype=np.int64)
        self.steps = 0
        self.column_distinct = np.zeros(len(plan.table_sizes), dtype=np.int64)  # distinct rows per table, summed
        self.step_bytes: list[dict[str, int]] | None = [] if keep_steps else None
        self.dim = dim
        self.host_codes = host_codes(plan.off_device, plan.slot)  # None: no host rows (``host_tier``)
        self.host = np.zeros(p, dtype=np.int64)             # lookups every rank served from host memory

    def column_matrix(self, distinct: np.ndarray | None) -> np.ndarray:
        """[P, P] bytes of the column shards' squares exchange of ``distinct`` [T] rows per table."""
        if not self.exchanges or distinct is None:
            return np.zeros_like(self.off, dtype=np.int64)
        assert self.holds is not None
        return column_exchange(self.holds, distinct, self.wire.reduce_bytes)

    def replica_step(self, touched: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """int64 [2, P]: one step's replica sends (``ReplicaGroups.sends``) from each rank's touched rows
        (``ReplicaTouches``); booked in the run's sums."""
        if self.groups is None:
            return np.zeros_like(self.replica_sends)
        if touched is None:
            raise ValueError("a plan with replicated rows needs each step's touched rows")
        send_all, send_node, sparse, syncs = self.groups.sends(*touched)
        sends = np.stack([send_all, send_node])
        self.replica_sends += sends
        self.replica_syncs += (sparse, syncs)
        return sends

    def add_step(self, counts: np.ndarray, distinct: np.ndarray | None = None,
                 touched: tuple[np.ndarray, np.ndarray] | None = None, host: np.ndarray | None = None,
                 slots: int = 0) -> None:
        """``host`` [P]: the step's lookups each rank served from host memory (plans with host rows); ``slots``:
        the global batch's (sample, column) slots, B x K (read by the ``reduce_scatter`` protocol)."""
        self.counts += counts
        self.steps += 1
        self.slots += slots
        column = self.column_matrix(distinct)
        if self.exchanges and distinct is not None:
            self.column_distinct += distinct
        sends = self.replica_step(touched)
        if host is not None:
            self.host += host
        if self.step_bytes is not None:
            self.step_bytes.append(self._step(counts, column, sends, slots))
            if self.host_codes is not None:
                self.step_bytes[-1].update(host_counts(int(0 if host is None else host.sum()), self.dim))

    def add_steps(self, counts: np.ndarray, steps: int, distinct: np.ndarray, host: np.ndarray | None = None,
                  slots: int = 0) -> None:
        """Book ``steps`` steps at once: ``counts`` summed over them, ``distinct`` [T] their distinct rows per
        table, ``host`` [P] their host lookups (no per-step values; the replica sends are booked
        per step by ``replica_step``)."""
        if self.step_bytes is not None:
            raise ValueError("add_steps books no per-step values; this PlanTraffic keeps steps")
        if host is not None:
            self.host += host
        self.counts += counts
        self.steps += steps
        self.slots += slots
        if self.exchanges:
            self.column_distinct += distinct

    def replica_total(self) -> np.ndarray:
        """[P, P] bytes of the replica synchronisation over the run."""
        if self.groups is None:
            return np.zeros_like(self.counts)
        return self.groups.matrix(*self.replica_sends)

    def sparse_sync_share(self) -> float | None:
        """Share of the run's replica-group syncs that sent the touched rows (None: no replica group synced)."""
        sparse, syncs = self.replica_syncs
        return float(sparse / syncs) if syncs else None

    def pooled_sends(self, slots: int) -> tuple[int, int, int]:
        """``reduce_scatter`` protocol, for batches of ``slots`` (sample, column) slots in all: (length bytes each
        rank sends each other rank, bytes each rank sends its ring successor in the reduce-scatter, and in the
        all-gather) (``ring_reducescatter_matrix`` and ``ring_allgather_matrix`` of equal blocks)."""
        p = self.topology.world
        if not self.pooled or p < 2:
            return 0, 0, 0
        per_rank = slots // p
        return (per_rank * ID_BYTES, (p - 1) * per_rank * self.dim * self.wire.reduce_bytes,
                (p - 1) * per_rank * self.dim * self.wire.vector_bytes)

    def _step(self, counts: np.ndarray, column: np.ndarray, sends: np.ndarray, slots: int = 0) -> dict[str, int]:
        """One step's bytes per collective and intra/inter node, as ``Ledger.take_step`` gives them."""
        inter = int(counts[self.inter].sum())
        intra = int(counts[self.off].sum()) - inter
        split = {c: (0, 0) for c in COLLECTIVES}
        if self.topology.world > 1:
            split["input_a2a"] = (intra * ID_BYTES + self.pairs[0] * SPLIT_BYTES,
                                  inter * ID_BYTES + self.pairs[1] * SPLIT_BYTES)
        split["output_a2a"] = split["grad_a2a"] = (intra * self.vector_bytes, inter * self.vector_bytes)
        if self.pooled:
            lengths, scatter, gather = self.pooled_sends(slots)
            a, b = split["input_a2a"]
            split["input_a2a"] = (a + self.pairs[0] * lengths, b + self.pairs[1] * lengths)
            split["output_a2a"] = (scatter * self.ring_edges[0], scatter * self.ring_edges[1])
            split["grad_a2a"] = (gather * self.ring_edges[0], gather * self.ring_edges[1])
        split.update(self.fixed)
        if self.groups is not None:
            split["replica_allreduce"] = split_intra_inter(self.groups.matrix(*sends), self.topology)
        split["column_allreduce"] = split_intra_inter(column, self.topology)
        out = {f"{c}_bytes": a + b for c, (a, b) in split.items()}
        out["intra_node_bytes"] = sum(a for a, _ in split.values())
        out["inter_node_bytes"] = sum(b for _, b in split.values())
        return out

    def matrices(self) -> dict[str, np.ndarray]:
        """[P, P] bytes of every collective over all steps booked: ``step_matrices`` summed."""
        c, n = self.counts, self.steps
        out = {"input_a2a": (c * ID_BYTES + SPLIT_BYTES * n) * self.off if self.topology.world > 1
               else np.zeros_like(c),
               "output_a2a": c.T * self.vector_bytes * self.off,
               "grad_a2a": c * self.vector_bytes * self.off,
               "replica_allreduce": self.replica_total(),
               "column_allreduce": self.column_matrix(self.column_distinct),
               "dense_allreduce": self.dense * n}
        if self.pooled:
            lengths, scatter, gather = self.pooled_sends(self.slots)
            out["input_a2a"] = out["input_a2a"] + lengths * self.off
            out["output_a2a"], out["grad_a2a"] = self.ring * scatter, self.ring * gather
        return {k: out[k] for k in COLLECTIVES}

    def ledger(self) -> Ledger:
        ledger = Ledger(self.topology)
        for c, m in self.matrices().items():
            ledger.add(c, m)
        ledger.take_step()
        return ledger

    def served(self) -> np.ndarray:
        """int64 [P]: lookups every rank served (what every rank asked of it)."""
        return self.counts.sum(axis=0)


class ScaleSweep:
    """Every plan x headroom of one scale, fed the same batches once: one pass over each batch's lookups routes
    it through all of them (plans whose placement is identical share one ``PlanTraffic``). ``wire``: what every
    plan's collectives send."""

    def __init__(self, topo: Topology, num_rows: int, wire: Wire | None = None) -> None:
        self.topology = topo
        self.num_rows = num_rows
        self.wire = wire or Wire()
        self.traffic: list[PlanTraffic] = []
        self._codes: list[np.ndarray | None] = []  # a row plan's route codes; None: column-wise
        self.codes: np.ndarray | None = None      # [N, M] of the row plans, built by ``freeze``
        self._row_plans: list[int] = []           # traffic index of each column of ``codes``
        self.table_sizes: list[int] | None = None  # the tables, known from the first plan added
        self._tables: TableCounter | None = None   # the column-wise plans' per-table counts of each batch
        self._touches: ReplicaTouches | None = None  # the plans with replicas: each rank's touched rows per batch

    def add(self, plan: Plan, dim: int, state_width: int, dense_params: int, rw_protocol: str = LOOKUP) -> int:
        """The index of the ``PlanTraffic`` that books ``plan`` (shared with an identical plan added before, under
        the same ``rw_protocol``)."""
        if self.codes is not None:
            raise RuntimeError("plans must be added before the first batch")
        codes = plan.route_codes() if plan.columns == 1 else None
        self.table_sizes = list(plan.table_sizes)
        for i, other in enumerate(self._codes):
            t = self.traffic[i]
            same = (codes is None and other is None and t.holds is not None and np.array_equal(t.holds, plan.holds())
                    and t.columns == plan.columns and t.exchanges == (exchanges_row_squares(state_width) and plan.details.get(
                        "column_state", "row") == "row")) or (
                codes is not None and other is not None and np.array_equal(codes, other)
                and _same_host(self.traffic[i].host_codes, host_codes(plan.off_device, plan.slot)))
            if same and self.traffic[i].rw_protocol == rw_protocol:
                return i
        self.traffic.append(PlanTraffic(plan, dim, state_width, dense_params, wire=self.wire,
                                        rw_protocol=rw_protocol))
        self._codes.append(codes)
        return len(self.traffic) - 1

    def freeze(self) -> None:
        """Stack the row plans' codes side by side, [N, M]: one cache line per lookup for all of them."""
        p, g = self.topology.world, self.topology.ranks_per_node
        self._row_plans = [i for i, c in enumerate(self._codes) if c is not None]
        dtype = self._codes[self._row_plans[0]].dtype if self._row_plans else np.uint8
        self.codes = np.empty((self.num_rows, len(self._row_plans)), dtype=dtype)
        for j, i in enumerate(self._row_plans):
            self.codes[:, j] = self._codes[i]
            self._codes[i] = None  # the stacked copy is the one kept
        assert p + g <= np.iinfo(dtype).max
        if any(t.columns > 1 for t in self.traffic):
            assert self.table_sizes is not None
            self._tables = TableCounter(self.table_sizes, p)
        if any(self.traffic[i].groups is not None for i in self._row_plans):
            self._touches = ReplicaTouches(self.num_rows, p, g)

    def only(self, index: int) -> "ScaleSweep":
        """A sweep of this sweep's plan ``index`` alone (its codes copied, its booking fresh): one plan's cost."""
        if self.codes is None:
            self.freeze()
        assert self.codes is not None
        one = ScaleSweep(self.topology, self.num_rows, self.wire)
        traffic = copy.copy(self.traffic[index])
        traffic.counts, traffic.steps = np.zeros_like(traffic.counts), 0
        traffic.column_distinct = np.zeros_like(traffic.column_distinct)
        traffic.slots = 0
        traffic.host = np.zeros_like(traffic.host)
        traffic.step_bytes = None
        traffic.replica_sends = np.zeros_like(traffic.replica_sends)
        traffic.replica_syncs = np.zeros_like(traffic.replica_syncs)
        one.traffic, one._codes = [traffic], [None]
        column = self._row_plans.index(index) if index in self._row_plans else None
        one._row_plans = [0] if column is not None else []
        one.codes = np.ascontiguousarray(self.codes[:, column:column + 1] if column is not None
                                         else self.codes[:, :0])
        one.table_sizes = self.table_sizes
        one._tables = (TableCounter(self.table_sizes, self.topology.world)
                       if traffic.columns > 1 and self.table_sizes is not None else None)
        one._touches = ReplicaTouches(self.num_rows, self.topology.world, self.topology.ranks_per_node) \
            if traffic.groups is not None and column is not None else None
        return one

    def add_batch(self, batch: np.ndarray, counts: np.ndarray, column: np.ndarray,
                  offsets: np.ndarray | None = None, host: np.ndarray | None = None) -> None:
        """Route one global batch [B, K] through every plan; add to ``counts`` [M, P, P] and ``column`` [M, T]
        (the distinct rows per table, read by the column-wise plans) (and to ``host`` [M, P], the lookups served from host memory, for the plans with host rows).

        ``offsets``: ``batch`` holds table ids, global rows ``ids + offsets`` (``routing.route_counts``). The
        replica synchronisation of plans with replicated rows is booked in their ``PlanTraffic`` at once
        (``replica_step``: it depends on each step's touched rows, not only on the summed counts)."""
        topo = self.topology
        if self.codes is None:
            self.freeze()
        assert self.codes is not None
        if self._row_plans:
            sub = np.zeros((len(self._row_plans), topo.world, topo.world), dtype=np.int64)
            route_counts(batch, self.codes, topo.world, topo.ranks_per_node, sub, offsets)
            counts[self._row_plans] += sub
            if self._touches is not None:  # every plan with replicas in one pass over the batch
                cols = [j for j, i in enumerate(self._row_plans) if self.traffic[i].groups is not None]
                touched_all, touched_node = self._touches.many(batch, self.codes, cols, offsets)
                for n, j in enumerate(cols):
                    self.traffic[self._row_plans[j]].replica_step((touched_all[n], touched_node[n]))
        lookups, distinct = self._tables(batch, offsets) if self._tables is not None else (None, None)
        for i, t in enumerate(self.traffic):
            if t.holds is not None:
                counts[i] += lookups @ t.holds.T.astype(np.int64)
                column[i] += distinct
            if host is not None and t.host_codes is not None:
                host[i] += host_lookups_per_rank(batch, t.host_codes, topo.world, offsets)

    def route_all(self, batches: Iterable[np.ndarray],
                  offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """Route every batch of ``batches``: (counts [M, P, P] summed over them, distinct rows per table [M, T]
        (column-wise plans; zeros for the others), batches);
        their (sample, column) slots in ``self.slots``."""
        p, m = self.topology.world, len(self.traffic)
        counts = np.zeros((m, p, p), dtype=np.int64)
        column = np.zeros((m, len(self.table_sizes or [])), dtype=np.int64)
        self.host_sums = np.zeros((m, p), dtype=np.int64)
        self.slots = 0
        steps = 0
        for batch in batches:
            if m:
                self.add_batch(batch, counts, column, offsets, self.host_sums)
            self.slots += int(batch.size)
            steps += 1
        return counts, column, steps

    def run(self, batches: Iterable[np.ndarray], offsets: np.ndarray | None = None) -> None:
        """Book every batch of ``batches`` in every plan (counts summed over the run, no per-step values),
        then let the stacked codes go. ``offsets``: as ``add_batch``'s."""
        counts, column, steps = self.route_all(batches, offsets)
        for i, t in enumerate(self.traffic):
            t.add_steps(counts[i], steps, column[i], self.host_sums[i], self.slots)
        self.codes = None
        self._tables = None
        self._touches = None


def _same_host(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two plans keep the same rows in host memory (``host_codes``; None: none)."""
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


__all__ = ["PlanTraffic", "ScaleSweep", "replica_matrix"]
