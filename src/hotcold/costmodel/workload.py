"""The workload: what a run's record says one step did, and the dense model's sizes.

``Workload.from_record`` reads a record's config, its summary's per-step
counters (sums over ranks in a scale-out run) and its store report; the
techniques' pricing (``techniques.py``) reads nothing else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from hotcold.config import ConfigError, row_state_width
from hotcold.counters import FLOAT_BYTES

@dataclass(frozen=True)
class ModelShape:
    """The dense model's sizes: what its FLOPs and ops are counted from."""

    num_dense: int = 13
    num_tables: int = 26
    dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32, 1)
    history: int = 0          # sequence model: events of the history (0: DLRM)
    rows: int = 0             # embedding rows of all tables (0: unknown)
    bags: tuple[int, ...] = ()  # multi-hot: each table's ids a sample, its pooling factor (empty: one each)
    interaction: str = "dot"  # DLRM's pairwise dots, or "dcnv2": a low-rank cross network
    cross_layers: int = 3
    cross_rank: int = 512

    @classmethod
    def of(cls, ds: Any, model_cfg: Any) -> "ModelShape":
        """From an open ``Dataset`` and a ``ModelConfig``."""
        hist = int(ds.sequence["max_length"]) if ds.sequence else 0
        return cls(ds.num_dense, ds.num_tables, model_cfg.embedding_dim, tuple(model_cfg.bottom_mlp),
                   tuple(model_cfg.top_mlp), hist, int(sum(ds.cardinalities)), tuple(ds.bags or ()),
                   model_cfg.interaction, model_cfg.cross_layers, model_cfg.cross_rank)

    @property
    def id_columns(self) -> int:
        """Id columns of a sample: one per table (multi-hot: its bag's), and a history's events (item and category
        each)."""
        if self.history:
            return 3 + 2 * self.history
        return sum(self.bags) if self.bags else self.num_tables

    @property
    def sample_bytes(self) -> int:
        """Bytes the loader reads for one sample: float32 dense features, int32 ids, a float32 label."""
        return (self.num_dense + self.id_columns + 1) * FLOAT_BYTES

    def _layers(self) -> list[tuple[int, int]]:
        d = self.dim
        if self.history:
            widths = [7 * d, *self.top_mlp]
            return [(2 * d, 2 * d)] + list(zip(widths, widths[1:]))
        f = self.num_tables + 1
        bottom = [self.num_dense, *self.bottom_mlp]
        if self.interaction == "dcnv2":  # each cross layer: width -> rank -> width
            cross = [(f * d, self.cross_rank), (self.cross_rank, f * d)] * self.cross_layers
            top = [f * d, *self.top_mlp]
            return list(zip(bottom, bottom[1:])) + cross + list(zip(top, top[1:]))
        top = [d + f * (f - 1) // 2, *self.top_mlp]
        return list(zip(bottom, bottom[1:])) + list(zip(top, top[1:]))

    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample: 3 x the forward's (backward: two matmuls per matmul)."""
        fwd = sum(2.0 * a * b for a, b in self._layers())
        if self.history:
            fwd += 2 * 2.0 * self.history * 2 * self.dim          # scores and pooling einsums
        elif self.interaction == "dcnv2":
            fwd += 3.0 * self.cross_layers * (self.num_tables + 1) * self.dim  # x0 * (.) + x: a product, a sum
        else:
            f = self.num_tables + 1
            fwd += 2.0 * f * f * self.dim                           # the pairwise-dot bmm
        if self.bags:
            fwd += (sum(self.bags) - self.num_tables) * self.dim   # the bags' sums
        return 3.0 * fwd

    def dense_ops(self) -> int:
        """Tensor ops of a dense step: per linear layer ~6 (addmm, activation; backward 2 mm, sum,
        activation), 4 Adagrad ops per parameter tensor (weight, bias), and ~20 for the interaction or
        attention, concatenations and the loss."""
        n = len(self._layers())
        return 6 * n + 8 * n + 20


@dataclass(frozen=True)
class Workload:
    """What the model needs from one run (per step; counters are sums over ranks)."""

    method: str
    batch_size: int
    counters: dict[str, float]
    shape: ModelShape
    row_optimizer: str = "adagrad"
    store: dict[str, Any] = field(default_factory=dict)         # the run's store options
    report: dict[str, Any] = field(default_factory=dict)        # the record's store report
    world: int = 1
    ranks_per_node: int = 1
    threads: int = 1                                            # torch threads of each rank
    cores: int = 0                                              # the run's machine's cores (0: not recorded)
    pipelined: bool = False                                     # a worker planned each step ahead (train.pipeline)
    dense_graphed: bool = False                                 # the dense step replayed a CUDA graph
    assumptions: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, record: Mapping[str, Any], shape: ModelShape | None = None) -> "Workload":
        """From a record's config, summary (``counters_per_step``) and store report.

        ``shape``: the dense model's sizes (``ModelShape.of(dataset, model config)``); without it a
        DLRM with Criteo's 13 dense features and one table per id column is assumed (and said so).
        """
        if record.get("status", "ok") != "ok" or "summary" not in record:
            raise ConfigError(f"record {record.get('method')}/{record.get('variant')}: not a trained run")
        cfg, summary = record.get("config", {}), record["summary"]
        model, train = cfg.get("model", {}), cfg.get("train", {})
        dist = cfg.get("distributed", {})
        prov = record.get("provenance") or {}
        counters = {k: float(v) for k, v in summary.get("counters_per_step", {}).items()}
        batch = int(summary.get("batch_size", train.get("batch_size", 1024)))
        notes = []
        if shape is None:
            k = counters.get("lookups", 0.0) / max(batch, 1)
            shape = ModelShape(num_tables=max(1, round(k)), dim=int(model.get("embedding_dim", 16)),
                               bottom_mlp=tuple(model.get("bottom_mlp", (64, 16))),
                               top_mlp=tuple(model.get("top_mlp", (64, 32, 1))))
            notes.append(f"model shape assumed: DLRM, 13 dense features, {shape.num_tables} tables")
        return cls(method=record.get("method", cfg.get("method", "")), batch_size=batch, counters=counters,
                   shape=shape, row_optimizer=train.get("row_optimizer", "adagrad"),
                   store=dict(cfg.get("store") or {}), report=dict(record.get("store") or {}),
                   world=int(summary.get("world", dist.get("world", 1)) or 1),
                   ranks_per_node=int(summary.get("ranks_per_node", dist.get("ranks_per_node", 1)) or 1),
                   threads=int(prov.get("threads", 1) or 1), cores=int(prov.get("cores", 0) or 0),
                   pipelined=bool(summary.get("pipeline", False)),
                   dense_graphed=(record.get("store") or {}).get("dense_step") == "graph",
                   assumptions=tuple(notes))

    def c(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    @property
    def state_width(self) -> int:
        """Floats of optimizer state a row keeps (0, 1 or per element the dim)."""
        return row_state_width(self.row_optimizer, self.shape.dim)

    @property
    def state_bytes(self) -> int:
        """Bytes of one row's optimizer state (moved with it)."""
        return self.state_width * FLOAT_BYTES

    @property
    def vector_bytes(self) -> int:
        return self.shape.dim * FLOAT_BYTES

    @property
    def row_bytes(self) -> int:
        return (self.shape.dim + self.state_width) * FLOAT_BYTES

    def table_rows(self) -> float:
        """Embedding rows of all tables: the dataset's, else what the store report implies, else inf (a
        table of unknown size is taken to be larger than any cache)."""
        if self.shape.rows:
            return float(self.shape.rows)
        r = self.report
        for part, share in (("capacity", "cache_ratio"), ("hot_rows", "hot_ratio")):
            if r.get(part) and r.get(share):
                return float(r[part]) / float(r[share])
        return math.inf

    def table_bytes(self, rows: float, width: int | None = None) -> float:
        """Bytes of a table of ``rows`` rows of ``width`` bytes (default: one embedding vector)."""
        return rows * (self.vector_bytes if width is None else width)
