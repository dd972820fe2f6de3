"""``hotcold shard-sim``: the bytes of every collective for any world size, without training.

From a dataset's training batches (the loader's order) and a plan, the same
routing (``Plan.serving_rank``) and the same byte accounting
(``distributed.traffic``) as the training store give each step's bytes per
collective and per (source, destination) rank, so 16 nodes x 8 GPUs cost a
loop over batches. Tested equal to the training counters at the world sizes
that run here.

Every collective's bytes are linear in one [P, P] matrix per step, the
lookups requester r sends server q (``routing.route_counts``), plus terms
fixed by the plan (replica and dense all-reduces) and the batch's distinct
rows (the column-wise plan's all-reduce). So a plan's whole run is that
matrix summed over steps (``PlanTraffic``): memory does not grow with the
number of batches, and each batch is read once per scale and routed through
every plan x headroom in one pass over its lookups.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from hotcold.config import InfeasibleError, RunConfig
from hotcold.counters import FLOAT_BYTES
from hotcold.data.format import Dataset
from hotcold.data.loader import batch_rows
from hotcold.data.skew import row_counts
from hotcold.distributed.plan_types import ALL, DEFAULT_HEADROOM, NODE, Plan, PlanInputs
from hotcold.distributed.plans import build_plan
from hotcold.distributed.routing import DistinctCounter, lookups_per_rank, route_counts
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import (
    COLLECTIVES,
    ID_BYTES,
    REDUCE_BYTES,
    SPLIT_BYTES,
    Ledger,
    ring_allreduce_matrix,
    ring_edges,
    split_intra_inter,
)


@dataclass
class Scale:
    """A simulated cluster: ``nodes`` x ``ranks_per_node`` ranks."""

    nodes: int
    ranks_per_node: int

    @classmethod
    def parse(cls, text: str) -> "Scale":
        """``"16x8"``: 16 nodes of 8 ranks."""
        try:
            n, g = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"a scale is NODESxRANKS_PER_NODE (e.g. 16x8), got {text!r}") from None
        if n < 1 or g < 1:
            raise ValueError(f"a scale needs at least one node of one rank, got {text!r}")
        return cls(n, g)

    def topology(self) -> Topology:
        return Topology(self.nodes * self.ranks_per_node, self.ranks_per_node)


def dense_parameters(ds: Dataset, cfg: RunConfig) -> int:
    """Parameters of the dense layers: the data-parallel all-reduce's floats."""
    from hotcold.model import build_model

    return sum(p.numel() for p in build_model(ds, cfg.model).parameters())


def global_batches(ds: Dataset, cfg: RunConfig, batch_size: int | None = None) -> Iterator[np.ndarray]:
    """Global rows [B, K] (-1 at padding) of every training batch, in the loader's order.

    ``cfg.train.steps`` batches of ``batch_size`` samples (default ``cfg.train.batch_size``), epochs repeating
    as the loader's (``batch_rows``); one batch in memory at a time.
    """
    start, stop = ds.split("train")
    t = cfg.train
    for rows in batch_rows(stop - start, batch_size or t.batch_size, t.steps, cfg.seed, t.shuffle):
        yield ds.global_ids(rows + start)


def table_batches(ds: Dataset, cfg: RunConfig, batch_size: int | None = None) -> Iterator[np.ndarray]:
    """``global_batches``' batches as table ids [B, K] (global rows: ``+ ds.column_offsets``, -1 at padding),
    without a global copy; the stored integer type where the dataset has no histories."""
    start, stop = ds.split("train")
    t = cfg.train
    for rows in batch_rows(stop - start, batch_size or t.batch_size, t.steps, cfg.seed, t.shuffle):
        yield ds.batch_ids(rows + start) if ds.sequence else np.take(ds.sparse, rows + start, axis=0)


def route(plan: Plan, batch: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Global batch [B, K] -> counts[r, q] (lookups rank r sends rank q) and each rank's looked-up rows.

    The plain form, by ``Plan.serving_rank`` over the whole batch; ``step_matrices`` builds on it.
    """
    p = plan.topology.world
    requests = [s.reshape(-1)[s.reshape(-1) >= 0] for s in np.split(batch, p)]
    if plan.columns > 1:
        return np.repeat(lookups_per_rank(batch, p)[:, None], p, axis=1), requests
    requester = np.repeat(np.arange(p, dtype=np.int64), [r.size for r in requests])
    rows = np.concatenate(requests) if requests else np.zeros(0, dtype=np.int64)
    q = plan.serving_rank(requester, rows)
    return np.bincount(requester * p + q, minlength=p * p).reshape(p, p).astype(np.int64), requests


def replica_matrix(plan: Plan, dim: int) -> np.ndarray:
    """[P, P] bytes of one step's replica all-reduces: the ``ALL`` tier over every rank, each ``NODE`` slot's rows
    across the nodes (the whole tier every step, touched or not, as the training store reduces it)."""
    topo = plan.topology
    p, width = topo.world, dim // plan.columns
    out = ring_allreduce_matrix(range(p), int((plan.tier == ALL).sum()) * width * REDUCE_BYTES, p)
    node_rows = np.bincount(plan.slot[plan.tier == NODE], minlength=topo.ranks_per_node)
    for local in range(topo.ranks_per_node):
        out += ring_allreduce_matrix(topo.cross_node_group(local), int(node_rows[local]) * width * REDUCE_BYTES, p)
    return out


def step_matrices(plan: Plan, batch: np.ndarray, dim: int, state_width: int, dense_params: int,
                  routed: tuple[np.ndarray, list[np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """The [P, P] bytes of every collective of one training step of global batch ``batch`` [B, K]
    (``routed``: its ``route``, when already known). The plain per-step form that ``PlanTraffic`` sums."""
    topo = plan.topology
    p = topo.world
    counts, requests = routed or route(plan, batch)
    width = dim // plan.columns
    off = ~np.eye(p, dtype=bool)
    out = {c: np.zeros((p, p), dtype=np.int64) for c in COLLECTIVES}
    if p > 1:
        out["input_a2a"] = (counts * ID_BYTES + SPLIT_BYTES) * off
    out["output_a2a"] = counts.T * width * FLOAT_BYTES * off
    out["grad_a2a"] = counts * width * FLOAT_BYTES * off
    out["replica_allreduce"] = replica_matrix(plan, dim)
    if plan.columns > 1 and state_width:
        uniq = np.unique(np.concatenate(requests)).size
        out["column_allreduce"] = ring_allreduce_matrix(range(p), uniq * REDUCE_BYTES, p)
    out["dense_allreduce"] = ring_allreduce_matrix(range(p), dense_params * REDUCE_BYTES, p)
    return out


class PlanTraffic:
    """One plan's collectives over a run, kept as the lookups matrix summed over steps (``step_matrices``, summed).

    ``add_step(counts, distinct)`` books one step: ``counts`` [P, P] from
    ``route`` / ``routing.route_counts``, ``distinct`` the batch's distinct
    rows (read only by the column-wise plan with a row-optimizer state).
    ``keep_steps`` also keeps every step's bytes (``StepCounters`` names), as
    the training store's counters give them.
    """

    def __init__(self, plan: Plan, dim: int, state_width: int, dense_params: int, keep_steps: bool = False) -> None:
        topo = self.topology = plan.topology
        p = topo.world
        self.columns = plan.columns
        self.vector_bytes = dim // plan.columns * FLOAT_BYTES
        self.needs_distinct = plan.columns > 1 and state_width > 0
        self.off = ~np.eye(p, dtype=bool)
        self.inter = topo.inter_mask()
        self.replica = replica_matrix(plan, dim)
        self.dense = ring_allreduce_matrix(range(p), dense_params * REDUCE_BYTES, p)
        self.ring = ring_edges(range(p), p)
        self.pairs = split_intra_inter(self.off.astype(np.int64), topo) if p > 1 else (0, 0)
        self.fixed = {"replica_allreduce": split_intra_inter(self.replica, topo),
                      "dense_allreduce": split_intra_inter(self.dense, topo)}
        self.ring_edges = split_intra_inter(self.ring, topo)
        self.counts = np.zeros((p, p), dtype=np.int64)
        self.steps = 0
        self.column_send = 0  # bytes each rank sent its ring successor in the column all-reduces, over all steps
        self.step_bytes: list[dict[str, int]] | None = [] if keep_steps else None

    def column_per_rank(self, distinct: int | None) -> int:
        """Bytes one rank sends its successor in one step's column all-reduce (``ring_allreduce_matrix``'s)."""
        p = self.topology.world
        if not self.needs_distinct or p < 2 or not distinct:
            return 0
        return 2 * (p - 1) * (distinct * REDUCE_BYTES) // p

    def add_step(self, counts: np.ndarray, distinct: int | None = None) -> None:
        self.counts += counts
        self.steps += 1
        column = self.column_per_rank(distinct)
        self.column_send += column
        if self.step_bytes is not None:
            self.step_bytes.append(self._step(counts, column))

    def add_steps(self, counts: np.ndarray, steps: int, column_send: int) -> None:
        """Book ``steps`` steps at once: ``counts`` summed over them, ``column_send`` the sum of their
        ``column_per_rank`` (no per-step values)."""
        if self.step_bytes is not None:
            raise ValueError("add_steps books no per-step values; this PlanTraffic keeps steps")
        self.counts += counts
        self.steps += steps
        self.column_send += column_send

    def _step(self, counts: np.ndarray, column: int) -> dict[str, int]:
        """One step's bytes per collective and intra/inter node, as ``Ledger.take_step`` gives them."""
        inter = int(counts[self.inter].sum())
        intra = int(counts[self.off].sum()) - inter
        split = {c: (0, 0) for c in COLLECTIVES}
        if self.topology.world > 1:
            split["input_a2a"] = (intra * ID_BYTES + self.pairs[0] * SPLIT_BYTES,
                                  inter * ID_BYTES + self.pairs[1] * SPLIT_BYTES)
        split["output_a2a"] = split["grad_a2a"] = (intra * self.vector_bytes, inter * self.vector_bytes)
        split.update(self.fixed)
        split["column_allreduce"] = (column * self.ring_edges[0], column * self.ring_edges[1])
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
               "replica_allreduce": self.replica * n,
               "column_allreduce": self.ring * self.column_send,
               "dense_allreduce": self.dense * n}
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


def simulate_plan(plan: Plan, batches: Iterable[np.ndarray], dim: int, state_width: int,
                  dense_params: int) -> tuple[Ledger, list[dict[str, int]], np.ndarray]:
    """The ledger over all batches, each step's bytes (``StepCounters`` names) and lookups served per rank."""
    traffic = PlanTraffic(plan, dim, state_width, dense_params, keep_steps=True)
    topo = plan.topology
    codes = plan.route_codes().reshape(-1, 1) if plan.columns == 1 else None
    distinct = DistinctCounter(plan.num_rows) if traffic.needs_distinct else None
    for batch in batches:
        if codes is None:
            counts = np.repeat(lookups_per_rank(batch, topo.world)[:, None], topo.world, axis=1)
        else:
            counts = route_counts(batch, codes, topo.world, topo.ranks_per_node)[0]
        traffic.add_step(counts, distinct(batch) if distinct else None)
    assert traffic.step_bytes is not None
    return traffic.ledger(), traffic.step_bytes, traffic.served()


@dataclass
class _Entry:
    """One output row of a scale: its key, and its traffic (an index into the scale's ``PlanTraffic``s) or why not."""

    key: dict[str, Any]
    traffic: int = -1
    memory: dict[str, Any] | None = None
    reason: str = ""


class ScaleSweep:
    """Every plan x headroom of one scale, fed the same batches once: one pass over each batch's lookups routes
    it through all of them (plans whose placement is identical share one ``PlanTraffic``)."""

    def __init__(self, topo: Topology, num_rows: int) -> None:
        self.topology = topo
        self.num_rows = num_rows
        self.traffic: list[PlanTraffic] = []
        self._codes: list[np.ndarray | None] = []  # a row plan's route codes; None: column-wise
        self.codes: np.ndarray | None = None      # [N, M] of the row plans, built by ``freeze``
        self._row_plans: list[int] = []           # traffic index of each column of ``codes``
        self._distinct: DistinctCounter | None = None

    def add(self, plan: Plan, dim: int, state_width: int, dense_params: int) -> int:
        """The index of the ``PlanTraffic`` that books ``plan`` (shared with an identical plan added before)."""
        if self.codes is not None:
            raise RuntimeError("plans must be added before the first batch")
        codes = plan.route_codes() if plan.columns == 1 else None
        for i, other in enumerate(self._codes):
            same = (codes is None and other is None and self.traffic[i].columns == plan.columns) or (
                codes is not None and other is not None and np.array_equal(codes, other))
            if same:
                return i
        self.traffic.append(PlanTraffic(plan, dim, state_width, dense_params))
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
        if any(t.needs_distinct for t in self.traffic):
            self._distinct = DistinctCounter(self.num_rows)

    def only(self, index: int) -> "ScaleSweep":
        """A sweep of this sweep's plan ``index`` alone (its codes copied, its booking fresh): one plan's cost."""
        if self.codes is None:
            self.freeze()
        assert self.codes is not None
        one = ScaleSweep(self.topology, self.num_rows)
        traffic = copy.copy(self.traffic[index])
        traffic.counts, traffic.steps, traffic.column_send = np.zeros_like(traffic.counts), 0, 0
        traffic.step_bytes = None
        one.traffic, one._codes = [traffic], [None]
        column = self._row_plans.index(index) if index in self._row_plans else None
        one._row_plans = [0] if column is not None else []
        one.codes = np.ascontiguousarray(self.codes[:, column:column + 1] if column is not None
                                         else self.codes[:, :0])
        one._distinct = DistinctCounter(self.num_rows) if traffic.needs_distinct else None
        return one

    def add_batch(self, batch: np.ndarray, counts: np.ndarray, column: np.ndarray,
                  offsets: np.ndarray | None = None) -> None:
        """Route one global batch [B, K] through every plan; add to ``counts`` [M, P, P] and ``column`` [M].

        ``offsets``: ``batch`` holds table ids, global rows ``ids + offsets`` (``routing.route_counts``)."""
        topo = self.topology
        if self.codes is None:
            self.freeze()
        assert self.codes is not None
        if self._row_plans:
            sub = np.zeros((len(self._row_plans), topo.world, topo.world), dtype=np.int64)
            route_counts(batch, self.codes, topo.world, topo.ranks_per_node, sub, offsets)
            counts[self._row_plans] += sub
        per_rank = None
        distinct = self._distinct(batch, offsets) if self._distinct is not None else None
        for i, t in enumerate(self.traffic):
            if t.columns > 1:
                if per_rank is None:
                    per_rank = lookups_per_rank(batch, topo.world)
                counts[i] += per_rank[:, None]
            column[i] += t.column_per_rank(distinct)

    def route_all(self, batches: Iterable[np.ndarray],
                  offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """Route every batch of ``batches``: (counts [M, P, P] summed over them, column sends [M], batches)."""
        p, m = self.topology.world, len(self.traffic)
        counts = np.zeros((m, p, p), dtype=np.int64)
        column = np.zeros(m, dtype=np.int64)
        steps = 0
        for batch in batches:
            if m:
                self.add_batch(batch, counts, column, offsets)
            steps += 1
        return counts, column, steps

    def run(self, batches: Iterable[np.ndarray], offsets: np.ndarray | None = None) -> None:
        """Book every batch of ``batches`` in every plan (counts summed over the run, no per-step values),
        then let the stacked codes go. ``offsets``: as ``add_batch``'s."""
        counts, column, steps = self.route_all(batches, offsets)
        for i, t in enumerate(self.traffic):
            t.add_steps(counts[i], steps, int(column[i]))
        self.codes = None
        self._distinct = None


def plan_scale(ds: Dataset, topo: Topology, plans: list[str], headrooms: list[float], counts: np.ndarray,
               batch: int, dim: int, state: int, dense: int, steps: int,
               options: dict[str, Any]) -> tuple[ScaleSweep, list[_Entry]]:
    """Every plan x headroom of one scale (``counts``: the training split's row counts, ``batch``: the global
    batch), in a ``ScaleSweep`` ready for the batches, and one entry per output row (headroom-major)."""
    start, stop = ds.split("train")
    sweep = ScaleSweep(topo, int(sum(ds.cardinalities)))
    entries = []
    for headroom in headrooms:
        for name in plans:
            inputs = PlanInputs.for_training(ds.cardinalities, counts, topo, dim, state, headroom, options,
                                             batch / max(1, stop - start))
            key = {"dataset": ds.name, "plan": name, "world": topo.world, "ranks_per_node": topo.ranks_per_node,
                   "nodes": topo.nodes, "memory_headroom": headroom, "steps": steps, "batch_size": batch,
                   "batch_per_rank": batch // topo.world}
            try:
                plan = build_plan(name, inputs)
            except InfeasibleError as e:
                entries.append(_Entry(key, reason=str(e)))
                continue
            memory = {"memory_bytes_per_rank_max": int(plan.bytes_held(dim, state).max()),
                      "memory_budget_bytes": inputs.budget_bytes()}
            entries.append(_Entry(key, sweep.add(plan, dim, state, dense), memory))
            del plan
    return sweep, entries


def scale_rows(sweep: ScaleSweep, entries: list[_Entry], steps: int) -> list[dict[str, Any]]:
    """The output rows of a scale whose batches ``sweep`` has run."""
    rows = []
    for e in entries:
        if e.traffic < 0:
            rows.append({**e.key, "status": "infeasible", "reason": e.reason})
            continue
        traffic = sweep.traffic[e.traffic]
        served = traffic.served()
        rows.append({**e.key, "status": "ok", **_per_step(traffic.ledger(), steps), **(e.memory or {}),
                     "load_imbalance": float(served.max() / served.mean()) if served.sum() else float("nan")})
    return rows


def shard_sim(ds: Dataset, cfg: RunConfig, plans: list[str], scales: list[Scale], headrooms: list[float],
              options: dict[str, Any] | None = None, batch_per_rank: int | None = None,
              progress: bool = False) -> list[dict[str, Any]]:
    """One row per plan x scale x headroom: bytes per step of every collective, memory, load imbalance.

    ``batch_per_rank``: weak scaling, each scale's global batch is ``batch_per_rank`` x its world size; None
    keeps ``cfg.train.batch_size`` at every scale. Either way ``cfg.train.steps`` batches in the loader's order;
    each row says the global batch (``batch_size``) and the samples per rank (``batch_per_rank``) it used.
    """
    from hotcold.embedding.update import RowOptimizer

    t = cfg.train
    if batch_per_rank is not None and (isinstance(batch_per_rank, bool) or not isinstance(batch_per_rank, int)
                                       or batch_per_rank < 1):
        raise ValueError(f"batch_per_rank must be a positive integer, got {batch_per_rank!r}")
    dim, state = cfg.model.embedding_dim, RowOptimizer(t.row_optimizer, t.lr).state_width
    counts = row_counts(ds, "train")
    start, stop = ds.split("train")
    dense = dense_parameters(ds, cfg)
    rows = []
    for scale in scales:
        topo = scale.topology()
        batch = batch_per_rank * topo.world if batch_per_rank is not None else t.batch_size
        if batch % topo.world:
            raise ValueError(f"batch_size {batch} is not divisible by {topo.world} ranks ({scale})")
        if batch > stop - start:
            raise ValueError(f"{ds.path}: a global batch of {batch} samples at {scale} is more than the "
                             f"{stop - start} training samples")
        sweep, entries = plan_scale(ds, topo, plans, headrooms, counts, batch, dim, state, dense, t.steps,
                                    options or {})
        sweep.run(tqdm(table_batches(ds, cfg, batch), total=t.steps, unit="batch", disable=not progress,
                       desc=f"shard-sim {topo.label()}: {len(sweep.traffic)} distinct plan(s)"), ds.column_offsets)
        rows += scale_rows(sweep, entries, t.steps)
    return rows


def _per_step(ledger: Ledger, steps: int) -> dict[str, float]:
    """Mean bytes per step of every collective, and of all of them intra- and inter-node."""
    summary = ledger.summary()
    out = {f"{c}_bytes": v["bytes"] / steps for c, v in summary.items()}
    out["intra_node_bytes"] = sum(v["intra_node_bytes"] for v in summary.values()) / steps
    out["inter_node_bytes"] = sum(v["inter_node_bytes"] for v in summary.values()) / steps
    out["inter_node_a2a_bytes"] = sum(summary[c]["inter_node_bytes"]
                                      for c in ("input_a2a", "output_a2a", "grad_a2a")) / steps
    return out


__all__ = ["DEFAULT_HEADROOM", "PlanTraffic", "Scale", "ScaleSweep", "global_batches", "route", "shard_sim",
           "table_batches",
           "simulate_plan", "step_matrices"]
