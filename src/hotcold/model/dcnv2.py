"""DLRM-DCNv2 (MLPerf Training's recommendation benchmark): a low-rank DCNv2 cross network in place of DLRM's dots.

The bottom MLP's dense vector and the (bag-pooled) embeddings are concatenated into ``x0`` of
``(T + 1) x D`` features; each of L cross layers computes ``x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l``
(``V_l``: D' -> r without bias, ``W_l``: r -> D' with bias ``b_l``; Wang et al. 2021, DCN-V2, its low-rank
form as TorchRec's ``LowRankCrossNet``); the top MLP reads ``x_L``. MLPerf's sizes: D = 128, 27 x 128 = 3,456
features, 3 layers of rank 512, bottom 13-512-256-128, top 1024-1024-512-256-1.
"""
from __future__ import annotations

import torch
from torch import nn

from hotcold.config import ModelConfig
from hotcold.model.bags import bag_pool
from hotcold.model.dlrm import mlp


class LowRankCross(nn.Module):
    """``layers`` low-rank cross layers over ``width`` features."""

    def __init__(self, width: int, layers: int, rank: int) -> None:
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))   # V_l
        self.up = nn.ModuleList(nn.Linear(rank, width, bias=True) for _ in range(layers))      # W_l, b_l

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x
        return x


class DCNv2(nn.Module):
    def __init__(self, num_dense: int, num_tables: int, cfg: ModelConfig, bags: list[int] | None = None) -> None:
        super().__init__()
        self.pool = bag_pool(bags)
        width = (num_tables + 1) * cfg.embedding_dim
        self.bottom = mlp([num_dense, *cfg.bottom_mlp], last_relu=True)
        self.cross = LowRankCross(width, cfg.cross_layers, cfg.cross_rank)
        self.top = mlp([width, *cfg.top_mlp], last_relu=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """dense [B, num_dense], emb [B, T, D] (multi-hot: [B, sum(bags), D]) -> logits [B]."""
        if self.pool is not None:
            emb = self.pool(emb)
        x0 = torch.cat([self.bottom(dense), emb.flatten(1)], dim=1)   # [B, (T+1) D]
        return self.top(self.cross(x0)).squeeze(1)
