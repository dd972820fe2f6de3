"""The run matrix of a workflow config: which datasets, runs and simulations it asks for, and their configs.

``workflows/rules/common.smk`` builds one ``Matrix`` from Snakemake's
validated config and keeps only input functions and wildcard constraints;
everything that decides what runs, and with which settings, is here and
unit-tested. A dataset's settings are the global sections with its own
overrides merged in (``merged``: mappings key by key, a null removes).
One-process methods train once per (dataset, variant, seed); methods whose
store spans ranks train at every ``distributed.scales`` entry. ``check``
resolves every dataset and run with the package's typed configs, so a bad
config fails before any job starts; global batches against the training splits
are ``hotcold.workflow_checks``'s.
"""
from __future__ import annotations

import copy
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from hotcold import methods, workflow_checks
from hotcold.config import ConfigError, DistributedConfig, read_yaml
from hotcold.run_config import RunConfig


def merged(base: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """``override`` merged into ``base``: mappings key by key, other values replace, None removes."""
    out = dict(base)
    for key, value in (override or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


#: the workflow's own config (the Snakefile's ``configfile``) and schema
REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "workflows" / "config" / "default.yaml"
SCHEMA = REPO / "workflows" / "schemas" / "config.schema.yaml"


def overlaid(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base`` as Snakemake merges ``--configfile`` over the Snakefile's ``configfile``:
    mappings key by key, every other value (a null too) replaces. The nulls stay: ``Matrix`` reads a null
    dataset, method, variant or option as removed, and a null setting (``max_rows_per_table``) as its value."""
    out = dict(base)
    for key, value in override.items():
        out[key] = overlaid(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def with_defaults(config: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the schema's defaults filled in where keys are missing, as Snakemake's ``validate``
    (``set_default``) does wherever a subschema's ``properties`` apply; needs no jsonschema."""
    defs = schema.get("$defs", {})

    def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in node:
            target: Any = defs
            for part in node["$ref"].removeprefix("#/$defs/").split("/"):
                target = target[part]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"},
                    "properties": {**target.get("properties", {}), **node.get("properties", {})}}
        return node

    def fill(instance: Any, node: Mapping[str, Any]) -> None:
        if not isinstance(instance, dict):
            return
        node = resolve(node)
        props = node.get("properties", {})
        for key, sub in props.items():
            if "default" in sub and key not in instance:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                fill(instance[key], sub)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in instance.keys() - props.keys():
                fill(instance[key], extra)

    filled = copy.deepcopy(config)
    fill(filled, schema)
    return filled


def workflow_config(path: Path | str | None = None) -> dict[str, Any]:
    """The config the workflow runs with ``--configfile path`` (None: none): ``default.yaml`` with the file
    overlaid (``overlaid``) and the schema's defaults filled in, as ``make reproduce CONFIG=path`` sees it."""
    def load(p: Path) -> dict[str, Any]:
        try:
            data = read_yaml(p) or {}
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the config: {' '.join(str(e).split())}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a config must be a mapping, got {type(data).__name__}")
        return data

    config = load(DEFAULT_CONFIG)
    if path is not None and Path(path).resolve() != DEFAULT_CONFIG.resolve():
        config = overlaid(config, load(Path(path)))
    return with_defaults(config, load(SCHEMA))


def without_nulls(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with None-valued keys removed at every level (a null in a merged file removes)."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in mapping.items() if v is not None}


def _with_steps(train: Mapping[str, Any], steps: int | None) -> dict[str, Any]:
    """A train section with ``steps`` replayed instead of its own (None: unchanged)."""
    return dict(train) if steps is None else {**train, "steps": steps}


class Run(NamedTuple):
    """One training job; world 1 is a one-process run."""

    dataset: str
    method: str
    variant: str
    seed: int
    world: int = 1
    ranks_per_node: int = 1

    @property
    def scale_out(self) -> bool:
        return methods.get(self.method).spans_ranks

    @property
    def dir(self) -> str:
        """results/runs/<dataset>/<method>/<variant>[/world~<P>-rpn~<G>]/seed~<n>."""
        scale = [scale_dir(self.world, self.ranks_per_node)] if self.scale_out else []
        return Path("results", "runs", self.dataset, self.method, self.variant, *scale, f"seed~{self.seed}").as_posix()


def scale_dir(world: int, ranks_per_node: int) -> str:
    """The path component of a scale-out run's scale: ``world~4-rpn~2`` (4 ranks, 2 per node)."""
    return f"world~{world}-rpn~{ranks_per_node}"


class Matrix:
    """What a validated workflow config (Snakemake's ``config``) asks for."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    # -- datasets -----------------------------------------------------------------------------------
    def datasets(self) -> list[str]:
        """Names of the configured datasets (a null entry removes one)."""
        return [name for name, spec in self.config["datasets"].items() if spec is not None]

    def dataset_spec(self, name: str) -> dict[str, Any]:
        return self.config["datasets"][name]

    def source_of(self, name: str) -> dict[str, Any] | None:
        """The dataset's ``source`` section (a real dataset), or None for a generated one."""
        return self.dataset_spec(name).get("source")

    def generated(self) -> list[str]:
        return [name for name in self.datasets() if self.source_of(name) is None]

    def sourced(self) -> list[str]:
        return [name for name in self.datasets() if self.source_of(name) is not None]

    def generator_spec(self, name: str) -> dict[str, Any]:
        """``hotcold generate --spec``: the dataset's generator options plus its name."""
        return {**self.dataset_spec(name)["generator"], "name": name}

    def section(self, name: str, key: str) -> dict[str, Any]:
        """The global ``train`` or ``model`` section with the dataset's overrides merged in."""
        return merged(self.config[key], self.dataset_spec(name).get(key))

    def methods_for(self, name: str) -> dict[str, dict[str, dict[str, Any]]]:
        """Method -> variant -> store options for one dataset: the global methods, its overrides merged in."""
        effective = without_nulls(merged(self.config["methods"], self.dataset_spec(name).get("methods")))
        return {method: variants for method, variants in effective.items() if variants}

    # -- runs ---------------------------------------------------------------------------------------
    def trained_scales(self) -> list[tuple[int, int]]:
        """(world, ranks_per_node) of every configured scale-out training scale."""
        return [(s["world"], s["ranks_per_node"]) for s in self.config["distributed"]["scales"]]

    @cached_property
    def _runs(self) -> tuple[Run, ...]:
        out = []
        for dataset in self.datasets():
            for method, variants in self.methods_for(dataset).items():
                scales = self.trained_scales() if methods.get(method).spans_ranks else [(1, 1)]
                out += [Run(dataset, method, variant, seed, world, rpn)
                        for variant in variants for world, rpn in scales for seed in self.config["seeds"]]
        return tuple(out)

    def runs(self) -> list[Run]:
        """Every run the config asks for: one-process methods once, scale-out methods at every trained scale."""
        return list(self._runs)

    def scale_out_train(self, name: str) -> dict[str, Any]:
        """The dataset's train section with ``distributed.train`` (fewer steps, a smaller evaluation) merged in,
        without ``batch_per_rank`` (``train_batch_per_rank``): its ``batch_size`` is the fixed global batch."""
        train = merged(self.section(name, "train"), self.config["distributed"]["train"])
        train.pop("batch_per_rank", None)
        return train

    def train_batch_per_rank(self) -> int | None:
        """``distributed.train.batch_per_rank``: the trained scale-out runs' samples per rank (None: fixed global)."""
        return self.config["distributed"]["train"].get("batch_per_rank")

    def scale_out_batch(self, run: Run) -> int:
        """The global batch of a scale-out run: ``batch_per_rank x world``, or the fixed ``batch_size``."""
        per_rank = self.train_batch_per_rank()
        return per_rank * run.world if per_rank is not None else self.scale_out_train(run.dataset)["batch_size"]

    def run_config(self, run: Run) -> dict[str, Any]:
        """``hotcold train --run-config``: everything that determines one run."""
        out = {
            "dataset": run.dataset,
            "method": run.method,
            "variant": run.variant,
            "seed": int(run.seed),
            "store": self.methods_for(run.dataset)[run.method][run.variant],
            "model": self.section(run.dataset, "model"),
            "train": self.scale_out_train(run.dataset) if run.scale_out else self.section(run.dataset, "train"),
            "timing": {k: v for k, v in self.config["timing"].items() if k != "interleave"},  # a layout of jobs
        }
        if run.scale_out:
            out["train"]["batch_size"] = self.scale_out_batch(run)
            out["distributed"] = {"world": int(run.world), "ranks_per_node": int(run.ranks_per_node), **self.wire()}
            if self.train_batch_per_rank() is not None:  # stated only when set: the fixed batch's params stay
                out["distributed"]["batch_per_rank"] = self.train_batch_per_rank()
            timeout = self.config["distributed"].get("timeout_s", DistributedConfig.timeout_s)
            if timeout != DistributedConfig.timeout_s:  # stated only when set: a default leaves the jobs' params
                out["distributed"]["timeout_s"] = timeout
            for key in ("backend", "reference"):  # stated only when not the default, as timeout_s
                value = self.config["distributed"].get(key, getattr(DistributedConfig, key))
                if value != getattr(DistributedConfig, key):
                    out["distributed"][key] = value
        return out

    def device(self) -> str:
        """``timing.device`` as configured: ``auto``, ``cpu`` or ``cuda``. Never resolved here: a job resolves
        ``auto`` where it runs (``devices.resolve_device``), which a login node without a GPU cannot know."""
        return self.config["timing"]["device"]

    def gpus(self, world: int = 1) -> int:
        """The ``gpu`` resource a training job over ``world`` ranks claims: a GPU per rank unless ``timing.device``
        is ``cpu``, planned from the config, never from the machine Snakemake runs on (a login node without a GPU
        plans the GPU nodes' jobs). ``snakemake --resources gpu=N`` then never gives two timed jobs one GPU
        (Snakemake lowers a claim above N to N, 0 included: a gloo run whose ranks share fewer GPUs runs alone, a
        machine without one runs its jobs as before)."""
        return 0 if self.device() == "cpu" else int(world)

    def infeasible_reason(self, run: Run) -> str | None:
        """Why a run cannot run, known from the config before it starts (None: it can, or only its job can tell):
        its options on a configured ``cpu`` or ``cuda`` trainer (with ``auto`` the job finds out and records it),
        or a scale-out run's global batch over its dataset's training split (``workflow_checks.scale_out_reason``)."""
        options = methods.get(run.method).parse_options(self.methods_for(run.dataset)[run.method][run.variant])
        device = self.device()
        return ((options.infeasible_on(device) if device != "auto" else None)
                or workflow_checks.scale_out_reason(self, run))

    @cached_property
    def _device_infeasible(self) -> tuple[Run, ...]:
        return tuple(run for run in self._runs if self.infeasible_reason(run) is not None)

    def device_infeasible(self) -> list[Run]:
        """The runs known not to run (a GPU-only variant on a CPU, a scale-out batch over the training split): one
        job writes their records (``hotcold infeasible``) instead of a job each."""
        return list(self._device_infeasible)

    def interleaved_runs(self, dataset: str) -> list[tuple[str, str]]:
        """(method, variant) of the dataset's one-process runs that one ``hotcold train-group`` job trains per seed."""
        skip = set(self._device_infeasible)
        return list(dict.fromkeys((r.method, r.variant) for r in self._runs
                                  if r.dataset == dataset and not r.scale_out and r not in skip))

    def trained_ratios(self, dataset: str) -> list[float]:
        """The device shares the dataset's runs state (``simulate --curve-ratios``), ascending."""
        shares = {methods.get(method).parse_options(options).device_share()
                  for method, variants in self.methods_for(dataset).items() for options in variants.values()}
        return sorted(s for s in shares if s is not None)

    # -- simulations --------------------------------------------------------------------------------
    def first_seed(self) -> int:
        """Profiles and simulations follow the batch order of the first seed."""
        return self.config["seeds"][0]

    def simulate_config(self, dataset: str) -> dict[str, Any]:
        """``hotcold simulate --run-config``: the dataset's train section fixes the simulated batches
        (``simulate.steps`` of them, when set)."""
        return {"seed": self.first_seed(),
                "train": _with_steps(self.section(dataset, "train"), self.config["simulate"].get("steps"))}

    def shard_sim_config(self, dataset: str) -> dict[str, Any]:
        """``hotcold shard-sim --run-config``: the batches (and model) of the dataset's scale-out runs."""
        steps = self.config["distributed"]["shard_sim"].get("steps")
        return {"seed": self.first_seed(), "train": _with_steps(self.scale_out_train(dataset), steps),
                "model": self.section(dataset, "model"), "distributed": self.wire()}

    def wire(self) -> dict[str, Any]:
        """``distributed.wire_dtype`` and ``distributed.exact``: what the scale-out collectives send (and shard-sim
        prices), as the run config states them."""
        section = self.config["distributed"]
        return {"wire_dtype": section.get("wire_dtype", "float32"), "exact": bool(section.get("exact", False))}

    def shard_sim_batch_per_rank(self) -> int | None:
        """``hotcold shard-sim --batch-per-rank``: ``distributed.shard_sim.batch_per_rank`` (None: fixed global)."""
        return self.config["distributed"]["shard_sim"]["batch_per_rank"]

    def shard_sim_fixed_batch(self) -> bool:
        """``hotcold shard-sim --fixed-batch``: also simulate at the fixed global batch (the scale-out batch_size)."""
        return bool(self.config["distributed"]["shard_sim"]["fixed_batch"])

    def shard_sim_scales(self) -> list[str]:
        """``hotcold shard-sim --scales``: the configured NODESxRANKS_PER_NODE, then the trained scales not in it."""
        configured = list(self.config["distributed"]["shard_sim"]["scales"])
        trained = [f"{world // rpn}x{rpn}" for world, rpn in self.trained_scales() if world % rpn == 0]
        return list(dict.fromkeys(configured + trained))

    def shard_sim_headrooms(self) -> list[float]:
        """``hotcold shard-sim --headrooms``: the configured ones, then those the scale-out runs train at."""
        trained = [methods.get(method).parse_options(options).memory_headroom
                   for dataset in self.datasets() for method, variants in self.methods_for(dataset).items()
                   if methods.get(method).spans_ranks for options in variants.values()]
        return list(dict.fromkeys([*self.config["distributed"]["shard_sim"]["headrooms"], *trained]))

    # -- checks -------------------------------------------------------------------------------------
    def check(self) -> None:
        """Resolve every dataset and run config with the typed configs; the first problem raises
        ``ConfigError`` naming where it is. Only the config is read, never this machine: whether a scale's ranks
        fit the GPUs of the machine a job lands on is that job's check (``runner.train_run``)."""
        from hotcold.data.generators import GeneratorConfig
        from hotcold.data.sources import locate_taobao
        from hotcold.data.sources.prepare import SourceConfig

        for name in self.datasets():
            for method, variants in self.methods_for(name).items():
                for variant, options in variants.items():
                    methods.get(method).parse_options(
                        options, f"invalid configuration for dataset {name}: methods.{method}.{variant}")
        for world, rpn in self.trained_scales():
            if world % rpn:
                raise ConfigError(f"invalid configuration: distributed.scales: ranks_per_node {rpn} does not divide "
                                  f"world {world} (a world is whole nodes of ranks_per_node ranks)")
        profile = self.config["profile"]
        if profile["window"] > profile["batches"]:
            raise ConfigError(f"invalid configuration: profile.window={profile['window']} is more than "
                              f"profile.batches={profile['batches']}")
        checks: list[tuple[str, Any, Any]] = [
            (f"dataset {name}", GeneratorConfig.from_dict, self.generator_spec(name)) for name in self.generated()]
        for name in self.sourced():
            source = self.source_of(name)
            checks.append((f"dataset {name}", SourceConfig.from_dict, source))
            if source["kind"] == "taobao" and not (source.get("path") or "").strip():
                checks.append((f"dataset {name}", lambda _, n=name: locate_taobao(None, name=n), source))
        for run in self._runs:
            checks.append((f"run {run.dir}", RunConfig.from_dict, self.run_config(run)))
            if run.scale_out:
                checks.append((f"run {run.dir}", _check_batch_split, self.run_config(run)))
        for where, build, data in checks:
            try:
                build(data)
            except (ConfigError, FileNotFoundError) as e:
                raise ConfigError(f"invalid configuration for {where}: {e}") from None
        workflow_checks.check_batches(self)  # a one-process or simulated batch over a training split
        self._check_shard_sim_batch()
        self._check_backend()

    def _check_backend(self) -> None:
        """The scale-out backend suits a configured trainer device (NCCL needs ``cuda``); with ``auto`` the job
        picks its backend where it runs."""
        from hotcold.distributed.devices import resolve_backend

        if self.device() == "auto" or not any(run.scale_out for run in self._runs):
            return
        try:
            resolve_backend(self.config["distributed"].get("backend", DistributedConfig.backend), self.device())
        except ConfigError as e:
            raise ConfigError(f"invalid configuration: {e}") from None

    def _check_shard_sim_batch(self) -> None:
        """The fixed global batch the simulations use (``fixed_batch``, or no per-rank batch) splits evenly at
        every simulated scale."""
        if self.shard_sim_batch_per_rank() is not None and not self.shard_sim_fixed_batch():
            return
        for name in self.datasets():
            batch = self.scale_out_train(name)["batch_size"]
            for scale in self.shard_sim_scales():
                nodes, rpn = (int(x) for x in scale.split("x"))
                if batch % (nodes * rpn):
                    option = ("distributed.shard_sim.fixed_batch" if self.shard_sim_batch_per_rank() is not None
                              else "distributed.shard_sim.batch_per_rank null")
                    raise ConfigError(f"invalid configuration for dataset {name}: {option} simulates the fixed "
                                      f"global batch train.batch_size {batch}, which {nodes * rpn} ranks ({scale}) "
                                      f"cannot split evenly")


def _check_batch_split(run_config: Mapping[str, Any]) -> None:
    """A scale-out run splits every global batch evenly over its ranks (always so with a per-rank batch)."""
    world, batch = run_config["distributed"]["world"], run_config["train"]["batch_size"]
    if batch % world:
        raise ConfigError(f"train.batch_size {batch} is not divisible by distributed.scales world {world} "
                          f"(or set distributed.train.batch_per_rank)")


def to_json(data: Any) -> str:
    """How a verb receives a config on its command line."""
    return json.dumps(data, sort_keys=True)
