"""``hybrid``: every row in host memory, lookups and updates on the CPU.

The CPU-GPU hybrid baseline of FAE and ScratchPipe: the CPU gathers the rows
of a batch, the looked-up vectors go to the device for the dense part, their
gradients come back, and the CPU applies the sparse update.
"""
from __future__ import annotations

import torch

from hotcold.accel import runtime
from hotcold.counters import all_host
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.rows import Lookup, init_table


class HybridStore(EmbeddingStore):
    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.weight = init_table(spec.table_sizes, spec.dim, spec.seed)   # [N, D], host
        self.state = self.optimizer.init_state(spec.num_rows, spec.dim)    # [N(, D)], host
        self.rt = runtime(self.device)
        self._out_buf = torch.empty(0)   # pinned staging of looked-up vectors (offloaded only)
        self._grad_buf = torch.empty(0)  # pinned staging of their gradients (offloaded only)
        self._last: Lookup | None = None

    def _staging(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        """A pinned buffer of at least [n, D], grown when needed."""
        if buf.shape[0] < n:
            buf = self.rt.empty_host(n, self.dim)
        return buf

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Host gather, into pinned memory when it will travel to a GPU: [L, D]."""
        if not self.rt.offloaded:
            return self.weight.index_select(0, rows)
        self._out_buf = self._staging(self._out_buf, rows.numel())
        # Safe to reuse: the previous step's copy out of this buffer finished
        # before that step's gradients came back (backward synchronises).
        return torch.index_select(self.weight, 0, rows, out=self._out_buf[: rows.numel()])

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        return self.forward_planned(self.planned(ids), timer)

    def forward_planned(self, lk: Lookup, timer: Marker) -> torch.Tensor:
        """``forward`` of a batch already planned (``plan``): a store that wraps this one passes its own plan,
        so the grouping it made serves this store's update."""
        self._last = lk
        values = self._gather(lk.rows)
        timer.mark("emb_fwd")
        out = self.to_batch(values.to(self.device, non_blocking=self.rt.cuda), lk)  # [B, K, D]
        timer.mark("h2d")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        lk = self._last
        grad = self.from_batch(grad, lk)  # [L, D]
        if self.rt.offloaded:
            self._grad_buf = self._staging(self._grad_buf, lk.size)
            grad = self.rt.copy_to_host(self._grad_buf[: lk.size], grad)
            self.rt.wait(self.rt.current_stream(), "hybrid's gradients")  # the host update needs them (the baseline)
        timer.mark("d2h")
        groups = lk.groups()
        uniq = groups.rows
        self.optimizer.step(self.weight, self.state, uniq, groups, grad)
        self._counters = all_host(lk.size, uniq.numel(), self.dim)
        self._last = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        lk = self.plan(ids)
        return self.to_batch(self.weight.index_select(0, lk.rows).to(self.device), lk)

    def export(self) -> torch.Tensor:
        return self.weight.clone()

    def final_rows(self) -> torch.Tensor:
        return self.weight  # the host table itself: no second copy
