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
import os
import warnings
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


class RowGroups:
    """A batch's lookups grouped by the row they read: the plan of its gradient sum.

    rows [U] are the distinct rows, ascending; ``order`` [L] lists the lookups
    row by row (those of ``rows[0]`` first, each row's in batch order) and
    ``counts`` [U] says how many each row has. All int64 on the CPU, planned
    on the host by one stable sort.
    """

    def __init__(self, rows: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> None:
        self.rows, self.order, self.counts = rows, order, counts
        self._inverse: dict[torch.device, torch.Tensor] = {}
        self._offsets: torch.Tensor | None = None

    @classmethod
    def of(cls, rows: torch.Tensor) -> "RowGroups":
        """Group int64 rows [L] (>= 0) on the CPU.

        The sort runs on int32 keys when the rows fit: faster than
        ``torch.unique`` on int64 at a batch's size, and it also yields the
        order that ``sum_by_index`` reads the gradients in.
        """
        keys = rows.to(torch.int32) if rows.numel() and int(rows.max()) < 2**31 else rows
        ordered, order = torch.sort(keys, stable=True)
        uniq, counts = torch.unique_consecutive(ordered, return_counts=True)
        return cls(uniq.to(torch.int64), order, counts)

    @property
    def size(self) -> int:
        """Distinct rows U."""
        return self.rows.numel()

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [U + 1]: the lookups of row u are ``order[offsets[u]:offsets[u + 1]]``."""
        if self._offsets is None:
            self._offsets = torch.zeros(self.size + 1, dtype=torch.int64)
            torch.cumsum(self.counts, 0, out=self._offsets[1:])
        return self._offsets

    def inverse(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """int64 [L]: each lookup's index into ``rows``, on ``device`` (shipped once, then kept)."""
        cpu, device = torch.device("cpu"), torch.device(device)
        if cpu not in self._inverse:  # lookup order[j] reads row j's group: scatter the group numbers back
            group = torch.zeros(self.order.numel(), dtype=torch.int64)
            group[self.offsets[1:-1]] = 1
            self._inverse[cpu] = torch.empty_like(self.order).scatter_(0, self.order, torch.cumsum(group, 0))
        if device not in self._inverse:
            self._inverse[device] = ship(self._inverse[cpu], device)
        return self._inverse[device]


@dataclass
class Lookup:
    """The rows one batch looks up, planned on the host from its ids."""

    rows: torch.Tensor                 # int64 [L] global rows of the non-padding entries
    positions: torch.Tensor | None     # int64 [L] their flat positions in [B*K]; None: no padding
    shape: tuple[int, int]             # (B, K)
    _groups: RowGroups | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return self.rows.numel()

    def groups(self) -> RowGroups:
        """The lookups grouped by row, planned on the host once.

        ``torch.unique`` of a device tensor would synchronise the device
        inside the timed update.
        """
        if self._groups is None:
            self._groups = RowGroups.of(self.rows)
        return self._groups

    def unique(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The distinct rows [U] (ascending), each lookup's index into them [L] and their lookups [U]."""
        g = self.groups()
        return g.rows, g.inverse(), g.counts


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


def bag_sums(order: torch.Tensor, starts: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """[U, D]: row u sums ``grads[order[starts[u]:starts[u + 1]]]`` (to the end for the last), in that order."""
    return torch.nn.functional.embedding_bag(order, grads, starts, mode="sum")


def sum_by_index(groups: RowGroups, grads: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """Gradients [L, D] of a batch's lookups summed per distinct row: [U, D] (the second half of ``coalesce``).

    Each row's gradients are added in batch order. On the CPU this is an
    embedding-bag sum over the gradients themselves: bag u gathers
    ``grads[order[offsets[u]:offsets[u + 1]]]``, in one pass of torch's
    vectorised bag kernel (three times as fast as the sparse 0/1-matrix
    product and ten times ``index_add_`` at a batch's size here). Bags are
    summed one by one, so the sums do not depend on the thread count.
    Elsewhere it is ``index_add_`` by the lookups' ``inverse``.

    ``exact``: accumulate in float64 (and return float64). A row's gradient
    is then, after rounding to float32, the same bits however its terms are
    split and ordered, as when ranks sum parts of it (``StoreSpec.exact_sums``).
    """
    n, width = groups.size, grads.shape[1]
    if grads.shape[0] != groups.order.numel():
        raise ValueError(f"sum_by_index: {grads.shape[0]} gradients for {groups.order.numel()} lookups")
    if grads.device.type == "cpu" and not exact and grads.dtype in (torch.float32, torch.float64) and n:
        return bag_sums(groups.order, groups.offsets[:-1], grads.contiguous())
    dtype = torch.float64 if exact else grads.dtype
    summed = torch.zeros(n, width, dtype=dtype, device=grads.device)
    summed.index_add_(0, groups.inverse(grads.device), grads.to(dtype))
    return summed


#: environment switch of the compiled sparse step: "1" compiles it (where ``torch.compile`` works), else plain
COMPILE_ENV = "HOTCOLD_COMPILE"


def update_rows(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
                lr: float, eps: float, adagrad: bool, sq_mean: torch.Tensor | None = None) -> None:
    """One SGD or row-wise Adagrad step on the rows ``slots``, in place.

    weight [N, D] float32; state [N]; slots: unique int64 [U]; grad [U, D],
    each row's summed gradient. Adagrad: ``acc += mean(g^2)`` per row,
    ``w -= lr * g / (sqrt(acc) + eps)``; SGD: ``w -= lr * g``. ``sq_mean``
    [U]: each row's mean squared gradient over all its columns, for a store
    that holds only some of a row's columns (column-wise sharding). A float64
    ``grad`` (an exact sum) is rounded to the weights' float32 after its
    squares are taken. Gather, update, scatter: the rows are unique, and on
    CPUs this is several times faster than ``index_add_`` into a large table.
    """
    if adagrad:
        sq_mean = grad.pow(2).mean(dim=1) if sq_mean is None else sq_mean
        acc = state.index_select(0, slots) + sq_mean.to(state.dtype)  # [U]
        state.index_copy_(0, slots, acc)
        grad = grad / (acc.sqrt() + eps).unsqueeze(1)
    weight.index_copy_(0, slots, weight.index_select(0, slots) - lr * grad.to(weight.dtype))


def sparse_step(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, order: torch.Tensor,
                starts: torch.Tensor, grads: torch.Tensor, lr: float, eps: float, adagrad: bool) -> None:
    """The backward and update of the rows a batch looked up, fused: the function ``torch.compile`` takes.

    grads [L, D]: the lookups' gradients; ``order`` [L] and ``starts`` [U]
    group them by distinct row (``RowGroups``); slots [U]: where those rows
    live in ``weight``/``state``. Sums each row's gradients (``bag_sums``),
    then ``update_rows``. Run plainly it is exactly those two calls.
    """
    update_rows(weight, state, slots, bag_sums(order, starts, grads), lr, eps, adagrad)


class _CompiledStep:
    """``sparse_step`` through ``torch.compile(dynamic=True)``, made on first use; plain where that fails.

    One graph per optimizer kind; the number of lookups and rows varies
    without recompiling. Compiling takes seconds at the first call (a
    training run's warm-up steps absorb it). A failure (no C++ compiler, an
    old torch) is said once, then every call runs ``sparse_step`` plainly.
    """

    def __init__(self) -> None:
        self.fn: Callable[..., None] | None = None
        self.failed: str | None = None

    def __call__(self, *args: Any) -> None:
        if self.failed is None:
            try:
                if self.fn is None:
                    self.fn = torch.compile(sparse_step, dynamic=True)
                self.fn(*args)
                return
            except Exception as e:  # noqa: BLE001 - any compiler failure means: run it plainly
                self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                warnings.warn(f"torch.compile of the sparse step failed, running it plainly: {self.failed}",
                              RuntimeWarning, stacklevel=2)
        sparse_step(*args)


_COMPILED = _CompiledStep()


def compile_requested() -> bool:
    """Whether ``HOTCOLD_COMPILE`` asks for the compiled sparse step."""
    return os.environ.get(COMPILE_ENV, "0").strip() == "1"


class RowOptimizer:
    """SGD or row-wise Adagrad applied to a set of unique rows.

    Row-wise Adagrad keeps one float per row (the running sum of the mean
    squared gradient of the row), so its state is a [N] tensor that moves with
    the rows wherever a store puts them. ``compile``: run ``step`` on the CPU
    through ``torch.compile`` (None: as ``HOTCOLD_COMPILE`` says; exact
    float64 sums and every other device run plainly).
    """

    def __init__(self, kind: str, lr: float, eps: float = 1e-8, compile: bool | None = None) -> None:
        if kind not in ("sgd", "adagrad"):
            raise ConfigError(f"row optimizer must be 'sgd' or 'adagrad', got {kind!r}")
        self.kind, self.lr, self.eps = kind, lr, eps
        self.compile = compile_requested() if compile is None else bool(compile)

    @property
    def state_width(self) -> int:
        """Floats of optimizer state per row."""
        return 1 if self.kind == "adagrad" else 0

    @property
    def compiled(self) -> bool:
        """Whether ``step`` runs compiled on the CPU (requested, and the compiler has not failed)."""
        return self.compile and _COMPILED.failed is None

    def init_state(self, num_rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(num_rows, dtype=torch.float32, device=device)

    def step(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, groups: RowGroups,
             grads: torch.Tensor, exact: bool = False) -> None:
        """A batch's backward and update: its lookups' gradients summed per row, then ``apply``.

        grads [L, D]: the gradient of each lookup; ``groups`` plans their sum
        (``sum_by_index``, float64 with ``exact``); slots [U]: where the
        distinct rows ``groups.rows`` live in ``weight`` and ``state``.
        """
        if (self.compile and not exact and grads.device.type == "cpu" and weight.device.type == "cpu"
                and grads.dtype == weight.dtype == torch.float32 and groups.size > 1):
            # (below two rows a dynamic graph would specialise and recompile; they cost nothing plainly)
            _COMPILED(weight, state, slots, groups.order, groups.offsets[:-1], grads.contiguous(), self.lr, self.eps,
                      self.kind == "adagrad")
            return
        self.apply(weight, state, slots, sum_by_index(groups, grads, exact))

    def apply(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
              sq_mean: torch.Tensor | None = None) -> None:
        """Update ``weight[slots]`` (and ``state[slots]``) in place: ``update_rows`` with this optimizer.

        weight: [N, D]; state: [N]; slots: unique int64 [U]; grad: [U, D];
        ``sq_mean`` [U] as ``update_rows`` says.
        """
        update_rows(weight, state, slots, grad, self.lr, self.eps, self.kind == "adagrad", sq_mean)


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
        if ids.numel() and int(ids.min()) >= 0:  # no padding (the common case): ``to_global`` is one add
            return Lookup((ids + self.column_offsets).reshape(-1), None, tuple(ids.shape))
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
