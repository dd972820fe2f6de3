"""Replica synchronisation: a dense all-reduce of a tier, or an all-gather of the rows touched, whichever sends less.

FlexShard's replicated tiers (``plan_types``: ``ALL`` over every rank,
``NODE`` over one rank per node) must sum every replica's gradient each step.
A replica group of ``g`` members, holding ``n`` rows of ``width`` elements,
can do it two ways:

- **dense**: all-reduce the whole tier, touched or not: a ring in which each
  member sends its successor ``2 (g - 1) n width E / g`` bytes
  (``traffic.ring_allreduce_matrix``);
- **sparse**: all-gather the rows each member touched this step, ids and
  vectors (``t_i (ID_BYTES + width E)`` bytes from member ``i``), then sum
  them locally in rank order: a ring all-gather, in which member ``i`` sends
  its successor every block but the successor's own
  (``traffic.ring_allgather_matrix``).

``E`` is the all-reduced element's size on the run's wire (``traffic.Wire.reduce_bytes``:
float32 by default, bfloat16 or float64 in exact mode); the training store sends the
gathered rows in that type too.
Every step each group first all-gathers its members' touched counts (one
``SPLIT_BYTES`` integer each, a ring all-gather, counted under the replica
collective), so that every member knows both costs and all choose alike:
sparse when its ring sends fewer bytes in total than the dense ring, dense
otherwise (``sync_sends``). The training store (``sharded.py``) and
``shard-sim`` (``sweep.py``) both book these bytes, so their counters stay
equal; ``ReplicaTouches`` gives shard-sim each member's touched rows per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotcold.config import Wire
from hotcold.distributed.plan_types import ALL, NODE, Plan
from hotcold.distributed.traffic import ID_BYTES, SPLIT_BYTES
from hotcold.jit import KERNEL, jit

DENSE, SPARSE = "dense", "sparse"


def sync_sends(touched: np.ndarray, rows: int, width: int, elem_bytes: int) -> tuple[str, np.ndarray]:
    """One group's step: (``DENSE`` or ``SPARSE``, int64 [g] bytes each member sends its ring successor).

    ``touched`` [g]: the distinct rows of the tier each member (ascending
    rank order) touched this step; ``rows``: the tier's rows on each member;
    ``elem_bytes``: one reduced element's size on the wire (``Wire.reduce_bytes``).
    The count exchange is included; a group of fewer than two members, or of
    no rows, sends nothing.
    """
    touched = np.asarray(touched, dtype=np.int64)
    g = touched.size
    if g < 2 or rows <= 0:
        return DENSE, np.zeros(g, dtype=np.int64)
    exchange = (g - 1) * SPLIT_BYTES
    dense = 2 * (g - 1) * (int(rows) * width * elem_bytes) // g
    blocks = touched * (ID_BYTES + width * elem_bytes)
    sparse = int(blocks.sum()) - np.roll(blocks, -1)
    if int(sparse.sum()) < g * dense:
        return SPARSE, sparse + exchange
    return DENSE, np.full(g, dense + exchange, dtype=np.int64)


@dataclass
class ReplicaGroups:
    """A row plan's replica groups: the ``ALL`` tier over every rank, each ``NODE`` slot across the nodes."""

    world: int
    ranks_per_node: int
    all_rows: int
    node_rows: np.ndarray   # int64 [G]: NODE rows of each index inside a node
    width: int
    elem_bytes: int         # one reduced element on the wire (``Wire.reduce_bytes``)

    @classmethod
    def of(cls, plan: Plan, dim: int, wire: Wire | None = None) -> "ReplicaGroups | None":
        """The plan's groups (None: it has no replicated row), priced as ``wire`` sends (default: the float32 wire)."""
        topo = plan.topology
        if plan.columns > 1 or not np.isin(plan.tier, (ALL, NODE)).any():
            return None
        node_rows = np.bincount(plan.slot[plan.tier == NODE], minlength=topo.ranks_per_node)[:topo.ranks_per_node]
        return cls(topo.world, topo.ranks_per_node, int((plan.tier == ALL).sum()), node_rows.astype(np.int64),
                   dim // plan.columns, (wire or Wire()).reduce_bytes)

    def sends(self, touched_all: np.ndarray, touched_node: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """One step: (bytes each rank sends in the ALL ring [P], in its NODE ring [P], sparse syncs, syncs).

        ``touched_all`` [P]: distinct ALL rows each rank served; ``touched_node`` [P]: distinct NODE rows each
        rank served (its node's lookups of its slot's rows)."""
        p, g = self.world, self.ranks_per_node
        send_all = np.zeros(p, dtype=np.int64)
        send_node = np.zeros(p, dtype=np.int64)
        sparse = syncs = 0
        if p > 1 and self.all_rows:
            how, send_all = sync_sends(touched_all, self.all_rows, self.width, self.elem_bytes)
            sparse, syncs = sparse + (how == SPARSE), syncs + 1
        if p // g > 1:
            for local in range(g):
                if self.node_rows[local]:
                    members = np.arange(local, p, g)
                    how, send_node[members] = sync_sends(touched_node[members], int(self.node_rows[local]),
                                                         self.width, self.elem_bytes)
                    sparse, syncs = sparse + (how == SPARSE), syncs + 1
        return send_all, send_node, sparse, syncs

    def matrix(self, send_all: np.ndarray, send_node: np.ndarray) -> np.ndarray:
        """[P, P]: the sends on the rings' edges (rank r -> r + 1 in the ALL ring, r -> r + G in its NODE ring)."""
        p, g = self.world, self.ranks_per_node
        m = np.zeros((p, p), dtype=np.int64)
        r = np.arange(p)
        np.add.at(m, (r, (r + 1) % p), send_all)
        np.add.at(m, (r, (r + g) % p), send_node)
        return m


@jit
def _touch_kernel(ids: np.ndarray, offsets: np.ndarray, per_rank: int, codes: np.ndarray, cols: np.ndarray,
                  world: int, ranks_per_node: int, seen_by: np.ndarray, seen_in: np.ndarray, key: int,
                  touched_all: np.ndarray, touched_node: np.ndarray) -> None:
    """Distinct replicated rows each rank serves for batch ``ids`` [B, K], under each plan in columns ``cols``
    [C] of ``codes`` (``Plan.route_codes``), in one pass over the batch: an ALL row counts for its requester once
    per requester, a NODE row for its slot's rank in the requester's node once per node. A row's first lookup
    by a requester (``seen_by`` [N] marks it with ``key + r``) and in a node (``seen_in`` [N]: ``key + node``)
    is found once for all plans, which then read its codes from one cache line. Every mark must be below ``key``
    before; adds to ``touched_all`` and ``touched_node`` [C, P]."""
    g = ranks_per_node
    for r in range(world):
        node = r // g
        key_by = key + r
        key_in = key + node
        for s in range(r * per_rank, (r + 1) * per_rank):
            for k in range(ids.shape[1]):
                local = ids[s, k]
                if local < 0:
                    continue
                row = local + offsets[k]
                first_by = seen_by[row] != key_by
                first_in = seen_in[row] != key_in
                if not first_by and not first_in:
                    continue
                seen_by[row] = key_by
                seen_in[row] = key_in
                for i in range(cols.shape[0]):
                    c = codes[row, cols[i]]
                    if c < world:
                        continue
                    if c == world + g:
                        if first_by:
                            touched_all[i, r] += 1
                    elif first_in:
                        touched_node[i, node * g + c - world] += 1


def touches_numpy(ids: np.ndarray, offsets: np.ndarray, codes: np.ndarray, world: int,
                  ranks_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """``_touch_kernel``'s counts with numpy (``codes``: one plan's [N] route codes)."""
    p, g = world, ranks_per_node
    flat = ids.reshape(-1)
    keep = np.flatnonzero(flat >= 0)
    rows = (ids + offsets).reshape(-1)[keep].astype(np.int64)
    requester = keep // (ids.shape[0] // p * ids.shape[1])
    c = codes[rows].astype(np.int64)
    all_mask = c == p + g
    pairs = np.unique(requester[all_mask] * codes.size + rows[all_mask])
    touched_all = np.bincount(pairs // codes.size, minlength=p).astype(np.int64)
    node_mask = (c >= p) & (c < p + g)
    node = requester[node_mask] // g
    server = node * g + c[node_mask] - p
    first = np.unique(node * codes.size + rows[node_mask], return_index=True)[1]  # each (node, row) once
    touched_node = np.bincount(server[first], minlength=p).astype(np.int64)
    return touched_all, touched_node


class ReplicaTouches:
    """Each rank's distinct replicated rows per batch (``sync_sends``' ``touched``), for plans given by codes."""

    LIMIT = np.iinfo(np.uint32).max

    def __init__(self, num_rows: int, world: int, ranks_per_node: int) -> None:
        self.world, self.ranks_per_node = world, ranks_per_node
        numba = KERNEL == "numba"
        self.seen_by = np.zeros(num_rows, dtype=np.uint32) if numba else None
        self.seen_in = np.zeros(num_rows, dtype=np.uint32) if numba else None
        self.key = 1

    def __call__(self, batch: np.ndarray, codes: np.ndarray, j: int = 0,
                 offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(touched ALL rows [P], touched NODE rows [P]) of ``batch`` [B, K] under column ``j`` of ``codes`` [N, M]
        (``offsets``: as ``routing.route_counts``')."""
        touched_all, touched_node = self.many(batch, codes, [j], offsets)
        return touched_all[0], touched_node[0]

    def many(self, batch: np.ndarray, codes: np.ndarray, cols: list[int],
             offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``__call__``'s counts under each column of ``cols`` at once: (touched ALL rows [C, P], touched NODE rows
        [C, P])."""
        p, g = self.world, self.ranks_per_node
        ids = np.ascontiguousarray(batch)
        offsets = np.zeros(ids.shape[1], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
        codes = codes.reshape(codes.shape[0], -1)
        if ids.shape[0] % p:
            raise ValueError(f"a batch of {ids.shape[0]} samples does not split over {p} ranks")
        if self.seen_by is None or self.seen_in is None:
            pairs = [touches_numpy(ids, offsets, codes[:, j], p, g) for j in cols]
            return (np.array([a for a, _ in pairs], dtype=np.int64).reshape(len(cols), p),
                    np.array([b for _, b in pairs], dtype=np.int64).reshape(len(cols), p))
        if self.key + p >= self.LIMIT:
            self.seen_by[:] = 0
            self.seen_in[:] = 0
            self.key = 1
        touched_all = np.zeros((len(cols), p), dtype=np.int64)
        touched_node = np.zeros((len(cols), p), dtype=np.int64)
        _touch_kernel(ids, offsets, ids.shape[0] // p, codes, np.asarray(cols, dtype=np.int64), p, g,
                      self.seen_by, self.seen_in, self.key, touched_all, touched_node)
        self.key += p
        return touched_all, touched_node
