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
def _route_counts_kernel(ids: np.ndarray, offsets: np.ndarray, per_rank: int, codes: np.ndarray,
                         table: np.ndarray, counts: np.ndarray) -> None:
    """counts [M, P * P] += lookups of ``ids`` [B, K] (global row ``ids + offsets[k]``, skipped below 0) per
    (requester, server) under each plan's ``codes`` [N, M] (``table``: ``pair_table``)."""
    m = codes.shape[1]
    k_cols = ids.shape[1]
    for r in range(table.shape[0]):
        pairs = table[r]
        for s in range(r * per_rank, (r + 1) * per_rank):
            for k in range(k_cols):
                local = ids[s, k]
                if local < 0:
                    continue
                row = local + offsets[k]
                for j in range(m):
                    counts[j, pairs[codes[row, j]]] += 1


def _route_counts_numpy(ids: np.ndarray, offsets: np.ndarray, per_rank: int, codes: np.ndarray, world: int,
                        ranks_per_node: int, counts: np.ndarray) -> None:
    """The kernel's counts with numpy, one plan at a time."""
    keep = np.flatnonzero(ids.reshape(-1) >= 0)
    rows = (ids + offsets).reshape(-1)[keep]
    requester = keep // (per_rank * ids.shape[1])
    node_base = requester // ranks_per_node * ranks_per_node
    for j in range(codes.shape[1]):
        c = codes[rows, j].astype(np.int64)
        q = np.where(c < world, c, np.where(c < world + ranks_per_node, node_base + c - world, requester))
        counts[j] += np.bincount(requester * world + q, minlength=world * world)


def route_counts(batch: np.ndarray, codes: np.ndarray, world: int, ranks_per_node: int,
                 counts: np.ndarray | None = None, offsets: np.ndarray | None = None) -> np.ndarray:
    """int64 [M, P, P]: lookups of global batch ``batch`` [B, K] that requester r sends rank q under each of the M
    plans whose ``route_codes`` are the columns of ``codes`` [N, M] (added to ``counts`` when given).

    ``offsets`` [K]: ``batch`` holds each column's table ids, global rows ``ids + offsets`` (``Dataset.batch_ids``
    and ``column_offsets``: no global copy of the batch is made); None: ``batch`` holds global rows.
    """
    if batch.ndim != 2 or batch.shape[0] % world:
        raise ValueError(f"a batch of {batch.shape[0]} samples does not split over {world} ranks")
    m = codes.shape[1]
    if counts is None:
        counts = np.zeros((m, world, world), dtype=np.int64)
    ids = np.ascontiguousarray(batch)
    offsets = np.zeros(ids.shape[1], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
    per_rank = ids.shape[0] // world
    flat = counts.reshape(m, world * world)  # a view: the kernel adds in place
    if KERNEL == "numba":
        _route_counts_kernel(ids, offsets, per_rank, codes, pair_table(world, ranks_per_node), flat)
    else:
        _route_counts_numpy(ids, offsets, per_rank, codes, world, ranks_per_node, flat)
    return counts


def lookups_per_rank(batch: np.ndarray, world: int) -> np.ndarray:
    """int64 [P]: the non-padding lookups of every requester's slice of ``batch`` [B, K]."""
    return (batch.reshape(world, -1) >= 0).sum(axis=1, dtype=np.int64)


@jit
def _distinct_kernel(ids: np.ndarray, offsets: np.ndarray, seen: np.ndarray) -> int:
    """Distinct global rows of ``ids`` [B, K] (``ids + offsets[k]``, skipped below 0); ``seen`` [N] is all zero
    before and after."""
    n = 0
    for s in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            if ids[s, k] >= 0:
                row = ids[s, k] + offsets[k]
                if seen[row] == 0:
                    seen[row] = 1
                    n += 1
    for s in range(ids.shape[0]):  # leave ``seen`` clean for the next batch
        for k in range(ids.shape[1]):
            if ids[s, k] >= 0:
                seen[ids[s, k] + offsets[k]] = 0
    return n


class DistinctCounter:
    """Distinct rows of a batch (the column-wise plan's per-step all-reduce), reusing one [N] marker."""

    def __init__(self, num_rows: int) -> None:
        self.seen = np.zeros(num_rows, dtype=np.uint8) if KERNEL == "numba" else None

    def __call__(self, batch: np.ndarray, offsets: np.ndarray | None = None) -> int:
        """Distinct rows of ``batch`` [B, K] (global rows, or table ids with ``offsets`` as ``route_counts``)."""
        ids = np.ascontiguousarray(batch)
        offsets = np.zeros(ids.shape[1], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
        if self.seen is None:
            return int(np.unique((ids + offsets)[ids >= 0]).size)
        return int(_distinct_kernel(ids, offsets, self.seen))


__all__ = ["DistinctCounter", "lookups_per_rank", "pair_table", "route_counts"]
