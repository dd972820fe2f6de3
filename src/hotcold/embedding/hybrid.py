"""``hybrid``: every row in host memory, lookups and updates on the CPU.

The CPU-GPU hybrid baseline of FAE and ScratchPipe: the CPU gathers and pools
the rows of a batch, the pooled vectors go to the device for the dense part,
their gradients come back, and the CPU applies the sparse update.
"""
from __future__ import annotations

import torch

from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec, coalesce, init_table


class HybridStore(EmbeddingStore):
    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.weight = init_table(spec.table_sizes, spec.dim, spec.seed)   # [N, D], host
        self.state = self.optimizer.init_state(spec.num_rows)              # [N], host
        self._cuda = self.device.type == "cuda"
        self._out_buf = torch.empty(0)   # pinned staging of pooled vectors (GPU only)
        self._grad_buf = torch.empty(0)  # pinned staging of their gradients (GPU only)
        self._rows: torch.Tensor | None = None

    def _staging(self, buf: torch.Tensor, n: int) -> torch.Tensor:
        """A pinned [n, D] view, growing the buffer when needed."""
        if buf.shape[0] < n:
            buf = torch.empty(n, self.dim, dtype=torch.float32, pin_memory=True)
        return buf

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Host gather into pinned memory when it will travel to a GPU: [L, D]."""
        if not self._cuda:
            return self.weight.index_select(0, rows)
        self._out_buf = self._staging(self._out_buf, rows.numel())
        # Safe to reuse: the previous step's copy out of this buffer finished
        # before that step's gradients came back (backward synchronises).
        return torch.index_select(self.weight, 0, rows, out=self._out_buf[: rows.numel()])

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        rows = self.global_rows(ids)
        self._rows = rows
        pooled = self._gather(rows)
        timer.mark("emb_fwd")
        out = pooled.to(self.device, non_blocking=True).view(*ids.shape, self.dim)  # [B, T, D]
        timer.mark("h2d")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._rows is not None, "backward without forward"
        grad = grad.reshape(-1, self.dim)
        if self._cuda:
            self._grad_buf = self._staging(self._grad_buf, grad.shape[0])
            host = self._grad_buf[: grad.shape[0]]
            host.copy_(grad, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()  # the CPU update needs them
            grad = host
        timer.mark("d2h")
        uniq, summed = coalesce(self._rows, grad)
        self.optimizer.apply(self.weight, self.state, uniq, summed)
        lookups = self._rows.numel()
        moved = lookups * self.dim * 4
        self._counters = {
            "lookups": lookups, "unique_rows": uniq.numel(), "hits": 0, "misses": lookups,
            "rows_h2d": lookups, "rows_d2h": lookups, "bytes_h2d": moved, "bytes_d2h": moved,
        }
        self._rows = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = self.weight.index_select(0, self.global_rows(ids))
        return pooled.to(self.device).view(*ids.shape, self.dim)

    def export(self) -> torch.Tensor:
        return self.weight.clone()
