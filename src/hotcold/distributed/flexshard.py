"""FlexShard plan (Sethi et al., arXiv 2301.02959): per-row tiers chosen to minimise the topology's traffic.

Rows are ranked by their training access counts. The hottest ``h`` rows are
replicated on every rank (``ALL``: lookups are local, gradients all-reduced
over all P ranks every step), the next ``w`` once per node (``NODE``: spread
over the node's G ranks, lookups stay inside the node, gradients all-reduced
across the nodes), and the cold rest is sharded over all ranks (``SHARDED``:
a lookup leaves its node with probability (P - G) / P). The bytes per step
(``unit_bytes``, ``expected_lookups``) are priced on the links
(``Bandwidths``), and ``Solver`` finds the exact best (h, w) under the memory budget.

Two options change what it plans:

- ``unaccessed_rows``: ``"host"`` (default) keeps the rows the planning
  profile never saw (count zero) off the device budget: they stay in the
  sharded tier on their row-wise owner (``plan_types.rowwise_owner``), held
  in that rank's host memory (``Plan.off_device``), so the budget they would
  take goes to replicas ("no extra memory": FlexShard's tiers in the
  row-wise plan's device memory). A lookup of such a row later (the profile
  was a sample, or evaluation) is served by its owner like any sharded row,
  so training stays exact; it costs the same bytes as under row-wise.
  ``"device"`` plans every row on the device, as row-wise does.
- ``replica_sync``: ``"priced"`` (default) prices each replica's dense
  all-reduce; ``"free"`` prices it at zero: the plan FlexShard would choose
  if replicas cost nothing to keep in sync, whose all-to-all bytes are the
  sync-free bound ``shard-sim`` reports. The store sends the cheaper of the
  dense all-reduce and an all-gather of the touched rows
  (``replica_sync``), so the dense price is an upper bound of what is sent.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hotcold.config import Wire, is_real, require
from hotcold.distributed.plan_types import ALL, NODE, SHARDED, Plan, PlanInputs, rowwise_owner
from hotcold.distributed.balanced import balance, imbalance
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import ID_BYTES
from hotcold.options.sharded import DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS, REPLICA_SYNC, UNACCESSED



@dataclass(frozen=True)
class UnitBytes:
    """Expected bytes per step over all ranks, as (intra-node, inter-node) pairs, per unit of each quantity."""

    lookup_sharded: tuple[float, float]   # per expected lookup of a SHARDED row
    lookup_node: tuple[float, float]      # per expected lookup of a NODE row
    ring_all: tuple[float, float]         # per ALL row, its gradient ring over all P ranks
    ring_node: tuple[float, float]        # per NODE row, its gradient ring over one rank per node


def ring_links(members: list[int], topo: Topology) -> tuple[int, int]:
    """(intra, inter) links of a ring over ``members`` in ascending order (each member -> its successor)."""
    ranks = sorted(members)
    if len(ranks) < 2:
        return 0, 0
    inter = sum(topo.node(a) != topo.node(b) for a, b in zip(ranks, ranks[1:] + ranks[:1]))
    return len(ranks) - inter, inter


def unit_bytes(topo: Topology, dim: int, wire: Wire | None = None, sync_free: bool = False) -> UnitBytes:
    """The per-lookup and per-replicated-row bytes of the store's protocol on ``topo``.

    Per training step, with every rank equally likely to request any lookup
    (ranks train on equal slices of one global batch) and the store's protocol
    (``sharded.py``): every lookup moves an 8-byte id to its server, a ``D``
    element vector back and a ``D`` element gradient to the server again; sends to
    self are free. Replicated tiers all-reduce ``D`` elements per row per step
    as a ring in ascending rank order (``traffic.py``), whose links are counted
    intra- or inter-node from the topology. Elements are priced as ``wire`` sends
    them (``Wire.vector_bytes``, ``Wire.reduce_bytes``; default: the float32 wire).
    ``sync_free``: the rings cost nothing (the sync-free bound).
    """
    p, g = topo.world, topo.ranks_per_node
    wire = wire or Wire()
    per_lookup = ID_BYTES + 2 * dim * wire.vector_bytes    # id out, vector back, gradient out
    row = dim * wire.reduce_bytes                           # a replicated row's all-reduced gradient

    def ring(members: list[int]) -> tuple[float, float]:
        intra, inter = ring_links(members, topo)
        n = len(members)
        per_member = 2 * (n - 1) / n * row if n > 1 and not sync_free else 0.0
        return intra * per_member, inter * per_member

    return UnitBytes(lookup_sharded=(per_lookup * (g - 1) / p, per_lookup * (p - g) / p),
                     lookup_node=(per_lookup * (g - 1) / g, 0.0),
                     ring_all=ring(list(range(p))),
                     ring_node=ring(topo.cross_node_group(0)))   # every NODE row sits in one such group


@dataclass(frozen=True)
class Bandwidths:
    """Per-rank link bandwidths in bytes per second.

    Modelled time per step = the average rank's intra-node bytes over
    ``intra_node_gbps`` + its inter-node bytes over ``inter_node_gbps``
    (GB/s per rank, one link of each kind per GPU as in a DGX-class node).
    Defaults: 300 GB/s (NVLink-class) and 25 GB/s (one 200 Gb/s NIC per GPU);
    modelled figures, not measurements.
    """

    intra: float
    inter: float

    @classmethod
    def from_options(cls, options: Any) -> Bandwidths:
        vals = []
        for key, default in (("intra_node_gbps", DEFAULT_INTRA_GBPS), ("inter_node_gbps", DEFAULT_INTER_GBPS)):
            v = options.get(key, default)
            require(is_real(v) and math.isfinite(v) and v > 0, "plan flexshard",
                    f"{key} must be a positive number of GB/s, got {v!r}")
            vals.append(float(v) * 1e9)
        return cls(*vals)

    def seconds(self, intra: np.ndarray | float, inter: np.ndarray | float, world: int) -> np.ndarray | float:
        """Modelled step time: the average rank's bytes over its links."""
        return (intra / self.intra + inter / self.inter) / world


def expected_lookups(inputs: PlanInputs) -> np.ndarray:
    """float [N]: each row's expected lookups in one global step.

    Row ``i``'s expected lookups per step are ``counts[i] / sum(counts) *
    lookups_per_step``; ``lookups_per_step`` (one global batch's lookups) comes
    from the options, else ``sum(counts) / steps`` with ``steps`` from the
    options (default 1: then the counts themselves are the step, which makes
    replication look cheap; pass one of the two for a meaningful trade-off).
    """
    counts = np.asarray(inputs.counts, dtype=np.float64)
    total = float(counts.sum())
    opts = inputs.options
    steps = opts.get("steps", 1)
    require(is_real(steps) and steps >= 1, "plan flexshard", f"steps must be a number >= 1, got {steps!r}")
    per_step = opts.get("lookups_per_step", total / steps)
    require(is_real(per_step) and math.isfinite(per_step) and per_step >= 0, "plan flexshard",
            f"lookups_per_step must be a non-negative number, got {per_step!r}")
    return counts * (float(per_step) / total) if total > 0 else counts


def step_bytes(u: UnitBytes, lookups_node: np.ndarray, lookups_sharded: np.ndarray,
               h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intra, inter) expected bytes per step of tierings (vectorised over candidates)."""
    def part(i: int) -> np.ndarray:
        return (u.lookup_sharded[i] * lookups_sharded + u.lookup_node[i] * lookups_node
                + u.ring_all[i] * h + u.ring_node[i] * w)
    return part(0), part(1)


@dataclass
class Tiering:
    """One (h, w) choice with its modelled bytes and time per step."""

    h: int
    w: int
    intra_bytes: float
    inter_bytes: float
    seconds: float

    def record(self) -> dict[str, float]:
        return {"h": self.h, "w": self.w, "intra_node_bytes_per_step": self.intra_bytes,
                "inter_node_bytes_per_step": self.inter_bytes, "modelled_seconds_per_step": self.seconds}


class Solver:
    """Prefix sums over the sorted expected lookups: the modelled time of any (h, w) in O(1).

    With ``F(k)`` the expected lookups of the hottest ``k`` rows and
    ``k = h + w``, the time is ``const - (a_S - a_N) F(k) + r_N k
    - a_N F(h) + (r_A - r_N) h`` (``a``: time per lookup of a tier, ``r``: ring
    time per replicated row). For a fixed ``h`` this is convex in ``k``
    (``F`` is concave because rows are sorted hottest first), so the best ``k``
    is "every row whose lookups save more than its ring costs", clipped to what
    the memory budget allows. Every ``h`` from 0 to its largest feasible value
    is then evaluated at once with prefix sums, so the search is exact: it can
    never do worse than the simplest tiering (no ``ALL`` rows, the largest
    ``NODE`` tier that fits) or than pure sharding, and more memory headroom can
    never raise the modelled time.

    Memory: a rank holds the ``h`` ALL rows, the NODE rows of its local index
    (at most ``ceil(w / G)``) and its sharded rows. With ``B`` budget rows and
    ``S = P B - N`` spare rows over all ranks, a tiering fits iff
    ``(P - 1) h + (M - 1) w <= S`` (each extra copy spends spare rows) and
    ``h + ceil(w / G) <= B`` (M = number of nodes).
    """

    def __init__(self, sorted_lookups: np.ndarray, topo: Topology, dim: int, budget_rows: int,
                 bw: Bandwidths, wire: Wire | None = None, sync_free: bool = False) -> None:
        self.n = sorted_lookups.size
        self.prefix = np.concatenate([[0.0], np.cumsum(sorted_lookups)])
        self.sorted = sorted_lookups
        self.topo, self.bw, self.budget = topo, bw, budget_rows
        self.units = unit_bytes(topo, dim, wire, sync_free)
        self.spare = topo.world * budget_rows - self.n

    def evaluate(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(intra bytes, inter bytes, seconds) per step of the tierings ``(h, w)``."""
        h, w = np.asarray(h, dtype=np.int64), np.asarray(w, dtype=np.int64)
        f_h, f_k, total = self.prefix[h], self.prefix[h + w], self.prefix[-1]
        intra, inter = step_bytes(self.units, f_k - f_h, total - f_k, h, w)
        return intra, inter, self.bw.seconds(intra, inter, self.topo.world)

    def tiering(self, h: int, w: int) -> Tiering:
        intra, inter, sec = self.evaluate(np.array([h]), np.array([w]))
        return Tiering(int(h), int(w), float(intra[0]), float(inter[0]), float(sec[0]))

    def max_k(self, h: np.ndarray) -> np.ndarray:
        """Largest h + w that fits the budget for each ``h`` (h itself must already fit)."""
        p, g, m = self.topo.world, self.topo.ranks_per_node, self.topo.nodes
        k = np.minimum(self.n, h + g * (self.budget - h))                   # h + ceil(w / G) <= B
        if m > 1:                                                           # (P - M) h + (M - 1) k <= S
            k = np.minimum(k, (self.spare - (p - m) * h) // (m - 1))
        return np.maximum(k, h)

    def max_h(self) -> int:
        p = self.topo.world
        h = min(self.n, self.budget)
        return int(min(h, self.spare // (p - 1))) if p > 1 else int(h)

    def simplest(self) -> Tiering:
        """The hottest rows replicated once per node, as many as fit, nothing on every rank."""
        return self.tiering(0, int(self.max_k(np.array([0]))[0]))

    def solve(self) -> Tiering:
        """The exact optimum: every feasible h, each with its best w (for a fixed h the cost is convex in h + w)."""
        a_s = self.bw.seconds(*self.units.lookup_sharded, self.topo.world)
        a_n = self.bw.seconds(*self.units.lookup_node, self.topo.world)
        r_n = self.bw.seconds(*self.units.ring_node, self.topo.world)
        # rows worth a NODE copy rather than a sharded one (a prefix: the rows are sorted hottest first)
        k_free = int(np.count_nonzero((a_s - a_n) * self.sorted > r_n))
        h = np.arange(max(self.max_h(), 0) + 1, dtype=np.int64)
        k = np.clip(k_free, h, self.max_k(h))
        _, _, sec = self.evaluate(h, k - h)
        best = int(np.argmin(sec))   # first minimum: the least replication among equals
        return self.tiering(int(h[best]), int(k[best] - h[best]))


def place(inputs: PlanInputs, order: np.ndarray, lookups: np.ndarray, h: int, w: int,
          off_device: np.ndarray | None = None) -> Plan:
    """The plan of tiering (h, w) of the rows ``order`` (hottest first): NODE rows balanced over a node's G indices,
    the rest over all P ranks; ``off_device`` (rows outside ``order``): on their row-wise owner's host memory."""
    topo, budget = inputs.topology, inputs.budget_rows()
    g, p = topo.ranks_per_node, topo.world
    tier = np.full(inputs.num_rows, SHARDED, dtype=np.int8)
    slot = np.full(inputs.num_rows, -1, dtype=np.int32)
    hot, warm, cold = order[:h], order[h:h + w], order[h + w:]
    tier[hot], tier[warm] = ALL, NODE
    node_slot = balance(lookups[warm], np.full(g, -(-w // g), dtype=np.int64))
    slot[warm] = node_slot
    node_rows = np.bincount(node_slot, minlength=g)
    node_load = np.bincount(node_slot, weights=lookups[warm], minlength=g)
    local = np.arange(p) % g
    # a rank serves its node's share (1/M) of its NODE rows' lookups: the sharded tier evens out the rest
    slot[cold] = balance(lookups[cold], budget - h - node_rows[local], initial=node_load[local] / topo.nodes)
    host = None
    if off_device is not None and off_device.size:
        slot[off_device] = rowwise_owner(inputs.table_sizes, p, off_device)
        host = np.zeros(inputs.num_rows, dtype=bool)
        host[off_device] = True
    return Plan("flexshard", topo, list(inputs.table_sizes), tier, slot, off_device=host)


def served_per_rank(plan: Plan, lookups: np.ndarray) -> np.ndarray:
    """float [P]: expected lookups each rank serves under the uniform-requester model."""
    topo = plan.topology
    p, g, m = topo.world, topo.ranks_per_node, topo.nodes
    out = np.zeros(p)
    sh, nd, al = plan.tier == SHARDED, plan.tier == NODE, plan.tier == ALL
    out += np.bincount(plan.slot[sh], weights=lookups[sh], minlength=p)
    out += np.tile(np.bincount(plan.slot[nd], weights=lookups[nd], minlength=g) / m, m)
    out += lookups[al].sum() / p
    return out


def fits(plan: Plan, inputs: PlanInputs) -> bool:
    return bool(plan.bytes_held(inputs.dim, inputs.state_width).max() <= inputs.budget_bytes())


def flexshard(inputs: PlanInputs) -> Plan:
    """FlexShard's tiered plan for ``inputs``: the (h, w) of least modelled time per step under the budget."""
    bw = Bandwidths.from_options(inputs.options)
    unaccessed, sync = (_choice(inputs, key, known) for key, known in (("unaccessed_rows", UNACCESSED),
                                                                        ("replica_sync", REPLICA_SYNC)))
    lookups = expected_lookups(inputs)
    order = inputs.hottest_first()
    off = None
    if unaccessed == "host":   # the never-seen rows (a suffix of ``order``) leave the device budget
        seen = int(np.count_nonzero(np.asarray(inputs.counts)))
        order, off = order[:seen], order[seen:]
    solver = Solver(lookups[order], inputs.topology, inputs.dim, inputs.budget_rows(), bw, inputs.wire,
                    sync == "free")
    best = solver.solve()
    h, w = best.h, best.w
    plan = place(inputs, order, lookups, h, w, off)
    while not fits(plan, inputs) and h + w > 0:   # cannot happen by the constraints; a guard, not a tuner
        h, w = h // 2, w // 2
        plan = place(inputs, order, lookups, h, w, off)
    chosen = solver.tiering(h, w)
    served = served_per_rank(plan, lookups)
    plan.details.update({
        "tiering": chosen.record(), "simplest_tiering": solver.simplest().record(),
        "row_wise": solver.tiering(0, 0).record(),
        "intra_node_gbps": bw.intra / 1e9, "inter_node_gbps": bw.inter / 1e9,
        "lookups_per_step": float(lookups.sum()),
        "expected_lookups_per_rank": served.tolist(), "expected_lookup_imbalance": imbalance(served),
        "unaccessed_rows": unaccessed, "rows_off_device": int(off.size) if off is not None else 0,
        "replica_sync": sync,
    })
    plan.details["priced_wire"] = inputs.wire.record()   # what the solver priced each element as
    return plan


def flexshard_on_device(inputs: PlanInputs) -> Plan:
    """FlexShard with every row on the device budget (``unaccessed_rows="device"``), as plan ``flexshard-device``."""
    plan = flexshard(dataclasses.replace(inputs, options={**inputs.options, "unaccessed_rows": "device"}))
    plan.name = "flexshard-device"
    return plan


def sync_free(inputs: PlanInputs) -> Plan:
    """FlexShard's plan if replicas cost nothing to keep in sync (``replica_sync="free"``): the sync-free bound."""
    return flexshard(dataclasses.replace(inputs, options={**inputs.options, "replica_sync": "free"}))


def _choice(inputs: PlanInputs, key: str, known: tuple[str, ...]) -> str:
    value = inputs.options.get(key, known[0])
    require(value in known, "plan flexshard", f"{key} must be one of {list(known)}, got {value!r}")
    return str(value)
