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
matrix summed over steps (``sweep.PlanTraffic``): memory does not grow with the
number of batches, and each batch is read once per scale and routed through
every plan x headroom in one pass over its lookups.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from tqdm import tqdm

from hotcold.config import ConfigError, InfeasibleError, Wire, row_state_width
from hotcold import model_size
from hotcold.counters import exchanges_row_squares
from hotcold.data.format import Dataset
from hotcold.data.order import table_batches
from hotcold.data.skew import row_counts
from hotcold.distributed.host_lookups import host_counts, host_lookups_per_rank
from hotcold.distributed.plan_types import ALL, NODE, Plan, PlanInputs, descending
from hotcold.options.sharded import DEFAULT_HEADROOM, LOOKUP, REDUCE_SCATTER, RW_PROTOCOLS
from hotcold.distributed.plans import build_plan
from hotcold.distributed.routing import TableCounter, route_counts
from hotcold.distributed.replica_sync import ReplicaGroups, ReplicaTouches
from hotcold.distributed.sweep import PlanTraffic, ScaleSweep
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import (
    COLLECTIVES,
    ID_BYTES,
    SPLIT_BYTES,
    Ledger,
    ring_allgather_matrix,
    ring_allreduce_matrix,
    ring_reducescatter_matrix,
)

if TYPE_CHECKING:  # the sections of a run config it reads
    from hotcold.config import Sections


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


def dense_parameters(ds: Dataset, cfg: Sections) -> int:
    """Parameters of the dense layers: the data-parallel all-reduce's floats (counted without building the model)."""
    return model_size.dense_parameters(ds, cfg.model)


def route(plan: Plan, batch: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Global batch [B, K] -> counts[r, q] (lookups rank r sends rank q) and each rank's looked-up rows.

    The plain form, by ``Plan.serving_rank`` over the whole batch; ``step_matrices`` builds on it.
    """
    p = plan.topology.world
    requests = [s.reshape(-1)[s.reshape(-1) >= 0] for s in np.split(batch, p)]
    if plan.columns > 1:
        return plan.column_counts(TableCounter(plan.table_sizes, p)(batch)[0]), requests
    requester = np.repeat(np.arange(p, dtype=np.int64), [r.size for r in requests])
    rows = np.concatenate(requests) if requests else np.zeros(0, dtype=np.int64)
    q = plan.serving_rank(requester, rows)
    return np.bincount(requester * p + q, minlength=p * p).reshape(p, p).astype(np.int64), requests


def step_matrices(plan: Plan, batch: np.ndarray, dim: int, state_width: int, dense_params: int,
                  routed: tuple[np.ndarray, list[np.ndarray]] | None = None,
                  wire: Wire | None = None, rw_protocol: str = LOOKUP) -> dict[str, np.ndarray]:
    """The [P, P] bytes of every collective of one training step of global batch ``batch`` [B, K]
    (``routed``: its ``route``, when already known; ``wire``: what is sent, default the float32 wire;
    ``rw_protocol``: the row plan's output protocol, ``PlanTraffic``'s). The plain per-step form that
    ``PlanTraffic`` sums."""
    wire = wire or Wire()
    topo = plan.topology
    p = topo.world
    counts, requests = routed or route(plan, batch)
    width = dim // plan.columns
    off = ~np.eye(p, dtype=bool)
    out = {c: np.zeros((p, p), dtype=np.int64) for c in COLLECTIVES}
    if p > 1:
        out["input_a2a"] = (counts * ID_BYTES + SPLIT_BYTES) * off
    out["output_a2a"] = counts.T * width * wire.vector_bytes * off
    out["grad_a2a"] = counts * width * wire.vector_bytes * off
    groups = ReplicaGroups.of(plan, dim, wire)
    if groups is not None:
        out["replica_allreduce"] = groups.matrix(*groups.sends(*touched_rows(plan, requests))[:2])
    if plan.columns > 1 and exchanges_row_squares(state_width) and plan.details.get("column_state", "row") == "row":
        uniq = np.unique(np.concatenate(requests))
        bounds = np.concatenate([[0], np.cumsum(plan.table_sizes)])
        distinct = np.bincount(np.searchsorted(bounds, uniq, side="right") - 1, minlength=len(plan.table_sizes))
        out["column_allreduce"] = plan.column_exchange(distinct, wire.reduce_bytes)
    out["dense_allreduce"] = ring_allreduce_matrix(range(p), dense_params * wire.reduce_bytes, p)
    if rw_protocol == REDUCE_SCATTER and p > 1:  # every rank's (sample, column) slots: lengths, pooled sums
        slots = batch.size // p
        out["input_a2a"] = out["input_a2a"] + slots * ID_BYTES * off
        out["output_a2a"] = ring_reducescatter_matrix(range(p), [slots * dim * wire.reduce_bytes] * p, p)
        out["grad_a2a"] = ring_allgather_matrix(range(p), [slots * dim * wire.vector_bytes] * p, p)
    return out


def touched_rows(plan: Plan, requests: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The plain form of ``ReplicaTouches``: (distinct ALL rows each rank asked for [P], distinct NODE rows each
    rank serves to its node [P]), from ``Plan.serving_rank`` over each rank's requests (``route``'s)."""
    topo = plan.topology
    p = topo.world
    touched_all = np.zeros(p, dtype=np.int64)
    node_rows: list[set[int]] = [set() for _ in range(p)]
    for r, rows in enumerate(requests):
        rows = np.unique(rows)
        touched_all[r] = int((plan.tier[rows] == ALL).sum())
        node = rows[plan.tier[rows] == NODE]
        for row, q in zip(node.tolist(), plan.serving_rank(r, node).tolist()):
            node_rows[q].add(row)
    return touched_all, np.array([len(s) for s in node_rows], dtype=np.int64)


def simulate_plan(plan: Plan, batches: Iterable[np.ndarray], dim: int, state_width: int,
                  dense_params: int, wire: Wire | None = None,
                  rw_protocol: str = LOOKUP) -> tuple[Ledger, list[dict[str, int]], np.ndarray]:
    """The ledger over all batches, each step's bytes (``StepCounters`` names) and lookups served per rank
    (``wire``: what is sent, default the float32 wire; ``rw_protocol``: the row plan's output protocol)."""
    traffic = PlanTraffic(plan, dim, state_width, dense_params, keep_steps=True, wire=wire, rw_protocol=rw_protocol)
    topo = plan.topology
    codes = plan.route_codes().reshape(-1, 1) if plan.columns == 1 else None
    tables = TableCounter(plan.table_sizes, topo.world) if codes is None else None
    touches = ReplicaTouches(plan.num_rows, topo.world, topo.ranks_per_node) if traffic.groups is not None else None
    for batch in batches:
        distinct = None
        if tables is not None:
            lookups, distinct = tables(batch)
            counts = plan.column_counts(lookups)
        else:
            counts = route_counts(batch, codes, topo.world, topo.ranks_per_node)[0]
        host = (host_lookups_per_rank(batch, traffic.host_codes, topo.world) if traffic.host_codes is not None
                else None)
        traffic.add_step(counts, distinct, touches(batch, codes) if touches else None,
                         host, int(batch.size))
    assert traffic.step_bytes is not None
    return traffic.ledger(), traffic.step_bytes, traffic.served()


#: the plans whose shard-sim rows carry a sync-free bound (``syncfree_inter_node_a2a_bytes``)
SYNC_FREE = ("flexshard", "flexshard-device")


@dataclass
class _Entry:
    """One output row of a scale: its key, and its traffic (an index into the scale's ``PlanTraffic``s) or why not."""

    key: dict[str, Any]
    traffic: int = -1
    memory: dict[str, Any] | None = None
    reason: str = ""
    bound: int = -1   # FlexShard: the traffic index of its sync-free plan (``flexshard.sync_free``)


def plan_scale(ds: Dataset, topo: Topology, plans: list[str], headrooms: list[float], counts: np.ndarray,
               batch: int, dim: int, state: int, dense: int, steps: int,
               options: dict[str, Any], wire: Wire | None = None,
               rw_protocol: str = LOOKUP) -> tuple[ScaleSweep, list[_Entry]]:
    """Every plan x headroom of one scale (``counts``: the training split's row counts, ``batch``: the global
    batch, ``wire``: what is sent and priced, ``rw_protocol``: the row plan's output protocol, the other plans
    send lookups), in a ``ScaleSweep`` ready for the batches, and one entry per output row (headroom-major). The
    rows are sorted by count once, for every plan and headroom (``PlanInputs.order``)."""
    start, stop = ds.split("train")
    wire = wire or Wire()
    order = descending(counts)
    sweep = ScaleSweep(topo, int(sum(ds.cardinalities)), wire)
    entries = []
    for headroom in headrooms:
        for name in plans:
            inputs = PlanInputs.for_training(ds.cardinalities, counts, topo, dim, state, headroom, options,
                                             batch / max(1, stop - start), wire=wire, order=order)
            protocol = rw_protocol if name == "row" else LOOKUP
            key = {"dataset": ds.name, "plan": name, "rw_protocol": protocol, "world": topo.world,
                   "ranks_per_node": topo.ranks_per_node,
                   "nodes": topo.nodes, "memory_headroom": headroom, "steps": steps, "batch_size": batch,
                   "batch_per_rank": batch // topo.world, **wire.record()}
            try:
                plan = build_plan(name, inputs)
            except InfeasibleError as e:
                entries.append(_Entry(key, reason=str(e)))
                continue
            memory = {"memory_bytes_per_rank_max": int(plan.bytes_held(dim, state).max()),
                      "memory_budget_bytes": inputs.budget_bytes(),
                      "host_bytes_per_rank_max": int(plan.host_rows_held().max()) * inputs.row_bytes()}
            entries.append(_Entry(key, sweep.add(plan, dim, state, dense, protocol), memory))
            if name in SYNC_FREE:   # the same planner with replicas priced at zero: the sync-free bound
                free = dataclasses.replace(inputs, options={**inputs.options, "replica_sync": "free"})
                entries[-1].bound = sweep.add(build_plan(name, free), dim, state, dense)
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
        bound = _per_step(sweep.traffic[e.bound].ledger(), steps)["inter_node_a2a_bytes"] if e.bound >= 0 \
            else None
        rows.append({**e.key, "status": "ok", **_per_step(traffic.ledger(), steps), **(e.memory or {}),
                     "syncfree_inter_node_a2a_bytes": bound, "replica_sparse_share": traffic.sparse_sync_share(),
                     "load_imbalance": float(served.max() / served.mean()) if served.sum() else float("nan"),
                     **{k: v / steps for k, v in host_counts(int(traffic.host.sum()), traffic.dim).items()},
                     "host_lookups_max_rank": int(traffic.host.max()) / steps})
    return rows


def shard_sim(ds: Dataset, cfg: Sections, plans: list[str], scales: list[Scale], headrooms: list[float],
              options: dict[str, Any] | None = None, batch_per_rank: int | None = None,
              progress: bool = False, rw_protocol: str = LOOKUP) -> list[dict[str, Any]]:
    """One row per plan x scale x headroom: bytes per step of every collective, memory, load imbalance.

    ``batch_per_rank``: weak scaling, each scale's global batch is ``batch_per_rank`` x its world size; None
    keeps ``cfg.train.batch_size`` at every scale. Either way ``cfg.train.steps`` batches in the loader's order;
    each row says the global batch (``batch_size``) and the samples per rank (``batch_per_rank``) it used.
    ``rw_protocol``: the row plan's output protocol (``options.sharded.RW_PROTOCOLS``; ``reduce_scatter`` only for data
    of one id per sample and table, as the training store).
    """
    t = cfg.train
    if batch_per_rank is not None and (isinstance(batch_per_rank, bool) or not isinstance(batch_per_rank, int)
                                       or batch_per_rank < 1):
        raise ValueError(f"batch_per_rank must be a positive integer, got {batch_per_rank!r}")
    check_rw_protocol(ds, rw_protocol)
    dim = cfg.model.embedding_dim
    state = row_state_width(t.row_optimizer, dim)
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
                                    options or {}, cfg.distributed.wire(), rw_protocol)
        sweep.run(tqdm(table_batches(ds, cfg, batch), total=t.steps, unit="batch", disable=not progress,
                       desc=f"shard-sim {topo.label()}: {len(sweep.traffic)} distinct plan(s)"), ds.column_offsets)
        rows += scale_rows(sweep, entries, t.steps)
    return rows


def check_rw_protocol(ds: Dataset, rw_protocol: str) -> None:
    """``ConfigError`` unless ``rw_protocol`` is known and, for ``reduce_scatter``, ``ds`` has one id per sample
    and table (the training store refuses the same)."""
    if rw_protocol not in RW_PROTOCOLS:
        raise ConfigError(f"rw_protocol must be one of {list(RW_PROTOCOLS)}, got {rw_protocol!r}")
    tables = list(ds.column_tables)
    if rw_protocol == REDUCE_SCATTER and len(set(tables)) < len(tables):
        raise ConfigError(f"{ds.path}: rw_protocol reduce_scatter sum-pools one id per sample and table (DLRM "
                          f"style); this dataset's histories share tables and are pooled by the model")


def _per_step(ledger: Ledger, steps: int) -> dict[str, float]:
    """Mean bytes per step of every collective, and of all of them intra- and inter-node."""
    summary = ledger.summary()
    out = {f"{c}_bytes": v["bytes"] / steps for c, v in summary.items()}
    out["intra_node_bytes"] = sum(v["intra_node_bytes"] for v in summary.values()) / steps
    out["inter_node_bytes"] = sum(v["inter_node_bytes"] for v in summary.values()) / steps
    out["inter_node_a2a_bytes"] = sum(summary[c]["inter_node_bytes"]
                                      for c in ("input_a2a", "output_a2a", "grad_a2a")) / steps
    out["inter_node_replica_bytes"] = summary["replica_allreduce"]["inter_node_bytes"] / steps
    out["inter_node_dense_bytes"] = summary["dense_allreduce"]["inter_node_bytes"] / steps
    # every collective of the embeddings (all-to-alls, replica and column all-reduces): all but the dense one
    out["inter_node_embedding_bytes"] = out["inter_node_bytes"] - out["inter_node_dense_bytes"]
    return out


__all__ = ["DEFAULT_HEADROOM", "PlanTraffic", "Scale", "ScaleSweep", "route", "shard_sim",
           "simulate_plan", "step_matrices"]
