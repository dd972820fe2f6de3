"""Training jobs: runs with repeats, alone or interleaved with other runs of one dataset, written as run directories.

With ``timing.repeats`` R, a run trains its timed part R times from the same
initial state on the same batches (``RepeatedRun``), so repeats must agree
and their times can be pooled. ``run_group`` trains several one-process runs
of one dataset round-robin by repeat, so that a slow period of the machine
does not land on one method only. What the settings do: docs/configuration.md,
"Repeats and interleaved runs".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from hotcold import methods
from hotcold.config import ConfigError, InfeasibleError
from hotcold.run_config import RunConfig
from hotcold.contention import Watch
from hotcold.data.format import Dataset
from hotcold.devices import local_ranks
from hotcold.distributed.world import World
from hotcold.embedding.fbgemm import PeerUnavailableError
from hotcold.runs.lockstep import check_run
from hotcold.runs.records import (
    diverged_record,
    infeasible_record,
    param_checksum,
    param_fingerprint,
    skipped_record,
    steps_frame,
    trained_record,
    write_run,
)
from hotcold.record_status import sketch_rel_diff
from hotcold.timing import TimedPart, summarize_repeats
from hotcold.train import DivergedError, RunResult, reference, reference_key, store_spec, train


class RepeatMismatchError(RuntimeError):
    """Repeats of one run ended with different parameters on the CPU, where training is deterministic: a bug."""


@dataclass(frozen=True)
class Job:
    """One run to train and the directory its record goes to."""

    cfg: RunConfig
    out_dir: Path


class References:
    """The ``device`` replays (``train.reference``) of a group's runs, the last one kept: the next run that
    needs the same replay (its key: ``train.reference_key``) takes it instead of training it again, as the
    plans of one launch do, trained on the same batches. One is kept at a time: its tables may be large."""

    def __init__(self, ds: Dataset, device: torch.device, progress: bool) -> None:
        self.ds, self.device, self.progress = ds, device, progress
        self._key: tuple | None = None
        self._ref: RunResult | None = None

    def replay(self, cfg: RunConfig, order: Sequence[Any]) -> RunResult | None:
        """The run's replay (None: it needs none), trained unless the last one was the same."""
        key = reference_key(cfg, order)
        if key is None:
            return None
        if key != self._key:
            self._key, self._ref = None, None  # the old replay's memory goes before the new one is trained
            self._ref = reference(cfg, self.ds, self.device, order, progress=self.progress)
            self._key = key
        return self._ref


class RepeatedRun:
    """One run across its repeats. Keeps each repeat's samples and parameter fingerprint, never its model.

    With ``timing.repeats`` R, a run trains its timed part R times, each time
    from the same initial state on the same batches (``train.train`` builds the
    model and the store afresh from the seed), so every repeat must end with the
    same parameters, and that is checked. The first repeat is evaluated (AUC);
    the ``device`` reference replay, where a run has one, runs once after the
    last. The record's summary pools the timed steps of all repeats
    (``timing.summarize_repeats``) and says in which order they ran.
    """

    def __init__(self, job: Job, ds: Dataset, device: torch.device, world: World, progress: bool,
                 references: References, group_runs: int = 1) -> None:
        self.job, self.ds, self.device, self.world, self.progress = job, ds, device, world, progress
        self.references, self.group_runs = references, group_runs
        self.parts: list[TimedPart] = []
        self.steps: list[pd.DataFrame] = []
        self.params: list[dict[str, Any]] = []
        self.order_index: list[int] = []
        self.start_s: list[float] = []
        self.infeasible: str | None = None
        self.skipped: str | None = None  # a peer method without its optional package: why
        self.diverged: tuple[int, str] | None = None  # a non-finite loss or parameter: (first step, why)
        self._first: dict[str, Any] = {}

    @property
    def repeats(self) -> int:
        return self.job.cfg.timing.repeats

    @property
    def pending(self) -> bool:
        """Whether repeats are left to train."""
        return (self.infeasible is None and self.skipped is None and self.diverged is None
                and len(self.parts) < self.repeats)

    def run_repeat(self, position: int, started: float) -> None:
        """Train the next repeat; ``position``: its place in the job's sequence of timed parts."""
        cfg, r = self.job.cfg, len(self.parts)
        self.start_s.append(time.perf_counter() - started)
        watch = Watch.for_device(self.device, torch.get_num_threads(), 1 if self.world.size == 1 else local_ranks())
        watch.start()
        try:
            result = train(cfg, self.ds, self.device, progress=self.progress, world=self.world, evaluation=r == 0)
        except InfeasibleError as e:
            self.infeasible = str(e)
            return
        except PeerUnavailableError as e:
            self.skipped = str(e)
            return
        except DivergedError as e:
            self.diverged = (e.step, str(e))
            return
        result.timed.contention = watch.stop()
        if r == 0:
            self._first = {"summary": result.summary, "metrics": result.metrics, "order": result.order,
                           "store": result.store_report}
        self.parts.append(result.timed)
        self.steps.append(steps_frame(result.phases, result.counters, repeat=r))
        self.order_index.append(position)
        if self.world.is_main:
            self._check_params(r, result)

    def _check_params(self, r: int, result: RunResult) -> None:
        """Fingerprint the first repeat; a later one by its checksum, and by its sketch where that differs."""
        if r == 0 or param_checksum(result.named_parameters()) != self.params[0]["checksum"]:
            self.params.append(param_fingerprint(result.named_parameters()))
        else:
            self.params.append(self.params[0])
        first, last = self.params[0], self.params[r]
        if first["checksum"] == last["checksum"] or self.device.type != "cpu":
            return  # on a GPU, atomic adds make sums depend on their order: recorded, not an error
        cfg = self.job.cfg
        diff = sketch_rel_diff(last["sketch"], first["sketch"])
        raise RepeatMismatchError(
            f"{cfg.dataset}/{cfg.method}/{cfg.variant}/seed~{cfg.seed}: repeat {r + 1} of {self.repeats} ended "
            f"with other parameters than repeat 1 (relative difference {diff:.3g}); each repeat trains from the "
            "same initial state on the same batches, so something else changed the result: a bug")

    def summary(self) -> dict[str, Any]:
        """The summary over all repeats, with the order they ran in and whether their parameters agreed."""
        summary = summarize_repeats(self.parts)
        first = self._first["summary"]
        checksums = {p["checksum"] for p in self.params}
        diffs = [sketch_rel_diff(p["sketch"], self.params[0]["sketch"]) for p in self.params[1:]]
        summary.update(
            world=first["world"], ranks_per_node=first["ranks_per_node"], plan=first["plan"],
            batch_size=first.get("batch_size"), batch_per_rank=first.get("batch_per_rank"),
            repeat_order=self.order_index, repeat_start_s=[round(s, 3) for s in self.start_s],
            repeat_params_equal=len(checksums) == 1,
            repeat_param_rel_diff=None if any(map(math.isnan, diffs)) else max(diffs, default=0.0),
            group_runs=self.group_runs,
        )
        return summary

    def finish(self) -> dict[str, Any] | None:
        """Write the run directory (rank 0) and return the record; None on the other ranks."""
        cfg, out_dir = self.job.cfg, Path(self.job.out_dir)
        if not self.world.is_main:
            return None
        if self.infeasible is not None or self.skipped is not None:
            record = (infeasible_record(cfg, self.ds, self.device, self.infeasible) if self.infeasible is not None
                      else skipped_record(cfg, self.ds, self.device, self.skipped))
            write_run(out_dir, record, steps_frame([], []))
            return record
        if self.diverged is None:
            try:
                ref = self.references.replay(cfg, self._first["order"])
            except DivergedError as e:
                self.diverged = (e.step, f"its device reference replay: {e}")
        if self.diverged is not None:
            record = diverged_record(cfg, self.ds, self.device, self.diverged[1], self.diverged[0])
            write_run(out_dir, record, steps_frame([], []))
            return record
        lock = None
        if methods.get(cfg.method).check == methods.CHECK_LOCKSTEP:  # a peer: its kernels round their own way
            lock = check_run(cfg, self.ds, store_spec(cfg, self.ds, self.device), self._first["order"]).to_record()
        record = trained_record(cfg, self.ds, self.device, self.summary(), self._first["metrics"], self.params[0],
                                self._first["store"], ref, lock)
        write_run(out_dir, record, pd.concat(self.steps, ignore_index=True))
        return record


def run_group(jobs: Sequence[Job], dataset_dir: Path, device: torch.device, progress: bool = True,
              world: World | None = None) -> list[dict[str, Any] | None]:
    """Train ``jobs`` on the dataset in ``dataset_dir`` round-robin by repeat on ``device`` (the job's, resolved
    once: ``runner``); write each run directory.

    Returns the records in the order of ``jobs`` (None on ranks other than
    0). The runs of a group are runs of one dataset with distinct run
    directories, over the ranks of ``world`` (one process without one); runs
    whose ``device`` replays are the same (a launch's plans, on the same
    batches) share one (``References``).

    Round-robin by repeat: repeat 1 of every run, then repeat 2 of every run,
    ..., so that a slow period of the machine does not land on one method only.
    Each run's directory is written as soon as its last repeat is done, exactly
    as a run trained alone would be; a run that cannot run on the dataset ends
    as an ``infeasible`` record (a peer method whose optional package is
    missing, as a ``skipped`` one), and any other error propagates before the
    records of the runs still training are written.
    """
    world = world or World.single()
    if not jobs:
        raise ConfigError("no runs to train")
    if any(j.cfg.distributed.world != world.size for j in jobs):
        raise ConfigError(f"the runs of this group train over {world.size} rank(s), got runs over "
                          f"{sorted({j.cfg.distributed.world for j in jobs})}")
    if len(jobs) > 1:
        names = sorted({j.cfg.dataset for j in jobs})
        if len(names) > 1:
            raise ConfigError(f"a group trains the runs of one dataset, got {names}")
        outs = [Path(j.out_dir).resolve() for j in jobs]
        if len(set(outs)) < len(outs):
            raise ConfigError("two runs of the group share one run directory")
    if world.is_main:
        for job in jobs:  # never leave a stale complete-looking run
            (Path(job.out_dir) / "record.json").unlink(missing_ok=True)
    ds = Dataset.open(dataset_dir, verify=True, progress=progress and world.is_main)  # checks and hashes (cached)
    references = References(ds, device, progress)
    runs = [RepeatedRun(j, ds, device, world, progress, references, len(jobs)) for j in jobs]
    records: list[dict[str, Any] | None] = [None] * len(runs)
    started, position = time.perf_counter(), 0
    for _ in range(max(run.repeats for run in runs)):
        for i, run in enumerate(runs):
            if not run.pending:
                continue
            run.run_repeat(position, started)
            position += 1
            if not run.pending:
                records[i] = run.finish()
    return records


def run_and_record(cfg: RunConfig, dataset_dir: Path, out_dir: Path, device: torch.device, progress: bool = True,
                   world: World | None = None) -> dict[str, Any] | None:
    """Train one run (``cfg.timing.repeats`` times) and write its run directory; return the record.

    An infeasible variant (``InfeasibleError``: valid, but it cannot run on
    this dataset) is recorded as such, a peer method without its optional
    package (``PeerUnavailableError``) as ``skipped``; every other error propagates and
    leaves no record, so the job fails. Across ranks, every rank trains every
    repeat and rank 0 writes the record once every rank has finished (others
    return None): a rank that dies leaves no record.
    """
    return run_group([Job(cfg, Path(out_dir))], dataset_dir, device, progress, world)[0]
