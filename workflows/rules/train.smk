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
