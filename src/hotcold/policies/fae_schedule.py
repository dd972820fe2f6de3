"""FAE's planning, shared by the ``fae`` store and the FAE trace model.

FAE (Adnan et al., VLDB 2022) profiles row accesses on a sample of the
training inputs, keeps the hottest rows that fit a device budget on the
device, calls an input *hot* when every one of its lookups is a hot row, and
trains hot-only and cold mini-batches. A cold batch also reads and updates
hot rows on the host, so every switch of batch kind copies the whole hot set
(with its optimizer state) to where the next batch runs.

The batch order (``fae_order``) is timed on FAE's epoch. A run trains
``train.steps`` batches, far fewer than an epoch at paper scale (2,000 of
~38k), and the authors' epoch puts all its cold batches first: the first
``steps`` batches of an epoch would be timed as the ``hybrid`` store. So the
order is a *scaled epoch* in training order: the warm-up steps are one
period, the timed steps another, and each period is as many whole epochs as
fit followed by a sample of the next epoch whose hot:cold batch ratio is the
epoch's (``scaled_counts``: rounded to the nearest batch, so the timed hot
share is within ``0.5 / timed steps`` of the epoch's), its kinds in the
order ``run_length`` dictates (``"epoch"``: its cold batches, then its hot
ones; an integer: runs of that many in random order). Syncs follow from the
kinds. With ``"epoch"`` the epoch pays two an epoch; timed steps of k whole
epochs and a scaled rest pay 2k + 1 (2k - 1 without a rest; the warm-up runs in reverse and ends
cold, so the first timed step copies nothing): within one hot-set copy of
pro rata, and a window shorter than an epoch pays exactly one, the least
that holds both kinds (at paper scale one copy of the hot set in 1,900
steps against the epoch's 0.1). With an integer run length the runs are in
random order, and the timed switches are the epoch's switches per batch in
expectation.
``FAEOrder.summary`` states the epoch's and the timed steps' hot shares and
switches in the run's record, and ``degenerate`` (``all-hot``: every timed
batch hot, the run is the ``device`` store's; ``all-cold``: the ``hybrid``
store's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hotcold.config import ConfigError
from hotcold.options.base import EPOCH
from hotcold.counters import StepCounters, all_host, all_resident
from hotcold.data.skew import row_counts

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

_CHUNK = 1 << 16               # samples read at a time when profiling and classifying


def profile_counts(ds: "Dataset", seed: int, fraction: float) -> tuple[np.ndarray, int]:
    """Access count of every global row [N] over a random sample of the training inputs.

    The sample (``fraction`` of the split, at least one input) is a fixed
    function of the seed. Returns the counts and the number of inputs sampled.
    """
    start, stop = ds.split("train")
    n = stop - start
    k = max(1, int(round(fraction * n)))
    sample = np.sort(np.random.default_rng([seed, 0xFAE]).choice(n, size=k, replace=False))
    return row_counts(ds, "train", sample, _CHUNK), k


def hottest_rows(counts: np.ndarray, capacity: int) -> np.ndarray:
    """The ``capacity`` most accessed rows, ties by row index; ascending int64."""
    top = np.argsort(-counts, kind="stable")[:capacity]
    return np.sort(top).astype(np.int64)


def classify_samples(ds: "Dataset", hot_rows: np.ndarray) -> np.ndarray:
    """bool [n_train]: whether each training input looks up only hot rows (padding ignored)."""
    hot = np.zeros(sum(ds.cardinalities), dtype=bool)
    hot[hot_rows] = True
    start, stop = ds.split("train")
    out = np.empty(stop - start, dtype=bool)
    for a in range(start, stop, _CHUNK):
        b = min(a + _CHUNK, stop)
        g = ds.global_ids(np.arange(a, b))  # [B, K], -1 at padding
        out[a - start:b - start] = (hot[np.maximum(g, 0)] | (g < 0)).all(axis=1)
    return out


@dataclass(frozen=True)
class FAEPlan:
    """What FAE's profiling decided: the hot rows and which training inputs are hot."""

    hot_rows: np.ndarray     # int64 [H] global rows, ascending
    is_hot: np.ndarray       # bool [n_train]
    sampled: int             # training inputs profiled

    @property
    def hot_fraction(self) -> float:
        return float(self.is_hot.mean()) if self.is_hot.size else 0.0


def plan(ds: "Dataset", seed: int, fraction: float, capacity: int) -> FAEPlan:
    """Profile a ``fraction`` of the inputs, keep the ``capacity`` hottest rows, classify every input."""
    counts, sampled = profile_counts(ds, seed, fraction)
    hot_rows = hottest_rows(counts, capacity)
    return FAEPlan(hot_rows, classify_samples(ds, hot_rows), sampled)


def scaled_counts(n_hot: int, n_cold: int, length: int) -> tuple[int, int]:
    """Hot and cold batches of a period of ``length`` batches with the epoch's ratio (nearest batch, half up)."""
    total = n_hot + n_cold
    hot = (2 * length * n_hot + total) // (2 * total)
    return hot, length - hot


def period_lengths(length: int, per_epoch: int) -> list[int]:
    """``length`` batches as whole epochs of ``per_epoch`` batches, then the remainder (a scaled epoch)."""
    whole, rest = divmod(length, per_epoch)
    return [per_epoch] * whole + ([rest] if rest else [])


def period_kinds(n_hot: int, n_cold: int, run_length: int | str, seed: int, period: int) -> np.ndarray:
    """bool [n_hot + n_cold]: the kind (hot: True) of each batch of one period, in training order.

    ``"epoch"``: the cold batches, then the hot ones (the authors' loop). An
    integer R: the batches of each kind grouped into runs of R (each kind's
    last run may be short) in a random order (``default_rng([seed, period,
    0xFAE])``).
    """
    if run_length == EPOCH:
        return np.repeat([False, True], [n_cold, n_hot])
    runs = np.repeat([True, False], [-(-n_hot // run_length), -(-n_cold // run_length)])
    runs = np.random.default_rng([seed, period, 0xFAE]).permutation(runs)
    left = {True: n_hot, False: n_cold}
    sizes = []
    for is_hot in runs.tolist():
        sizes.append(min(run_length, left[is_hot]))
        left[is_hot] -= sizes[-1]
    return np.repeat(runs, sizes)


def order_kinds(n_hot: int, n_cold: int, steps: int, warmup: int, run_length: int | str,
                seed: int) -> np.ndarray:
    """bool [steps]: FAE's batch kinds for a run of ``steps`` whose first ``warmup`` are not timed.

    The warm-up steps and the timed ones are each ``period_lengths`` of the
    epoch of ``n_hot + n_cold`` batches; each period holds ``scaled_counts``
    of each kind in ``period_kinds``' order (period p numbered from 0 over
    the run). The warm-up steps run in reverse, so that with ``"epoch"`` they
    end cold as the timed steps begin: the first timed step copies no hot set
    that the epoch would not (a timed window shorter than the epoch then
    pays one sync, its cold->hot switch).
    """
    per_epoch = n_hot + n_cold
    if per_epoch == 0:
        raise ConfigError("fae: the epoch has no full batch")
    if not 0 <= warmup <= steps:
        raise ConfigError(f"fae: warm-up steps {warmup} must be within the run's {steps} steps")
    parts = [period_kinds(*scaled_counts(n_hot, n_cold, length), run_length, seed, p) for p, length in
             enumerate(period_lengths(warmup, per_epoch) + period_lengths(steps - warmup, per_epoch))]
    kinds = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    kinds[:warmup] = kinds[:warmup][::-1].copy()  # ends with the kind the timed steps begin with ("epoch": cold)
    return kinds


def sync_steps(kinds: np.ndarray) -> np.ndarray:
    """bool [steps]: the steps that copy the hot set first (``HotSetSync``: a switch of kind, never step 0)."""
    out = np.zeros(len(kinds), dtype=bool)
    out[1:] = kinds[1:] != kinds[:-1]
    return out


class _KindStream:
    """One kind's batches epoch after epoch: the samples shuffled by ``default_rng([seed, epoch])`` (the
    loader's permutation), cut into batches (the last partial one dropped), each batch sorted."""

    def __init__(self, samples: np.ndarray, batch_size: int, seed: int) -> None:
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        self.per_epoch = len(samples) // batch_size
        self.taken, self.epoch, self.order = 0, -1, samples

    def next(self) -> np.ndarray:
        epoch, k = divmod(self.taken, self.per_epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self.order = self.samples[np.random.default_rng([self.seed, epoch]).permutation(len(self.samples))]
        self.taken += 1
        return np.sort(self.order[k * self.batch_size:(k + 1) * self.batch_size])


@dataclass(frozen=True)
class FAEOrder:
    """FAE's batches for one run and how they were chosen (``fae_order``)."""

    batches: list[np.ndarray]   # train-relative sample indices of each batch, sorted
    kinds: np.ndarray           # bool [steps]: hot batch
    warmup: int                 # steps before the timed ones
    epoch_hot: int              # hot batches an epoch
    epoch_cold: int             # cold batches an epoch
    epoch_switches: int         # kind switches an epoch, epoch after epoch (its kinds taken cyclically)

    def summary(self) -> dict[str, Any]:
        """The record's statement of the selection: the epoch's and the timed steps' hot shares and switches."""
        per_epoch = self.epoch_hot + self.epoch_cold
        timed = self.kinds[self.warmup:]
        switches = int(sync_steps(self.kinds)[self.warmup:].sum())
        whole, rest = divmod(len(timed), per_epoch)
        hot = int(timed.sum())
        degenerate = None
        if len(timed):
            degenerate = "all-hot" if hot == len(timed) else "all-cold" if hot == 0 else None
        return {
            "epoch_batches": per_epoch, "epoch_hot_share": self.epoch_hot / per_epoch,
            "epoch_switches": self.epoch_switches, "epoch_switches_per_step": self.epoch_switches / per_epoch,
            "timed_steps": len(timed), "timed_hot_share": hot / len(timed) if len(timed) else None,
            "timed_switches": switches,
            "timed_switches_per_step": switches / len(timed) if len(timed) else None,
            "timed_selection": f"scaled epoch: {whole} whole epoch(s) of {per_epoch} batches and {rest} batches "
                               "sampled from the next with its hot:cold ratio, in run_length order; the "
                               "warm-up steps a scaled epoch of their own, in reverse",
            "degenerate": degenerate,
        }


def fae_order(hot: np.ndarray, cold: np.ndarray, batch_size: int, steps: int, seed: int,
              run_length: int | str = EPOCH, warmup: int = 0) -> FAEOrder:
    """FAE's ``steps`` batches, the first ``warmup`` untimed (see the module's docstring).

    hot, cold: train-relative sample indices of each kind. Each kind's
    batches come from its own shuffled epochs (``_KindStream``: every sample
    at most once an epoch of its kind; with one kind only, the loader's
    order), consumed in the order of ``order_kinds``.
    """
    streams = {True: _KindStream(hot, batch_size, seed), False: _KindStream(cold, batch_size, seed)}
    n_hot, n_cold = streams[True].per_epoch, streams[False].per_epoch
    if n_hot + n_cold == 0:
        raise ConfigError(f"fae: {len(hot)} hot and {len(cold)} cold training inputs make no full "
                          f"batch of {batch_size}")
    kinds = order_kinds(n_hot, n_cold, steps, warmup, run_length, seed)
    epoch = period_kinds(n_hot, n_cold, run_length, seed, 0)
    switches = int((epoch[1:] != epoch[:-1]).sum() + (epoch[-1] != epoch[0]))
    return FAEOrder([streams[k].next() for k in kinds.tolist()], kinds, warmup, n_hot, n_cold, switches)


class HotSetSync:
    """Which copy of the hot rows is current, and what a batch of a kind must synchronise first.

    Both copies start equal (placing the hot rows on the device is no step
    cost), so the first batch never synchronises.
    """

    def __init__(self, hot_rows: int) -> None:
        self.hot_rows = hot_rows
        self.fresh = "both"   # both | host | device

    def enter(self, hot: bool) -> int:
        """Rows to copy before a batch of this kind (0 or all hot rows): host -> device for a hot batch."""
        stale = "host" if hot else "device"
        sync = self.hot_rows if self.fresh == stale else 0
        self.fresh = "device" if hot else "host"
        return sync


def fae_counters(hot: bool, lookups: int, unique_rows: int, synced: int, dim: int,
                 row_bytes: int) -> StepCounters:
    """One FAE step: a hot batch on the device or a cold one on the host, after syncing ``synced`` rows."""
    c = all_resident(lookups, unique_rows) if hot else all_host(lookups, unique_rows, dim)
    c.hot_batch = int(hot)
    c.switches = int(synced > 0)
    c.sync_rows, c.sync_bytes = synced, synced * row_bytes
    return c.set_param_traffic(synced if hot else 0, 0 if hot else synced, row_bytes)
