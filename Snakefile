# hotcold: train every configured (dataset, method, variant, seed), then
# aggregate the records into tables and figures. See README.md.
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: Path(workflow.basedir, "workflows/config/default.yaml")


validate(config, Path(workflow.basedir, "workflows/schemas/config.schema.yaml"))


report: "workflows/report/workflow.rst"


include: "workflows/rules/common.smk"
include: "workflows/rules/data.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/analysis.smk"


localrules:
    all,
    aggregate,
    figures,


rule all:
    input:
        "results/tables/summary.csv",
        "results/tables/summary.md",
        "paper_figs/step_phases.png",
        "paper_figs/step_phases.pdf",
        "paper_figs/throughput.png",
        "paper_figs/throughput.pdf",
    default_target: True
