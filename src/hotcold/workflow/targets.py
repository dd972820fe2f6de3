"""The run files a Snakemake command line names: checked against the config, and trained alone.

A researcher reruns one method by naming its runs' files, as targets or
with ``--forcerun`` (``results/runs/kaggle/lru/1.5pct/seed~0/record.json``).
Snakemake reads the Snakefile before it resolves its targets and tells it
nothing of them, so the workflow reads its own command line
(``CommandLine``, with Snakemake's own argument parser). Every run file
named there must be a run the config asks for (``check_named``: a wrong
dataset, method, variant, seed or scale is named with what is configured,
before any job starts). Where every target is a run file, the runs among
them that a group would train (one-process runs with ``timing.interleave``,
scale-out runs with ``distributed.group_runs``) are trained one job each
(``hotcold train``) instead of by their group's job (``lone_runs``;
docs/configuration.md, "Rerunning parts"): the plan then holds only those
runs, so no group's job makes the same files. A target that Snakemake's ``--configfile`` took
as a config file is named (``check_configfiles``), and a GPU count too small
for a scale-out run over NCCL (``check_gpus``).

A job that Snakemake runs elsewhere (a cluster executor) reads the Snakefile
again with the job as its target (``--target-jobs``): it names no file, and
its rules are the same ones.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from hotcold import methods
from hotcold.config import ConfigError
from hotcold.workflow.matrix import Matrix, Run, scale_dir

RUN_FILE = re.compile(
    r"(?:^|/)results/runs/(?P<dataset>[^/]+)/(?P<method>[^/]+)/(?P<variant>[^/]+)/"
    r"(?:world~(?P<world>\d+)-rpn~(?P<rpn>\d+)/)?seed~(?P<seed>\d+)/(?:record\.json|steps\.parquet)$")


@dataclass(frozen=True)
class CommandLine:
    """What a Snakemake command line asks for: its targets, its ``--forcerun`` values and its config files."""

    targets: tuple[str, ...]
    forcerun: tuple[str, ...]
    configfiles: tuple[str, ...]
    gpus: int | None = None  # --resources gpu=N

    @classmethod
    def parse(cls, argv: list[str]) -> "CommandLine":
        from snakemake.cli import get_argument_parser

        args, _ = get_argument_parser().parse_known_args(argv)
        gpu = (args.resources or {}).get("gpu")
        value = getattr(gpu, "value", gpu)
        return cls(tuple(args.targets or ()), tuple(sorted(args.forcerun or ())),
                   tuple(str(f) for f in (args.configfile or ())), int(value) if isinstance(value, int) else None)

    def lone(self) -> list[tuple[str, Run]]:
        """The run files among the targets where every target is one (else none)."""
        named = named_runs(self.targets)
        return named if self.targets and len(named) == len(self.targets) else []


def check_configfiles(cmd: CommandLine) -> None:
    """A ``ConfigError`` naming the config files that are run files (targets written after ``--configfile``)."""
    misread = [f for f in cmd.configfiles if RUN_FILE.search(f)]
    if misread:
        raise ConfigError(f"--configfile took {', '.join(misread)} as config file(s): write the targets before "
                          f"--configfile, or after `--` (snakemake --cores 2 TARGET --configfile FILE)")


def named_runs(argv: Iterable[str]) -> list[tuple[str, Run]]:
    """Each argument naming a run's ``record.json`` or ``steps.parquet``, with the run it names (world 1 where
    the path has no scale)."""
    out = []
    for arg in argv:
        m = RUN_FILE.search(arg)
        if m is None:
            continue
        world, rpn = (int(m["world"]), int(m["rpn"])) if m["world"] else (1, 1)
        out.append((arg, Run(m["dataset"], m["method"], m["variant"], int(m["seed"]), world, rpn)))
    return out


def lone_runs(matrix: Matrix, named: list[tuple[str, Run]]) -> list[Run]:
    """The runs among ``named`` (``check_named`` first) that a job of several runs would train
    (``Matrix.grouped``): each by a job of its own instead (those known not to run keep their one
    ``infeasible`` job)."""
    return list(dict.fromkeys(run for _, run in named if matrix.grouped(run)))


def check_named(matrix: Matrix, named: list[tuple[str, Run]]) -> None:
    """A ``ConfigError`` for the first path whose run the config does not ask for, naming the part that is not
    configured and what is."""
    runs = set(matrix.runs())
    for path, run in named:
        if run not in runs:
            raise ConfigError(f"{path}: {_why_not(matrix, run)}")


def _why_not(matrix: Matrix, run: Run) -> str:
    datasets = matrix.datasets()
    if run.dataset not in datasets:
        return f"no dataset {run.dataset!r} is configured (datasets: {', '.join(datasets)})"
    variants = matrix.methods_for(run.dataset)
    if run.method not in variants:
        return f"method {run.method!r} is not run on {run.dataset} (methods: {', '.join(variants)})"
    if run.variant not in variants[run.method]:
        return (f"{run.method} has no variant {run.variant!r} on {run.dataset} "
                f"(variants: {', '.join(variants[run.method])})")
    seeds = matrix.config["seeds"]
    if run.seed not in seeds:
        return f"seed {run.seed} is not configured (seeds: {', '.join(map(str, seeds))})"
    if not methods.get(run.method).spans_ranks:
        return f"{run.method} runs in one process: its path has no world~P-rpn~G part"
    scales = ", ".join(scale_dir(*s) for s in matrix.trained_scales()) or "none"
    if run.world == 1 and run.ranks_per_node == 1:
        return f"{run.method} runs over ranks: its path names a scale before seed~ (trained scales: {scales})"
    return f"scale {scale_dir(run.world, run.ranks_per_node)} is not trained (trained scales: {scales})"


def check_gpus(matrix: Matrix, gpus: int | None) -> None:
    """A ``ConfigError`` where ``--resources gpu=N`` is fewer GPUs than a scale-out job over NCCL needs (a rank
    each on its one machine: Snakemake would lower the job's claim to N and the ranks would fail inside it)."""
    from hotcold.devices import ranks_fit_problem

    if gpus is None or matrix.device() != "cuda" or not any(run.scale_out for run in matrix.runs()):
        return
    backend = matrix.config["distributed"].get("backend", "auto")
    for world, _ in matrix.trained_scales():
        problem = ranks_fit_problem(world, "cuda", backend, gpus)
        if problem is not None:
            raise ConfigError(f"--resources gpu={gpus}: "
                              f"{problem.replace('this machine has', 'Snakemake may give a job')}")
