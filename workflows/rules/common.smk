# Input functions and wildcard constraints for data.smk, train.smk, analysis.smk and costmodel.smk.
# What runs, and with which settings, is decided by the package (hotcold.workflow.matrix.Matrix, unit-tested);
# Snakemake imports it, so run Snakemake where hotcold is installed (`make` does).
import functools
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import DeploymentMethod

from hotcold import methods
from hotcold.config import ConfigError
from hotcold.files import tree_sha256
from hotcold.workflow.matrix import Matrix, Run, scale_dir
from hotcold.workflow.settings import to_json
from hotcold.workflow.peers import peer_state
from hotcold.workflow.resume import MARKER as RESUME_MARKER
from hotcold.workflow.targets import check_gpus, check_named, lone_runs, named_runs

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
# Set (to 1) by `make figures`: the tables are redrawn from the runs there, none is trained.
TABLES_ONLY = "HOTCOLD_TABLES_ONLY"
SRC = Path(workflow.basedir, "src")
MATRIX = Matrix(config)


def shell_prefix() -> str:
    """Run the CLI from this checkout's sources; outside conda, with Snakemake's own interpreter. Every job
    carries this Snakemake's process id (`hotcold resume` ends the jobs that outlive a killed Snakemake)."""
    exports = [f"export PYTHONPATH={shlex.quote(str(SRC))}${{PYTHONPATH:+:$PYTHONPATH}}",
               f"export {RESUME_MARKER}={os.getpid()}"]
    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
        python_bin = shlex.quote(str(Path(sys.executable).parent))
        exports.append(f'export PATH={python_bin}:"$PATH"')
    text = "set -euo pipefail; " + "; ".join(exports) + "; "
    return text.replace("{", "{{").replace("}", "}}")


shell.prefix(shell_prefix())

# A `params` entry of the training rules: Snakemake reruns a job whose params changed, so with
# `rerun_on_code_change` an edit of the package reruns the training jobs (its records carry the same hash).
SOURCE_PARAM = (tree_sha256(SRC / "hotcold") if config["rerun_on_code_change"]
                else "not tracked (rerun_on_code_change: false)")


@functools.cache
def installed_peers() -> str:
    return peer_state(SRC)


def peers_param(method_names) -> str:
    """The training rules' `peers` parameter where a peer method is among them: its installed build and whether it
    imports (installing the optional package later reruns those jobs); empty for the others."""
    return installed_peers() if any(methods.get(m).peer for m in method_names) else ""


def one_of(names) -> str:
    """A wildcard regex matching exactly ``names`` (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def per_dataset(pattern: str) -> list[str]:
    return expand(pattern, dataset=MATRIX.datasets())


def run_of(wildcards) -> Run:
    scale = (int(wildcards.world), int(wildcards.rpn)) if "world" in wildcards.keys() else (1, 1)
    return Run(wildcards.dataset, wildcards.method, wildcards.variant, int(wildcards.seed), *scale)


def all_records() -> list[str]:
    return [f"{run.dir}/record.json" for run in MATRIX.runs()]


def all_run_files() -> list[str]:
    """Every run's ``record.json`` and ``steps.parquet`` (the tables read both)."""
    return [f"{run.dir}/{name}" for run in MATRIX.runs() for name in ("record.json", "steps.parquet")]


#: the tables `all` asks for, each as .csv and, where a reader wants it, .md
TABLES = {"summary": ("csv", "md"), "infeasible": ("md",), "phases": ("csv",), "counters": ("csv", "md"),
          "speedup": ("csv", "md"), "cache_sim": ("csv",), "fae_hot_fraction": ("csv",), "rows_moved": ("csv",),
          "dataset_stats": ("csv",), "comm_traffic": ("csv", "md"), "flexshard_headroom": ("csv", "md"),
          "proactive": ("csv", "md"), "costmodel_validation": ("csv", "md"), "claims": ("csv", "md")}


def final_targets() -> list[str]:
    """What the target `all` asks for: every run's files, every table and every figure.

    Every run's files are inputs of `all`, not only of the tables that read them: Snakemake does not rerun
    a job whose inputs are missing while its outputs exist, so a deleted record would leave the tables
    reading it stale ("Nothing to be done"); as a target's input, the missing file reruns its run, and
    then every table that reads it."""
    tables = [f"results/tables/{name}.{ext}" for name, exts in TABLES.items() for ext in exts]
    figures = ["coverage", *FIGURES, *SCALE_OUT_FIGURES, "claims", "hit_rate_curves"]
    return [*all_run_files(), *tables, *(f"paper_figs/{name}.{ext}" for name in figures for ext in ("png", "pdf"))]


def scale_out_records() -> list[str]:
    return [f"{run.dir}/record.json" for run in MATRIX.runs() if run.scale_out]


def generator_spec(wildcards) -> str:
    return to_json(MATRIX.generator_spec(wildcards.dataset))


def source_spec(wildcards) -> str:
    return to_json(MATRIX.source_of(wildcards.dataset))


def batch_size(wildcards) -> int:
    return MATRIX.section(wildcards.dataset, "train")["batch_size"]


def simulate_config(wildcards) -> str:
    return to_json(MATRIX.simulate_config(wildcards.dataset))


def trained_ratios(wildcards) -> str:
    return " ".join(str(r) for r in MATRIX.trained_ratios(wildcards.dataset))


def run_config(wildcards) -> str:
    return to_json(MATRIX.run_config(run_of(wildcards)))


def group_rule_name(dataset: str, scale: tuple[int, int] = (1, 1)) -> str:
    """The name of the dataset's interleaved training rule, or with a scale, of its scale-out runs at that scale."""
    name = f"train_group_{dataset.replace('-', '_')}"
    return name if scale == (1, 1) else f"{name}_world{scale[0]}_rpn{scale[1]}"


def group_pairs(dataset: str, scale: tuple[int, int] = (1, 1)) -> list[tuple[str, str]]:
    """(method, variant) of the runs one group job trains (``Matrix.groups``)."""
    return MATRIX.groups(dataset)[scale]


def group_outputs(dataset: str, name: str, scale: tuple[int, int] = (1, 1)) -> list[str]:
    """The run files (``record.json`` or ``steps.parquet``) of the group's runs, per {seed}."""
    return [f"{Path(Run(dataset, method, variant, 0, *scale).dir).parent.as_posix()}/seed~{{seed}}/{name}"
            for method, variant in group_pairs(dataset, scale)]


def group_runs(dataset: str, scale: tuple[int, int] = (1, 1)):
    """`hotcold train-group --runs` for one seed of the group: every run's config and directory."""
    def runs_json(wildcards) -> str:
        group = [Run(dataset, method, variant, int(wildcards.seed), *scale)
                 for method, variant in group_pairs(dataset, scale)]
        return to_json([{"run_config": MATRIX.run_config(run), "out": run.dir} for run in group])

    return runs_json


def shard_sim_config(wildcards) -> str:
    return to_json(MATRIX.shard_sim_config(wildcards.dataset))


FIGURES = ["step_phases", "throughput", "speedup", "hit_rate", "fae_hot_fraction", "rows_moved"]
SCALE_OUT_FIGURES = ["inter_node_bytes", "proactive_hidden", "flexshard_headroom"]


def figure(name: str, ext: str):
    """A figure output; the PNG goes into `snakemake --report` with its caption."""
    path = f"paper_figs/{name}.{ext}"
    if ext != "png":
        return path
    return report(path, caption=f"../report/{name}.rst", category="Figures")


# The shipped hardware profiles of the cost model.
HARDWARE = Path(workflow.basedir, "workflows/config/hardware")


def hardware_profiles() -> list[str]:
    """The shipped profiles the claims table models with (`costmodel.profiles`)."""
    return [str(HARDWARE / f"{name}.yaml") for name in config["costmodel"]["profiles"]]


def gpu_profile_files() -> list[str]:
    """The GPU's calibrated profile the claims are modelled on, if any (`costmodel.gpu_profile`)."""
    name = config["costmodel"]["gpu_profile"]
    return [str(HARDWARE / f"{name}.yaml")] if name else []


def gpu_claims_args() -> str:
    """`hotcold claims`'s options for the claims on a GPU (`costmodel.gpu_records`, `costmodel.gpu_profile`)."""
    cm = config["costmodel"]
    records = " ".join(shlex.quote(str(Path(workflow.basedir, p))) for p in cm["gpu_records"])
    args = f" --gpu-records {records}" if records else ""
    for profile in gpu_profile_files():
        args += f" --gpu-profile {shlex.quote(profile)}"
    return args


# `make figures` redraws the tables from the runs there (it allows no training rule): with a run's files gone,
# it stops here naming them instead of in Snakemake's MissingInputException.
if os.environ.get(TABLES_ONLY) == "1":
    _missing = [f for f in all_run_files() if not Path(f).is_file()]
    if _missing:
        raise WorkflowError(f"{len(_missing)} run file(s) missing ({', '.join(_missing[:3])}"
                            f"{', ...' if len(_missing) > 3 else ''}): `make reproduce` reruns their runs "
                            f"and rebuilds the tables; `make figures` only redraws from the runs there")

# The run files named on the command line (targets, --forcerun): each a configured run; where every target is
# a run file, the one-process ones are trained alone (train.smk).
try:
    MATRIX.check()
    check_named(MATRIX, named_runs([*COMMAND_LINE.targets, *COMMAND_LINE.forcerun]))
    check_gpus(MATRIX, COMMAND_LINE.gpus)
except ConfigError as e:
    raise WorkflowError(str(e)) from None
LONE_RUNS = lone_runs(MATRIX, COMMAND_LINE.lone())


def run_named(run_dir: str) -> Run:
    """The run of `train_alone`'s {run} wildcard (a run directory below results/runs/)."""
    return named_runs([f"results/runs/{run_dir}/record.json"])[0][1]


def forget_how_made(paths) -> None:
    """Drop Snakemake's record of the jobs that made ``paths`` (what `snakemake --cleanup-metadata` does): a
    later plan judges them by their modification times alone."""
    from snakemake.io import IOFile

    for path in paths:
        if Path(path).exists():
            workflow.persistence.cleanup_metadata(IOFile(path))
# Scale-out runs whose global batch is more than their dataset's training split: skipped, each with an
# `infeasible` record (rule device_infeasible); a line per dataset and scale says so at every plan (`-n` too).
for _note in MATRIX.skip_notes():
    print(_note, file=sys.stderr)
_group_names = [group_rule_name(d) for d in MATRIX.datasets()]
if (MATRIX.interleaves() or MATRIX.groups_scale_out()) and len(set(_group_names)) < len(_group_names):
    raise WorkflowError(f"invalid configuration: with timing.interleave or distributed.group_runs, dataset names "
                        f"must stay distinct with '-' read as '_' (rule names {sorted(_group_names)})")
