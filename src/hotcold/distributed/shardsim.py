"""``hotcold shard-sim``: the bytes of every collective for any world size, without training.

From a dataset's training batches (the loader's order) and a plan, the same
routing (``Plan.serving_rank``) and the same byte accounting
(``distributed.traffic``) as the training store give each step's bytes per
collective and per (source, destination) rank, so 16 nodes x 8 GPUs cost a
loop over batches. Tested equal to the training counters at the world sizes
that run here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from hotcold.config import InfeasibleError, RunConfig
from hotcold.counters import FLOAT_BYTES
from hotcold.data.format import Dataset
from hotcold.data.loader import batch_rows
from hotcold.data.skew import row_counts
from hotcold.distributed.plan_types import ALL, DEFAULT_HEADROOM, NODE, Plan, PlanInputs
from hotcold.distributed.plans import build_plan
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import (
    COLLECTIVES,
    ID_BYTES,
    REDUCE_BYTES,
    SPLIT_BYTES,
    Ledger,
    ring_allreduce_matrix,
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


def global_batches(ds: Dataset, cfg: RunConfig) -> Iterator[np.ndarray]:
    """Global rows [B, K] (-1 at padding) of every training batch, in the loader's order."""
    start, stop = ds.split("train")
    t = cfg.train
    for rows in batch_rows(stop - start, t.batch_size, t.steps, cfg.seed, t.shuffle):
        yield ds.global_ids(rows + start)


def route(plan: Plan, batch: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Global batch [B, K] -> counts[r, q] (lookups rank r sends rank q) and each rank's looked-up rows."""
    p = plan.topology.world
    requests = [s.reshape(-1)[s.reshape(-1) >= 0] for s in np.split(batch, p)]
    counts = np.zeros((p, p), dtype=np.int64)
    for r, rows in enumerate(requests):
        if plan.columns > 1:
            counts[r] = rows.size
        else:
            counts[r] = np.bincount(plan.serving_rank(r, rows), minlength=p)
    return counts, requests


def step_matrices(plan: Plan, batch: np.ndarray, dim: int, state_width: int, dense_params: int,
                  routed: tuple[np.ndarray, list[np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """The [P, P] bytes of every collective of one training step of global batch ``batch`` [B, K]
    (``routed``: its ``route``, when already known)."""
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
    tier_all = int((plan.tier == ALL).sum())
    out["replica_allreduce"] = ring_allreduce_matrix(range(p), tier_all * width * REDUCE_BYTES, p)
    node_rows = plan.slot[plan.tier == NODE]
    for local in range(topo.ranks_per_node):
        n = int((node_rows == local).sum())
        out["replica_allreduce"] += ring_allreduce_matrix(topo.cross_node_group(local), n * width * REDUCE_BYTES, p)
    if plan.columns > 1 and state_width:
        uniq = np.unique(np.concatenate(requests)).size
        out["column_allreduce"] = ring_allreduce_matrix(range(p), uniq * REDUCE_BYTES, p)
    out["dense_allreduce"] = ring_allreduce_matrix(range(p), dense_params * REDUCE_BYTES, p)
    return out


def simulate_plan(plan: Plan, batches: Iterable[np.ndarray], dim: int, state_width: int,
                  dense_params: int) -> tuple[Ledger, list[dict[str, int]], np.ndarray]:
    """The ledger over all batches, each step's bytes (``StepCounters`` names) and lookups served per rank."""
    ledger = Ledger(plan.topology)
    steps = []
    served = np.zeros(plan.topology.world, dtype=np.int64)
    for batch in batches:
        routed = route(plan, batch)
        for c, m in step_matrices(plan, batch, dim, state_width, dense_params, routed).items():
            ledger.add(c, m)
        steps.append(ledger.take_step())
        served += routed[0].sum(axis=0)  # what every rank asks of each
    return ledger, steps, served


def shard_sim(ds: Dataset, cfg: RunConfig, plans: list[str], scales: list[Scale], headrooms: list[float],
              options: dict[str, Any] | None = None, *, batch_per_rank: int | None = None) -> list[dict[str, Any]]:
    """One row per plan x scale x headroom: bytes per step of every collective, memory, load imbalance.

    ``batch_per_rank``: each scale's global batch is ``batch_per_rank x world`` (None: ``cfg.train.batch_size``)."""
    from dataclasses import replace

    from hotcold.embedding.update import RowOptimizer

    t = cfg.train
    dim, state = cfg.model.embedding_dim, RowOptimizer(t.row_optimizer, t.lr).state_width
    counts = row_counts(ds, "train")
    start, stop = ds.split("train")
    dense = dense_parameters(ds, cfg)
    rows = []
    for scale in scales:
        topo = scale.topology()
        batch_size = t.batch_size if batch_per_rank is None else batch_per_rank * topo.world
        if batch_size % topo.world:
            raise ValueError(f"batch_size {batch_size} is not divisible by {topo.world} ranks ({scale})")
        batches = list(global_batches(ds, replace(cfg, train=replace(t, batch_size=batch_size))))
        for headroom in headrooms:
            for name in plans:
                inputs = PlanInputs.for_training(ds.cardinalities, counts, topo, dim, state, headroom, options or {},
                                                 batch_size / max(1, stop - start))
                key = {"dataset": ds.name, "plan": name, "world": topo.world, "ranks_per_node": topo.ranks_per_node,
                       "nodes": topo.nodes, "memory_headroom": headroom, "steps": len(batches),
                       "batch_size": batch_size, "batch_per_rank": batch_size // topo.world}
                try:
                    plan = build_plan(name, inputs)
                except InfeasibleError as e:
                    rows.append({**key, "status": "infeasible", "reason": str(e)})
                    continue
                ledger, _, served = simulate_plan(plan, batches, dim, state, dense)
                rows.append({**key, "status": "ok", **_per_step(ledger, len(batches)),
                             "memory_bytes_per_rank_max": int(plan.bytes_held(dim, state).max()),
                             "memory_budget_bytes": inputs.budget_bytes(),
                             "load_imbalance": float(served.max() / served.mean()) if served.sum() else float("nan")})
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


__all__ = ["Scale", "shard_sim", "simulate_plan", "step_matrices", "DEFAULT_HEADROOM"]
