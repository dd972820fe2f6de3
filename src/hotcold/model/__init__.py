"""The models: DLRM (dots, or DCNv2's cross network) for Criteo-shaped data, multi-hot bags sum-pooled; a
target-attention model for sequences."""
from __future__ import annotations

from torch import nn

from hotcold.config import ConfigError, ModelConfig
from hotcold.data.format import Dataset
from hotcold.model.dcnv2 import DCNv2
from hotcold.model.dlrm import DLRM
from hotcold.model.sequence import SequenceModel


def build_model(ds: Dataset, cfg: ModelConfig) -> nn.Module:
    """The model for a dataset's schema and ``cfg.interaction``: sequence datasets get the sequence model."""
    if ds.sequence:
        if cfg.interaction != "dot":
            raise ConfigError(f"model.interaction {cfg.interaction!r} is for Criteo-shaped data; dataset "
                              f"{ds.name} has histories (the sequence model)")
        return SequenceModel(ds.num_tables, len(ds.sequence["tables"]), cfg)
    return (DCNv2 if cfg.interaction == "dcnv2" else DLRM)(ds.num_dense, ds.num_tables, cfg, ds.bags)
