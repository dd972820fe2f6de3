# Datasets: one directory per configured dataset; manifest.json marks it complete.


rule generate:
    output:
        manifest="results/data/{dataset}/manifest.json",
    params:
        cli=HOTCOLD,
        spec=generator_spec,
        out=lambda wildcards, output: str(Path(output.manifest).parent),
    log:
        "results/logs/generate/{dataset}.log",
    conda:
        "../../envs/hotcold.yaml"
    shell:
        "{params.cli} generate --spec {params.spec:q} --out {params.out:q} --no-progress > {log:q} 2>&1"
