"""Run one configured training run as a job: on this process, or over ranks it launches; and groups of runs.

``hotcold train`` and ``hotcold train-group`` are these functions. A job
says where the run trains (``device`` overrides ``timing.device``), over how
many ranks (``nproc`` overrides ``distributed.world``) and with how many
threads, shared by its ranks. A run over P ranks started by hand launches
P ranks with torchrun, each running ``hotcold train`` on the resolved
config, and each of those joins the process group and trains its slice
(``repeats.run_group``). A group of scale-out runs that agree on their
launch trains over one launch the same way (``hotcold train-group``): the
ranks start, import and open the dataset once for all of them. Status lines
go to stderr, as progress does.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from hotcold import methods
from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.distributed.comm import launched
from hotcold.distributed.batch import batch_option
from hotcold.devices import check_ranks_fit, gpu_count, resolve_device, threads_per_rank
from hotcold.distributed.launch import join_launch, report_failure, run_ranks
from hotcold.runs.repeats import Job, run_and_record, run_group

ROLL_CALL_S = 3.0  # how long a rank whose collective failed waits for the others to answer the roll call


def with_device(cfg: RunConfig, device: str | None) -> RunConfig:
    """``cfg`` with ``timing.device`` set to ``device`` (unchanged when None)."""
    if not device:
        return cfg
    return dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, device=device))


def train_run(cfg: RunConfig, dataset_dir: str | Path, out_dir: str | Path, threads: int = 1,
              nproc: int | None = None, device: str | None = None, progress: bool = True) -> dict[str, Any] | None:
    """Train one run and write its run directory; the record (None where another process writes it).

    One-process methods cannot run over several ranks (``ConfigError``). Not
    launched yet, a run over several ranks launches them and returns None
    once they are done (a failed rank: ``ChildProcessError``, no record). A
    rank joins the process group and trains with ``threads`` divided by the
    ranks on its machine (``LOCAL_WORLD_SIZE``); rank 0 returns the record.
    Over NCCL, more ranks than GPUs fail before any starts (``devices.check_ranks_fit``).
    """
    cfg = with_device(cfg, device)
    on = resolve_device(cfg.timing.device)  # once per job: every rank, store and timer gets this one
    if nproc is not None:
        cfg = cfg.with_world(nproc)
        cfg.distributed.validate("--nproc")
    option = "--nproc" if nproc is not None else "distributed.world"
    if cfg.distributed.world > 1:
        _check_spans_ranks(cfg)
    if cfg.distributed.world > 1 and not launched():
        _check_launch(cfg, on, option)
        verb = ["train", "--dataset", str(dataset_dir), "--run-config", json.dumps(cfg.to_dict()), "--out",
                str(out_dir)]
        _launch(cfg.distributed.world, verb, [Path(out_dir)], threads, progress)
        return None
    if launched():
        return _train_rank([Job(cfg, Path(out_dir))], Path(dataset_dir), on, threads, progress)[0]
    torch.set_num_threads(max(1, threads))
    print(f"run {cfg.dataset}/{cfg.method}/{cfg.variant}/seed~{cfg.seed} ({threads} threads, 1 rank(s))",
          file=sys.stderr)
    return run_and_record(cfg, Path(dataset_dir), Path(out_dir), on, progress=progress)


def _check_spans_ranks(cfg: RunConfig) -> None:
    """A run over several ranks: its method spans ranks and its global batch divides over them (before any
    rank starts)."""
    world_size = cfg.distributed.world
    if not methods.get(cfg.method).spans_ranks:
        raise ConfigError(f"method {cfg.method!r} runs in one process; over {world_size} ranks use "
                          f"{', '.join(methods.names(spans_ranks=True))}")
    if cfg.train.batch_size % world_size:
        raise ConfigError(f"{batch_option(cfg.distributed)}: the global batch {cfg.train.batch_size} is not "
                          f"divisible by the world size {world_size}")


def _check_launch(cfg: RunConfig, on: torch.device, option: str) -> None:
    """The launch's ranks fit this machine (over NCCL: a GPU each)."""
    check_ranks_fit(cfg.distributed.world, on.type, cfg.distributed.backend,
                    gpu_count() if on.type == "cuda" else 0, option)


def _train_rank(jobs: Sequence[Job], dataset_dir: Path, device: torch.device, threads: int,
                progress: bool) -> list[dict[str, Any] | None]:
    """One rank of a launch: join the process group and train this rank's slice of each job (one launch: the
    jobs agree on ``DistributedConfig.launch``); rank 0 returns the records, the others None each.

    A collective that fails (a rank that did not answer within
    ``distributed.timeout_s``, or died) ends this rank with ``RankTimeoutError``
    naming the ranks that did not answer a roll call (``world.unanswered``), a
    message the launcher shows.
    """
    from hotcold.distributed.world import World, collective_failure, unanswered

    cfg = jobs[0].cfg
    world = None
    world_size, timeout_s = cfg.distributed.world, cfg.distributed.timeout_s
    rank = int(os.environ["RANK"])
    join_launch(rank)
    try:
        world = World.join(cfg.distributed.ranks_per_node, world_size, device,
                           timeout_s=timeout_s, backend=cfg.distributed.backend)
        torch.set_num_threads(threads_per_rank(threads))  # the job's threads over the ranks on this machine
        if world.is_main:
            what = (f"{cfg.dataset}/{cfg.method}/{cfg.variant}/seed~{cfg.seed}" if len(jobs) == 1
                    else f"{len(jobs)} runs of {cfg.dataset} interleaved by repeat")
            print(f"run {what} ({threads} threads, {world_size} rank(s), {torch.get_num_threads()} per rank, "
                  f"{cfg.distributed.backend} backend on {world.comm.device})", file=sys.stderr)
        return run_group(jobs, dataset_dir, world.comm.device, progress=progress, world=world)
    except Exception as e:
        if world_size > 1 and collective_failure(e):
            missing = unanswered(rank, world_size, grace_s=min(ROLL_CALL_S, timeout_s))
            if missing:
                message = (f"rank {rank}: rank(s) {', '.join(map(str, missing))} did not answer within "
                           f"distributed.timeout_s {timeout_s:g} s (hung, stopped or dead; {type(e).__name__})")
                report_failure(message)
                raise RankTimeoutError(message) from None
        raise
    finally:
        if world is not None:
            world.close()


class RankTimeoutError(TimeoutError):
    """A rank of the launch did not answer a collective in time: the run fails, naming it."""


def _launch(world_size: int, verb: list[str], out_dirs: Sequence[Path], threads: int, progress: bool) -> None:
    """Start ``world_size`` ranks, each running the ``hotcold`` ``verb``; a failed or stopped launch leaves none of
    the records in ``out_dirs``."""
    records = [Path(out) / "record.json" for out in out_dirs]

    def forget() -> None:
        for record in records:
            record.unlink(missing_ok=True)

    forget()
    verb = [*verb, "--threads", str(threads)] + ([] if progress else ["--no-progress"])
    rc, message = run_ranks(world_size, verb, on_stop=forget)
    if rc != 0:
        forget()
        raise ChildProcessError(f"torchrun exited with status {rc}: a rank failed, no record was written"
                                + (f": {message}" if message else ""))


def train_group(runs: Sequence[tuple[Mapping[str, Any], str | Path]], dataset_dir: str | Path, threads: int = 1,
                device: str | None = None, progress: bool = True) -> list[tuple[Job, dict[str, Any] | None]]:
    """Train runs of one dataset interleaved by repeat (``repeats.run_group``); each job and its record (None
    where another process wrote it).

    ``runs``: (run config mapping, run directory) pairs: one-process runs, or
    scale-out runs that agree on their launch (``DistributedConfig.launch``:
    world, ranks per node, backend, timeout), which then train over one launch
    of their ranks, as ``train_run`` launches one run's.
    """
    jobs = [Job(with_device(RunConfig.from_dict(config), device), Path(out)) for config, out in runs]
    if not jobs:
        raise ConfigError("no runs to train")
    devices = {job.cfg.timing.device for job in jobs}
    if len(devices) > 1:
        raise ConfigError(f"the runs of one group train on one timing.device, got {sorted(devices)}")
    launches = {job.cfg.distributed.launch() for job in jobs}
    if len(launches) > 1:
        raise ConfigError("the runs of one group train over one launch: their distributed world, ranks_per_node, "
                          f"backend and timeout_s agree, got {sorted(launches)}")
    on = resolve_device(devices.pop())
    cfg = jobs[0].cfg
    if cfg.distributed.world > 1:
        for job in jobs:
            _check_spans_ranks(job.cfg)
        if not launched():
            _check_launch(cfg, on, "distributed.world")
            verb = ["train-group", "--dataset", str(dataset_dir),
                    "--runs", json.dumps([{"run_config": job.cfg.to_dict(), "out": str(job.out_dir)} for job in jobs])]
            _launch(cfg.distributed.world, verb, [job.out_dir for job in jobs], threads, progress)
            return [(job, None) for job in jobs]
        return list(zip(jobs, _train_rank(jobs, Path(dataset_dir), on, threads, progress)))
    torch.set_num_threads(max(1, threads))
    print(f"train {len(jobs)} run(s) of {cfg.dataset} interleaved by repeat ({threads} threads)", file=sys.stderr)
    return list(zip(jobs, run_group(jobs, Path(dataset_dir), on, progress=progress)))


def write_infeasible_runs(runs: Sequence[tuple[Mapping[str, Any], str | Path]], data_dir: str | Path,
                          device: str | None = None) -> list[tuple[Path, str]]:
    """The ``infeasible`` records of runs whose options cannot run on their trainer device, or whose
    scale-out global batch is more than the dataset's training split, without training.

    The device is each run's ``timing.device`` (``device`` overrides it), ``auto``
    resolved where this runs. Each run's dataset is ``data_dir/<dataset>``. A run
    that can run there fails (``ConfigError``): it is to be trained. Returns (run
    directory, reason).
    """
    from hotcold.data.format import Dataset
    from hotcold.distributed.batch import train_samples
    from hotcold.runs.records import write_infeasible
    from hotcold.workflow.splits import batch_reason

    written, auto = [], None
    for config, out in runs:
        cfg = with_device(RunConfig.from_dict(config), device)
        if cfg.timing.device == "auto" and auto is None:
            auto = resolve_device("auto").type
        on = auto if cfg.timing.device == "auto" else cfg.timing.device
        d = cfg.distributed
        reason = cfg.store.infeasible_on(on)
        if reason is None and d.world > 1:  # the same words as the workflow's plan, against the split written
            reason = batch_reason(cfg.dataset, d.world, d.ranks_per_node, cfg.train.batch_size, d.batch_per_rank,
                                  train_samples(Dataset.open(Path(data_dir) / cfg.dataset)))
        if reason is None:
            raise ConfigError(f"run {out}: {cfg.method}/{cfg.variant} can run on {on}; train it instead")
        write_infeasible(cfg, Path(data_dir) / cfg.dataset, Path(out), on, reason)
        written.append((Path(out), reason))
    return written


def outcome(record: Mapping[str, Any]) -> str:
    """One line on how a run ended: its throughput and AUC, or why it could not run."""
    if record["status"] != "ok":
        return f"{record['status']}: {record['reason']}"
    s, m = record["summary"], record["metrics"]
    repeats = f" (median of {s['repeats']} repeats, spread {s['repeat_spread']:.2f})" if s.get("repeats", 1) > 1 else ""
    return (f"{s['samples_per_s']:.0f} samples/s{repeats}, step p50 {s['step_ms_p50']:.2f} ms, AUC {m['auc']:.4f}"
            + ("" if s.get("stable", True) else f", unstable: {s['unstable_reason']}"))
