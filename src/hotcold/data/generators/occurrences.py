"""The full-size model of the Criteo kinds: exact per-row counts over a full dataset, placed in time.

At the real table sizes a row exists because its value occurs: over the
``F = full_samples`` samples of the full dataset every row of a table is
looked up at least once, and the table's ``F`` lookups (one per sample) fall
on its ``n`` rows with these counts (``table_counts``), by popularity rank r:

    count(r) = 1 + extra(r),   extra(r) ~ (F - n) * (r + 1)^-a / sum_j (j + 1)^-a

(floored, the remainder added to the top ranks, so the counts sum to ``F``
exactly): one occurrence per row, the value's existence, plus a power law
of exponent ``a`` (``GeneratorConfig.exponent``) for the rest. The top of the
law is the head; where ``extra`` falls below 1 the rows are seen once, the tail.

The occurrences are placed in time by a pseudo-random permutation of the
``F`` positions (``PositionShuffle``, a Feistel network with random round
tables, cycle-walked onto ``[0, F)``): position p holds element
``shuffle(p)`` of the lookups listed rank by rank, so every rank gets exactly
its count over the full dataset, and a dataset of ``rows`` samples is the
first ``rows`` positions of the same process, computed without the rest.
Ranks become ids through the table's rank -> id permutation, which drifts at
each of the ``drift_segments`` boundaries of the FULL dataset (``drift``),
among the ranks seen often enough (``DRIFT_MIN_PER_SEGMENT`` times per
segment on average) that a hot rank is looked up in every segment: an id
swapped in or out of a hot rank is then seen while it holds it, so every id
still occurs over the full dataset.

A prefix of ``m`` samples touches a rank of count c with probability
``1 - C(F - c, m) / C(F, m)`` (``expected_touched``), the share of rows the
real dataset's first ``m`` samples touch if its occurrences are as evenly
spread.
"""
from __future__ import annotations

import math

import numpy as np

from hotcold.data.generators.drift import HOT_FRACTION, drift
from hotcold.data.powerlaw import powerlaw_weights

ROUNDS = 4                  # Feistel rounds (random round functions: a pseudo-random permutation)
DRIFT_MIN_PER_SEGMENT = 40  # a drifting rank is seen >= 40 times per segment on average: P(missing one) ~ e^-40
# Criteo Kaggle train.txt, 45,840,617 lines: 998,960 features in AutoInt's preprocessing (Song et al., CIKM
# 2019, Table 1), which gives a field's value its own feature when it occurs more than 10 times, and keeps
# one feature per field for the rest and one per dense field: 998,960 - 26 - 13 rows seen more than 10 times.
KAGGLE_ROWS_SEEN_OVER_10 = 998_921


def exact_counts(weights: np.ndarray, total: int, minimum: int = 1) -> np.ndarray:
    """Lookups int64 [n] summing to ``total``: ``minimum`` each plus the rest split by ``weights`` [n] (non-increasing).

    The rest is floored per row and its remainder (< n) added to the first rows.
    """
    n = weights.size
    if not 1 <= minimum * n <= total:
        raise ValueError(f"{n} rows of at least {minimum} lookups need 1 <= {minimum} * rows <= lookups, "
                         f"got {total} lookups")
    extra = np.floor((total - minimum * n) * (weights / weights.sum())).astype(np.int64)
    extra[: total - minimum * n - int(extra.sum())] += 1   # the floors' remainder (< n) to the top ranks
    return minimum + extra


def table_counts(n: int, total: int, exponent: float) -> np.ndarray:
    """Lookups int64 [n] of each popularity rank over ``total`` lookups: all >= 1, non-increasing, summing to total."""
    if not 1 <= n <= total:
        raise ValueError(f"a table of {n} rows needs 1 <= rows <= lookups, got {total} lookups")
    return exact_counts(powerlaw_weights(n, exponent), total)


def expected_touched(counts: np.ndarray, prefix: int, total: int) -> float:
    """Expected share of rows seen in the first ``prefix`` of ``total`` positions, rows of ``counts`` [n] placed at random.

    A row of count c is missed with probability ``C(total - c, prefix) / C(total, prefix)``.
    """
    if not 0 <= prefix <= total:
        raise ValueError(f"prefix must lie in [0, {total}], got {prefix}")
    values, rows = np.unique(np.asarray(counts, dtype=np.int64), return_counts=True)
    rest = total - prefix
    missed = 0.0
    for c, k in zip(values.tolist(), rows.tolist()):
        if c <= rest:
            log_p = (math.lgamma(rest + 1) - math.lgamma(rest - c + 1)
                     - math.lgamma(total + 1) + math.lgamma(total - c + 1))
            missed += k * math.exp(log_p)
    return 1.0 - missed / float(rows.sum())


def miss_probability(counts: np.ndarray, prefix: int, total: int, at_least: int = 1) -> np.ndarray:
    """float64 [n]: chance that a row of count c (``counts`` [n]) is seen fewer than ``at_least`` times in the
    first ``prefix`` of ``total`` positions, its c positions placed at random (hypergeometric)."""
    if not 0 <= prefix <= total:
        raise ValueError(f"prefix must lie in [0, {total}], got {prefix}")
    values, inverse = np.unique(np.asarray(counts, dtype=np.int64), return_inverse=True)
    p = np.zeros(values.size)
    for i, c in enumerate(values.tolist()):
        for k in range(min(at_least, c + 1, prefix + 1)):   # P(exactly k of the c in the prefix)
            if c - k <= total - prefix:
                p[i] += math.exp(math.lgamma(c + 1) - math.lgamma(k + 1) - math.lgamma(c - k + 1)
                                 + math.lgamma(total - c + 1) - math.lgamma(prefix - k + 1)
                                 - math.lgamma(total - c - prefix + k + 1) - math.lgamma(total + 1)
                                 + math.lgamma(prefix + 1) + math.lgamma(total - prefix + 1))
    return p[inverse.reshape(-1)]


class PositionShuffle:
    """A keyed bijection of ``[0, size)``: a Feistel network with random round tables, cycle-walked.

    ``ROUNDS`` rounds on 2h bits (``4^h >= size``), each ``L, R = R, L ^ T_i[R]``
    with ``T_i`` a random table of ``2^h`` entries: any position maps to its
    element without computing the others.
    """

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.half = max(1, math.ceil(max(1, (size - 1).bit_length()) / 2))
        self.mask = (1 << self.half) - 1
        self.tables = rng.integers(0, 1 << self.half, size=(ROUNDS, 1 << self.half), dtype=np.int64)

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for table in self.tables:
            left, right = right, left ^ table[right]
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Elements int64 of ``positions`` (int, in ``[0, size)``)."""
        out = self._rounds(np.asarray(positions, dtype=np.int64))
        todo = np.flatnonzero(out >= self.size)
        while todo.size:                       # cycle walking: map again until inside [0, size)
            out[todo] = self._rounds(out[todo])
            todo = todo[out[todo] >= self.size]
        return out


class Occurrences:
    """The ids of one table at any positions of the full dataset, segment by segment (time order).

    ``counts`` [n] (non-increasing, by rank) list ``sum(counts) <= total``
    lookups rank by rank; position p holds element ``shuffle(p)``, which is
    no lookup (id -1) where it is ``>= sum(counts)``. ``ids(lo, hi)`` must be
    called with increasing, non-overlapping ranges that do not straddle a
    segment boundary (``boundaries``); the table's rank -> id permutation
    drifts as a range enters a new segment.
    """

    def __init__(self, counts: np.ndarray, total: int, drift_share: float, segments: int,
                 rng: np.random.Generator) -> None:
        n = counts.size
        self.counts = counts                                            # [n] by rank
        self.lookups = int(counts.sum())
        if self.lookups > total:
            raise ValueError(f"{self.lookups} lookups do not fit {total} positions")
        self.perm = rng.permutation(n).astype(np.int32)                 # rank -> id
        self.shuffle = PositionShuffle(total, rng)
        self.rng, self.drift_share, self.total, self.segments = rng, drift_share, total, segments
        self.boundaries = [k * total // segments for k in range(segments + 1)]
        often = int(np.searchsorted(-self.counts, -DRIFT_MIN_PER_SEGMENT * segments, side="right"))
        self.hot = min(max(1, math.ceil(HOT_FRACTION * n)), often)     # the drifting ranks
        # Runs of ranks with equal counts (few: the counts are non-increasing): first rank, first element, count.
        first = np.flatnonzero(np.diff(self.counts, prepend=self.counts[0] + 1))
        self.run_rank, self.run_count = first, self.counts[first]
        self.run_elem = np.concatenate([[0], np.cumsum(self.counts)[first[1:] - 1]])
        self.segment = 0

    def ranks(self, elements: np.ndarray) -> np.ndarray:
        """Rank int64 of each element (the lookups listed rank by rank)."""
        run = np.searchsorted(self.run_elem, elements, side="right") - 1
        return self.run_rank[run] + (elements - self.run_elem[run]) // self.run_count[run]

    def enter(self, lo: int, hi: int) -> None:
        """Check that ``[lo, hi)`` lies in one segment, at or after the current one; drift into it."""
        seg = int(np.searchsorted(self.boundaries, lo, side="right")) - 1
        if hi > self.boundaries[seg + 1]:
            raise ValueError(f"positions [{lo}, {hi}) straddle the segment boundary {self.boundaries[seg + 1]}")
        if seg < self.segment:
            raise ValueError(f"positions must be visited in time order (segment {seg} after {self.segment})")
        while self.segment < seg:
            self.segment += 1
            if self.drift_share > 0 and self.hot > 0:
                drift(self.perm, self.hot, self.drift_share, self.rng)

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """int32 [hi - lo] ids looked up by samples ``lo .. hi-1`` of the full dataset (-1: no lookup)."""
        self.enter(lo, hi)
        elements = self.shuffle(np.arange(lo, hi, dtype=np.int64))
        if self.lookups == self.total:
            return self.perm[self.ranks(elements)]
        out = np.full(hi - lo, -1, dtype=np.int32)
        hit = elements < self.lookups
        out[hit] = self.perm[self.ranks(elements[hit])]
        return out


class TableOccurrences(Occurrences):
    """A table whose ``total`` lookups (one per sample) have the counts ``table_counts(n, total, exponent)``."""

    def __init__(self, n: int, total: int, exponent: float, drift_share: float, segments: int,
                 rng: np.random.Generator) -> None:
        super().__init__(table_counts(n, total, exponent), total, drift_share, segments, rng)
