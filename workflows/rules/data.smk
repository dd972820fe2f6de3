# Datasets: one directory per configured dataset; manifest.json marks it complete.
# A dataset is generated (`generator`) or fetched and preprocessed (`source`); each
# rule only matches the datasets of its kind. Then a profile and a cache simulation
# of each dataset's training trace (with its hit-rate curves over all cache sizes),
# and `hotcold shard-sim` of its sharding plans.


rule generate:
    output:
        manifest="results/data/{dataset}/manifest.json",
    params:
        cli=HOTCOLD,
        spec=generator_spec,
        out=lambda wildcards, output: str(Path(output.manifest).parent),
    wildcard_constraints:
        dataset=one_of(MATRIX.generated()),
    priority: 1   # every dataset first, so that every shard-sim can start early (see shard_sim)
    benchmark:
        "results/benchmarks/{dataset}/generate.tsv"
    log:
        "results/logs/generate/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} generate --spec {params.spec:q} --out {params.out:q} --no-progress > {log:q} 2>&1"


rule download:
    output:
        source="results/raw/{dataset}/source.json",
    params:
        cli=HOTCOLD,
        spec=source_spec,
        out=lambda wildcards, output: str(Path(output.source).parent),
    wildcard_constraints:
        dataset=one_of(MATRIX.sourced()),
    log:
        "results/logs/download/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} download --spec {params.spec:q} --out {params.out:q} --name {wildcards.dataset}"
        " --no-progress > {log:q} 2>&1"


rule preprocess:
    input:
        source="results/raw/{dataset}/source.json",
    output:
        manifest="results/data/{dataset}/manifest.json",
    params:
        cli=HOTCOLD,
        spec=source_spec,
        raw=lambda wildcards, input: str(Path(input.source).parent),
        out=lambda wildcards, output: str(Path(output.manifest).parent),
    wildcard_constraints:
        dataset=one_of(MATRIX.sourced()),
    benchmark:
        "results/benchmarks/{dataset}/preprocess.tsv"
    log:
        "results/logs/preprocess/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} preprocess --spec {params.spec:q} --raw {params.raw:q} --out {params.out:q}"
        " --name {wildcards.dataset} --no-progress > {log:q} 2>&1"


rule profile:
    input:
        manifest="results/data/{dataset}/manifest.json",
    output:
        profile="results/profiles/{dataset}/profile.json",
        counts="results/profiles/{dataset}/counts.npz",
    params:
        cli=HOTCOLD,
        dataset=lambda wildcards, input: str(Path(input.manifest).parent),
        out=lambda wildcards, output: str(Path(output.profile).parent),
        sample_fraction=config["profile"]["sample_fraction"],
        window=config["profile"]["window"],
        batches=config["profile"]["batches"],
        batch_size=batch_size,
        seed=MATRIX.first_seed(),
    benchmark:
        "results/benchmarks/{dataset}/profile.tsv"
    log:
        "results/logs/profile/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} profile --dataset {params.dataset:q} --out {params.out:q}"
        " --sample-fraction {params.sample_fraction} --batch-size {params.batch_size}"
        " --window {params.window} --batches {params.batches} --seed {params.seed} > {log:q} 2>&1"


rule simulate:
    input:
        manifest="results/data/{dataset}/manifest.json",
    output:
        csv="results/sim/{dataset}.csv",
        curves="results/sim/curves/{dataset}.csv",
    params:
        cli=HOTCOLD,
        dataset=lambda wildcards, input: str(Path(input.manifest).parent),
        run_config=simulate_config,
        ratios=config["simulate"]["ratios"],
        policies=config["simulate"]["policies"],
        windows=config["simulate"]["windows"],
        fae_budgets=config["simulate"]["fae_budgets"],
        fae_run_lengths=config["simulate"]["fae_run_lengths"],
        fae_sample_fraction=config["simulate"]["fae_sample_fraction"],
        trained_ratios=trained_ratios,
    benchmark:
        "results/benchmarks/{dataset}/simulate.tsv"
    log:
        "results/logs/simulate/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} simulate --dataset {params.dataset:q} --run-config {params.run_config:q}"
        " --out {output.csv:q} --ratios {params.ratios} --policies {params.policies}"
        " --windows {params.windows} --fae-budgets {params.fae_budgets}"
        " --fae-run-lengths {params.fae_run_lengths} --fae-sample-fraction {params.fae_sample_fraction}"
        " --curves-out {output.curves:q} --curve-ratios {params.trained_ratios} > {log:q} 2>&1"


# The longest jobs before the training go first (multi-hot's shard-sim took 83 s): one left running alone at the
# end keeps the other core idle, as the training jobs take both.
rule shard_sim:
    input:
        manifest="results/data/{dataset}/manifest.json",
    output:
        csv="results/shard_sim/{dataset}.csv",
    params:
        cli=HOTCOLD,
        dataset=lambda wildcards, input: str(Path(input.manifest).parent),
        run_config=shard_sim_config,
        plans=config["distributed"]["shard_sim"]["plans"],
        scales=MATRIX.shard_sim_scales(),
        headrooms=MATRIX.shard_sim_headrooms(),
        batch_per_rank=MATRIX.shard_sim_batch_per_rank() or "none",
        fixed_batch="--fixed-batch" if MATRIX.shard_sim_fixed_batch() else "--no-fixed-batch",
    priority: 1
    benchmark:
        "results/benchmarks/{dataset}/shard_sim.tsv"
    log:
        "results/logs/shard_sim/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} shard-sim --dataset {params.dataset:q} --run-config {params.run_config:q}"
        " --out {output.csv:q} --plans {params.plans} --scales {params.scales} --headrooms {params.headrooms}"
        " --batch-per-rank {params.batch_per_rank} {params.fixed_batch} --no-progress > {log:q} 2>&1"
