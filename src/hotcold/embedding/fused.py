"""A batch's sparse backward and row update as one kernel: the gradient sum per row, then SGD or Adagrad.

``update.sparse_step`` composes the step from torch operations (an
embedding-bag sum, the pairwise square sum, then gather, arithmetic,
scatter): about fifteen kernels a step. Here the same arithmetic runs as one
compiled loop over the distinct rows (numba, without the GIL), each row's
float32 operations one after the other in the same order and with the same
rounding as the torch composition:

- the row's gradient: its lookups' gradients added in batch order into zero;
- row-wise Adagrad: the squares added as ``update.row_square_sums``'s pairwise
  tree, times the reciprocal of the width, added to the row's state; the
  gradient divided by the state's square root plus ``eps``;
- per-element Adagrad: each element's square added to its own state, the
  element divided by that state's square root plus ``eps``;
- the weight minus ``lr`` times that.

No operation is fused (numba's default: no fast-math, no contraction into
multiply-adds), so the result is the torch composition's bits (tested).
Rows are independent, so ``threads`` > 1 splits them into contiguous chunks
run on a thread pool: the same bits at any thread count.
"""
from __future__ import annotations

import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import torch

from hotcold.jit import KERNEL, jit

#: below this many distinct rows a step runs on one thread (a pool's hand-off costs more than the work)
MIN_ROWS_PER_THREAD = 2048


@jit
def _step_rows(weight, state, slots, order, starts, grads, lr, eps, inv_width, mode, lo, hi):  # pragma: no cover
    """Rows ``lo..hi`` of the step (numba; the plain-Python body is the same arithmetic, slowly).

    ``mode``: 0 SGD, 1 row-wise Adagrad, 2 per-element Adagrad. weight float32
    [N, D], state float32 [N, 1] (row-wise), [N, D] (per element; unread for SGD), slots int64 [U],
    order int64 [L], starts int64 [U + 1] (the last: L), grads float32 [L, D];
    lr, eps, inv_width: float32 scalars.
    """
    width = weight.shape[1]
    g = np.empty((hi - lo, width), dtype=np.float32)  # the rows' gradient sums, first all of them (a tight loop)
    sq = np.empty(width, dtype=np.float32)
    zero = np.float32(0.0)
    for u in range(lo, hi):
        k = u - lo
        for d in range(width):
            g[k, d] = zero
        for j in range(starts[u], starts[u + 1]):
            src = order[j]
            for d in range(width):
                g[k, d] += grads[src, d]
    for u in range(lo, hi):
        k, s = u - lo, slots[u]
        if mode == 2:
            for d in range(width):
                acc = state[s, d] + g[k, d] * g[k, d]
                state[s, d] = acc
                denom = np.float32(math.sqrt(acc)) + eps  # correctly rounded (update.correct_sqrt)
                weight[s, d] = weight[s, d] - lr * (g[k, d] / denom)
        elif mode == 1:
            for d in range(width):
                sq[d] = g[k, d] * g[k, d]
            n = width
            while n > 1:  # update.row_square_sums: halves added pairwise, an odd last column into the first
                half = n // 2
                for d in range(half):
                    sq[d] = sq[d] + sq[half + d]
                if n % 2:
                    sq[0] = sq[0] + sq[2 * half]
                n = half
            acc = state[s, 0] + sq[0] * inv_width
            state[s, 0] = acc
            denom = np.float32(math.sqrt(acc)) + eps  # correctly rounded (update.correct_sqrt)
            for d in range(width):
                weight[s, d] = weight[s, d] - lr * (g[k, d] / denom)
        else:
            for d in range(width):
                weight[s, d] = weight[s, d] - lr * g[k, d]


_POOL: ThreadPoolExecutor | None = None
_WATCH = threading.local()  # this thread's observer of the kernels run (``watching``)


@contextlib.contextmanager
def watching(seen: Callable[[str], None]) -> Iterator[None]:
    """Within: every ``fused_step`` on this thread calls ``seen`` with its name: a kernel that no torch
    dispatch sees (``bench.opcount.OpCount`` counts it as one operation)."""
    before = getattr(_WATCH, "seen", None)
    _WATCH.seen = seen
    try:
        yield
    finally:
        _WATCH.seen = before



def _pool(threads: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < threads:  # noqa: SLF001 - grown, never shrunk
        _POOL = ThreadPoolExecutor(threads, thread_name_prefix="hotcold-rows")
    return _POOL


def available(weight: torch.Tensor, grads: torch.Tensor) -> bool:
    """Whether ``fused_step`` runs these tensors: compiled kernels, float32 on the CPU, contiguous rows."""
    return (KERNEL == "numba" and weight.device.type == "cpu" and grads.device.type == "cpu"
            and weight.dtype == grads.dtype == torch.float32 and weight.dim() == 2 and weight.is_contiguous())


def fused_step(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, order: torch.Tensor,
               offsets: torch.Tensor, grads: torch.Tensor, lr: float, eps: float, adagrad: bool,
               threads: int = 1, elementwise: bool = False) -> None:
    """``update.sparse_step``'s arithmetic in one kernel, in place on ``weight`` (and ``state`` for Adagrad).

    slots int64 [U]: the rows' places in ``weight``; ``order`` [L] and
    ``offsets`` [U + 1]: the lookups of row u are ``order[offsets[u]:offsets[u + 1]]``
    (``RowGroups``); grads float32 [L, D]. ``available`` must hold.
    """
    u = slots.numel()
    seen = getattr(_WATCH, "seen", None)
    if seen is not None:
        seen("hotcold.fused_step")
    if not u:
        return
    w = weight.numpy()
    s = state.numpy().reshape(state.shape[0], -1) if adagrad else np.zeros((1, 1), dtype=np.float32)
    args = (w, s, slots.numpy(), order.numpy(), offsets.numpy(), grads.contiguous().numpy(),
            np.float32(lr), np.float32(eps), np.float32(1.0 / max(w.shape[1], 1)),
            (2 if elementwise else 1) if adagrad else 0)
    chunks = min(max(1, int(threads)), max(1, u // MIN_ROWS_PER_THREAD))
    if chunks == 1:
        _step_rows(*args, 0, u)
        return
    bounds = np.linspace(0, u, chunks + 1).astype(np.int64)
    futures = [_pool(chunks).submit(_step_rows, *args, int(a), int(b)) for a, b in zip(bounds, bounds[1:])]
    for f in futures:
        f.result()
