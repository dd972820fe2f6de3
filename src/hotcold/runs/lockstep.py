"""A lock-step check of a store against the ``device`` reference: same lookups, same gradients, every step.

The harness's own stores add every gradient in one fixed order on every
device (``rows.sum_by_index``, ``update.row_square_means``), so they train
the ``device`` store's bits and their check is equality (``methods.CHECK_BITS``).
Where that cannot hold, because a library kernel the harness does not
control rounds its own way (a peer such as FBGEMM, a fused multiply-add),
an end-state distance after training would grow with every step and say
little. This module checks such a store in lock step instead
(``methods.CHECK_LOCKSTEP``): it builds the store under test and the ``device``
reference from the same spec, feeds both the same batches of ids and the
same gradients for K steps, and after each step compares what both looked
up and the rows the step touched (max absolute difference per step).

API (small on purpose; ``make gpu-check`` may call it):

- ``run(store, spec, batches, seed=0, atol=DEFAULT_ATOL) -> Lockstep``:
  ``store`` is a method name (``hotcold.methods``) or a function building a
  store from a ``StoreSpec``; ``batches`` the ids [B, K] of each step.
- ``Lockstep.ok`` / ``.max_diff`` / ``.steps`` (``StepDiff(step, lookup,
  rows)``) / ``.to_record()`` (a JSON-ready dict).
- ``random_batches(table_sizes, batch_size, steps, seed)``: skewed ids to
  drive it.
- ``check_run(cfg, ds, spec, order)``: the check of a trained run (a
  peer's), on its first ``RUN_STEPS`` batches; the record keeps it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hotcold import methods
from hotcold.embedding.base import EmbeddingStore, NullMarker, StoreSpec

if TYPE_CHECKING:
    from hotcold.run_config import RunConfig
    from hotcold.data.format import Dataset

#: the largest absolute difference per step a lock-step check accepts by default: a float32 row of magnitude
#: ~0.1 differs by ~1e-8 per differently rounded update, so K <= 100 such steps stay well below it, while a
#: wrong update (a lost or doubled gradient of scale ``GRAD_SCALE``) is far above it
DEFAULT_ATOL = 1e-5
#: the gradients fed to both stores: standard normal times this
GRAD_SCALE = 0.1

StoreBuilder = Callable[[StoreSpec], EmbeddingStore]


@dataclass(frozen=True)
class StepDiff:
    """One step's largest absolute differences from the reference: in what ``forward`` returned, and in the
    rows the step touched (read back by ``lookup`` after the update)."""

    step: int
    lookup: float
    rows: float

    @property
    def max(self) -> float:
        return max(self.lookup, self.rows)


@dataclass(frozen=True)
class Lockstep:
    """The result of ``run``: one ``StepDiff`` per step and the tolerance it was held to."""

    method: str
    steps: tuple[StepDiff, ...]
    atol: float

    @property
    def max_diff(self) -> float:
        return max((s.max for s in self.steps), default=0.0)

    @property
    def bitwise(self) -> bool:
        """Whether every step matched the reference exactly."""
        return self.max_diff == 0.0

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.atol

    @property
    def first_bad_step(self) -> int | None:
        """The first step over the tolerance (None: none)."""
        return next((s.step for s in self.steps if s.max > self.atol), None)

    def to_record(self) -> dict[str, Any]:
        """What a record keeps of it: the check, its tolerance, the steps, the max difference per step."""
        return {"check": methods.CHECK_LOCKSTEP, "method": self.method, "steps": len(self.steps), "atol": self.atol,
                "ok": self.ok, "bitwise": self.bitwise, "max_diff": self.max_diff,
                "max_diff_per_step": [s.max for s in self.steps]}


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise ValueError(f"lockstep: shapes differ, {tuple(a.shape)} and {tuple(b.shape)}")
    if not a.numel():
        return 0.0
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())


def _own_spec(spec: StoreSpec, batches: Sequence[torch.Tensor]) -> StoreSpec:
    """A copy of ``spec`` per store (stores may parse or fill it), with the batches and frequencies planners read."""
    own = dataclasses.replace(spec, options=dict(spec.options) if isinstance(spec.options, dict) else spec.options,
                              prepared=dict(spec.prepared))
    if own.batches is None:
        own.batches = lambda: iter(batches)
    if own.frequencies is None:
        offsets = own.column_offsets()
        counts = torch.zeros(own.num_rows, dtype=torch.int64)
        for ids in batches:
            valid = ids >= 0
            counts += torch.bincount((ids + offsets)[valid], minlength=own.num_rows)
        own.frequencies = counts
    return own


def _build(store: str | StoreBuilder, spec: StoreSpec) -> tuple[str, EmbeddingStore]:
    if isinstance(store, str):
        return store, methods.get(store).build(spec)
    return getattr(store, "__name__", type(store).__name__), store(spec)


def run(store: str | StoreBuilder, spec: StoreSpec, batches: Sequence[torch.Tensor], seed: int = 0,
        atol: float = DEFAULT_ATOL, reference: str | StoreBuilder = "device") -> Lockstep:
    """Train ``store`` and ``reference`` in lock step on ``batches`` (ids [B, K] each); compare every step.

    Per step both see the same ``prefetch`` window (the next ``lookahead``
    batches, as the training loop gives it), the same ids and the same
    gradient [B, K, D] (``GRAD_SCALE`` times standard normal, drawn on the CPU
    from ``seed``, then moved to ``spec.device``). Each store gets its own
    copy of ``spec`` (the reference without the store's ``options``); a store
    that plans ahead reads ``batches`` (and their row counts as
    ``frequencies``) unless the spec has its own.
    """
    batches = list(batches)
    name, under_test = _build(store, _own_spec(spec, batches))
    _, ref = _build(reference, dataclasses.replace(_own_spec(spec, batches), options={}, prepared={}))
    gen = torch.Generator().manual_seed(seed)
    marker, diffs = NullMarker(), []
    for i, ids in enumerate(batches):
        for s in (under_test, ref):
            s.prefetch(batches[i + 1:i + 1 + s.lookahead])
        got, want = under_test.forward(ids, marker), ref.forward(ids, marker)
        lookup = _max_abs(got, want)
        grad = (torch.randn(*ids.shape, spec.dim, generator=gen) * GRAD_SCALE).to(spec.device)
        under_test.backward(grad.clone(), marker)
        ref.backward(grad.clone(), marker)
        rows = _max_abs(under_test.lookup(ids), ref.lookup(ids))
        diffs.append(StepDiff(i, lookup, rows))
    return Lockstep(name, tuple(diffs), float(atol))


#: steps of the lock-step check a peer's trained run gets (``check_run``)
RUN_STEPS = 20


def check_run(cfg: "RunConfig", ds: "Dataset", spec: StoreSpec, order: Sequence[Any],
              steps: int = RUN_STEPS) -> Lockstep:
    """The lock-step check of a trained run: its store against ``device`` on the run's first ``steps`` batches.

    ``order``: the run's row batches of the train split (as ``train.build``
    returns them); ``spec``: the run's own (``train.store_spec``, on the run's
    device), both stores are built from it.
    """
    start = ds.split("train")[0]
    batches = [torch.from_numpy(ds.batch_ids(rows + start)) for rows in list(order)[:steps]]
    return run(cfg.method, spec, batches, seed=cfg.seed)


def random_batches(table_sizes: Sequence[int], batch_size: int, steps: int, seed: int = 0,
                   skew: float = 1.2) -> list[torch.Tensor]:
    """``steps`` batches of ids [batch_size, T], one column per table, Zipf-like (``skew``) within each table,
    so that rows repeat within a batch (the sums have several terms) and across batches."""
    gen = torch.Generator().manual_seed(seed)
    cols = []
    for n in table_sizes:
        weights = torch.arange(1, n + 1, dtype=torch.float64).pow(-skew)
        cols.append(weights)
    out = []
    for _ in range(steps):
        out.append(torch.stack([torch.multinomial(w, batch_size, replacement=True, generator=gen) for w in cols], 1))
    return out
