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
from hotcold.sorting import search_right


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
def _table_kernel(ids: np.ndarray, offsets: np.ndarray, bounds: np.ndarray, world: int, seen: np.ndarray,
                  lookups: np.ndarray, distinct: np.ndarray) -> None:
    """Add to ``lookups`` [P, T] every requester's non-padding lookups per table and to ``distinct`` [T] the
    batch's distinct rows per table (``ids + offsets[k]`` global rows in tables ``bounds`` [T + 1]; ``seen`` [N]
    is all zero before and after)."""
    per = ids.shape[0] // world
    for s in range(ids.shape[0]):
        r = s // per
        for k in range(ids.shape[1]):
            if ids[s, k] >= 0:
                row = ids[s, k] + offsets[k]
                t = search_right(bounds, row) - 1
                lookups[r, t] += 1
                if seen[row] == 0:
                    seen[row] = 1
                    distinct[t] += 1
    for s in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            if ids[s, k] >= 0:
                seen[ids[s, k] + offsets[k]] = 0


class TableCounter:
    """Per batch, what the column-wise plans' traffic reads: every requester's lookups per table [P, T] (a
    lookup of table t goes to each of t's shard owners) and the distinct rows per table [T] (their squares'
    exchange), reusing one [N] marker."""

    def __init__(self, table_sizes: list[int], world: int) -> None:
        self.bounds = np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)
        self.world = world
        self.seen = np.zeros(int(self.bounds[-1]), dtype=np.uint8) if KERNEL == "numba" else None

    def __call__(self, batch: np.ndarray, offsets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lookups [P, T], distinct [T]) of ``batch`` [B, K] (global rows, or table ids with ``offsets``)."""
        ids = np.ascontiguousarray(batch)
        offsets = np.zeros(ids.shape[1], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
        t = self.bounds.size - 1
        if self.seen is None:
            rows = ids.astype(np.int64) + offsets
            valid = ids >= 0
            requester = np.repeat(np.arange(self.world), ids.size // self.world).reshape(ids.shape)[valid]
            table = np.searchsorted(self.bounds, rows[valid], side="right") - 1
            lookups = np.bincount(requester * t + table, minlength=self.world * t).reshape(self.world, t)
            uniq = np.unique(rows[valid])
            distinct = np.bincount(np.searchsorted(self.bounds, uniq, side="right") - 1, minlength=t)
            return lookups.astype(np.int64), distinct.astype(np.int64)
        lookups = np.zeros((self.world, t), dtype=np.int64)
        distinct = np.zeros(t, dtype=np.int64)
        _table_kernel(ids, offsets, self.bounds, self.world, self.seen, lookups, distinct)
        return lookups, distinct


__all__ = ["TableCounter", "lookups_per_rank", "pair_table", "route_counts"]
