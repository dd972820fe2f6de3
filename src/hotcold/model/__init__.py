"""The models: DLRM for Criteo-shaped data, a target-attention model for sequences."""
from __future__ import annotations

from torch import nn

from hotcold.config import ModelConfig
from hotcold.data.format import Dataset
from hotcold.model.dlrm import DLRM
from hotcold.model.sequence import SequenceModel


def build_model(ds: Dataset, cfg: ModelConfig) -> nn.Module:
    """The model for a dataset's schema: sequence datasets get the sequence model."""
    if ds.sequence:
        return SequenceModel(ds.num_tables, len(ds.sequence["tables"]), cfg)
    return DLRM(ds.num_dense, ds.num_tables, cfg)
