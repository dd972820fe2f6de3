"""A sequence model for Taobao-style data: target attention over the user's history.

Columns of the id matrix: user, target item, target category, then L past
events of (item, category), oldest first and left-padded. History rows share
the item and category tables with the target. Each past event is scored
against the target (scaled dot product after a learned projection), padded
events are masked out, and the attention-pooled history joins the user and
target vectors in a top MLP (the interest extraction of DIN; TBSM uses the
same target-attention idea).
"""
from __future__ import annotations

import torch
from torch import nn

from hotcold.config import ModelConfig
from hotcold.model.dlrm import mlp


class SequenceModel(nn.Module):
    def __init__(self, num_sparse: int, history_width: int, cfg: ModelConfig) -> None:
        super().__init__()
        if num_sparse != 3 or history_width != 2:
            raise ValueError("the sequence model expects (user, item, category) targets and "
                             f"(item, category) history events, got {num_sparse} and {history_width}")
        d = cfg.embedding_dim
        self.dim = d
        self.query = nn.Linear(2 * d, 2 * d, bias=False)
        self.top = mlp([7 * d, *cfg.top_mlp], last_relu=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """emb [B, 3 + 2L, D], valid [B, 3 + 2L] (False at padding) -> logits [B]. ``dense`` is unused."""
        b, d = emb.shape[0], self.dim
        user = emb[:, 0]                                    # [B, D]
        target = emb[:, 1:3].reshape(b, 2 * d)              # [B, 2D]
        hist = emb[:, 3:].reshape(b, -1, 2 * d)             # [B, L, 2D]
        mask = valid[:, 3::2]                               # [B, L] an event is present
        scores = torch.einsum("bld,bd->bl", hist, self.query(target)) / (2 * d) ** 0.5
        weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=1) * mask  # no history -> zeros
        pooled = torch.einsum("bl,bld->bd", weights, hist)  # [B, 2D]
        return self.top(torch.cat([user, target, pooled, target * pooled], dim=1)).squeeze(1)
