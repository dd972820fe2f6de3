# hotcold: make every configured dataset (generate, or download + preprocess),
# profile and simulate it (caches, sharding plans), train every (dataset, method,
# variant, seed), scale-out methods at every configured scale, then aggregate the
# records into tables and figures. See README.md.
import sys
from pathlib import Path

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from hotcold.workflow_schema import schema_error
from hotcold.config import ConfigError
from hotcold.workflow_targets import CommandLine, check_configfiles

min_version("9.0")


configfile: Path(workflow.basedir, "workflows/config/default.yaml")


# What the command line asks for (hotcold.workflow_targets): a target that --configfile took as a config file
# is named here, before the config it spoiled is validated.
COMMAND_LINE = CommandLine.parse(sys.argv[1:])
try:
    check_configfiles(COMMAND_LINE)
except ConfigError as e:
    raise WorkflowError(str(e)) from None

SCHEMA = Path(workflow.basedir, "workflows/schemas/config.schema.yaml")
try:
    validate(config, SCHEMA)
except WorkflowError as e:  # one line naming the setting (hotcold.workflow_schema), not the whole schema
    line = schema_error(e, yaml.safe_load(SCHEMA.read_text()))
    if line is None:
        raise
    raise WorkflowError(line) from None


report: "workflows/report/workflow.rst"


include: "workflows/rules/common.smk"
include: "workflows/rules/data.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/analysis.smk"
include: "workflows/rules/costmodel.smk"


# Cheap jobs run where Snakemake runs; downloads too, as cluster nodes often have no internet.
localrules:
    all,
    download,
    dataset_stats,
    cache_sim,
    aggregate,
    scaleout_tables,
    figures,
    costmodel_validation,
    claims,


# Every run's files are inputs of `all`, not only of the tables that read them: Snakemake does not rerun
# a job whose inputs are missing while its outputs exist, so a deleted record would leave the tables
# reading it stale ("Nothing to be done"); as a target's input, the missing file reruns its run, and
# then every table that reads it.
rule all:
    input:
        all_run_files(),
        "results/tables/summary.csv",
        "results/tables/summary.md",
        "results/tables/infeasible.md",
        "results/tables/phases.csv",
        "results/tables/counters.csv",
        "results/tables/counters.md",
        "results/tables/speedup.csv",
        "results/tables/speedup.md",
        "results/tables/cache_sim.csv",
        "results/tables/fae_hot_fraction.csv",
        "results/tables/rows_moved.csv",
        "results/tables/dataset_stats.csv",
        "results/tables/comm_traffic.csv",
        "results/tables/comm_traffic.md",
        "results/tables/flexshard_headroom.csv",
        "results/tables/flexshard_headroom.md",
        "results/tables/proactive.csv",
        "results/tables/proactive.md",
        "results/tables/costmodel_validation.csv",
        "results/tables/costmodel_validation.md",
        "results/tables/claims.csv",
        "results/tables/claims.md",
        expand(
            "paper_figs/{name}.{ext}",
            name=["coverage", *FIGURES, *SCALE_OUT_FIGURES, "claims", "hit_rate_curves"],
            ext=["png", "pdf"],
        ),
    default_target: True
