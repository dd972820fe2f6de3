"""The dense models' parameter counts from the config alone, without torch: what shard-sim's data-parallel
all-reduce sends a step. ``hotcold.model`` builds the same layers (tests/test_shardsim.py checks every model's
count against the built one's); shard-sim, which never trains, then does not import torch (1.5-3 s a job)."""
from __future__ import annotations

from collections.abc import Sequence

from hotcold.config import ConfigError, ModelConfig
from hotcold.data.format import Dataset


def mlp_parameters(widths: Sequence[int]) -> int:
    """Weights and biases of the linear layers ``widths[0] -> widths[1] -> ...``."""
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def dense_parameters(ds: Dataset, cfg: ModelConfig) -> int:
    """Parameters of the dataset's model under ``cfg`` (``hotcold.model.build_model``'s choice of model)."""
    d = cfg.embedding_dim
    if ds.sequence:   # the sequence model: a query projection (no bias) and the top MLP over 7 d features
        if cfg.interaction != "dot":
            raise ConfigError(f"model.interaction {cfg.interaction!r} is for Criteo-shaped data; dataset "
                              f"{ds.name} has histories (the sequence model)")
        return (2 * d) * (2 * d) + mlp_parameters([7 * d, *cfg.top_mlp])
    bottom = mlp_parameters([ds.num_dense, *cfg.bottom_mlp])
    features = ds.num_tables + 1   # the pooled embeddings and the dense vector
    if cfg.interaction == "dcnv2":  # each cross layer: V_l (no bias) down to the rank, W_l and b_l back up
        width = features * d
        cross = cfg.cross_layers * (width * cfg.cross_rank + cfg.cross_rank * width + width)
        return bottom + cross + mlp_parameters([width, *cfg.top_mlp])
    return bottom + mlp_parameters([d + features * (features - 1) // 2, *cfg.top_mlp])
