# The cost model's place in the workflow: this machine's rates (`hotcold calibrate`), the model's
# per-phase error against the measured runs (`costmodel_validation`), and the papers' claims beside
# hotcold's measured and modelled numbers (`claims`).

# Alone on the machine (it reserves every core) so that no training job disturbs the micro-benchmarks;
# torch gets the training jobs' threads.
rule calibrate:
    output:
        profile="results/hardware/calibrated.yaml",
    params:
        cli=HOTCOLD,
        device=config["timing"]["device"],
        threads=config["threads"],
    threads: lambda wildcards: workflow.cores
    log:
        "results/logs/calibrate.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} calibrate --out {output.profile:q} --device {params.device} --threads {params.threads}"
        " > {log:q} 2>&1"


rule costmodel_validation:
    input:
        records=all_records(),
        manifests=per_dataset("results/data/{dataset}/manifest.json"),
        profile="results/hardware/calibrated.yaml",
    output:
        csv=report("results/tables/costmodel_validation.csv", caption="../report/costmodel_validation.rst",
                   category="Tables"),
        md="results/tables/costmodel_validation.md",
        summary="results/tables/costmodel_validation_summary.csv",
    params:
        cli=HOTCOLD,
        out=lambda wildcards, output: str(Path(output.csv).parent),
        data=lambda wildcards, input: str(Path(input.manifests[0]).parent.parent),
    log:
        "results/logs/costmodel_validation.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} costmodel-validation {input.records:q} --profile {input.profile:q} --data {params.data}"
        " --out {params.out:q}"
        " > {log:q} 2>&1"


rule claims:
    input:
        records=all_records(),
        comm_traffic="results/tables/comm_traffic.csv",
        manifests=per_dataset("results/data/{dataset}/manifest.json"),
        profiles=hardware_profiles(),
        gpu_profile=gpu_profile_files(),
        sims=per_dataset("results/sim/{dataset}.csv"),
        shard_sims=per_dataset("results/shard_sim/{dataset}.csv"),
    output:
        csv=report("results/tables/claims.csv", caption="../report/claims.rst", category="Tables"),
        md="results/tables/claims.md",
        sweep="results/tables/claims_sweep.csv",
        png=figure("claims", "png"),
        pdf=figure("claims", "pdf"),
    params:
        cli=HOTCOLD,
        out=lambda wildcards, output: str(Path(output.csv).parent),
        figures=lambda wildcards, output: str(Path(output.pdf).parent),
        data=lambda wildcards, input: str(Path(input.manifests[0]).parent.parent),
        sim_configs=lambda wildcards: to_json({d: {"simulate": MATRIX.simulate_config(d),
                                                   "shard_sim": MATRIX.shard_sim_config(d)} for d in MATRIX.datasets()}),
        gpu=gpu_claims_args(),
    log:
        "results/logs/claims.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} claims {input.records:q} --comm-traffic {input.comm_traffic:q}"
        " --profiles {input.profiles:q} --data {params.data} --out {params.out:q} --figures {params.figures:q}"
        " --sims {input.sims:q} --shard-sims {input.shard_sims:q} --sim-configs {params.sim_configs:q}{params.gpu}"
        " > {log:q} 2>&1"
