"""FAE's planning, shared by the ``fae`` store and the FAE trace model.

FAE (Adnan et al., VLDB 2022) profiles row accesses on a sample of the
training inputs, keeps the hottest rows that fit a device budget on the
device, calls an input *hot* when every one of its lookups is a hot row, and
trains hot-only and cold mini-batches. A cold batch also reads and updates
hot rows on the host, so every switch of batch kind copies the whole hot set
(with its optimizer state) to where the next batch runs. The batch order:
``shuffle_schedule``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from hotcold.config import ConfigError, is_int
from hotcold.counters import StepCounters, all_host, all_resident
from hotcold.data.skew import row_counts

if TYPE_CHECKING:
    from hotcold.data.format import Dataset

DEFAULT_SAMPLE_FRACTION = 0.05
DEFAULT_BUDGET_RATIO = 0.124   # 256 MiB of full Criteo Kaggle's 2061 MiB of weights at D=16
EPOCH = "epoch"
_CHUNK = 1 << 16               # samples read at a time when profiling and classifying


def check_run_length(value: Any) -> int | str:
    """A positive integer or ``"epoch"``."""
    if value == EPOCH or (is_int(value) and value >= 1):
        return value
    raise ConfigError(f"fae: run_length must be a positive integer or {EPOCH!r}, got {value!r}")


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


def shuffle_schedule(hot: np.ndarray, cold: np.ndarray, batch_size: int, seed: int,
                     run_length: int | str = EPOCH) -> Iterator[np.ndarray]:
    """Endless FAE batches, epoch after epoch.

    hot, cold: train-relative sample indices of each kind. Each batch is
    sorted (the loader's convention); every sample appears at most once an
    epoch.

    Each epoch shuffles the hot and the cold samples (the loader's
    permutation, ``default_rng([seed, epoch])``) and cuts each into batches
    (dropping each kind's last partial batch). ``run_length`` sets how often the
    kind may switch: ``"epoch"`` (the default) trains the epoch's cold batches,
    then its hot ones, as the authors' training loop does, so the hot set is
    synchronised about twice an epoch; an integer groups the batches of each
    kind into runs of that many and puts the runs in random order, so the two
    kinds are interleaved more finely at the price of more synchronisations
    (``run_length: 1`` interleaves per batch).
    """
    n = {True: len(hot) // batch_size, False: len(cold) // batch_size}
    if n[True] + n[False] == 0:
        raise ConfigError(f"fae: {len(hot)} hot and {len(cold)} cold training inputs make no full "
                          f"batch of {batch_size}")
    epoch = 0
    while True:
        src = {True: hot[np.random.default_rng([seed, epoch]).permutation(len(hot))],
               False: cold[np.random.default_rng([seed, epoch]).permutation(len(cold))]}
        if run_length == EPOCH:
            kinds = [False] * n[False] + [True] * n[True]
        else:
            runs = np.repeat([True, False], [-(-n[True] // run_length), -(-n[False] // run_length)])
            kinds = []
            left = dict(n)
            for is_hot in np.random.default_rng([seed, epoch, 0xFAE]).permutation(runs).tolist():
                take = min(run_length, left[is_hot])
                kinds += [is_hot] * take
                left[is_hot] -= take
        taken = {True: 0, False: 0}
        for is_hot in kinds:
            i = taken[is_hot]
            taken[is_hot] += 1
            yield np.sort(src[is_hot][i * batch_size:(i + 1) * batch_size])
        epoch += 1


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
