# Every training job claims the `gpu` resource on a CUDA trainer (one per rank, `Matrix.gpus`): run
# `snakemake --resources gpu=<GPUs>` so that timed jobs never share a GPU.
# Training: one job per dataset x method x variant x seed, with the dataset's
# effective settings (global sections, its own overrides merged in). With
# timing.interleave, one job per dataset x seed trains all its one-process runs
# round-robin by repeat instead (`hotcold train-group`), and with distributed.group_runs one job per dataset x
# scale x seed its scale-out runs, over one launch of their ranks; the record paths are the same. The grouped
# runs whose files are named on the command line (targets, --forcerun: hotcold.workflow.targets) are trained
# alone even then, by `train_alone`, which makes exactly those (their record's `summary.group_runs` is 1).
# When the workflow succeeds, Snakemake's own record of how their files were made is dropped, so that a later
# plan judges them by their times alone: otherwise the group's job would see another rule's code and
# parameters there and retrain every run of the group.
# Every training rule takes the package's source hash as a parameter, so that with
# rerun_on_code_change a code edit reruns it (Snakemake's "params changed"); the jobs of peer
# methods also take the installed build of their optional package (`peers_param`).
# The variants that cannot run on a configured trainer device (GPU-only ones on `timing.device: cpu`,
# known from their options; with `auto` their job finds out where it runs), and the scale-out runs
# whose global batch is more than their dataset's training split (hotcold.workflow.matrix), get their
# `infeasible` records from one job, `hotcold infeasible`, instead of a job each.

if MATRIX.device_infeasible():

    rule device_infeasible:
        localrule: True
        input:
            manifests=sorted({f"results/data/{run.dataset}/manifest.json" for run in MATRIX.device_infeasible()}),
        output:
            records=[f"{run.dir}/record.json" for run in MATRIX.device_infeasible()],
            steps=[f"{run.dir}/steps.parquet" for run in MATRIX.device_infeasible()],
        params:
            cli=HOTCOLD,
            runs=lambda wildcards: to_json([{"run_config": MATRIX.run_config(run), "out": run.dir}
                                            for run in MATRIX.device_infeasible()]),
            data=lambda wildcards, input: str(Path(input.manifests[0]).parent.parent),
            source=SOURCE_PARAM,
        log:
            "results/logs/train/device_infeasible.log",
        conda:
            "../../envs/hotcold.yaml"
        shell:
            "{params.cli} infeasible --runs {params.runs:q} --data {params.data:q} > {log:q} 2>&1"


if MATRIX.device_infeasible() and not MATRIX.groups_scale_out():

    ruleorder: device_infeasible > train_scaleout


if MATRIX.device_infeasible() and not MATRIX.interleaves():

    ruleorder: device_infeasible > train


if not MATRIX.interleaves():

    rule train:
        input:
            manifest="results/data/{dataset}/manifest.json",
        output:
            record="results/runs/{dataset}/{method}/{variant}/seed~{seed}/record.json",
            steps="results/runs/{dataset}/{method}/{variant}/seed~{seed}/steps.parquet",
        params:
            cli=HOTCOLD,
            run_config=run_config,
            dataset=lambda wildcards, input: str(Path(input.manifest).parent),
            out=lambda wildcards, output: str(Path(output.record).parent),
            source=SOURCE_PARAM,
            peers=lambda wildcards: peers_param([wildcards.method]),
        threads: config["threads"]
        resources:
            gpu=MATRIX.gpus(1),
        benchmark:
            "results/benchmarks/{dataset}/{method}/{variant}/seed~{seed}.tsv"
        log:
            "results/logs/train/{dataset}/{method}/{variant}/seed~{seed}.log",
        conda:
            "../../envs/hotcold.yaml"
        shell:
            "{params.cli} train --dataset {params.dataset:q} --run-config {params.run_config:q}"
            " --out {params.out:q} --threads {threads} --no-progress > {log:q} 2>&1"


for _dataset in MATRIX.datasets():
    for _scale in MATRIX.groups(_dataset):
        _dir = "" if _scale == (1, 1) else f"{scale_dir(*_scale)}/"

        rule:
            name:
                group_rule_name(_dataset, _scale)
            input:
                manifest=f"results/data/{_dataset}/manifest.json",
            output:
                records=group_outputs(_dataset, "record.json", _scale),
                steps=group_outputs(_dataset, "steps.parquet", _scale),
            params:
                cli=HOTCOLD,
                runs=group_runs(_dataset, _scale),
                dataset=lambda wildcards, input: str(Path(input.manifest).parent),
                source=SOURCE_PARAM,
                peers=peers_param([method for method, _ in group_pairs(_dataset, _scale)]),
            threads: config["threads"] if _scale == (1, 1) else _scale[0]
            resources:
                gpu=MATRIX.gpus(_scale[0]),
            benchmark:
                f"results/benchmarks/{_dataset}/train_group/{_dir}seed~{{seed}}.tsv"
            log:
                f"results/logs/train_group/{_dataset}/{_dir}seed~{{seed}}.log",
            conda:
                "../../envs/hotcold.yaml"
            shell:
                "{params.cli} train-group --dataset {params.dataset:q} --runs {params.runs:q}"
                " --threads {threads} --no-progress > {log:q} 2>&1"

# A profile that sizes the group jobs by name (the SLURM one: `set-resources`) sizes only the groups it names:
# each other group's job is named at every plan, as it would get the default resources.
_sized = dict(getattr(workflow.resource_settings, "overwrite_resources", None) or {})
if any(name.startswith("train_group_") for name in _sized):
    for _dataset in MATRIX.datasets():
        for _scale in MATRIX.groups(_dataset):
            if group_rule_name(_dataset, _scale) not in _sized:
                print(f"{group_rule_name(_dataset, _scale)}: the profile's set-resources does not size this "
                      f"group's job (it gets default-resources); add an entry as for the others", file=sys.stderr)

# A job run elsewhere (a cluster executor) reads this file again naming its job, not the files.
if (MATRIX.interleaves() or MATRIX.groups_scale_out()) and (LONE_RUNS or "--target-jobs" in sys.argv):

    rule train_alone:
        input:
            manifest=lambda wildcards: f"results/data/{run_named(wildcards.run).dataset}/manifest.json",
        output:
            record="results/runs/{run}/record.json",
            steps="results/runs/{run}/steps.parquet",
        params:
            cli=HOTCOLD,
            run_config=lambda wildcards: to_json(MATRIX.run_config(run_named(wildcards.run))),
            dataset=lambda wildcards, input: str(Path(input.manifest).parent),
            out=lambda wildcards, output: str(Path(output.record).parent),
            source=SOURCE_PARAM,
            peers=lambda wildcards: peers_param([run_named(wildcards.run).method]),
        wildcard_constraints:
            run=one_of(run.dir.removeprefix("results/runs/") for run in LONE_RUNS) if LONE_RUNS else ".+",
        threads: lambda wildcards: run_named(wildcards.run).world if run_named(wildcards.run).scale_out \
            else config["threads"]
        resources:
            gpu=lambda wildcards: MATRIX.gpus(run_named(wildcards.run).world),
        benchmark:
            "results/benchmarks/{run}.tsv"
        log:
            "results/logs/train/{run}.log",
        conda:
            "../../envs/hotcold.yaml"
        shell:
            "{params.cli} train --dataset {params.dataset:q} --run-config {params.run_config:q}"
            " --out {params.out:q} --threads {threads} --no-progress > {log:q} 2>&1"

    for _dataset in MATRIX.datasets():
        for _scale in MATRIX.groups(_dataset):
            workflow.ruleorder("train_alone", group_rule_name(_dataset, _scale))

    onsuccess:
        forget_how_made([f"{run.dir}/{name}" for run in LONE_RUNS for name in ("record.json", "steps.parquet")])


# Scale-out (without distributed.group_runs): one job per dataset x scale-out method x variant x trained scale x
# seed, P ranks under torchrun sharing the job's threads (a job never takes more than --cores). Rank 0 writes
# the record once every rank has finished; a plan that does not fit its memory budget ends as an
# `infeasible` record, as other variants do. The run config states the global batch: train.batch_size,
# distributed.train.batch_per_rank x world where that is set (then also its distributed.batch_per_rank).
if not MATRIX.groups_scale_out():

    rule train_scaleout:
        input:
            manifest="results/data/{dataset}/manifest.json",
        output:
            record="results/runs/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}/record.json",
            steps="results/runs/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}/steps.parquet",
        params:
            cli=HOTCOLD,
            run_config=run_config,
            dataset=lambda wildcards, input: str(Path(input.manifest).parent),
            out=lambda wildcards, output: str(Path(output.record).parent),
            source=SOURCE_PARAM,
        wildcard_constraints:
            method=one_of(methods.names(spans_ranks=True)),
        threads: lambda wildcards: int(wildcards.world)
        resources:
            gpu=lambda wildcards: MATRIX.gpus(int(wildcards.world)),
        benchmark:
            "results/benchmarks/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}.tsv"
        log:
            "results/logs/train/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~{seed}.log",
        conda:
            "../../envs/hotcold.yaml"
        shell:
            "{params.cli} train --nproc {wildcards.world} --dataset {params.dataset:q}"
            " --run-config {params.run_config:q} --out {params.out:q} --threads {threads} --no-progress"
            " > {log:q} 2>&1"
