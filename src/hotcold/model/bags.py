"""Multi-hot features: each table's bag of looked-up vectors sum-pooled into one, inside the model.

A multi-hot dataset's batch has ``bags[t]`` columns of table t, the tables in
order (``Dataset.column_tables``). Every store looks each column up as it
would any other, so stores train the same rows whatever the bags; the model
pools: ``BagPool`` sums each table's columns (``nn.EmbeddingBag(mode="sum")``
over a fixed-size bag). One gather puts the columns in order of bag size,
the tables of one size side by side; each size's block is then one sum, in
the same order on every call. The gradient of a sum hands every column its
bag's gradient; the one gather's backward fills one zero tensor (a gather per
size filled one each: MLPerf's bags have 13 sizes, about a third of a DCNv2
step's dense time at batch 128 on a CPU).
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
        self.widths = tuple(k * len(by_size[k]) for k in self.sizes)  # columns of each size's block
        cols = [c for t in order for c in range(starts[t], starts[t] + self.bags[t])]
        self.register_buffer("cols", torch.tensor(cols, dtype=torch.long), persistent=False)
        self.register_buffer("to_tables", torch.tensor(sorted(range(len(order)), key=order.__getitem__),
                                                       dtype=torch.long), persistent=False)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        b, _, d = emb.shape
        blocks = emb.index_select(1, self.cols).split(self.widths, dim=1)   # [B, n_k * k, D] for each size k
        parts = [block.view(b, -1, k, d).sum(2) for block, k in zip(blocks, self.sizes)]
        pooled = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return pooled.index_select(1, self.to_tables)
