# Helpers for data.smk, train.smk and analysis.smk: how to call the hotcold CLI,
# which runs the config asks for, and the JSON each `hotcold` verb receives.
import json
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import DeploymentMethod

# Path components must match the schema's name patterns.
wildcard_constraints:
    dataset="[a-z0-9][a-z0-9_-]*",
    method="[a-z0-9_]+",
    variant="[a-z0-9][a-z0-9_.-]*",
    seed="[0-9]+",


# Every job calls the package the same way: `python -m hotcold <verb>`.
HOTCOLD = "python -m hotcold"
SRC = Path(workflow.basedir, "src")


def shell_prefix() -> str:
    """Run the CLI from this checkout's sources; outside conda, with Snakemake's own interpreter."""
    exports = [f"export PYTHONPATH={shlex.quote(str(SRC))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
        python_bin = shlex.quote(str(Path(sys.executable).parent))
        exports.append(f'export PATH={python_bin}:"$PATH"')
    text = "set -euo pipefail; " + "; ".join(exports) + "; "
    return text.replace("{", "{{").replace("}", "}}")


shell.prefix(shell_prefix())


def runs() -> list[tuple[str, str, str, int]]:
    """Every (dataset, method, variant, seed) the config asks for."""
    return [
        (dataset, method, variant, seed)
        for dataset in config["datasets"]
        for method, variants in config["methods"].items()
        for variant in variants
        for seed in config["seeds"]
    ]


def run_dir(dataset: str, method: str, variant: str, seed: int) -> str:
    return f"results/runs/{dataset}/{method}/{variant}/seed~{seed}"


def all_records() -> list[str]:
    return [f"{run_dir(*run)}/record.json" for run in runs()]


def generator_spec(wildcards) -> str:
    """`hotcold generate --spec`: the dataset's generator options plus its name."""
    return json.dumps({**config["datasets"][wildcards.dataset]["generator"], "name": wildcards.dataset},
                      sort_keys=True)


def run_config_dict(dataset: str, method: str, variant: str, seed: int) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "variant": variant,
        "seed": int(seed),
        "store": config["methods"][method][variant],
        "model": config["model"],
        "train": config["train"],
        "timing": config["timing"],
    }


def run_config(wildcards) -> str:
    """`hotcold train --run-config`: everything that determines one run."""
    return json.dumps(
        run_config_dict(wildcards.dataset, wildcards.method, wildcards.variant, wildcards.seed),
        sort_keys=True,
    )


def check_configs() -> None:
    """Resolve every dataset and run config with the package's own typed configs, so `snakemake -n` fails early."""
    try:
        from hotcold.config import ConfigError, RunConfig
        from hotcold.data.generate import GeneratorConfig
    except ImportError:
        return  # Snakemake runs outside the package's environment (e.g. --sdm conda); the jobs check later
    checks = [
        (f"dataset {name}", GeneratorConfig.from_dict, {**spec["generator"], "name": name})
        for name, spec in config["datasets"].items()
    ] + [(f"run {run_dir(*run)}", RunConfig.from_dict, run_config_dict(*run)) for run in runs()]
    for where, build, data in checks:
        try:
            build(data)
        except ConfigError as e:
            raise WorkflowError(f"invalid configuration for {where}: {e}") from None


check_configs()
