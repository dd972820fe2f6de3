"""Multi-hot bags as MLPerf's DLRM-DCNv2 builds them from one-hot Criteo data.

Id x of table t becomes the bag ``[x, r_1(x), ..., r_(k-1)(x)]`` of k ids (``MLPERF_BAGS``): the first keeps the
one-hot data's skew, the others are a fixed function of (seed, table, x, position) drawn uniformly over the
table, so a sample's bag is the same wherever and whenever its first id occurs. MLPerf materializes that
function as a random table of ``rows x (k - 1)`` ids per table; here it is a hash (SplitMix64's finalizer,
applied to the four keys in turn), so memory does not grow with the rows.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 whose outputs look uniform."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def extra_ids(first: np.ndarray, seed: int, table: int, position: int, rows: int) -> np.ndarray:
    """int64 [m]: the bag's id at ``position`` (>= 1) for each first id, uniform over ``[0, rows)``."""
    with np.errstate(over="ignore"):
        key = _mix(np.full(1, seed, np.uint64) ^ (np.uint64(table) << np.uint64(32)))
        key = _mix(key ^ np.uint64(position))
        h = _mix(first.astype(np.uint64) ^ key)
    return (h % np.uint64(rows)).astype(np.int64)


def bag_ids(first: np.ndarray, seed: int, table: int, size: int, rows: int) -> np.ndarray:
    """int32 [m, size]: each sample's bag of table ``table``, its first id ``first`` [m]."""
    out = np.empty((len(first), size), dtype=np.int32)
    out[:, 0] = first
    for j in range(1, size):
        out[:, j] = extra_ids(first, seed, table, j, rows)
    return out
