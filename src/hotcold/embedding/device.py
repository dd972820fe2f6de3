"""``device``: every row in the trainer device's memory; the upper bound."""
from __future__ import annotations

import torch

from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec, coalesce, init_table


class DeviceStore(EmbeddingStore):
    """All rows and their optimizer state live on the trainer device.

    Only the ids cross from the host; lookup, pooling and the sparse update
    run where the rows are. Nothing else moves.
    """

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.weight = init_table(spec.table_sizes, spec.dim, spec.seed).to(self.device)  # [N, D]
        self.state = self.optimizer.init_state(spec.num_rows, self.device)                # [N]
        self.offsets = self.offsets_cpu.to(self.device)
        self._rows: torch.Tensor | None = None

    def _rows_on_device(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.device, non_blocking=True)
        return (ids + self.offsets).reshape(-1)  # [B*T]

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        rows = self._rows_on_device(ids)
        timer.mark("h2d")
        self._rows = rows
        out = self.weight.index_select(0, rows).view(*ids.shape, self.dim)  # [B, T, D]
        timer.mark("emb_fwd")
        return out

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._rows is not None, "backward without forward"
        uniq, summed = coalesce(self._rows, grad.reshape(-1, self.dim))
        self.optimizer.apply(self.weight, self.state, uniq, summed)
        lookups = self._rows.numel()
        self._counters = {
            "lookups": lookups, "unique_rows": uniq.numel(), "hits": lookups, "misses": 0,
            "rows_h2d": 0, "rows_d2h": 0, "bytes_h2d": 0, "bytes_d2h": 0,
        }
        self._rows = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.index_select(0, self._rows_on_device(ids)).view(*ids.shape, self.dim)

    def export(self) -> torch.Tensor:
        return self.weight.detach().cpu()
