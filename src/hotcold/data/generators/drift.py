"""Drift of the hot set, shared by the generators: popular ranks trade ids between time segments."""
from __future__ import annotations

import numpy as np

# Drift acts on the hottest HOT_FRACTION of ranks of each table (Taobao: of the items).
HOT_FRACTION = 0.1


def drift(perm: np.ndarray, hot: int, share: float, rng: np.random.Generator) -> None:
    """Swap the ids of a random ``share`` of the top ``hot`` ranks with random ranks, in place."""
    a = np.flatnonzero(rng.random(hot) < share)       # hot ranks that move
    b = rng.integers(0, perm.size, size=a.size)       # their partner ranks
    _, first = np.unique(b, return_index=True)
    keep = np.zeros(b.size, dtype=bool)
    keep[first] = True
    keep &= ~np.isin(b, a)                            # disjoint pairs, so one fancy swap is exact
    a, b = a[keep], b[keep]
    perm[a], perm[b] = perm[b], perm[a]   # fancy indexing copies the right side
