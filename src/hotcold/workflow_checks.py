"""Global batches against the training splits, known before any job runs: this module's one job.

A generated dataset's training split follows from its generator: Criteo-style data train on the first
``rows - round(rows x holdout_fraction)`` samples (``generators.config.split_sizes``); Taobao-style data split
by user, so before generation only ``rows`` bounds theirs. Datasets read from real logs are left alone (their
split is known once preprocessed; the jobs check it). ``Matrix.check`` refuses, in one line naming the dataset,
the scale and the option to change, the batches no job could record a skip for: the one-process
``train.batch_size`` (its runs, profile and cache simulation) and every global batch ``hotcold shard-sim``
simulates. A trained scale-out run whose global batch does not fit is skipped instead: ``Matrix.infeasible_reason``
gives its reason, and the ``device_infeasible`` job writes its ``infeasible`` record (``hotcold infeasible``
checks the same against the generated split, ``batch_reason``), as for runs that cannot run on the device.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

from hotcold.config import ConfigError

if TYPE_CHECKING:
    from hotcold.workflow import Matrix, Run


class Split(NamedTuple):
    """A dataset's training samples before generation: exact, or (``exact`` False) the most it can hold."""

    samples: int
    exact: bool


def train_split(matrix: Matrix, name: str) -> Split | None:
    """The training split of a generated dataset, from its generator options (None: read from real logs)."""
    from hotcold.data.generators.config import GeneratorConfig, split_sizes

    if matrix.source_of(name) is not None:
        return None
    try:
        cfg = GeneratorConfig.from_dict(matrix.generator_spec(name))
    except ConfigError:
        return None  # ``Matrix.check`` names the bad option
    if cfg.kind == "taobao-style":  # split by user: the held-out users' samples are known once generated
        return Split(cfg.rows, False)
    return Split(split_sizes(cfg.rows, cfg.holdout_fraction)[0], True)


def _split_words(name: str, samples: int, exact: bool = True) -> str:
    if exact:
        return f"the {samples:,} samples of dataset {name}'s training split"
    return f"the {samples:,} samples of dataset {name} (its training split, by user, holds fewer)"


def _rows(name: str) -> str:
    return f"datasets.{name}.generator.rows"


def batch_size_option(matrix: Matrix, name: str, scale_out: bool = False) -> str:
    """The option that sets the dataset's ``train.batch_size`` (scale-out: its fixed global batch)."""
    if scale_out and "batch_size" in matrix.config["distributed"]["train"]:
        return "distributed.train.batch_size"
    own = matrix.dataset_spec(name).get("train") or {}
    return f"datasets.{name}.train.batch_size" if "batch_size" in own else "train.batch_size"


def batch_reason(dataset: str, world: int, ranks_per_node: int, batch: int, batch_per_rank: int | None,
                 samples: int, exact: bool = True) -> str | None:
    """Why a trained scale-out run cannot run: its global ``batch`` is more than the ``samples`` of the training
    split (None: it fits). ``batch_per_rank``: ``distributed.train.batch_per_rank`` (None: the fixed batch)."""
    if batch <= samples:
        return None
    scale, split = f"world {world} ({world // ranks_per_node}x{ranks_per_node})", _split_words(dataset, samples, exact)
    if batch_per_rank is not None:
        return (f"dataset {dataset}: distributed.train.batch_per_rank {batch_per_rank} x {scale} is a global batch "
                f"of {batch:,} samples, more than {split}: lower distributed.train.batch_per_rank, drop world {world} "
                f"from distributed.scales or raise {_rows(dataset)}")
    return (f"dataset {dataset}: distributed.train.batch_size {batch:,}, the fixed global batch at {scale}, is more "
            f"than {split}: lower distributed.train.batch_size or raise {_rows(dataset)}")


def scale_out_reason(matrix: Matrix, run: Run) -> str | None:
    """Why a scale-out run's global batch cannot run on its dataset, known from the config (None: it can)."""
    split = train_split(matrix, run.dataset) if run.scale_out else None
    if split is None:
        return None
    return batch_reason(run.dataset, run.world, run.ranks_per_node, matrix.scale_out_batch(run),
                        matrix.train_batch_per_rank(), *split)


def skip_notes(matrix: Matrix) -> list[str]:
    """One line per skipped (dataset, scale): how many scale-out runs get an ``infeasible`` record, and why."""
    reasons = Counter(filter(None, (scale_out_reason(matrix, run) for run in matrix.device_infeasible())))
    return [f"hotcold: {n} scale-out run(s) skipped, each with an infeasible record: {reason}"
            for reason, n in reasons.items()]


def check_batches(matrix: Matrix) -> None:
    """``ConfigError`` (one line) where a one-process batch or a simulated global batch exceeds a training split."""
    sim = matrix.config["distributed"]["shard_sim"]
    per_rank, scales = matrix.shard_sim_batch_per_rank(), matrix.shard_sim_scales()
    for name in matrix.datasets():
        split = train_split(matrix, name)
        if split is None:
            continue
        words, rows = _split_words(name, *split), _rows(name)
        option, batch = batch_size_option(matrix, name), matrix.section(name, "train")["batch_size"]
        if batch > split.samples:
            raise ConfigError(f"invalid configuration for dataset {name}: {option} {batch:,} (one process, world 1: "
                              f"its runs, profile and cache simulation) is more than {words}: lower {option} "
                              f"or raise {rows}")
        for scale in scales if per_rank is not None else []:
            nodes, rpn = (int(x) for x in scale.split("x"))
            if per_rank * nodes * rpn > split.samples:
                where = "distributed.shard_sim.scales" if scale in sim["scales"] else "distributed.scales"
                raise ConfigError(f"invalid configuration for dataset {name}: distributed.shard_sim.batch_per_rank "
                                  f"{per_rank} x {nodes * rpn} ranks ({scale}) simulates a global batch of "
                                  f"{per_rank * nodes * rpn:,} samples, more than {words}: lower "
                                  f"distributed.shard_sim.batch_per_rank, drop {scale} from {where} or raise {rows}")
        fixed, option = matrix.scale_out_train(name)["batch_size"], batch_size_option(matrix, name, scale_out=True)
        if scales and (per_rank is None or sim["fixed_batch"]) and fixed > split.samples:
            why, fix = (("distributed.shard_sim.batch_per_rank null", "set distributed.shard_sim.batch_per_rank")
                        if per_rank is None else
                        ("distributed.shard_sim.fixed_batch", "set distributed.shard_sim.fixed_batch false"))
            raise ConfigError(f"invalid configuration for dataset {name}: {why} simulates the fixed global batch "
                              f"{option} {fixed:,} at the scales {', '.join(scales)}, more than {words}: lower "
                              f"{option}, {fix} or raise {rows}")
