"""``fae``: FAE (Adnan et al., VLDB 2022), hot rows on the device, hot and cold mini-batches.

FAE profiles row accesses on a random sample of the training inputs
(``sample_fraction``, 5% as in the paper), keeps the hottest rows that fit a
device-memory budget in device memory and leaves every row in host memory.
A training input is *hot* when every one of its lookups is a hot row. FAE
forms hot-only and cold mini-batches; a hot batch runs entirely on the device
like ``device``, a cold batch takes the CPU-GPU ``hybrid`` path on the host
rows. A cold batch also reads and updates hot rows, so when the kind of batch
switches the whole hot set is copied across (hot -> cold: device to host
before the cold batch; cold -> hot: host to device before the hot batch) and
no copy is ever read stale.

Scheduler. FAE's Shuffle Scheduler interleaves hot and cold mini-batches at
random, so that training never sees long runs of only popular or only
unpopular inputs (which hurts convergence); every switch of kind costs a
hot-set synchronisation. Here the schedule is fixed before training
(``schedule``): each epoch shuffles the hot and the cold samples (per seed
and epoch), cuts each into batches (dropping each kind's last partial batch,
as the loader does), and places the hot batches among the cold ones
uniformly at random, so hot batches make up the hot share of every epoch in
proportion. Each switch moves the whole hot set (256 MiB on full Kaggle,
against 1.7 MB of looked-up vectors in a batch of 1024), so ``run_length``
(default 1: interleave per batch) schedules runs of that many batches of one
kind to switch less often. FAE always shuffles;
``train.shuffle`` does not apply. The sample permutation is the loader's
(``default_rng([seed, epoch])``), so with a budget of 0 rows (all cold) the
order is exactly the loader's and the run is ``hybrid``'s, and with every
row hot it is ``device``'s.

Budget. ``budget_bytes`` is device memory for hot rows; a row costs
``(D + state) * 4`` bytes (state: 1 float for row-wise Adagrad, 0 for SGD).
``budget_ratio`` is the same knob as a fraction of all rows, which is how it
scales with the dataset: FAE's 128, 256 and 512 MiB on full Criteo Kaggle
(33.76M rows, D=16, 64 B a row, 2061 MiB of weights) are ratios 0.062, 0.124
and 0.248; on a scaled-down dataset use the ratio. The default is 0.124
(FAE's middle budget and its profiler's default). As in FAE's profiler the
hot set fills the budget: the ``budget`` rows with the highest sampled
counts, ties broken by row index (rows the sample never saw come last), so a
budget of all rows makes every input hot.

Counters. ``hits`` are lookups served from device memory (all of a hot
batch, none of a cold one). A cold batch moves its looked-up vectors and
their gradients as ``hybrid`` counts them (``lookups`` rows and
``lookups * D * 4`` bytes each way). A synchronisation adds the H hot rows
with their optimizer state, ``H * (D + state) * 4`` bytes, to ``rows_h2d`` /
``bytes_h2d`` (cold -> hot) or ``rows_d2h`` / ``bytes_d2h`` (hot -> cold).
The first batch needs none (both copies start equal); placing the hot rows
on the device at construction is not a step cost. ``hot_batch`` is 1 for a
batch run on the device. A batch is hot when all its rows are hot, so the
store is correct for any order; on FAE's own order this is its schedule.

The hot set reaches the store through the spec: ``schedule`` attaches an
``FAEProfile`` to it. A store built without one (no ``schedule`` call, e.g.
when replaying a given order) has no hot rows and behaves as ``hybrid``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import torch

from hotcold.config import ConfigError
from hotcold.data.skew import row_counts
from hotcold.embedding.base import EmbeddingStore, Lookup, Marker, StoreSpec, budget_rows, coalesce
from hotcold.embedding.hybrid import HybridStore

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

DEFAULT_SAMPLE_FRACTION = 0.05
DEFAULT_BUDGET_RATIO = 0.124   # 256 MiB of full Criteo Kaggle's 2061 MiB at D=16
_CHUNK = 1 << 16               # samples read at a time when profiling and classifying


@dataclass(frozen=True)
class FAEProfile:
    """What FAE's profiling decided: the hot rows and the hot share of the inputs."""

    hot_rows: torch.Tensor      # int64 [H] global rows, ascending
    hot_fraction: float = 0.0   # hot training inputs / training inputs
    sampled: int = 0            # training inputs profiled

    def attach(self, spec: StoreSpec) -> None:
        spec.prepared["fae"] = self

    @staticmethod
    def of(spec: StoreSpec) -> "FAEProfile | None":
        return spec.prepared.get("fae")


def fae_options(spec: StoreSpec) -> tuple[float, int, int]:
    """Validated (sample_fraction, capacity in rows, run_length) from ``spec.options``."""
    opts = dict(spec.options)
    unknown = sorted(set(opts) - set(FAEStore.option_names))
    if unknown:
        raise ConfigError(f"store FAEStore: unknown option(s) {unknown}; allowed: {list(FAEStore.option_names)}")
    frac = opts.get("sample_fraction", DEFAULT_SAMPLE_FRACTION)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ConfigError(f"fae: sample_fraction must be in (0, 1], got {frac!r}")
    rows = budget_rows(opts, "fae", spec.num_rows, rows_key="budget_bytes", ratio_key="budget_ratio",
                       default_ratio=DEFAULT_BUDGET_RATIO, unit_bytes=row_bytes(spec), allow_zero=True)
    run = opts.get("run_length", 1)
    if isinstance(run, bool) or not isinstance(run, int) or run < 1:
        raise ConfigError(f"fae: run_length must be a positive integer, got {run!r}")
    return float(frac), min(rows, spec.num_rows), run


def row_bytes(spec: StoreSpec) -> int:
    """Bytes of one row with its optimizer state."""
    return (spec.dim + spec.optimizer.state_width) * 4


def profile_counts(spec: StoreSpec, ds: "Dataset", fraction: float) -> tuple[np.ndarray, int]:
    """Access count of every global row [N] over a random sample of the training inputs.

    The sample (``fraction`` of the split, at least one input) is a fixed
    function of the seed. Returns the counts and the number of inputs sampled.
    """
    start, stop = ds.split("train")
    n = stop - start
    k = max(1, int(round(fraction * n)))
    sample = np.sort(np.random.default_rng([spec.seed, 0xFAE]).choice(n, size=k, replace=False))
    return row_counts(ds, "train", sample, _CHUNK), k


def hottest_rows(counts: np.ndarray, capacity: int) -> np.ndarray:
    """The ``capacity`` most accessed rows, ties by row index; ascending int64."""
    top = np.argsort(-counts, kind="stable")[:capacity]
    return np.sort(top).astype(np.int64)


def classify_samples(spec: StoreSpec, ds: "Dataset", hot_rows: np.ndarray) -> np.ndarray:
    """bool [n_train]: whether each training input looks up only hot rows (padding ignored)."""
    hot = np.zeros(spec.num_rows, dtype=bool)
    hot[hot_rows] = True
    start, stop = ds.split("train")
    cols = ds.column_offsets  # [K]
    out = np.empty(stop - start, dtype=bool)
    for a in range(start, stop, _CHUNK):
        b = min(a + _CHUNK, stop)
        ids = ds.batch_ids(np.arange(a, b))  # [B, K]
        valid = ids >= 0
        out[a - start:b - start] = (hot[np.where(valid, ids + cols, 0)] | ~valid).all(axis=1)
    return out


def shuffle_schedule(hot: np.ndarray, cold: np.ndarray, batch_size: int, seed: int,
                     run_length: int = 1) -> Iterator[np.ndarray]:
    """Endless FAE batches: per epoch, shuffled hot-only and cold batches randomly interleaved.

    hot, cold: train-relative sample indices of each kind. The batches of
    each kind are grouped into runs of ``run_length`` (the last run of a kind
    may be shorter) and the runs of both kinds are put in random order. Each
    batch is sorted (the loader's convention); every sample appears at most
    once an epoch.
    """
    n = {True: len(hot) // batch_size, False: len(cold) // batch_size}
    if n[True] + n[False] == 0:
        raise ConfigError(f"fae: {len(hot)} hot and {len(cold)} cold training inputs make no full "
                          f"batch of {batch_size}")
    runs = np.repeat([True, False], [-(-n[True] // run_length), -(-n[False] // run_length)])
    epoch = 0
    while True:
        src = {True: hot[np.random.default_rng([seed, epoch]).permutation(len(hot))],
               False: cold[np.random.default_rng([seed, epoch]).permutation(len(cold))]}
        taken = {True: 0, False: 0}
        for is_hot in np.random.default_rng([seed, epoch, 0xFAE]).permutation(runs).tolist():
            for i in range(taken[is_hot], min(taken[is_hot] + run_length, n[is_hot])):
                yield np.sort(src[is_hot][i * batch_size:(i + 1) * batch_size])
            taken[is_hot] += run_length
        epoch += 1


class FAEStore(EmbeddingStore):
    """Hot rows (weights + optimizer state) in device memory, every row in host memory."""

    option_names = ("sample_fraction", "budget_bytes", "budget_ratio", "run_length")

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        fae_options(spec)
        prof = FAEProfile.of(spec)
        self.profile = prof or FAEProfile(torch.zeros(0, dtype=torch.int64))
        # Cold path and the host copy of every row: the hybrid store on the same rows.
        self.host = HybridStore(dataclasses.replace(spec, options={}))
        self.hot_rows = torch.unique(self.profile.hot_rows.to(torch.int64))  # [H] ascending, CPU
        h = self.hot_rows.numel()
        self._slot_of = torch.full((spec.num_rows,), -1, dtype=torch.int32)  # [N] global row -> hot slot
        self._slot_of[self.hot_rows] = torch.arange(h, dtype=torch.int32)
        self.dev_weight = self.host.weight.index_select(0, self.hot_rows).to(self.device)  # [H, D]
        self.dev_state = self.host.state.index_select(0, self.hot_rows).to(self.device)    # [H]
        self._cuda = self.device.type == "cuda"
        if self._cuda:  # pinned staging of synchronisation copies
            self._pin_w = torch.empty(h, self.dim, dtype=torch.float32, pin_memory=True)
            self._pin_s = torch.empty(h, dtype=torch.float32, pin_memory=True)
        self._fresh = "both"     # which copy of the hot rows is current: both, host or device
        self._last: tuple[Lookup, torch.Tensor] | None = None  # hot batch: plan and slots on the device
        self._hot_step: bool | None = None  # kind of the batch awaiting ``backward``
        self._synced = 0                    # hot rows synchronised before that batch

    @property
    def hot_fraction(self) -> float:
        return self.profile.hot_fraction

    def report(self) -> dict[str, Any]:
        return {"hot_fraction": self.hot_fraction, "hot_rows": int(self.hot_rows.numel()),
                "hot_ratio": self.hot_rows.numel() / self.spec.num_rows,
                "hot_bytes": int(self.hot_rows.numel()) * row_bytes(self.spec),
                "sampled_inputs": self.profile.sampled}

    @classmethod
    def schedule(cls, spec: StoreSpec, ds: "Dataset", default: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Profile, pick the hot rows, classify every training input, and return FAE's batch order.

        The batch size is the default order's; the order has as many batches
        as the default one (so as many as ``train.steps``).
        """
        frac, capacity, run_length = fae_options(spec)
        counts, sampled = profile_counts(spec, ds, frac)
        hot_rows = hottest_rows(counts, capacity)
        is_hot = classify_samples(spec, ds, hot_rows)
        FAEProfile(torch.from_numpy(hot_rows), float(is_hot.mean()) if is_hot.size else 0.0,
                   sampled).attach(spec)
        it = iter(default)
        first = next(it, None)
        if first is None:
            return iter(())
        batches = shuffle_schedule(np.flatnonzero(is_hot), np.flatnonzero(~is_hot), len(first), spec.seed,
                                   run_length)
        return (b for _, b in zip(chain([first], it), batches))

    def _hot_to_device(self) -> None:
        """Copy the hot rows (and state) host -> device."""
        adagrad = self.optimizer.state_width > 0
        if self._cuda:
            torch.index_select(self.host.weight, 0, self.hot_rows, out=self._pin_w)
            self.dev_weight.copy_(self._pin_w, non_blocking=True)
            if adagrad:
                torch.index_select(self.host.state, 0, self.hot_rows, out=self._pin_s)
                self.dev_state.copy_(self._pin_s, non_blocking=True)
        else:
            self.dev_weight.copy_(self.host.weight.index_select(0, self.hot_rows))
            if adagrad:
                self.dev_state.copy_(self.host.state.index_select(0, self.hot_rows))

    def _hot_to_host(self) -> None:
        """Copy the hot rows (and state) device -> host."""
        adagrad = self.optimizer.state_width > 0
        w, s = self.dev_weight, self.dev_state
        if self._cuda:
            self._pin_w.copy_(w, non_blocking=True)
            if adagrad:
                self._pin_s.copy_(s, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()  # the host copy needs them now
            w, s = self._pin_w, self._pin_s
        self.host.weight.index_copy_(0, self.hot_rows, w)
        if adagrad:
            self.host.state.index_copy_(0, self.hot_rows, s)

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        lk = self.plan(ids)
        slots = self._slot_of[lk.rows].to(torch.int64)  # [L], -1 = cold row
        self._synced = 0
        if bool((slots >= 0).all()):
            if self._fresh == "host":
                self._hot_to_device()
                self._synced = self.hot_rows.numel()
            self._fresh, self._hot_step = "device", True
            dev_slots = slots.to(self.device, non_blocking=True)
            timer.mark("h2d")
            self._last = (lk, dev_slots)
            out = self.to_batch(self.dev_weight.index_select(0, dev_slots), lk)  # [B, K, D]
            timer.mark("emb_fwd")
            return out
        if self._fresh == "device":
            self._hot_to_host()
            self._synced = self.hot_rows.numel()
            timer.mark("d2h")
        self._fresh, self._hot_step, self._last = "host", False, None
        return self.host.forward(ids, timer)

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._hot_step is not None, "backward without forward"
        sync_rows = self._synced
        sync_bytes = sync_rows * (self.dim + self.optimizer.state_width) * 4
        if not self._hot_step:  # cold batch: the hybrid update on the host rows
            self._hot_step = None
            self.host.backward(grad, timer)
            c = self.host.step_counters()
            c["rows_d2h"] += sync_rows
            c["bytes_d2h"] += sync_bytes
            self._counters = {**c, "hot_batch": 0}
            return
        assert self._last is not None
        lk, slots = self._last
        uniq, summed = coalesce(slots, self.from_batch(grad, lk))
        self.optimizer.apply(self.dev_weight, self.dev_state, uniq, summed)
        self._counters = {
            "lookups": lk.size, "unique_rows": uniq.numel(), "hits": lk.size, "misses": 0,
            "rows_h2d": sync_rows, "rows_d2h": 0, "bytes_h2d": sync_bytes, "bytes_d2h": 0,
            "hot_batch": 1,
        }
        self._last, self._hot_step = None, None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation: host rows, with the hot ones from the device when that copy is current."""
        if self._fresh != "device":
            return self.host.lookup(ids)
        lk = self.plan(ids)
        slots = self._slot_of[lk.rows].to(torch.int64)  # [L]
        hot = (slots >= 0).nonzero().squeeze(1)          # [Lh] positions of hot lookups
        if hot.numel() == lk.size:
            return self.to_batch(self.dev_weight.index_select(0, slots.to(self.device)), lk)
        values = self.host.weight.index_select(0, lk.rows).to(self.device)  # [L, D]
        values.index_copy_(0, hot.to(self.device),
                           self.dev_weight.index_select(0, slots.index_select(0, hot).to(self.device)))
        return self.to_batch(values, lk)

    def export(self) -> torch.Tensor:
        out = self.host.export()  # [N, D], CPU
        if self._fresh == "device":
            out.index_copy_(0, self.hot_rows, self.dev_weight.to("cpu"))
        return out

    def close(self) -> None:
        self.host.close()
