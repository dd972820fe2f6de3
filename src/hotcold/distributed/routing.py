"""Route a whole global batch through many row plans at once: lookups per (requester, server) rank pair.

``shard-sim``'s inner loop. A global batch [B, K] of global rows (-1 at
padding) is split into P contiguous slices of ``B / P`` samples, slice r
asked by rank r, as the training loader splits it. Every plan is reduced to
one small code per row (``Plan.route_codes``); the codes of all plans sit
side by side, [N, M], so one lookup reads one cache line for all M plans.
``counts[m, r, q]`` gains one for every lookup of requester r that plan m
serves on rank q, exactly ``Plan.serving_rank``'s answer (the tests check the
two agree on every plan kind). A compiled kernel runs when numba is installed;
without it, the same counts come from numpy (slower, identical).
"""
from __future__ import annotations

import numpy as np

from hotcold.jit import KERNEL, jit


def pair_table(world: int, ranks_per_node: int) -> np.ndarray:
    """int64 [P, P + G + 1]: for requester r and route code c, the flat pair index ``r * P + q`` of the rank q
    that serves it (``Plan.route_codes``): the kernel's branch-free decoding, the same for every plan of a scale."""
    p, g = world, ranks_per_node
    r = np.arange(p, dtype=np.int64)[:, None]
    c = np.arange(p + g + 1, dtype=np.int64)[None, :]
    q = np.where(c < p, c, np.where(c < p + g, r // g * g + c - p, r))
    return r * p + q


@jit
def _route_counts_kernel(ids: np.ndarray, per_rank: int, codes: np.ndarray, table: np.ndarray,
                         counts: np.ndarray) -> None:
    """counts [M, P * P] += lookups of ``ids`` [B * K] per (requester, server) under each plan's ``codes`` [N, M]
    (``table``: ``pair_table``)."""
    m = codes.shape[1]
    for r in range(table.shape[0]):
        pairs = table[r]
        for i in range(r * per_rank, (r + 1) * per_rank):
            row = ids[i]
            if row < 0:
                continue
            for j in range(m):
                counts[j, pairs[codes[row, j]]] += 1


def _route_counts_numpy(ids: np.ndarray, per_rank: int, codes: np.ndarray, world: int, ranks_per_node: int,
                        counts: np.ndarray) -> None:
    """The kernel's counts with numpy, one plan at a time."""
    keep = np.flatnonzero(ids >= 0)
    rows = ids[keep]
    requester = keep // per_rank
    node_base = requester // ranks_per_node * ranks_per_node
    for j in range(codes.shape[1]):
        c = codes[rows, j].astype(np.int64)
        q = np.where(c < world, c, np.where(c < world + ranks_per_node, node_base + c - world, requester))
        counts[j] += np.bincount(requester * world + q, minlength=world * world)


def route_counts(batch: np.ndarray, codes: np.ndarray, world: int, ranks_per_node: int,
                 counts: np.ndarray | None = None) -> np.ndarray:
    """int64 [M, P, P]: lookups of global batch ``batch`` [B, K] that requester r sends rank q under each of the M
    plans whose ``route_codes`` are the columns of ``codes`` [N, M] (added to ``counts`` when given)."""
    if batch.shape[0] % world:
        raise ValueError(f"a batch of {batch.shape[0]} samples does not split over {world} ranks")
    m = codes.shape[1]
    if counts is None:
        counts = np.zeros((m, world, world), dtype=np.int64)
    ids = np.ascontiguousarray(batch, dtype=np.int64).reshape(-1)
    per_rank = ids.size // world
    flat = counts.reshape(m, world * world)  # a view: the kernel adds in place
    if KERNEL == "numba":
        _route_counts_kernel(ids, per_rank, codes, pair_table(world, ranks_per_node), flat)
    else:
        _route_counts_numpy(ids, per_rank, codes, world, ranks_per_node, flat)
    return counts


def lookups_per_rank(batch: np.ndarray, world: int) -> np.ndarray:
    """int64 [P]: the non-padding lookups of every requester's slice of ``batch`` [B, K]."""
    return (batch.reshape(world, -1) >= 0).sum(axis=1, dtype=np.int64)


@jit
def _distinct_kernel(ids: np.ndarray, seen: np.ndarray) -> int:
    """Distinct non-negative values of ``ids``; ``seen`` [N] is all zero before and after."""
    n = 0
    for i in range(ids.size):
        row = ids[i]
        if row >= 0 and seen[row] == 0:
            seen[row] = 1
            n += 1
    for i in range(ids.size):  # leave ``seen`` clean for the next batch
        row = ids[i]
        if row >= 0:
            seen[row] = 0
    return n


class DistinctCounter:
    """Distinct rows of a batch (the column-wise plan's per-step all-reduce), reusing one [N] marker."""

    def __init__(self, num_rows: int) -> None:
        self.seen = np.zeros(num_rows, dtype=np.uint8) if KERNEL == "numba" else None

    def __call__(self, batch: np.ndarray) -> int:
        ids = np.ascontiguousarray(batch, dtype=np.int64).reshape(-1)
        if self.seen is None:
            return int(np.unique(ids[ids >= 0]).size)
        return int(_distinct_kernel(ids, self.seen))


__all__ = ["DistinctCounter", "lookups_per_rank", "pair_table", "route_counts"]
