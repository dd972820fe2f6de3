"""The exact greedy of ``balanced.balance`` over the hottest rows, compiled: apart from the plans' module, so that
reading a sharded store's options (Snakemake's dry run, the report jobs) imports no numba (0.5 s)."""
from __future__ import annotations

import numpy as np

from hotcold.jit import jit


@jit
def greedy_head(loads: np.ndarray, room: np.ndarray, load: np.ndarray, used: np.ndarray,
                owner: np.ndarray) -> None:
    """Exact LPT over ``loads`` (descending): each item to the bin with the least load, then fewest items, then the
    lowest index, among the bins with room (a scan of the bins per item: at most 128 bins, 8,192 items)."""
    for i in range(loads.size):
        best = -1
        for b in range(room.size):
            if used[b] < room[b] and (best < 0 or load[b] < load[best]
                                      or (load[b] == load[best] and used[b] < used[best])):
                best = b
        owner[i] = best
        load[best] += loads[i]
        used[best] += 1
