# hotcold: make every configured dataset (generate, or download + preprocess),
# profile and simulate it (caches, sharding plans), train every (dataset, method,
# variant, seed), scale-out methods at every configured scale, then aggregate the
# records into tables and figures. See README.md.
import sys
from pathlib import Path

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from hotcold.workflow.schema import schema_error
from hotcold.config import ConfigError
from hotcold.workflow.targets import CommandLine, check_configfiles

min_version("9.0")


configfile: Path(workflow.basedir, "workflows/config/default.yaml")


# What the command line asks for (hotcold.workflow.targets): a target that --configfile took as a config file
# is named here, before the config it spoiled is validated.
COMMAND_LINE = CommandLine.parse(sys.argv[1:])
try:
    check_configfiles(COMMAND_LINE)
except ConfigError as e:
    raise WorkflowError(str(e)) from None

SCHEMA = Path(workflow.basedir, "workflows/schemas/config.schema.yaml")
try:
    validate(config, SCHEMA)
except WorkflowError as e:  # one line naming the setting (hotcold.workflow.schema), not the whole schema
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
    scaleout_figures,
    costmodel_validation,
    claims,


rule all:
    input:
        final_targets(),
    default_target: True
