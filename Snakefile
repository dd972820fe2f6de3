# hotcold: make every configured dataset (generate, or download + preprocess),
# profile and simulate it (caches, sharding plans), train every (dataset, method,
# variant, seed), scale-out methods at every configured scale, then aggregate the
# records into tables and figures. See README.md.
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
