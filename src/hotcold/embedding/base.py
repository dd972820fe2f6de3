"""The embedding-store protocol: what every technique's store is built from and answers.

A batch is an id matrix [B, K] whose column k holds ids of table
``column_tables[k]`` (several columns may share a table, as a history shares
the item table with the target); -1 marks padding, which is neither looked up
nor updated and comes back as a zero vector. A store owns every row and its
optimizer state and decides where each lives; the training loop only calls
``forward``, ``backward`` and ``lookup``. Every store must train exactly the
same model as the ``device`` store: they share ``rows.init_table``,
``rows.sum_by_index`` and ``update.RowOptimizer``, and differ only in where
those run and what moves.
"""

from __future__ import annotations

import abc
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import torch

from hotcold.counters import StepCounters
from hotcold.data.columns import to_global
from hotcold.options.base import NoOptions, StoreOptions
from hotcold.embedding import rows as rows_mod
from hotcold.embedding.rows import Lookup
from hotcold.embedding.settle import PendingCounts

if TYPE_CHECKING:
    from hotcold.data.format import Dataset
    from hotcold.embedding.update import RowOptimizer


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
    #: the store's typed options (``EmbeddingStore.Options``); a plain mapping is parsed by the store
    options: StoreOptions | Mapping[str, Any] = field(default_factory=dict)
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
    #: the run's first timed step (``train.warmup_steps``): a store with its own batch order (FAE) keeps the
    #: timed steps representative of its epoch
    warmup_steps: int = 0

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


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a store allocates that grow with the number of rows: on the host and on the trainer device.

    On a CPU trainer the two are one memory and a store counts everything as
    ``host``. What does not grow with the rows (the dense model, a batch, the
    staging buffers) is the run's bounded overhead, not counted here.
    """

    host: int = 0
    device: int = 0

    def __add__(self, other: "MemoryNeed") -> "MemoryNeed":
        return MemoryNeed(self.host + other.host, self.device + other.device)


class EmbeddingStore(abc.ABC):
    """Owns the embedding rows; answers lookups and applies sparse updates.

    Per training step the loop calls ``prefetch`` (with the ids of the next
    ``lookahead`` batches), ``forward``, then ``backward`` with the gradient
    of what ``forward`` returned. ``step_counters`` reports what that step
    looked up and moved. ``lookup`` serves evaluation without updating state
    or counters.

    The host's share of a step (the batch's global rows and their grouping,
    a store's decisions such as a cache directory's) is ``plan_step``. A
    store that sets ``plans_ahead`` lets the step pipeline (``hotcold.pipeline``)
    call ``prepare`` with each batch, in training order, on a worker thread
    while the previous step trains; ``forward`` then takes that plan
    (``planned``) or, called without one (a lock-step check, a benchmark),
    makes it itself. So ``plan_step`` of batch i+1 may run while step i's
    ``forward`` and ``backward`` do: it must not touch what they read or
    write, and step i's own plan is made before it and never changed by it.
    """

    #: the typed options this store takes in ``StoreSpec.options``
    Options: ClassVar[type[StoreOptions]] = NoOptions
    #: batches of look-ahead the store wants from the loader
    lookahead: int = 0
    #: whether the store wants ``StoreSpec.batches`` / ``StoreSpec.frequencies``
    needs_batches: bool = False
    needs_frequencies: bool = False
    #: whether the store can span several processes (the scale-out stores); others run in one
    spans_ranks: bool = False
    #: whether the step pipeline calls ``prepare`` (``forward`` takes its plan from there: it may be made a step ahead)
    plans_ahead: bool = False

    def __init__(self, spec: StoreSpec) -> None:
        self.options = self.Options.parse(spec.options, f"store {type(self).__name__}")
        self.spec = spec
        self.device = spec.device
        self.dim = spec.dim
        self.optimizer = spec.optimizer
        self.column_offsets = spec.column_offsets()  # [K], CPU
        self._counters: StepCounters | dict[str, int] = StepCounters()  # a dict: filled in by ``_device_counts.settle``
        self._device_counts = PendingCounts()  # steps whose counts were left on the device
        self._prepared: deque[tuple[torch.Tensor, Any]] = deque()  # (ids, plan) made ahead, in training order

    def plan(self, ids: torch.Tensor) -> Lookup:
        """ids int64 [B, K] on the CPU -> the global rows to look up."""
        if ids.numel() and int(ids.min()) >= 0:  # no padding (the common case): ``to_global`` is one add
            return Lookup((ids + self.column_offsets).reshape(-1), None, tuple(ids.shape))
        rows = torch.from_numpy(to_global(ids.numpy(), self.column_offsets.numpy())).reshape(-1)
        valid = rows >= 0
        if bool(valid.all()):
            return Lookup(rows, None, tuple(ids.shape))
        positions = valid.nonzero().squeeze(1)
        return Lookup(rows.index_select(0, positions), positions, tuple(ids.shape))

    def plan_step(self, ids: torch.Tensor, device_rows: torch.Tensor | None = None) -> Any:
        """What ``forward`` needs of a batch that the host decides: by default its ``Lookup``, grouped by row.

        A store overrides it to add its own decisions (which rows hit, which
        slots to fill) and to start its copies; the result is ``planned``'s.
        ``device_rows``: the batch's global rows already on the trainer device
        (int32 [B, K], the number of rows N at padding: shipped by the step
        pipeline, ``hotcold.data.packed``), for a store that plans there.
        """
        lk = self.plan(ids)
        lk.groups().offsets  # noqa: B018 - computed now, off the training path
        lk.positions_on(self.device)
        return lk

    def prepare(self, ids: torch.Tensor, upcoming: Sequence[torch.Tensor] = (),
                device_rows: torch.Tensor | None = None) -> None:
        """Plan the batch ``ids`` [B, K] ahead of its ``forward`` (the step pipeline's worker, in training order).

        ``upcoming``: the ids of the batches after it, as ``prefetch`` will see them; ``device_rows``: see
        ``plan_step``.
        """
        self._prepared.append((ids, self.plan_step(ids, device_rows)))

    def planned(self, ids: torch.Tensor) -> Any:
        """``forward``'s plan of ``ids``: the one ``prepare`` made, else ``plan_step``'s now."""
        if not self._prepared:
            return self.plan_step(ids)
        got, plan = self._prepared.popleft()
        if got is not ids:
            raise RuntimeError(f"{type(self).__name__}: forward got a batch other than the next one prepared")
        return plan

    def to_batch(self, values: torch.Tensor, lk: Lookup) -> torch.Tensor:
        """[L, D] looked-up rows -> [B, K, D], zeros at padding, on ``values``' device."""
        if lk.positions is None:
            return values.view(*lk.shape, self.dim)
        out = torch.zeros(lk.shape[0] * lk.shape[1], self.dim, dtype=values.dtype, device=values.device)
        out.index_copy_(0, lk.positions_on(values.device), values)
        return out.view(*lk.shape, self.dim)

    def from_batch(self, grad: torch.Tensor, lk: Lookup) -> torch.Tensor:
        """[B, K, D] gradients -> [L, D] gradients of the looked-up rows."""
        flat = grad.reshape(-1, self.dim)
        if lk.positions is None:
            return flat
        return flat.index_select(0, lk.positions_on(grad.device))

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

    def begin_backward(self, grad: torch.Tensor, timer: Marker) -> None:
        """Over several ranks, called with ``backward``'s gradient while the dense all-reduce is in flight
        (before ``backward``): a store may issue its own collectives beside it. Default: nothing."""

    @abc.abstractmethod
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation lookup: ids [B, K] on the CPU -> [B, K, D] on the trainer device."""

    @abc.abstractmethod
    def export(self) -> torch.Tensor:
        """A copy of every row's current weights, float32 [N, D] on the CPU, in global-row order."""

    def final_rows(self) -> torch.Tensor:
        """Every row's weights once training is over, float32 [N, D] on the CPU, in global-row order.

        ``export``'s values; a store whose host table already holds them
        returns that table itself rather than a second copy of it, so the
        result changes if the store trains on.
        """
        return self.export()

    @classmethod
    def memory_need(cls, spec: StoreSpec) -> MemoryNeed:
        """What this store will allocate for ``spec``'s rows, known before it allocates anything.

        The default is a store that keeps every row and its optimizer state
        in host memory (the hybrid baseline, the caches, FAE, ScratchPipe),
        with the access counts of every row (int64) when it needs them, and,
        on a GPU, the device share its options state (a cache's rows).
        """
        table = rows_mod.table_bytes(spec.num_rows, spec.dim, spec.optimizer.state_width(spec.dim))
        host = table + (8 * spec.num_rows if cls.needs_frequencies else 0)
        device = 0
        if spec.device.type != "cpu":
            options = cls.Options.parse(spec.options, f"store {cls.__name__}")
            share = options.device_share()
            device = int(table * share) if share is not None else 0
        return MemoryNeed(host, device)

    def step_counters(self) -> dict[str, int]:
        """Counters of the last training step: every field of ``StepCounters`` (None until ``settle_counters``
        where the step left its counts on the device)."""
        c = self._counters
        return c if isinstance(c, dict) else c.as_dict()

    def settle_counters(self) -> None:
        """Called once after the timed steps, the timer flushed: a store whose ``step_counters`` left device-side
        counts pending (read inside the steps they would drain the GPU) fills in the dicts it returned: those
        of ``_device_counts`` by default."""
        self._device_counts.settle()

    def report(self) -> dict[str, Any]:
        """Store-specific numbers for the run record (capacity, hot fraction, hidden side time...)."""
        return {}

    @classmethod
    def own_schedule(cls) -> bool:
        """Whether the store trains on a batch order of its own (then ``device`` replays it as reference)."""
        return cls.schedule.__func__ is not EmbeddingStore.schedule.__func__

    def close(self) -> None:
        """Release background resources (threads, streams)."""
