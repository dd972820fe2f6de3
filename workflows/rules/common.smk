# Helpers for data.smk, train.smk and analysis.smk: how to call the hotcold CLI, each
# dataset's effective settings (global sections with its own overrides merged in),
# which runs the config asks for, and the JSON each `hotcold` verb receives.
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import DeploymentMethod

# Path components must match the schema's name patterns.
wildcard_constraints:
    dataset="[a-z0-9][a-z0-9_-]*",
    method="[a-z0-9_]+",
    variant="[a-z0-9][a-z0-9_.-]*",
    seed="[0-9]+",
    world="[0-9]+",
    rpn="[0-9]+",


# Every job calls the package the same way: `python -m hotcold <verb>`.
HOTCOLD = "python -m hotcold"
# Methods whose store spans ranks: trained at every `distributed.scales`, never in one process.
SCALE_OUT_METHODS = ("sharded", "proactive", "flexshard")
SRC = Path(workflow.basedir, "src")
SCHEMA = Path(workflow.basedir, "workflows/schemas/config.schema.yaml")


def shell_prefix() -> str:
    """Run the CLI from this checkout's sources; outside conda, with Snakemake's own interpreter."""
    exports = [f"export PYTHONPATH={shlex.quote(str(SRC))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
        python_bin = shlex.quote(str(Path(sys.executable).parent))
        exports.append(f'export PATH={python_bin}:"$PATH"')
    text = "set -euo pipefail; " + "; ".join(exports) + "; "
    return text.replace("{", "{{").replace("}", "}}")


shell.prefix(shell_prefix())


def source_sha256() -> str:
    """sha256 of the package's source: every src/hotcold/**/*.py by relative path, contents only.

    The package computes the same hash into each record's provenance
    (``hotcold.records.source_sha256``); a test pins the two definitions equal.
    """
    root = SRC / "hotcold"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.read_bytes())
    return digest.hexdigest()


# A `params` entry of the training rules: Snakemake reruns a job whose params changed, so with
# `rerun_on_code_change` an edit of the package reruns the training jobs (computed once, here).
SOURCE_PARAM = source_sha256() if config["rerun_on_code_change"] else "not tracked (rerun_on_code_change: false)"

# Peer methods run on an optional package (`pip install -e .[peers]`); without it their runs end as
# `skipped` records. Their training jobs take the installed build, and whether it imports, as a
# parameter, so installing (or repairing) the package later reruns them (Snakemake's "params changed");
# the other jobs do not depend on it.
PEER_METHODS = ("fbgemm",)  # as hotcold.embedding.PEER_METHODS


@functools.cache
def peer_state() -> str:
    """The installed distributions of fbgemm_gpu (CPU or CUDA build) with versions, and whether its TBE imports
    for the jobs' interpreter (asked in a child process, so Snakemake itself never loads it)."""
    from importlib import metadata

    names = sorted(set(metadata.packages_distributions().get("fbgemm_gpu", [])))
    builds = ", ".join(f"{name}=={metadata.version(name)}" for name in names) or "not installed"
    probe = "from hotcold.embedding.fbgemm import available; print(available() or 'usable')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
        usable = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        usable = "unknown"
    return f"{builds}: {usable}"


def peers_param(methods) -> str:
    """The training rules' `peers` parameter: ``peer_state()`` where a peer method is among ``methods``."""
    return peer_state() if any(m in PEER_METHODS for m in methods) else ""


def merged(base: dict, override: dict | None) -> dict:
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


def without_nulls(mapping: dict) -> dict:
    """``mapping`` with None-valued keys removed at every level (a null in a merged file removes)."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in mapping.items() if v is not None}


def datasets() -> list[str]:
    """Names of the configured datasets (a null entry removes one)."""
    return [name for name, spec in config["datasets"].items() if spec is not None]


def dataset_spec(name: str) -> dict:
    return config["datasets"][name]


def source_of(name: str) -> dict | None:
    """The dataset's ``source`` section (a real dataset), or None for a generated one."""
    return dataset_spec(name).get("source")


def generated_datasets() -> list[str]:
    return [name for name in datasets() if source_of(name) is None]


def sourced_datasets() -> list[str]:
    return [name for name in datasets() if source_of(name) is not None]


def one_of(names: list[str]) -> str:
    """A wildcard regex matching exactly ``names`` (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def section(name: str, key: str) -> dict:
    """The global ``train`` or ``model`` section with the dataset's overrides merged in."""
    return merged(config[key], dataset_spec(name).get(key))


def methods_for(name: str) -> dict[str, dict[str, dict]]:
    """Method -> variant -> store options for one dataset: the global methods, its overrides merged in."""
    effective = without_nulls(merged(config["methods"], dataset_spec(name).get("methods")))
    return {method: variants for method, variants in effective.items() if variants}


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
        return self.method in SCALE_OUT_METHODS


def trained_scales() -> list[tuple[int, int]]:
    """(world, ranks_per_node) of every configured scale-out training scale."""
    return [(s["world"], s["ranks_per_node"]) for s in config["distributed"]["scales"]]


def runs() -> list[Run]:
    """Every run the config asks for: one-process methods once, scale-out methods at every trained scale."""
    out = []
    for dataset in datasets():
        for method, variants in methods_for(dataset).items():
            scales = trained_scales() if method in SCALE_OUT_METHODS else [(1, 1)]
            out += [Run(dataset, method, variant, seed, world, rpn)
                    for variant in variants for world, rpn in scales for seed in config["seeds"]]
    return out


def scale_dir(world: int, ranks_per_node: int) -> str:
    """The path component of a scale-out run's scale: ``world~4-rpn~2`` (4 ranks, 2 per node)."""
    return f"world~{world}-rpn~{ranks_per_node}"


def run_dir(run: Run) -> str:
    """results/runs/<dataset>/<method>/<variant>[/world~<P>-rpn~<G>]/seed~<n>: one-process paths stay as they were."""
    scale = [scale_dir(run.world, run.ranks_per_node)] if run.scale_out else []
    return Path("results", "runs", run.dataset, run.method, run.variant, *scale, f"seed~{run.seed}").as_posix()


def all_records() -> list[str]:
    return [f"{run_dir(run)}/record.json" for run in runs()]


def scale_out_records() -> list[str]:
    return [f"{run_dir(run)}/record.json" for run in runs() if run.scale_out]


def per_dataset(pattern: str) -> list[str]:
    return expand(pattern, dataset=datasets())


def generator_spec(wildcards) -> str:
    """`hotcold generate --spec`: the dataset's generator options plus its name."""
    spec = {**dataset_spec(wildcards.dataset)["generator"], "name": wildcards.dataset}
    return json.dumps(spec, sort_keys=True)


def source_spec(wildcards) -> str:
    """`hotcold download/preprocess --spec`: the dataset's source section."""
    return json.dumps(source_of(wildcards.dataset), sort_keys=True)


def first_seed() -> int:
    """Profiles and simulations follow the batch order of the first seed."""
    return config["seeds"][0]


def batch_size(wildcards) -> int:
    return section(wildcards.dataset, "train")["batch_size"]


def simulate_config(wildcards) -> str:
    """`hotcold simulate --run-config`: the dataset's train section fixes the simulated batches."""
    return json.dumps({"seed": first_seed(), "train": section(wildcards.dataset, "train")}, sort_keys=True)


def trained_ratios(wildcards) -> str:
    """The sizes (shares of all rows) the dataset's one-process runs train at: `simulate --curve-ratios`."""
    keys = ("cache_ratio", "scratchpad_ratio", "budget_ratio")
    ratios = {opts[k] for variants in methods_for(wildcards.dataset).values() for opts in variants.values()
              if isinstance(opts, dict) for k in keys if k in opts}
    return " ".join(str(r) for r in sorted(ratios))


def scale_out_train(name: str) -> dict:
    """The dataset's train section with `distributed.train` (fewer steps, a smaller evaluation) merged in."""
    return merged(section(name, "train"), config["distributed"]["train"])


def run_config_dict(run: Run) -> dict:
    out = {
        "dataset": run.dataset,
        "method": run.method,
        "variant": run.variant,
        "seed": int(run.seed),
        "store": methods_for(run.dataset)[run.method][run.variant],
        "model": section(run.dataset, "model"),
        "train": scale_out_train(run.dataset) if run.scale_out else section(run.dataset, "train"),
        "timing": {k: v for k, v in config["timing"].items() if k != "interleave"},  # a workflow layout
    }
    if run.scale_out:
        out["distributed"] = {"world": int(run.world), "ranks_per_node": int(run.ranks_per_node)}
    return out


def run_of(wildcards) -> Run:
    scale = (int(wildcards.world), int(wildcards.rpn)) if "world" in wildcards.keys() else (1, 1)
    return Run(wildcards.dataset, wildcards.method, wildcards.variant, int(wildcards.seed), *scale)


def run_config(wildcards) -> str:
    """`hotcold train --run-config`: everything that determines one run."""
    return json.dumps(run_config_dict(run_of(wildcards)), sort_keys=True)


def interleaved_runs(dataset: str) -> list[tuple[str, str]]:
    """(method, variant) of the dataset's one-process runs: what one `hotcold train-group` job trains per seed."""
    return list(dict.fromkeys((r.method, r.variant) for r in runs() if r.dataset == dataset and not r.scale_out))


def group_rule_name(dataset: str) -> str:
    """The name of the dataset's interleaved training rule."""
    return f"train_group_{dataset.replace('-', '_')}"


def group_outputs(dataset: str, name: str) -> list[str]:
    """The run files (``record.json`` or ``steps.parquet``) of the dataset's one-process runs, per {seed}."""
    return [f"results/runs/{dataset}/{method}/{variant}/seed~{{seed}}/{name}"
            for method, variant in interleaved_runs(dataset)]


def group_runs(dataset: str):
    """`hotcold train-group --runs` for one seed of the dataset: every one-process run's config and directory."""
    def runs_json(wildcards) -> str:
        group = [Run(dataset, method, variant, int(wildcards.seed)) for method, variant in interleaved_runs(dataset)]
        return json.dumps([{"run_config": run_config_dict(run), "out": run_dir(run)} for run in group],
                          sort_keys=True)

    return runs_json


def check_group_rule_names() -> None:
    """Every dataset gets its own interleaved training rule."""
    names = [group_rule_name(d) for d in datasets()]
    if len(set(names)) < len(names):
        raise WorkflowError(f"invalid configuration: with timing.interleave, dataset names must stay distinct "
                            f"with '-' read as '_' (rule names {sorted(names)})")


def shard_sim_scales() -> list[str]:
    """`hotcold shard-sim --scales`: the configured NODESxRANKS_PER_NODE, then the trained scales not among them."""
    configured = list(config["distributed"]["shard_sim"]["scales"])
    trained = [f"{world // rpn}x{rpn}" for world, rpn in trained_scales() if world % rpn == 0]
    return list(dict.fromkeys(configured + trained))


def store_default_headroom() -> float:
    """The scale-out stores' default memory headroom (the package's, from this checkout's sources)."""
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    try:
        from hotcold.distributed.plans import DEFAULT_HEADROOM
    except ImportError:
        return 1.25  # Snakemake runs outside the package's environment (--sdm conda): the package's value
    return DEFAULT_HEADROOM


def shard_sim_headrooms() -> list[float]:
    """`hotcold shard-sim --headrooms`: the configured ones, then those the scale-out runs train at."""
    trained = [options.get("memory_headroom") or store_default_headroom()
               for dataset in datasets() for method, variants in methods_for(dataset).items()
               if method in SCALE_OUT_METHODS for options in variants.values()]
    return list(dict.fromkeys([*config["distributed"]["shard_sim"]["headrooms"], *trained]))


def shard_sim_config(wildcards) -> str:
    """`hotcold shard-sim --run-config`: the batches (and model) of the dataset's scale-out runs."""
    return json.dumps({"seed": first_seed(), "train": scale_out_train(wildcards.dataset),
                       "model": section(wildcards.dataset, "model")}, sort_keys=True)


FIGURES = ["step_phases", "throughput", "speedup", "hit_rate", "fae_hot_fraction", "rows_moved"]
SCALE_OUT_FIGURES = ["inter_node_bytes", "proactive_hidden", "flexshard_headroom"]


def figure(name: str, ext: str):
    """A figure output; the PNG goes into `snakemake --report` with its caption."""
    path = f"paper_figs/{name}.{ext}"
    if ext != "png":
        return path
    return report(path, caption=f"../report/{name}.rst", category="Figures")


def check_taobao_path(name: str, source: dict) -> None:
    """A Taobao source needs a local file; an unset path fails now with the download instructions."""
    from hotcold.data.sources import locate_taobao

    if source["kind"] == "taobao" and not (source.get("path") or "").strip():
        locate_taobao(None, name=name)


def methods_validator() -> jsonschema.Validator:
    """The schema's ``methods`` definition (every method's store options) as a validator of its own."""
    defs = yaml.safe_load(SCHEMA.read_text())["$defs"]
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "$ref": "#/$defs/methods"}
    return jsonschema.Draft202012Validator(schema)


def check_store_options() -> None:
    """Each dataset's effective methods (its overrides merged in) against the schema's store options.

    The config validation sees the global and per-dataset sections apart; a
    merge can still combine them into something no store accepts (e.g. a
    dataset's cache_rows over a global cache_ratio).
    """
    validator = methods_validator()
    for name in datasets():
        for error in validator.iter_errors(methods_for(name)):
            where = ".".join(["methods", *map(str, error.absolute_path)])
            raise WorkflowError(f"invalid configuration for dataset {name}: {where}: {error.message}")


def check_batch_split(run_config: dict) -> None:
    """A scale-out run splits every global batch evenly over its ranks."""
    from hotcold.config import ConfigError

    world, batch = run_config["distributed"]["world"], run_config["train"]["batch_size"]
    if batch % world:
        raise ConfigError(f"train.batch_size {batch} is not divisible by distributed.scales world {world}")


def check_scales() -> None:
    """Every trained scale groups its ranks into whole nodes."""
    for world, rpn in trained_scales():
        if world % rpn:
            raise WorkflowError(f"invalid configuration: distributed.scales: ranks_per_node {rpn} does not divide "
                                f"world {world} (a world is whole nodes of ranks_per_node ranks)")


def check_configs() -> None:
    """Resolve every dataset and run config with the package's own typed configs, so `snakemake -n` fails early.

    The package is imported from this checkout's sources, as the jobs run it.
    """
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    try:
        from hotcold.config import ConfigError, RunConfig
        from hotcold.data.generators import GeneratorConfig
        from hotcold.data.sources.prepare import SourceConfig
    except ImportError:
        return  # Snakemake runs outside the package's environment (e.g. --sdm conda); the jobs check later
    if config["profile"]["window"] > config["profile"]["batches"]:
        raise WorkflowError(f"invalid configuration: profile.window={config['profile']['window']} is more "
                            f"than profile.batches={config['profile']['batches']}")
    checks = [(f"dataset {name}", GeneratorConfig.from_dict, {**dataset_spec(name)["generator"], "name": name})
              for name in generated_datasets()]
    checks += [(f"dataset {name}", SourceConfig.from_dict, source_of(name)) for name in sourced_datasets()]
    checks += [(f"dataset {name}", lambda s, n=name: check_taobao_path(n, s), source_of(name))
               for name in sourced_datasets()]
    checks += [(f"run {run_dir(run)}", RunConfig.from_dict, run_config_dict(run)) for run in runs()]
    checks += [(f"run {run_dir(run)}", check_batch_split, run_config_dict(run)) for run in runs() if run.scale_out]
    for where, build, data in checks:
        try:
            build(data)
        except (ConfigError, FileNotFoundError) as e:
            raise WorkflowError(f"invalid configuration for {where}: {e}") from None


check_store_options()
check_scales()
check_configs()
if config["timing"]["interleave"]:
    check_group_rule_names()


# The shipped hardware profiles of the cost model.
HARDWARE = Path(workflow.basedir, "workflows/config/hardware")


def hardware_profiles() -> list[str]:
    """The shipped profiles the claims table models with (`costmodel.profiles`)."""
    return [str(HARDWARE / f"{name}.yaml") for name in config["costmodel"]["profiles"]]
