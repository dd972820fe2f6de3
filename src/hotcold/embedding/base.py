"""The embedding-store protocol, the shared row optimizers and table initialisation.

All tables of a model share one global row space: row ``offsets[t] + id`` is
id ``id`` of table ``t``. A store owns every row and its optimizer state and
decides where each lives; the training loop only calls ``forward``,
``backward`` and ``lookup``. Every store must train exactly the same model as
the ``device`` store: they share ``init_table``, ``coalesce`` and
``RowOptimizer``, and differ only in where those run and what moves.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from hotcold.config import ConfigError


class Marker(Protocol):
    """What a store needs of the phase timer."""

    def mark(self, phase: str) -> None: ...


class NullMarker:
    def mark(self, phase: str) -> None:
        pass


@dataclass
class StoreSpec:
    """What every store is built from."""

    table_sizes: list[int]
    dim: int
    optimizer: "RowOptimizer"
    device: torch.device          # the trainer device (cuda, or cpu without a GPU)
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return sum(self.table_sizes)

    def offsets(self) -> torch.Tensor:
        """Global row of id 0 of each table: int64 [T]."""
        sizes = torch.tensor([0] + list(self.table_sizes[:-1]), dtype=torch.int64)
        return torch.cumsum(sizes, 0)


def init_table(table_sizes: Sequence[int], dim: int, seed: int) -> torch.Tensor:
    """Initial rows, float32 [sum(sizes), dim] on the CPU, identical for every store.

    Table t is uniform in +-sqrt(1/n_t), as in the DLRM reference.
    """
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(sum(table_sizes), dim, dtype=torch.float32)
    start = 0
    for n in table_sizes:
        bound = (1.0 / n) ** 0.5
        out[start:start + n].uniform_(-bound, bound, generator=gen)
        start += n
    return out


def coalesce(rows: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the gradients of repeated rows.

    rows: int64 [L] global rows; grads: [L, D]. Returns unique rows [U] and
    their summed gradients [U, D].
    """
    uniq, inverse = torch.unique(rows, return_inverse=True)
    summed = torch.zeros(uniq.numel(), grads.shape[1], dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return uniq, summed


class RowOptimizer:
    """SGD or row-wise Adagrad applied to a set of unique rows.

    Row-wise Adagrad keeps one float per row (the running sum of the mean
    squared gradient of the row), so its state is a [N] tensor that moves with
    the rows wherever a store puts them.
    """

    def __init__(self, kind: str, lr: float, eps: float = 1e-8) -> None:
        if kind not in ("sgd", "adagrad"):
            raise ConfigError(f"row optimizer must be 'sgd' or 'adagrad', got {kind!r}")
        self.kind, self.lr, self.eps = kind, lr, eps

    @property
    def state_width(self) -> int:
        """Floats of optimizer state per row."""
        return 1 if self.kind == "adagrad" else 0

    def init_state(self, num_rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(num_rows, dtype=torch.float32, device=device)

    def apply(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor) -> None:
        """Update ``weight[slots]`` (and ``state[slots]``) in place.

        weight: [N, D]; state: [N]; slots: unique int64 [U]; grad: [U, D].
        """
        if self.kind == "adagrad":
            acc = state.index_select(0, slots) + grad.pow(2).mean(dim=1)  # [U]
            state.index_copy_(0, slots, acc)
            grad = grad / (acc.sqrt() + self.eps).unsqueeze(1)
        # Gather, update, scatter: the rows are unique, and on CPUs this is
        # several times faster than index_add_ into a large table.
        weight.index_copy_(0, slots, weight.index_select(0, slots) - self.lr * grad)


class EmbeddingStore(abc.ABC):
    """Owns the embedding rows; answers lookups and applies sparse updates.

    Per training step the loop calls ``prefetch`` (with the ids of the next
    ``lookahead`` batches), ``forward``, then ``backward`` with the gradient
    of what ``forward`` returned. ``step_counters`` reports what that step
    looked up and moved. ``lookup`` serves evaluation without updating state
    or counters.
    """

    #: batches of look-ahead the store wants from the loader
    lookahead: int = 0
    #: options this store accepts in ``StoreSpec.options``
    option_names: tuple[str, ...] = ()

    def __init__(self, spec: StoreSpec) -> None:
        unknown = sorted(set(spec.options) - set(self.option_names))
        if unknown:
            raise ConfigError(
                f"store {type(self).__name__}: unknown option(s) {unknown}; "
                f"allowed: {list(self.option_names) or 'none'}"
            )
        self.spec = spec
        self.device = spec.device
        self.dim = spec.dim
        self.optimizer = spec.optimizer
        self.offsets_cpu = spec.offsets()
        self._counters: dict[str, int] = {}

    def global_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 [B, T] (per-table ids) -> global rows int64 [B*T] on ids' device."""
        return (ids + self.offsets_cpu.to(ids.device)).reshape(-1)

    def prefetch(self, upcoming: Sequence[torch.Tensor]) -> None:
        """See the ids ([B, T] each) of the next batches; only look-ahead stores use it."""

    @abc.abstractmethod
    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        """ids int64 [B, T] on the CPU -> pooled embeddings [B, T, D] on the trainer device."""

    @abc.abstractmethod
    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        """Apply the sparse update for the last ``forward``; grad: [B, T, D] on the trainer device."""

    @abc.abstractmethod
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation lookup: ids [B, T] on the CPU -> [B, T, D] on the trainer device."""

    @abc.abstractmethod
    def export(self) -> torch.Tensor:
        """Every row's current weights, float32 [N, D] on the CPU, in global-row order."""

    def step_counters(self) -> dict[str, int]:
        """Counters of the last training step."""
        return dict(self._counters)

    def close(self) -> None:
        """Release background resources (threads, streams)."""
