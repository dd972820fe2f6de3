"""Byte accounting of the collectives, shared by the training store and ``shard-sim``.

Every collective's bytes are a [P, P] matrix: entry (s, d) is what rank s
sends to rank d. A rank's sends to itself cross no link and count zero. One
accounting serves both, so a simulated plan and a trained run count the same
bytes. An all-to-all sends each destination exactly its split; an all-reduce
is counted as a ring (``ring_allreduce_matrix``). What each element costs
on the wire is ``config.Wire``'s: the one definition of the element sizes, read by
the training store's ``Comm``, ``shard-sim`` and FlexShard's solver alike.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from hotcold.counters import COLLECTIVES
from hotcold.distributed.topology import Topology

ID_BYTES = 8       # int64 row ids
SPLIT_BYTES = 8    # one int64 count per peer in the size exchange before an uneven all-to-all


def a2a_matrix(rank: int, send_bytes: np.ndarray, world: int) -> np.ndarray:
    """[P, P] with row ``rank`` = ``send_bytes`` [P] (its sends to itself zeroed)."""
    m = np.zeros((world, world), dtype=np.int64)
    m[rank] = send_bytes
    m[rank, rank] = 0
    return m


def ring_allreduce_matrix(group: Iterable[int], nbytes: int, world: int) -> np.ndarray:
    """[P, P] bytes of a ring all-reduce of ``nbytes`` over ``group`` (every member's sends).

    An all-reduce of ``n`` bytes over a group of ``g`` ranks is counted as a
    ring (reduce-scatter then all-gather, ranks in ascending order): each
    member sends ``2 (g - 1) n / g`` bytes (rounded down) to its successor.
    These are the bytes of the algorithm, not what a particular library chose
    to send (gloo and NCCL may pick a tree); docs/scale-out.md says so. ``nbytes``
    is the tensor as sent: elements x ``Wire.reduce_bytes``.
    """
    members = sorted(group)
    g = len(members)
    if g < 2 or nbytes <= 0:
        return np.zeros((world, world), dtype=np.int64)
    return ring_edges(members, world) * (2 * (g - 1) * nbytes // g)


def ring_edges(group: Iterable[int], world: int) -> np.ndarray:
    """int64 [P, P]: 1 from each member of ``group`` to its ring successor (ascending order), 0 elsewhere
    (all 0 for a group of fewer than two ranks): ``ring_allreduce_matrix``'s pattern."""
    members = sorted(group)
    m = np.zeros((world, world), dtype=np.int64)
    if len(members) < 2:
        return m
    for i, src in enumerate(members):
        m[src, members[(i + 1) % len(members)]] += 1
    return m


def split_intra_inter(matrix: np.ndarray, topo: Topology) -> tuple[int, int]:
    """(intra-node, inter-node) bytes of a [P, P] matrix."""
    inter = topo.inter_mask()
    off = ~np.eye(topo.world, dtype=bool)
    return int(matrix[off & ~inter].sum()), int(matrix[inter].sum())


class Ledger:
    """Bytes per collective as [P, P] matrices, per step and in total."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.total = {c: np.zeros((topo.world, topo.world), dtype=np.int64) for c in COLLECTIVES}
        self._step = {c: 0 for c in COLLECTIVES}
        self._step_intra = 0
        self._step_inter = 0

    def add(self, collective: str, matrix: np.ndarray) -> None:
        if collective not in self.total:
            raise KeyError(f"unknown collective {collective!r}; known: {COLLECTIVES}")
        self.total[collective] += matrix
        self._step[collective] += int(matrix.sum())
        intra, inter = split_intra_inter(matrix, self.topo)
        self._step_intra += intra
        self._step_inter += inter

    def take_step(self) -> dict[str, int]:
        """Bytes since the last call, per collective and intra/inter node; resets the step."""
        out = {f"{c}_bytes": v for c, v in self._step.items()}
        out["intra_node_bytes"], out["inter_node_bytes"] = self._step_intra, self._step_inter
        self._step = {c: 0 for c in COLLECTIVES}
        self._step_intra = self._step_inter = 0
        return out

    def summary(self) -> dict[str, dict[str, int]]:
        """{collective: {bytes, intra_node_bytes, inter_node_bytes}} over everything added."""
        out = {}
        for c, m in self.total.items():
            intra, inter = split_intra_inter(m, self.topo)
            out[c] = {"bytes": int(m.sum()), "intra_node_bytes": intra, "inter_node_bytes": inter}
        return out


def ring_allgather_matrix(group: Iterable[int], block_bytes: Iterable[int], world: int) -> np.ndarray:
    """[P, P] bytes of a ring all-gather over ``group`` whose members bring blocks of ``block_bytes`` (group order).

    Ranks in ascending order, each member forwards every block but its
    successor's own to its successor (``g - 1`` hops of every block): the
    algorithm's bytes, as ``ring_allreduce_matrix`` counts an all-reduce.
    """
    return _ring_blocks(group, block_bytes, world, skip=1)


def ring_reducescatter_matrix(group: Iterable[int], block_bytes: Iterable[int], world: int) -> np.ndarray:
    """[P, P] bytes of a ring reduce-scatter over ``group`` whose members end with blocks of ``block_bytes``
    (group order).

    Ranks in ascending order; member j's block starts at j's successor and is summed along the ring back to j
    (``g - 1`` hops), so every member forwards every block but its own: the first half of
    ``ring_allreduce_matrix``'s ring (even blocks: ``(g - 1) n / g`` bytes each of an ``n``-byte tensor).
    """
    return _ring_blocks(group, block_bytes, world, skip=0)


def _ring_blocks(group: Iterable[int], block_bytes: Iterable[int], world: int, skip: int) -> np.ndarray:
    """[P, P]: each member (ascending order) sends its ring successor every block but that of the member
    ``skip`` places after it (0: its own, 1: its successor's)."""
    members = sorted(group)
    blocks = np.asarray(list(block_bytes), dtype=np.int64)
    m = np.zeros((world, world), dtype=np.int64)
    g = len(members)
    if g < 2:
        return m
    total = int(blocks.sum())
    for i, src in enumerate(members):
        m[src, members[(i + 1) % g]] += total - int(blocks[(i + skip) % g])
    return m
