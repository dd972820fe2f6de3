"""Global batches against the training splits, known before any job runs: the arithmetic and its words.

A generated dataset's training split follows from its generator: Criteo-style data train on the first
``rows - round(rows x holdout_fraction)`` samples (``generators.config.split_sizes``); Taobao-style data split
by user, so before generation only ``rows`` bounds theirs. Datasets read from real logs are left alone (their
split is known once preprocessed; the jobs check it). ``Matrix.check`` refuses, in one line naming the dataset,
the scale and the option to change, the batches no job could record a skip for; a trained scale-out run whose
global batch does not fit is skipped instead (``Matrix.infeasible_reason``), and ``hotcold infeasible`` checks
the same against the generated split (``batch_reason``).
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from hotcold.config import ConfigError


class Split(NamedTuple):
    """A dataset's training samples before generation: exact, or (``exact`` False) the most it can hold."""

    samples: int
    exact: bool


def train_split(generator_spec: Mapping[str, Any]) -> Split | None:
    """The training split a generator's options make (None: options the config check names as bad)."""
    from hotcold.data.generators.config import GeneratorConfig, split_sizes

    try:
        cfg = GeneratorConfig.from_dict(generator_spec)
    except ConfigError:
        return None  # ``Matrix.check`` names the bad option
    if cfg.kind == "taobao-style":  # split by user: the held-out users' samples are known once generated
        return Split(cfg.rows, False)
    return Split(split_sizes(cfg.rows, cfg.holdout_fraction)[0], True)


def split_words(name: str, samples: int, exact: bool = True) -> str:
    if exact:
        return f"the {samples:,} samples of dataset {name}'s training split"
    return f"the {samples:,} samples of dataset {name} (its training split, by user, holds fewer)"


def rows_option(name: str) -> str:
    return f"datasets.{name}.generator.rows"


def batch_reason(dataset: str, world: int, ranks_per_node: int, batch: int, batch_per_rank: int | None,
                 samples: int, exact: bool = True) -> str | None:
    """Why a trained scale-out run cannot run: its global ``batch`` is more than the ``samples`` of the training
    split (None: it fits). ``batch_per_rank``: ``distributed.train.batch_per_rank`` (None: the fixed batch)."""
    if batch <= samples:
        return None
    scale, split = f"world {world} ({world // ranks_per_node}x{ranks_per_node})", split_words(dataset, samples, exact)
    if batch_per_rank is not None:
        return (f"dataset {dataset}: distributed.train.batch_per_rank {batch_per_rank} x {scale} is a global batch "
                f"of {batch:,} samples, more than {split}: lower distributed.train.batch_per_rank, drop world {world} "
                f"from distributed.scales or raise {rows_option(dataset)}")
    return (f"dataset {dataset}: distributed.train.batch_size {batch:,}, the fixed global batch at {scale}, is more "
            f"than {split}: lower distributed.train.batch_size or raise {rows_option(dataset)}")
