"""The global batch of a step and the per-rank batch: which option sets it, and whether the data holds it.

A scale-out step's global batch is either fixed (``train.batch_size``,
split over the ranks: strong scaling) or ``batch_per_rank x world`` (weak
scaling, as DLRM, FlexShard and TorchRec runs are sized). Both the trainer
and ``hotcold shard-sim`` check here that one batch fits the training
split, with an error naming the option that set it.
"""
from __future__ import annotations

from hotcold.config import ConfigError, DistributedConfig
from hotcold.data.format import Dataset


def batch_option(distributed: DistributedConfig) -> str:
    """The option that set a run's global batch, with its value, for error messages."""
    if distributed.batch_per_rank is None:
        return "train.batch_size"
    return f"distributed.batch_per_rank {distributed.batch_per_rank} x world {distributed.world}"


def train_samples(ds: Dataset) -> int:
    start, stop = ds.split("train")
    return stop - start


def check_batch_fits(batch: int, ds: Dataset, option: str) -> None:
    """Raise ``ConfigError`` naming ``option`` when one global ``batch`` is more than the training split."""
    n = train_samples(ds)
    if batch > n:
        raise ConfigError(f"{option}: a global batch of {batch:,} samples is more than the {n:,} samples of "
                          f"dataset {ds.name}'s training split")


PER_RANK, GLOBAL = "per-rank", "global"   # the ``batching`` of a scale-out row: weak or strong scaling


def sweep_batches(worlds: list[int], fixed: int, batch_per_rank: int | None,
                  fixed_too: bool) -> list[tuple[str, int | None, list[int]]]:
    """The simulations of a sweep over ``worlds``: (batching, ``batch_per_rank`` keyword, the worlds' indices).

    With a per-rank batch, every world at ``batch_per_rank x world``
    (``per-rank``), then, with ``fixed_too``, the worlds whose fixed global
    batch ``fixed`` differs from that (``global``); without one, every world
    at ``fixed``.
    """
    every = list(range(len(worlds)))
    if batch_per_rank is None:
        return [(GLOBAL, None, every)]
    out: list[tuple[str, int | None, list[int]]] = [(PER_RANK, batch_per_rank, every)]
    differ = [i for i in every if batch_per_rank * worlds[i] != fixed]
    if fixed_too and differ:
        out.append((GLOBAL, None, differ))
    return out
