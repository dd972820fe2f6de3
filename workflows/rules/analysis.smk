# Tables from all run records, figures from the tables.


rule aggregate:
    input:
        records=all_records(),
    output:
        summary_csv=report(
            "results/tables/summary.csv", caption="../report/summary.rst", category="Tables"
        ),
        summary_md="results/tables/summary.md",
        phases="results/tables/phases.csv",
        counters_csv="results/tables/counters.csv",
        counters_md="results/tables/counters.md",
    params:
        cli=HOTCOLD,
        exact_rtol=config["aggregate"]["exact_rtol"],
    log:
        "results/logs/aggregate.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} aggregate {input.records:q} --out results/tables"
        " --exact-rtol {params.exact_rtol} > {log:q} 2>&1"


rule figures:
    input:
        summary="results/tables/summary.csv",
        phases="results/tables/phases.csv",
    output:
        step_phases_png=report(
            "paper_figs/step_phases.png", caption="../report/step_phases.rst", category="Figures"
        ),
        step_phases_pdf="paper_figs/step_phases.pdf",
        throughput_png=report(
            "paper_figs/throughput.png", caption="../report/throughput.rst", category="Figures"
        ),
        throughput_pdf="paper_figs/throughput.pdf",
    params:
        cli=HOTCOLD,
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} figures --tables results/tables --out paper_figs > {log:q} 2>&1"
