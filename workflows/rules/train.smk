# Training: one job per dataset x method x variant x seed, with the dataset's
# effective settings (global sections, its own overrides merged in).


rule train:
    input:
        manifest="results/data/{dataset}/manifest.json",
    output:
        record="results/runs/{dataset}/{method}/{variant}/seed~{seed}/record.json",
        steps="results/runs/{dataset}/{method}/{variant}/seed~{seed}/steps.parquet",
    params:
        cli=HOTCOLD,
        run_config=run_config,
        device=config["timing"]["device"],
        dataset=lambda wildcards, input: str(Path(input.manifest).parent),
        out=lambda wildcards, output: str(Path(output.record).parent),
    threads: config["threads"]
    benchmark:
        "results/benchmarks/{dataset}/{method}/{variant}/seed~{seed}.tsv"
    log:
        "results/logs/train/{dataset}/{method}/{variant}/seed~{seed}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} train --dataset {params.dataset:q} --run-config {params.run_config:q}"
        " --out {params.out:q} --threads {threads} --device {params.device} --no-progress > {log:q} 2>&1"


# Scale-out: one job per dataset x scale-out method x variant x trained scale x seed, P ranks
# under torchrun sharing the job's threads (a job never takes more than --cores). Rank 0 writes
# the record once every rank has finished; a plan that does not fit its memory budget ends as an
# `infeasible` record, as other variants do.
rule train_scaleout:
    input:
        manifest="results/data/{dataset}/manifest.json",
    output:
        record="results/runs/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}/record.json",
        steps="results/runs/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}/steps.parquet",
    params:
        cli=HOTCOLD,
        run_config=run_config,
        device=config["timing"]["device"],
        dataset=lambda wildcards, input: str(Path(input.manifest).parent),
        out=lambda wildcards, output: str(Path(output.record).parent),
    wildcard_constraints:
        method=one_of(list(SCALE_OUT_METHODS)),
    threads: lambda wildcards: int(wildcards.world)
    resources:
        gpu=lambda wildcards: int(wildcards.world) if config["timing"]["device"] == "cuda" else 0,
    benchmark:
        "results/benchmarks/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}.tsv"
    log:
        "results/logs/train/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} train --nproc {wildcards.world} --dataset {params.dataset:q}"
        " --run-config {params.run_config:q} --out {params.out:q} --threads {threads} --device {params.device}"
        " --no-progress > {log:q} 2>&1"
