"""Counting the lookups a plan serves from its owners' host memory (``Plan.off_device``), without torch.

The training store (``host_tier``) and ``shard-sim`` count them alike: each is a vector copied to the device
and its gradient copied back.
"""
from __future__ import annotations

import numpy as np

from hotcold.counters import vector_bytes
from hotcold.jit import KERNEL, jit


def host_counts(host_lookups: int, dim: int) -> dict[str, int]:
    """The counters of ``host_lookups`` lookups served from host memory: each vector to the device and its
    gradient back (``D * 4`` bytes each way, the ``hybrid`` store's activation traffic)."""
    moved = host_lookups * vector_bytes(dim)
    return {"host_lookups": host_lookups, "vector_bytes_h2d": moved, "grad_bytes_d2h": moved}


def host_codes(plan_host: np.ndarray | None, slot: np.ndarray) -> np.ndarray | None:
    """uint [N]: 0 for a device row, ``owner + 1`` for a host row (None: the plan has none)."""
    if plan_host is None or not plan_host.any():
        return None
    top = int(slot.max()) + 2
    dtype = np.uint8 if top <= 255 else np.uint16 if top <= 65535 else np.uint32
    return np.where(plan_host, slot.astype(np.int64) + 1, 0).astype(dtype)


def host_lookups_per_rank(batch: np.ndarray, codes: np.ndarray, world: int,
                          offsets: np.ndarray | None = None) -> np.ndarray:
    """int64 [P]: lookups of global batch ``batch`` [B, K] (-1 at padding; ``offsets``: it holds table ids, global
    rows ``ids + offsets``) that each rank serves from its host memory under ``host_codes`` ``codes``."""
    ids = np.asarray(batch)
    if KERNEL == "numba":
        out = np.zeros(world + 1, dtype=np.int64)
        offs = np.zeros(ids.shape[1], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
        _count_kernel(np.ascontiguousarray(ids), offs, codes, out)
        return out[1:]
    rows = ids.astype(np.int64) + (0 if offsets is None else np.asarray(offsets, dtype=np.int64))
    rows = rows[ids >= 0]
    return np.bincount(codes[rows].astype(np.int64), minlength=world + 1)[1:world + 1].astype(np.int64)


@jit
def _count_kernel(ids: np.ndarray, offsets: np.ndarray, codes: np.ndarray, out: np.ndarray) -> None:
    """``host_lookups_per_rank``'s count in one pass: ``out`` [P + 1] gets each id's code (0: a device row)."""
    for s in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            if ids[s, k] >= 0:
                out[codes[ids[s, k] + offsets[k]]] += 1
