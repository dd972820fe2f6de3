# Tables from the run records, the simulations (cache and shard) and the profiles; figures from the tables.


rule dataset_stats:
    input:
        profiles=per_dataset("results/profiles/{dataset}/profile.json"),
    output:
        csv=report("results/tables/dataset_stats.csv", caption="../report/dataset_stats.rst", category="Tables"),
        coverage_png=figure("coverage", "png"),
        coverage_pdf=figure("coverage", "pdf"),
    params:
        cli=HOTCOLD,
        dirs=lambda wildcards, input: [str(Path(p).parent) for p in input.profiles],
        figures=lambda wildcards, output: str(Path(output.coverage_png).parent),
    log:
        "results/logs/dataset_stats.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} dataset-stats {params.dirs:q} --out {output.csv:q} --figures {params.figures:q} > {log:q} 2>&1"


rule cache_sim:
    input:
        sims=per_dataset("results/sim/{dataset}.csv"),
    output:
        csv=report(
            "results/tables/cache_sim.csv", caption="../report/cache_sim_table.rst", category="Tables"
        ),
    params:
        cli=HOTCOLD,
    priority: 1   # as soon as the simulations are there: the figures wait for it
    log:
        "results/logs/cache_sim.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} cache-sim {input.sims:q} --out {output.csv:q} > {log:q} 2>&1"


rule aggregate:
    input:
        records=all_records(),
    output:
        summary_csv=report(
            "results/tables/summary.csv", caption="../report/summary.rst", category="Tables"
        ),
        summary_md="results/tables/summary.md",
        infeasible="results/tables/infeasible.md",
        phases=report(
            "results/tables/phases.csv", caption="../report/phases_table.rst", category="Tables"
        ),
        counters_csv=report(
            "results/tables/counters.csv", caption="../report/counters_table.rst", category="Tables"
        ),
        counters_md="results/tables/counters.md",
        speedup_csv=report(
            "results/tables/speedup.csv", caption="../report/speedup_table.rst", category="Tables"
        ),
        speedup_md="results/tables/speedup.md",
        fae_hot_fraction=report(
            "results/tables/fae_hot_fraction.csv", caption="../report/fae_hot_fraction_table.rst", category="Tables"
        ),
        rows_moved=report(
            "results/tables/rows_moved.csv", caption="../report/rows_moved_table.rst", category="Tables"
        ),
    params:
        cli=HOTCOLD,
        out=lambda wildcards, output: str(Path(output.summary_csv).parent),
        exact_rtol=config["aggregate"]["exact_rtol"],
    log:
        "results/logs/aggregate.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} aggregate {input.records:q} --out {params.out:q}"
        " --exact-rtol {params.exact_rtol} > {log:q} 2>&1"


rule scaleout_tables:
    input:
        records=scale_out_records(),
        sims=per_dataset("results/shard_sim/{dataset}.csv"),
    output:
        comm_traffic_csv=report(
            "results/tables/comm_traffic.csv", caption="../report/comm_traffic.rst", category="Tables"
        ),
        comm_traffic_md="results/tables/comm_traffic.md",
        flexshard_headroom_csv=report(
            "results/tables/flexshard_headroom.csv", caption="../report/flexshard_headroom_table.rst", category="Tables"
        ),
        flexshard_headroom_md="results/tables/flexshard_headroom.md",
        proactive_csv=report(
            "results/tables/proactive.csv", caption="../report/proactive_table.rst", category="Tables"
        ),
        proactive_md="results/tables/proactive.md",
    params:
        cli=HOTCOLD,
        out=lambda wildcards, output: str(Path(output.comm_traffic_csv).parent),
    log:
        "results/logs/scaleout_tables.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} scaleout-tables {input.records:q} --shard-sims {input.sims:q} --out {params.out:q}"
        " > {log:q} 2>&1"


# The figures in two jobs that draw at once (`hotcold figures --set`): the one-process runs' and the scale-out
# runs' (drawing them all in one job took 29 s of the reproduction's tail, on one core). Each starts as soon as
# its tables are there.
rule figures:
    input:
        summary="results/tables/summary.csv",
        phases="results/tables/phases.csv",
        speedup="results/tables/speedup.csv",
        cache_sim="results/tables/cache_sim.csv",
        fae_hot_fraction="results/tables/fae_hot_fraction.csv",
        rows_moved="results/tables/rows_moved.csv",
    output:
        [figure(name, ext) for name in FIGURES for ext in ("png", "pdf")],
    params:
        cli=HOTCOLD,
        tables=lambda wildcards, input: str(Path(input.summary).parent),
        out=lambda wildcards, output: str(Path(output[0]).parent),
    priority: 1
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} figures --set one-process --tables {params.tables:q} --out {params.out:q} > {log:q} 2>&1"


rule scaleout_figures:
    input:
        summary="results/tables/summary.csv",
        comm_traffic="results/tables/comm_traffic.csv",
        flexshard_headroom="results/tables/flexshard_headroom.csv",
        proactive="results/tables/proactive.csv",
    output:
        [figure(name, ext) for name in SCALE_OUT_FIGURES for ext in ("png", "pdf")],
    params:
        cli=HOTCOLD,
        tables=lambda wildcards, input: str(Path(input.summary).parent),
        out=lambda wildcards, output: str(Path(output[0]).parent),
    priority: 1
    log:
        "results/logs/scaleout_figures.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} figures --set scale-out --tables {params.tables:q} --out {params.out:q} > {log:q} 2>&1"


rule hit_rate_curves:
    input:
        curves=per_dataset("results/sim/curves/{dataset}.csv"),
        summary="results/tables/summary.csv",
        counters="results/tables/counters.csv",
    output:
        png=figure("hit_rate_curves", "png"),
        pdf=figure("hit_rate_curves", "pdf"),
    params:
        cli=HOTCOLD,
        tables=lambda wildcards, input: str(Path(input.summary).parent),
        out=lambda wildcards, output: str(Path(output.png).parent),
    log:
        "results/logs/hit_rate_curves.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} hit-rate-curves {input.curves:q} --tables {params.tables:q} --out {params.out:q} > {log:q} 2>&1"
