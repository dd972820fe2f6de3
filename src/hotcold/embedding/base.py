"""The embedding-store protocol, the shared row optimizers and table initialisation.

All tables of a model share one global row space: row ``offsets[t] + id`` is
id ``id`` of table ``t``. A batch is an id matrix [B, K] whose column k holds
ids of table ``column_tables[k]`` (several columns may share a table, as a
history shares the item table with the target); -1 marks padding, which is
neither looked up nor updated and comes back as a zero vector. A store owns every row and its optimizer state and
decides where each lives; the training loop only calls ``forward``,
``backward`` and ``lookup``. Every store must train exactly the same model as
the ``device`` store: they share ``init_table``, ``sum_by_index`` and
``RowOptimizer``, and differ only in where those run and what moves.
Unique rows and the index of each lookup into them are planned on the host
(``Lookup.unique``), so no store synchronises the device to coalesce.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np

import torch

from hotcold.config import ConfigError, is_int, is_real, require
from hotcold.counters import StepCounters
from hotcold.data.format import to_global
from hotcold.trace.policies import rows_for_share

if TYPE_CHECKING:
    from hotcold.data.format import Dataset


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
    column_tables: list[int] | None = None  # table of each id column; None: column t is table t
    #: replays the ids [B, K] of every training batch in order, for stores that
    #: plan ahead (capacity checks, optimal policies); filled when ``needs_batches``
    batches: Callable[[], Iterable[torch.Tensor]] | None = None
    #: access count of every global row over the training split [N] (int64),
    #: filled when the store's ``needs_frequencies`` is set
    frequencies: torch.Tensor | None = None
    #: what a store's ``schedule`` prepared for its construction (FAE's hot set)
    prepared: dict[str, Any] = field(default_factory=dict)
    #: the counted collectives of this rank (``hotcold.distributed.comm.Comm``); None: one process
    comm: Any = None
    #: sum gradients in float64 (``sum_by_index(exact=True)``): set for runs over several ranks and
    #: their one-process reference, so both round the same sums to the same float32 bits
    exact_sums: bool = False
    #: the share of the training split one step reads (batch size / training samples), for planners
    #: that turn the ``frequencies`` of the whole split into expected lookups per step
    batch_share: float = 1.0

    @property
    def num_rows(self) -> int:
        return sum(self.table_sizes)

    def offsets(self) -> torch.Tensor:
        """Global row of id 0 of each table: int64 [T]."""
        sizes = torch.tensor([0] + list(self.table_sizes[:-1]), dtype=torch.int64)
        return torch.cumsum(sizes, 0)

    def column_offsets(self) -> torch.Tensor:
        """Global row of id 0 of each id column's table: int64 [K]."""
        tables = self.column_tables if self.column_tables is not None else range(len(self.table_sizes))
        return self.offsets()[torch.tensor(list(tables), dtype=torch.int64)]


@dataclass
class Lookup:
    """The rows one batch looks up, planned on the host from its ids."""

    rows: torch.Tensor                 # int64 [L] global rows of the non-padding entries
    positions: torch.Tensor | None     # int64 [L] their flat positions in [B*K]; None: no padding
    shape: tuple[int, int]             # (B, K)
    _unique: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return self.rows.numel()

    def unique(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The distinct rows [U] (ascending), each lookup's index into them [L] and their lookups [U].

        Planned on the host, once: ``torch.unique`` of a device tensor would
        synchronise the device inside the timed update.
        """
        if self._unique is None:
            self._unique = torch.unique(self.rows, return_inverse=True, return_counts=True)
        return self._unique


def budget_rows(options: dict[str, Any], where: str, num_rows: int, *, rows_key: str, ratio_key: str,
                default_ratio: float | None = None, unit_bytes: int = 1, allow_zero: bool = False) -> int | None:
    """Rows of device memory a store may use, at most ``num_rows``.

    From an absolute option ``rows_key`` (in rows, or in bytes with
    ``unit_bytes`` the bytes of one row) or a relative one ``ratio_key`` (a
    share of all rows); at most one may be given. None when neither is given
    and there is no ``default_ratio``. Without ``allow_zero`` at least one row.
    """
    require(not (rows_key in options and ratio_key in options), where, f"give {rows_key} or {ratio_key}, not both")
    low = 0 if allow_zero else 1
    if rows_key in options:
        v = options[rows_key]
        require(is_int(v) and v >= low, where, f"{rows_key} must be an integer >= {low}, got {v!r}")
        rows = int(v) // unit_bytes
    elif ratio_key in options or default_ratio is not None:
        r = options.get(ratio_key, default_ratio)
        require(is_real(r) and (0 <= r if allow_zero else 0 < r) and r <= 1, where,
                f"{ratio_key} must be in {'[' if allow_zero else '('}0, 1], got {r!r}")
        rows = rows_for_share(r, num_rows)
    else:
        return None
    return min(max(rows, low), num_rows)


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


def ship(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: through pinned memory and without blocking on a GPU."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def sum_by_index(inverse: torch.Tensor, grads: torch.Tensor, n: int, exact: bool = False) -> torch.Tensor:
    """Gradients [L, D] summed into [n, D] by their index ``inverse`` [L] (the second half of ``coalesce``).

    ``exact``: accumulate in float64 (and return float64). A row's gradient
    is then, after rounding to float32, the same bits however its terms are
    split and ordered, as when ranks sum parts of it (``StoreSpec.exact_sums``).
    """
    dtype = torch.float64 if exact else grads.dtype
    summed = torch.zeros(n, grads.shape[1], dtype=dtype, device=grads.device)
    summed.index_add_(0, inverse, grads.to(dtype))
    return summed


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

    def apply(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
              sq_mean: torch.Tensor | None = None) -> None:
        """Update ``weight[slots]`` (and ``state[slots]``) in place.

        weight: [N, D]; state: [N]; slots: unique int64 [U]; grad: [U, D].
        ``sq_mean`` [U]: each row's mean squared gradient over all its columns,
        for a store that holds only some of a row's columns (column-wise sharding).
        A float64 ``grad`` (an exact sum) is rounded to the weights' float32
        after its squares are taken.
        """
        if self.kind == "adagrad":
            sq_mean = grad.pow(2).mean(dim=1) if sq_mean is None else sq_mean
            acc = state.index_select(0, slots) + sq_mean.to(state.dtype)  # [U]
            state.index_copy_(0, slots, acc)
            grad = grad / (acc.sqrt() + self.eps).unsqueeze(1)
        grad = grad.to(weight.dtype)
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
    #: whether the store wants ``StoreSpec.batches`` / ``StoreSpec.frequencies``
    needs_batches: bool = False
    needs_frequencies: bool = False
    #: whether the store can span several processes (the scale-out stores); others run in one
    spans_ranks: bool = False

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
        self.column_offsets = spec.column_offsets()  # [K], CPU
        self._counters = StepCounters()

    def plan(self, ids: torch.Tensor) -> Lookup:
        """ids int64 [B, K] on the CPU -> the global rows to look up."""
        rows = torch.from_numpy(to_global(ids.numpy(), self.column_offsets.numpy())).reshape(-1)
        valid = rows >= 0
        if bool(valid.all()):
            return Lookup(rows, None, tuple(ids.shape))
        positions = valid.nonzero().squeeze(1)
        return Lookup(rows.index_select(0, positions), positions, tuple(ids.shape))

    def to_batch(self, values: torch.Tensor, lk: Lookup) -> torch.Tensor:
        """[L, D] looked-up rows -> [B, K, D], zeros at padding, on ``values``' device."""
        if lk.positions is None:
            return values.view(*lk.shape, self.dim)
        out = torch.zeros(lk.shape[0] * lk.shape[1], self.dim, dtype=values.dtype, device=values.device)
        out.index_copy_(0, lk.positions.to(values.device, non_blocking=True), values)
        return out.view(*lk.shape, self.dim)

    def from_batch(self, grad: torch.Tensor, lk: Lookup) -> torch.Tensor:
        """[B, K, D] gradients -> [L, D] gradients of the looked-up rows."""
        flat = grad.reshape(-1, self.dim)
        if lk.positions is None:
            return flat
        return flat.index_select(0, lk.positions.to(grad.device, non_blocking=True))

    @classmethod
    def schedule(cls, spec: StoreSpec, ds: "Dataset", default: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """The training batches as row indices into the train split, in order.

        Most stores train on the loader's order; FAE forms hot and cold
        batches of its own. Called once, before the store is built.
        """
        return default

    def prefetch(self, upcoming: Sequence[torch.Tensor]) -> None:
        """See the ids ([B, K] each) of the next batches; only look-ahead stores use it."""

    @abc.abstractmethod
    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        """ids int64 [B, K] on the CPU -> embeddings [B, K, D] on the trainer device."""

    @abc.abstractmethod
    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        """Apply the sparse update for the last ``forward``; grad: [B, K, D] on the trainer device."""

    @abc.abstractmethod
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation lookup: ids [B, K] on the CPU -> [B, K, D] on the trainer device."""

    @abc.abstractmethod
    def export(self) -> torch.Tensor:
        """A copy of every row's current weights, float32 [N, D] on the CPU, in global-row order."""

    def step_counters(self) -> dict[str, int]:
        """Counters of the last training step: every field of ``StepCounters``."""
        return self._counters.as_dict()

    def report(self) -> dict[str, Any]:
        """Store-specific numbers for the run record (capacity, hot fraction, hidden side time...)."""
        return {}

    @classmethod
    def own_schedule(cls) -> bool:
        """Whether the store trains on a batch order of its own (then ``device`` replays it as reference)."""
        return cls.schedule.__func__ is not EmbeddingStore.schedule.__func__

    def close(self) -> None:
        """Release background resources (threads, streams)."""
