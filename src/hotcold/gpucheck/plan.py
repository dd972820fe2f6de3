"""Which runs a GPU check trains: the one-process runs of a workflow config's generated datasets, at a scale.

The runs and their configs are the workflow's own (``hotcold.workflow.matrix.Matrix``
on the config, so a check trains what ``make reproduce`` trains), with the
scale-out methods left out and, at a smaller ``Scale``, the generators' rows
and the training section replaced. No Snakemake is needed: the config is read
as a file, and every setting it leaves out takes the typed configs' defaults
(the schema's).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hotcold import methods
from hotcold.config import ConfigError
from hotcold.workflow.matrix import Matrix, Run

#: the run directory of a run, under the check's output: runs/<dataset>/<method>/<variant>/seed~<n>
RUNS_DIR, DATA_DIR = "runs", "data"


@dataclass(frozen=True)
class Scale:
    """What a check changes of the config's datasets and training (None: the config's own)."""

    name: str
    rows: int | None = None                 # every generator's samples
    max_rows_per_table: int | None = None   # every generator's cap on a table's rows
    steps: int | None = None                # train.steps of every run
    warmup_steps: int | None = None
    batch_size: int | None = None
    eval_samples: int | None = None
    pipeline: str | None = None             # train.pipeline of every run (auto | on | off)
    cuda_graphs: str | None = None          # train.cuda_graphs of every run

    def train(self) -> dict[str, Any]:
        """The train section's replaced keys."""
        keys = ("steps", "warmup_steps", "batch_size", "eval_samples", "pipeline", "cuda_graphs")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    def generator(self) -> dict[str, int]:
        """The generator options replaced."""
        return {k: getattr(self, k) for k in ("rows", "max_rows_per_table") if getattr(self, k) is not None}

    def with_(self, **changes: Any) -> "Scale":
        """This scale with the given non-None fields replaced (options given by hand)."""
        return Scale(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})


SCALES = {
    # the config's datasets and training, as `make reproduce` trains them: the GPU check
    "config": Scale("config"),
    # seconds on a CPU: the fallback without a GPU, and the tests'. Big enough tables that the caches
    # and scratchpads at 1.5% of the rows hold a batch's unique rows (else their runs are infeasible).
    "tiny": Scale("tiny", rows=8000, max_rows_per_table=8000, steps=6, warmup_steps=2, batch_size=16,
                  eval_samples=512),
}


@dataclass(frozen=True)
class Preset:
    """A named check: a config of the repository, its datasets and methods, a scale and a time budget."""

    config: str                    # relative to the repository
    datasets: tuple[str, ...]
    methods: tuple[str, ...]
    scale: Scale
    budget_s: float


PRESETS = {
    # the full-size Kaggle-style tables (33.8M rows, 4M samples) with DLRM's Kaggle model at batch 2,048, as
    # `make reproduce CONFIG=workflows/config/paper-scale-cpu.yaml` trains them, the one-process techniques at
    # their headline settings; the evaluation cut to 20k samples so the check fits 6 minutes on one GPU
    "full-size-kaggle": Preset("workflows/config/paper-scale-cpu.yaml", ("kaggle",),
                               ("device", "hybrid", "fae", "lru", "freqcache", "scratchpipe"),
                               Scale("full-size-kaggle", eval_samples=20_000), 360.0),
}


@dataclass(frozen=True)
class PlannedRun:
    """One run of the check: its keys, the run config ``hotcold train`` gets, and where its record goes."""

    dataset: str
    method: str
    variant: str
    run_config: dict[str, Any]
    out_dir: Path
    infeasible: str | None    # why it cannot run on this device, known from its options (no training)

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.method}/{self.variant}"


@dataclass(frozen=True)
class Plan:
    generators: dict[str, dict[str, Any]]   # dataset -> `hotcold generate` spec
    runs: list[PlannedRun]
    left_out: list[str]                      # what the check does not train, one line each

    def dataset_dir(self, out: Path, name: str) -> Path:
        return Path(out) / DATA_DIR / name


def _matrix(config: Mapping[str, Any], device: str, train: Mapping[str, Any]) -> Matrix:
    """The workflow's matrix of ``config`` with its scale-out methods removed and ``train`` merged in."""
    cfg = copy.deepcopy(dict(config))
    for key in ("datasets", "methods"):
        if not isinstance(cfg.get(key), dict):
            raise ConfigError(f"gpu-check: the config has no {key} section")
    cfg["methods"] = {m: v for m, v in cfg["methods"].items() if v is not None and not methods.get(m).spans_ranks}
    cfg["seeds"] = list(cfg.get("seeds") or [0])[:1]
    cfg["timing"] = {**(cfg.get("timing") or {}), "device": device}
    cfg["train"] = {**(cfg.get("train") or {}), **train}
    cfg.setdefault("model", {})
    cfg.setdefault("distributed", {"scales": []})
    return Matrix(cfg)


def _order(method: str) -> int:
    """The ``device`` reference first (the others' exactness compares with it), then registry order."""
    names = methods.names()
    return -1 if method == "device" else names.index(method)


def plan(config: Mapping[str, Any], out: Path, device: str, scale: Scale,
         datasets: Sequence[str] | None = None, only: Sequence[str] | None = None) -> Plan:
    """The check's runs of ``config`` on ``device`` (cpu | cuda) at ``scale``.

    ``datasets``/``only``: keep these datasets/methods (None: all); the
    ``device`` method is kept whenever another one is, as the others'
    reference. Scale-out methods and datasets read from real logs are left
    out (``Plan.left_out`` says so).
    """
    for name in only or ():
        if methods.get(name).spans_ranks:  # an unknown one fails naming the known ones
            raise ConfigError(f"gpu-check: method {name!r} spans ranks; the check trains one-process methods: "
                              f"{', '.join(methods.names(spans_ranks=False))}")
    matrix = _matrix(config, device, scale.train())
    configured = {m for d in matrix.datasets() for m in matrix.methods_for(d)}
    absent = sorted(set(only or ()) - configured)
    if absent:
        raise ConfigError(f"gpu-check: method(s) {absent} are not in the config's one-process methods "
                          f"{sorted(configured)}")
    left_out = [f"scale-out methods ({', '.join(methods.names(spans_ranks=True))}): they train over ranks"]
    known = matrix.datasets()
    unknown = sorted(set(datasets or ()) - set(known))
    if unknown:
        raise ConfigError(f"gpu-check: unknown dataset(s) {unknown}; the config has {known}")
    names = [d for d in known if datasets is None or d in datasets]
    for name in [d for d in names if matrix.source_of(d) is not None]:
        left_out.append(f"dataset {name}: read from real logs, not generated")
    names = [d for d in names if matrix.source_of(d) is None]
    keep = None if only is None else {*only, "device"}
    runs: list[Run] = [r for r in matrix.runs() if r.dataset in names and (keep is None or r.method in keep)]
    # method by method over the datasets: a check cut short by its time budget loses the last methods
    # (the peer), not a whole dataset; every dataset's `device` reference trains first
    runs.sort(key=lambda r: (_order(r.method), names.index(r.dataset)))
    planned = []
    for run in runs:
        config_ = matrix.run_config(run)
        config_["train"].update(scale.train())
        out_dir = Path(out) / Path(run.dir).relative_to("results")
        planned.append(PlannedRun(run.dataset, run.method, run.variant, config_, out_dir,
                                  matrix.infeasible_reason(run)))
    generators = {name: {**matrix.generator_spec(name), **scale.generator()} for name in names}
    return Plan(generators, planned, left_out)
