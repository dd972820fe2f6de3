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
are its own (the arithmetic and words in ``workflow.splits``).
"""
from __future__ import annotations

from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from hotcold import methods
from hotcold.config import ConfigError, DistributedConfig
from hotcold.run_config import RunConfig
from hotcold.workflow.settings import merged, without_nulls
from hotcold.workflow.splits import Split, batch_reason, rows_option, split_words, train_split


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
        or a scale-out run's global batch over its dataset's training split (``scale_out_reason``)."""
        options = methods.get(run.method).parse_options(self.methods_for(run.dataset)[run.method][run.variant])
        device = self.device()
        return ((options.infeasible_on(device) if device != "auto" else None)
                or self.scale_out_reason(run))

    @cached_property
    def _device_infeasible(self) -> tuple[Run, ...]:
        return tuple(run for run in self._runs if self.infeasible_reason(run) is not None)

    def device_infeasible(self) -> list[Run]:
        """The runs known not to run (a GPU-only variant on a CPU, a scale-out batch over the training split): one
        job writes their records (``hotcold infeasible``) instead of a job each."""
        return list(self._device_infeasible)

    @cached_property
    def _skip(self) -> frozenset[Run]:
        return frozenset(self._device_infeasible)

    def interleaved_runs(self, dataset: str) -> list[tuple[str, str]]:
        """(method, variant) of the dataset's one-process runs that one ``hotcold train-group`` job trains per seed."""
        return list(dict.fromkeys((r.method, r.variant) for r in self._runs
                                  if r.dataset == dataset and not r.scale_out and r not in self._skip))

    def interleaves(self) -> bool:
        """``timing.interleave``: one job per dataset and seed trains its one-process runs."""
        return bool(self.config["timing"]["interleave"])

    def groups_scale_out(self) -> bool:
        """``distributed.group_runs``: one job per dataset, scale and seed trains its scale-out runs."""
        return bool(self.config["distributed"].get("group_runs", False))

    def groups(self, dataset: str) -> dict[tuple[int, int], list[tuple[str, str]]]:
        """The dataset's jobs of several runs, each trained per seed by ``hotcold train-group``: (1, 1) -> its
        interleaved one-process runs (``interleaves``), (world, ranks_per_node) -> its scale-out runs at that
        scale, over one launch (``groups_scale_out``). A run known not to run is in none."""
        out = {(1, 1): self.interleaved_runs(dataset)} if self.interleaves() else {}
        if self.groups_scale_out():
            for r in self._runs:
                if r.dataset == dataset and r.scale_out and r not in self._skip:
                    pairs = out.setdefault((r.world, r.ranks_per_node), [])
                    if (r.method, r.variant) not in pairs:
                        pairs.append((r.method, r.variant))
        return {scale: pairs for scale, pairs in out.items() if pairs}

    def grouped(self, run: Run) -> bool:
        """Whether a job of several runs (``groups``) trains ``run``."""
        if run in self._skip:
            return False
        return self.groups_scale_out() if run.scale_out else self.interleaves()

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
        """``hotcold shard-sim --run-config``: the batches (and model) of the dataset's scale-out runs, as many as
        ``datasets.<name>.shard_sim.steps``, else ``distributed.shard_sim.steps``, else the scale-out runs' steps.
        Every simulated step counts (shard-sim times nothing), so fewer steps than the runs' warm-up keep a
        warm-up below them, as the train section requires."""
        own = (self.dataset_spec(dataset).get("shard_sim") or {}).get("steps")
        steps = own if own is not None else self.config["distributed"]["shard_sim"].get("steps")
        train = _with_steps(self.scale_out_train(dataset), steps)
        train["warmup_steps"] = min(train["warmup_steps"], train["steps"] - 1)
        return {"seed": self.first_seed(), "train": train, "model": self.section(dataset, "model"),
                "distributed": self.wire()}

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
        from hotcold.data.generators.config import GeneratorConfig
        from hotcold.data.sources.catalog import locate_taobao
        from hotcold.data.sources.source_config import SourceConfig

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
        self._check_batches()  # a one-process or simulated batch over a training split
        self._check_shard_sim_batch()
        self._check_backend()

    # -- global batches against the training splits ---------------------------------------------------
    def train_split(self, name: str) -> Split | None:
        """The training split of a generated dataset, from its generator options (None: read from real logs)."""
        return None if self.source_of(name) is not None else train_split(self.generator_spec(name))

    def batch_size_option(self, name: str, scale_out: bool = False) -> str:
        """The option that sets the dataset's ``train.batch_size`` (scale-out: its fixed global batch)."""
        if scale_out and "batch_size" in self.config["distributed"]["train"]:
            return "distributed.train.batch_size"
        own = self.dataset_spec(name).get("train") or {}
        return f"datasets.{name}.train.batch_size" if "batch_size" in own else "train.batch_size"

    def scale_out_reason(self, run: Run) -> str | None:
        """Why a scale-out run's global batch cannot run on its dataset, known from the config (None: it can)."""
        split = self.train_split(run.dataset) if run.scale_out else None
        if split is None:
            return None
        return batch_reason(run.dataset, run.world, run.ranks_per_node, self.scale_out_batch(run),
                            self.train_batch_per_rank(), *split)

    def skip_notes(self) -> list[str]:
        """One line per skipped (dataset, scale): how many scale-out runs get an ``infeasible`` record, and why."""
        reasons = Counter(filter(None, (self.scale_out_reason(run) for run in self.device_infeasible())))
        return [f"hotcold: {n} scale-out run(s) skipped, each with an infeasible record: {reason}"
                for reason, n in reasons.items()]

    def _check_batches(self) -> None:
        """``ConfigError`` (one line) where a one-process batch or a simulated global batch exceeds a training
        split; a trained scale-out run's is skipped instead (``scale_out_reason``)."""
        sim = self.config["distributed"]["shard_sim"]
        per_rank, scales = self.shard_sim_batch_per_rank(), self.shard_sim_scales()
        for name in self.datasets():
            split = self.train_split(name)
            if split is None:
                continue
            words, rows = split_words(name, *split), rows_option(name)
            option, batch = self.batch_size_option(name), self.section(name, "train")["batch_size"]
            if batch > split.samples:
                raise ConfigError(f"invalid configuration for dataset {name}: {option} {batch:,} (one process, "
                                  f"world 1: its runs, profile and cache simulation) is more than {words}: lower "
                                  f"{option} or raise {rows}")
            for scale in scales if per_rank is not None else []:
                nodes, rpn = (int(x) for x in scale.split("x"))
                if per_rank * nodes * rpn > split.samples:
                    where = "distributed.shard_sim.scales" if scale in sim["scales"] else "distributed.scales"
                    raise ConfigError(f"invalid configuration for dataset {name}: distributed.shard_sim.batch_per_rank "
                                      f"{per_rank} x {nodes * rpn} ranks ({scale}) simulates a global batch of "
                                      f"{per_rank * nodes * rpn:,} samples, more than {words}: lower "
                                      f"distributed.shard_sim.batch_per_rank, drop {scale} from {where} or raise "
                                      f"{rows}")
            fixed, option = self.scale_out_train(name)["batch_size"], self.batch_size_option(name, scale_out=True)
            if scales and (per_rank is None or sim["fixed_batch"]) and fixed > split.samples:
                why, fix = (("distributed.shard_sim.batch_per_rank null", "set distributed.shard_sim.batch_per_rank")
                            if per_rank is None else
                            ("distributed.shard_sim.fixed_batch", "set distributed.shard_sim.fixed_batch false"))
                raise ConfigError(f"invalid configuration for dataset {name}: {why} simulates the fixed global batch "
                                  f"{option} {fixed:,} at the scales {', '.join(scales)}, more than {words}: lower "
                                  f"{option}, {fix} or raise {rows}")

    def _check_backend(self) -> None:
        """The scale-out backend suits a configured trainer device (NCCL needs ``cuda``); with ``auto`` the job
        picks its backend where it runs."""
        from hotcold.devices import resolve_backend

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
