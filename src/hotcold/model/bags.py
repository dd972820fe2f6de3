"""Multi-hot features: each table's bag of looked-up vectors sum-pooled into one, inside the model.

A multi-hot dataset's batch has ``bags[t]`` columns of table t, the tables in
order (``Dataset.column_tables``). Every store looks each column up as it
would any other, so stores train the same rows whatever the bags; the model
pools: ``BagPool`` sums each table's columns (``nn.EmbeddingBag(mode="sum")``
over a fixed-size bag). Tables whose bags have the same size are pooled
together, one gather and one sum per distinct size, in the same order on
every call; the gradient of a sum hands every column its bag's gradient.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
from torch import nn


def bag_pool(bags: Sequence[int] | None) -> "BagPool | None":
    """The pooling a model needs for a dataset's ``bags`` (``Dataset.bags``): None where every bag holds one id."""
    return BagPool(bags) if bags is not None and any(int(k) > 1 for k in bags) else None


class BagPool(nn.Module):
    """[B, sum(bags), D] looked-up vectors -> [B, T, D] per-table sums."""

    def __init__(self, bags: Sequence[int]) -> None:
        super().__init__()
        if not bags or any(int(k) < 1 for k in bags):
            raise ValueError(f"bags must be positive sizes, one per table, got {list(bags)}")
        self.bags = tuple(int(k) for k in bags)
        starts = [0]
        for k in self.bags:
            starts.append(starts[-1] + k)
        by_size: dict[int, list[int]] = defaultdict(list)
        for t, k in enumerate(self.bags):
            by_size[k].append(t)
        self.sizes = tuple(sorted(by_size))
        order = [t for k in self.sizes for t in by_size[k]]  # the tables as the groups leave them
        for i, k in enumerate(self.sizes):
            cols = [c for t in by_size[k] for c in range(starts[t], starts[t] + k)]
            self.register_buffer(f"cols{i}", torch.tensor(cols, dtype=torch.long), persistent=False)
        self.register_buffer("to_tables", torch.tensor(sorted(range(len(order)), key=order.__getitem__),
                                                       dtype=torch.long), persistent=False)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        b, _, d = emb.shape
        parts = [emb.index_select(1, getattr(self, f"cols{i}")).view(b, -1, k, d).sum(2)
                 for i, k in enumerate(self.sizes)]
        pooled = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return pooled.index_select(1, self.to_tables)
