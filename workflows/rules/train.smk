# Training: one job per dataset x method x variant x seed, with the dataset's
# effective settings (global sections, its own overrides merged in). With
# timing.interleave, one job per dataset x seed trains all its one-process runs
# round-robin by repeat instead (`hotcold train-group`); the record paths are the same.
# Every training rule takes the package's source hash as a parameter, so that with
# rerun_on_code_change a code edit reruns it (Snakemake's "params changed"); the jobs of peer
# methods also take the installed build of their optional package (`peers_param`).
# A variant that cannot run on the trainer device (a GPU-only one on a CPU) gets its `infeasible`
# record from `device_infeasible`, in Snakemake's own process: no job process starts for it.


rule device_infeasible:
    input:
        manifest=lambda wildcards: f"results/data/{wildcards.infeasible_run.split('/')[0]}/manifest.json",
    output:
        record="results/runs/{infeasible_run}/record.json",
        steps="results/runs/{infeasible_run}/steps.parquet",
    params:
        source=SOURCE_PARAM,
    wildcard_constraints:
        infeasible_run=one_of(device_infeasible_dirs()),
    log:
        "results/logs/train/{infeasible_run}.log",
    run:
        write_device_infeasible(wildcards.infeasible_run, input.manifest, output.record, log[0])


ruleorder: device_infeasible > train_scaleout


if not config["timing"]["interleave"]:

    ruleorder: device_infeasible > train

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
            source=SOURCE_PARAM,
            peers=lambda wildcards: peers_param([wildcards.method]),
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

else:
    for _dataset in MATRIX.datasets():
        if not MATRIX.interleaved_runs(_dataset):
            continue

        rule:
            name:
                group_rule_name(_dataset)
            input:
                manifest=f"results/data/{_dataset}/manifest.json",
            output:
                records=group_outputs(_dataset, "record.json"),
                steps=group_outputs(_dataset, "steps.parquet"),
            params:
                cli=HOTCOLD,
                runs=group_runs(_dataset),
                device=config["timing"]["device"],
                dataset=lambda wildcards, input: str(Path(input.manifest).parent),
                source=SOURCE_PARAM,
                peers=peers_param([method for method, _ in MATRIX.interleaved_runs(_dataset)]),
            threads: config["threads"]
            resources:
                gpu=1 if config["timing"]["device"] == "cuda" else 0,
            benchmark:
                f"results/benchmarks/{_dataset}/train_group/seed~{{seed}}.tsv"
            log:
                f"results/logs/train_group/{_dataset}/seed~{{seed}}.log",
            conda:
                "../../envs/hotcold.yaml"
            shell:
                "{params.cli} train-group --dataset {params.dataset:q} --runs {params.runs:q}"
                " --threads {threads} --device {params.device} --no-progress > {log:q} 2>&1"


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
        source=SOURCE_PARAM,
    wildcard_constraints:
        method=one_of(methods.names(spans_ranks=True)),
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
