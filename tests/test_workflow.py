"""The Snakemake workflow: lint, config validation, dry runs, and a tiny end-to-end run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from hotcold.analysis.claims.catalog import CLAIMS
from hotcold.embedding.fbgemm import available as fbgemm_available
from hotcold.runs.records import source_sha256

pytest.importorskip("snakemake", reason="Snakemake runs the workflow; `make` installs it (envs/requirements.txt)")

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
DATASETS = ("kaggle",)   # the tiny workflow's (TINY_CONFIG)
DEFAULT_DATASETS = ("kaggle", "terabyte", "taobao", "multihot")   # default.yaml's
METHODS = ("device", "hybrid", "fae", "lru", "lfu", "freqcache", "scratchpipe")
TABLES = ("summary.csv", "summary.md", "infeasible.md", "phases.csv", "counters.csv", "counters.md", "speedup.csv", "speedup.md",
          "cache_sim.csv", "fae_hot_fraction.csv", "rows_moved.csv", "dataset_stats.csv", "comm_traffic.csv",
          "comm_traffic.md", "flexshard_headroom.csv", "flexshard_headroom.md", "proactive.csv", "proactive.md",
          "costmodel_validation.csv", "costmodel_validation.md", "claims.csv", "claims.md")
INFEASIBLE = ("kaggle", "lfu")  # its cache is smaller than a batch's unique rows
TRAINED = set(METHODS) - {INFEASIBLE[1]}   # the methods with a trained run (lfu's one run is the infeasible one)
SAFETY_TIMEOUT_S = 1200            # against a hung run only; the tiny workflow takes about a minute
FIGURES = ("coverage", "step_phases", "throughput", "speedup", "hit_rate", "fae_hot_fraction", "rows_moved",
           "inter_node_bytes", "proactive_hidden", "flexshard_headroom", "claims", "hit_rate_curves")
# the scale-out runs: 2 ranks, one per simulated node, on kaggle; one job trains both over one launch
SCALE_OUT_RUNS = (("kaggle", "proactive", "row", 2, 1), ("kaggle", "sharded", "row", 2, 1))
PEER_RUNS = (("kaggle", "base"), ("kaggle", "lfu-5pct"))


def peer_status() -> dict[str, str]:
    """The peer's runs' statuses: fbgemm's base variant trains where the extra is installed (else it is skipped),
    and its managed cache (lfu-5pct) ends infeasible on a CPU. Asked when a test runs, not at collection
    (importing FBGEMM takes seconds in every test process)."""
    return {"base": "ok" if fbgemm_available() is None else "skipped", "lfu-5pct": "infeasible"}


# One of the default config's generated datasets, Kaggle's, and its seven methods at a tiny scale: every job of a
# dataset, and every table and figure, once (each dataset's jobs are the same rules: the others' plans are the dry
# runs'; their data the generators' tests; every store's bits on Taobao's sequences and on multi-hot bags are
# tests/test_stores.py's and tests/test_multihot.py's). One variant per method (a null removes a default variant).
# At this scale a batch touches a large share of the rows, so the caches get large ratios; two are per-dataset
# overrides, one of them too small for a batch: that lfu run ends as an infeasible record, and the workflow still
# completes. Two scale-out runs (row-wise and Proactive, 2 ranks; one launch trains both, default.yaml's
# distributed.group_runs) and a shard-sim at two scales, at 64 samples per rank and at the fixed global batch.
# Every run trains its timed part twice (one-process and scale-out runs alike).
TINY_CONFIG = """\
threads: 1
timing: {repeats: 2}
datasets:
  kaggle:
    generator: {kind: criteo-kaggle-style, rows: 4000, max_rows_per_table: 2000, seed: 0}
    methods:
      lru: {tiny: {cache_ratio: 0.3}}
      lfu: {tiny: {cache_ratio: 0.02}}
  terabyte: null
  taobao: null
  multihot: null
methods:
  sharded: {table: null, column: null, balanced: null}
  flexshard: null
  fae: {6.2pct: null, 24.8pct: null, 12.4pct-r1: null}
  lru: {1.5pct: null, 5pct: null, tiny: {cache_ratio: 0.1}}
  lfu: {1.5pct: null, 5pct: null, tiny: {cache_ratio: 0.1}}
  freqcache: {1.5pct: null, 5pct: null, tiny: {cache_ratio: 0.1}}
  scratchpipe: {w2-1.5pct: null, w2-5pct: null}
  fbgemm: {lru-1.5pct: null, lru-5pct: null, lfu-1.5pct: null}
train:
  batch_size: 256
  steps: 12
  warmup_steps: 2
  eval_batch_size: 4096
  eval_samples: 500
profile: {batches: 10}
simulate: {ratios: [0.05, 0.2, 0.5], policies: [lru, freqcache, static-topk], windows: [1]}
distributed:
  scales: [{world: 2, ranks_per_node: 1}]
  train: {steps: 6, warmup_steps: 1, eval_samples: 300}
  shard_sim: {plans: [table, row, column], scales: ["2x2"], headrooms: [1.0], batch_per_rank: 64}
  exact: true            # float64 sums: the scale-out runs are checked exact against the device replay
"""


def snakemake(workdir: Path, *args: str, timeout: float = 80) -> subprocess.CompletedProcess[str]:
    """Run Snakemake on the repository's Snakefile in ``workdir`` with this interpreter's tools first on PATH."""
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )


def dry_run(tmp_path: Path, yaml: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "extra.yaml").write_text(yaml)
    return snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "extra.yaml"), *args)


@pytest.mark.slow  # and `make lint`
def test_lint_is_clean(tmp_path: Path) -> None:
    proc = snakemake(tmp_path, "--lint")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Lints for" not in out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("trian:\n  steps: 3\n", "'trian' was unexpected"),
        ("train:\n  stesp: 3\n", "'stesp' was unexpected"),
        ("train:\n  steps: three\n", "train.steps: 'three' is not of type 'integer'"),
        ("timing:\n  device: gpu\n", "timing.device: 'gpu' is not one of"),
        ("methods:\n  Hybrid:\n    base: {}\n", "'Hybrid'"),
        ("datasets:\n  both:\n    generator: {rows: 100}\n    source: {kind: criteo-kaggle}\n",
         "Exactly one of generator or source (null = absent)"),
        ("datasets:\n  kaggle:\n    generator: null\n", "datasets.kaggle: 'source' is a required property (Exactly one of generator"),
        ("datasets:\n  kaggle:\n    generator: {rowz: 5}\n", "'rowz' was unexpected"),
        ("datasets:\n  x:\n    source: {kind: criteo-kaggle, dayz: [0, 1]}\n", "'dayz' was unexpected"),
        ("datasets:\n  x:\n    source: {kind: avazu}\n", "datasets.x.source.kind"),
        ("datasets:\n  taobao:\n    train: {stesp: 3}\n", "'stesp' was unexpected"),
        ("simulate:\n  policies: [fifo]\n", "simulate.policies[0]"),
        ("profile:\n  windw: 2\n", "'windw' was unexpected"),
    ],
    ids=["unknown-top-level-key", "unknown-nested-key", "wrong-type", "bad-enum", "bad-method-name",
         "generator-and-source", "neither-generator-nor-source", "unknown-generator-key", "unknown-source-key",
         "unknown-source-kind", "unknown-dataset-train-key", "unknown-policy", "unknown-profile-key"],
)
def test_bad_config_fails_naming_the_key(tmp_path: Path, yaml: str, expected: str) -> None:
    proc = dry_run(tmp_path, yaml)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error validating config file: " in out
    assert expected in out, out
    assert len(out) < 2000, out  # one line, not the schema


@pytest.mark.slow
@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("datasets:\n  kaggle:\n    generator: {kind: criteo-kaggle-style, max_length: 5}\n",
         "dataset kaggle: generator config: ['max_length'] only apply to kind 'taobao-style'"),
        ("datasets:\n  x:\n    source: {kind: criteo-kaggle, preprocess: {encodng: modulo}}\n",
         "dataset x: criteo config: unknown key(s) ['encodng']"),
        ("train:\n  warmup_steps: 400\n", "warmup_steps must be in [0, steps=60)"),
        ("datasets:\n  taobao:\n    model: {embedding_dim: 8}\n", "bottom_mlp must end with embedding_dim=8"),
        ("profile: {window: 20, batches: 10}\n", "profile.window=20 is more than profile.batches=10"),
        ("train: {lr: .inf}\n", "lr must be a finite number > 0, got inf"),
        ("datasets:\n  taobao:\n    train: {dense_lr: .nan}\n", "dense_lr must be a finite number > 0, got nan"),
        ("train: {dense_lr: 1.0e+308}\n", "dense_lr must be within float32's range"),
        ("distributed:\n  scales: [{world: 4, ranks_per_node: 3}]\n",
         "distributed.scales: ranks_per_node 3 does not divide world 4"),
        ("distributed:\n  scales: [{world: 3, ranks_per_node: 1}]\n",
         "train.batch_size 1024 is not divisible by distributed.scales world 3"),
    ],
    ids=["taobao-knob-on-criteo", "bad-preprocess-option", "bad-train-value", "bad-dataset-model", "bad-profile",
         "infinite-lr", "nan-dataset-lr", "float32-overflowing-lr", "world-not-whole-nodes", "batch-not-divisible"],
)
def test_bad_values_fail_at_dry_run(tmp_path: Path, yaml: str, expected: str) -> None:
    """The package's typed configs check every dataset and run config before any job starts."""
    proc = dry_run(tmp_path, yaml)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid configuration" in out and expected in out, out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("methods:\n  lrux:\n    a: {}\n", "'lrux' was unexpected"),
        ("methods:\n  lru:\n    a: {cache_ratio: true}\n", "methods.lru.a.cache_ratio"),
        ("methods:\n  scratchpipe:\n    a: {window: -1}\n", "methods.scratchpipe.a.window"),
        ("datasets:\n  taobao:\n    methods: {fae: {a: {budget_ratio: 2.0}}}\n",
         "datasets.taobao.methods.fae.a.budget_ratio"),
        ("methods:\n  sharded:\n    x: {plan: diagonal}\n", "methods.sharded.x.plan"),
        ("distributed:\n  shard_sim: {plans: [row, diagonal]}\n", "distributed.shard_sim.plans[1]"),
        ("distributed:\n  scales: [{world: 1, ranks_per_node: 1}]\n", "distributed.scales[0].world"),
        ("distributed:\n  shard_sim: {scales: [16by8]}\n", "distributed.shard_sim.scales[0]"),
    ],
    ids=["unknown-method", "cache-ratio-bool", "window-negative", "dataset-override", "unknown-plan",
         "unknown-simulated-plan", "world-of-one", "bad-simulated-scale"],
)
def test_bad_store_options_fail_at_dry_run(tmp_path: Path, yaml: str, expected: str) -> None:
    """Every method's options and the distributed section are checked, naming the key, before any job runs
    (each option: tests/test_flow_schema.py)."""
    proc = dry_run(tmp_path, yaml)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error validating config file" in out and expected in out, out


@pytest.mark.slow
def test_paper_config_plans(tmp_path: Path) -> None:
    """paper.yaml's nulls (variants it removes, options it replaces) pass the store-option checks."""
    csv = tmp_path / "UserBehavior.csv"
    csv.write_text("1,2,3,pv,1511000000\n")
    paper = REPO / "workflows" / "config" / "paper.yaml"
    proc = dry_run(tmp_path, f"datasets:\n  taobao:\n    source: {{path: '{csv}'}}\n", "--configfile", str(paper),
                   str(tmp_path / "extra.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "runs/kaggle/fae/128mib/seed~2" in out and "runs/kaggle/fae/12.4pct" not in out


def test_the_mlperf_config_plans_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    """mlperf-dlrmv2.yaml: the multi-hot dataset and the DCNv2 model pass every check, and every one-process
    method trains in the dataset's interleaved group (on the GPU machine it names)."""
    proc = snakemake(tmp_path, "-n", "--configfile", str(REPO / "workflows" / "config" / "mlperf-dlrmv2.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "train_group_mlperf" in out and "results/data/mlperf/manifest.json" in out and "kaggle" not in out


def test_store_options_are_checked_after_the_dataset_overrides_merge(tmp_path: Path) -> None:
    proc = dry_run(tmp_path, "datasets:\n  taobao:\n    methods: {lru: {1.5pct: {cache_rows: 500}}}\n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid configuration for dataset taobao: methods.lru.1.5pct" in out, out
    assert "cache_ratio and cache_rows are alternatives" in out, out


@pytest.mark.slow
def test_a_null_removes_a_store_option(tmp_path: Path) -> None:
    yaml = ("methods:\n  lru:\n    1.5pct: {cache_ratio: null, cache_rows: 500, pin_host: true}\n"
            "  fae:\n    12.4pct: {budget_ratio: null, budget_bytes: 1048576, run_length: epoch}\n")
    proc = dry_run(tmp_path, yaml, "-p")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lru = [ln for ln in out.splitlines() if "hotcold train" in ln and "runs/kaggle/lru/1.5pct" in ln]
    assert '"store": {"cache_rows": 500, "pin_host": true}' in lru[0]


@pytest.mark.slow
def test_taobao_without_a_path_fails_at_dry_run(tmp_path: Path) -> None:
    proc = dry_run(tmp_path, "datasets:\n  taobao:\n    generator: null\n    source: {kind: taobao}\n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "datasets.taobao.source.path" in out and "tianchi.aliyun.com" in out, out


@pytest.mark.slow
def test_dry_run_plans_scale_out_runs_and_shard_sims(tmp_path: Path) -> None:
    """Scale-out methods train at every scale under their own path; one-process paths are unchanged."""
    proc = dry_run(tmp_path, "seeds: [0]\ntiming: {interleave: false}\ndistributed: {group_runs: false}\n", "-p",
                   "--cores", "2")  # 4 ranks, 2 cores
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = out.splitlines()
    trains = [ln for ln in lines if "-m hotcold train --nproc" in ln]
    assert len(trains) == 5 + 6  # kaggle: 4 plans + proactive; taobao: + flexshard
    four = [ln for ln in trains if "runs/kaggle/sharded/row/world~4-rpn~2/seed~0" in ln]
    assert len(four) == 1 and "--nproc 4" in four[0] and "--threads 2" in four[0]
    assert '"ranks_per_node": 2, "wire_dtype": "float32", "world": 4}' in four[0] and '"steps": 24' in four[0]
    assert not any("runs/kaggle/flexshard" in ln for ln in trains)
    assert any("runs/taobao/flexshard/base/world~4-rpn~2/seed~0" in ln for ln in trains)
    assert any("--out 'results/runs/kaggle/lru/1.5pct/seed~0'" in ln and "--nproc" not in ln for ln in lines)
    sims = [ln for ln in lines if "hotcold shard-sim" in ln]
    assert len(sims) == len(DEFAULT_DATASETS)
    assert all("--scales 2x1 2x2 4x8 16x8 --headrooms 1.0 1.25 1.5 2.0" in ln for ln in sims), sims[0]
    assert all("--plans table row column balanced flexshard" in ln for ln in sims)
    assert all("--batch-per-rank 512 --fixed-batch" in ln for ln in sims)
    # the multi-hot dataset: no scale-out run, every plan simulated over its own 5 steps with its DCNv2 model
    assert not any("runs/multihot/" in ln for ln in trains)
    multihot = [ln for ln in sims if "results/data/multihot" in ln]
    assert len(multihot) == 1 and '"interaction": "dcnv2"' in multihot[0] and '"steps": 5,' in multihot[0]
    assert all('"steps": 24,' in ln for ln in sims if ln not in multihot)


@pytest.mark.slow
def test_dry_run_weak_scales_the_trained_runs_with_a_per_rank_batch(tmp_path: Path) -> None:
    """distributed.train.batch_per_rank: each trained scale's run config has batch_size = per-rank x world (the
    matrix's side is in the default tier: test_workflow_matrix; this is the Snakefile's command lines)."""
    yaml = ("seeds: [0]\ntiming: {interleave: false}\ndistributed:\n  group_runs: false\n  train: {batch_per_rank: 96}\n"
            "  shard_sim: {batch_per_rank: 256, fixed_batch: false}\n")
    proc = dry_run(tmp_path, yaml, "-p", "--cores", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    four = [ln for ln in out.splitlines() if "-m hotcold train --nproc" in ln
            and "runs/kaggle/sharded/row/world~4-rpn~2/seed~0" in ln]
    assert len(four) == 1 and '"distributed": {"batch_per_rank": 96, "exact": false, "ranks_per_node": 2, ' \
        '"wire_dtype": "float32", "world": 4}' in four[0]
    assert '"batch_size": 384' in four[0]
    sims = [ln for ln in out.splitlines() if "hotcold shard-sim" in ln]
    assert sims and all("--batch-per-rank 256 --no-fixed-batch" in ln for ln in sims)


@pytest.mark.slow
def test_dry_run_plans_real_and_generated_datasets_with_overrides(tmp_path: Path) -> None:
    csv = tmp_path / "UserBehavior.csv"
    csv.write_text("1,2,3,pv,1511000000\n")
    yaml = (
        "datasets:\n"
        "  taobao:\n"
        "    generator: null\n"
        f"    source: {{kind: taobao, path: '{csv}'}}\n"
        "    methods: {lru: {1.5pct: {cache_ratio: 0.07}}, fae: null}\n"
        "    train: {batch_size: 128}\n"
    )
    proc = dry_run(tmp_path, yaml, "-p")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    stats = out[out.index("Job stats:"):].splitlines()
    counts = {f[0]: int(f[1]) for f in (ln.split() for ln in stats) if len(f) == 2 and f[1].isdigit()}
    assert (counts["download"], counts["preprocess"], counts["generate"]) == (1, 1, 3)  # kaggle, terabyte, multihot
    generate = [ln for ln in out.splitlines() if "hotcold generate" in ln]
    assert not any('"name": "taobao"' in ln for ln in generate)
    assert any("hotcold download" in ln and "--out results/raw/taobao" in ln for ln in out.splitlines())
    taobao_lru = [ln for ln in out.splitlines() if "hotcold train" in ln and "runs/taobao/lru/1.5pct" in ln]
    assert len(taobao_lru) == 1
    assert '"cache_ratio": 0.07' in taobao_lru[0] and '"batch_size": 128' in taobao_lru[0]
    kaggle_lru = [ln for ln in out.splitlines() if "hotcold train" in ln and "runs/kaggle/lru/1.5pct" in ln]
    assert '"cache_ratio": 0.015' in kaggle_lru[0] and '"batch_size": 1024' in kaggle_lru[0]
    assert "runs/taobao/fae" not in out and "runs/kaggle/fae/12.4pct" in out


def training_jobs(out: str) -> tuple[Counter, set[str]]:
    """From a dry run's job list: how many jobs each training rule has, and the run files they write."""
    jobs, files = Counter(), set()
    for block in re.split(r"\n(?=\S*\s*(?:local)?rule \S+:)", out):
        rule = re.search(r"rule (\S+):", block)
        output = re.search(r"^\s+output: (.*)$", block, re.MULTILINE)
        if rule and output and rule[1].startswith("train"):
            jobs[rule[1]] += 1
            files.update(output[1].split(", "))
    return jobs, files


@pytest.mark.slow
def test_interleave_plans_one_group_job_per_dataset_and_seed(tmp_path: Path) -> None:
    """The same record paths as one job per run; one-process runs in one job per (dataset, seed), scale-out runs
    in one per (dataset, scale, seed)."""
    separate = dry_run(tmp_path, "seeds: [0, 1]\ntiming: {interleave: false, device: cpu}\n"
                                 "distributed: {group_runs: false}\n")
    interleaved = dry_run(tmp_path, "seeds: [0, 1]\ntiming: {interleave: true, repeats: 3, device: cpu}\n", "-p")
    for proc in (separate, interleaved):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs, files = training_jobs(separate.stdout)
    group_jobs, group_files = training_jobs(interleaved.stdout)
    assert group_files == files and any(f.endswith("kaggle/lru/1.5pct/seed~1/record.json") for f in files)
    # the default's 56 one-process runs and the fbgemm peer's 20 (5 variants x 4 datasets), 2 seeds; on a CPU
    # its 16 managed-cache runs a seed get their infeasible records from one job, without training
    assert jobs["train"] == 2 * (56 + 4) and "train" not in group_jobs
    assert separate.stdout.count("rule device_infeasible:") == interleaved.stdout.count("rule device_infeasible:") == 1
    assert group_jobs == {**{f"train_group_{d}": 2 for d in DEFAULT_DATASETS},
                          **{f"train_group_{d}_world4_rpn2": 2 for d in ("kaggle", "taobao")}}
    assert jobs["train_scaleout"] == 2 * (5 + 6)  # kaggle's plans and Proactive, taobao's six
    command = next(ln for ln in interleaved.stdout.splitlines() if "hotcold train-group" in ln and "taobao" in ln)
    runs = json.loads(re.search(r"--runs '(.*?)' --threads", command)[1])
    assert {r["run_config"]["dataset"] for r in runs} == {"taobao"}
    assert {r["run_config"]["timing"]["repeats"] for r in runs} == {3}
    assert all("interleave" not in r["run_config"]["timing"] for r in runs)  # a layout of jobs, not of a run


@pytest.mark.slow
def test_a_named_run_is_trained_alone(tmp_path: Path) -> None:
    """Under the default (interleaved) config, naming one run's record plans one training job, a method's
    record on every dataset four."""
    one = snakemake(tmp_path, "-n", "results/runs/kaggle/lru/1.5pct/seed~0/record.json")
    every = snakemake(tmp_path, "-n", *(f"results/runs/{d}/lru/1.5pct/seed~0/record.json" for d in DEFAULT_DATASETS))
    for proc in (one, every):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert training_jobs(one.stdout) == (Counter(train_alone=1), {"results/runs/kaggle/lru/1.5pct/seed~0/record.json",
                                                           "results/runs/kaggle/lru/1.5pct/seed~0/steps.parquet"})
    assert training_jobs(every.stdout)[0] == Counter(train_alone=4)


def test_a_run_the_config_does_not_ask_for_is_named_at_the_dry_run(tmp_path: Path) -> None:
    """A path the config does not ask for stops the dry run in one line naming what is configured (every
    mistake: tests/test_workflow_targets.py)."""
    bad = snakemake(tmp_path, "-n", "results/runs/kaggle/lru/1.4pct/seed~0/record.json")
    assert bad.returncode != 0
    assert ("results/runs/kaggle/lru/1.4pct/seed~0/record.json: lru has no variant '1.4pct' on kaggle "
            "(variants: 1.5pct, 5pct)") in bad.stdout + bad.stderr, bad.stdout + bad.stderr


@pytest.mark.slow
def test_a_code_change_reruns_the_training_jobs(tmp_path: Path) -> None:
    """The package's source hash is a parameter of the training rules: editing a .py file reruns them."""
    work = tmp_path / "copy"
    work.mkdir()
    shutil.copy(SNAKEFILE, work)
    for name in ("workflows", "envs"):
        shutil.copytree(REPO / name, work / name)
    shutil.copytree(REPO / "src" / "hotcold", work / "src" / "hotcold", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "one.yaml").write_text("seeds: [0]\ndatasets: {terabyte: null, taobao: null}\ntiming: {interleave: false}\n")
    run_dir = work / "results/runs/kaggle/device/base/seed~0"
    run_dir.mkdir(parents=True)
    for name in ("record.json", "steps.parquet"):
        (run_dir / name).touch()
    (work / "results/data/kaggle").mkdir(parents=True)
    time.sleep(0.05)
    (work / "results/data/kaggle/manifest.json").touch()  # newer: the run is out of date, and --touch records it
    target = "results/runs/kaggle/device/base/seed~0/record.json"

    def snakemake_copy(*args: str) -> subprocess.CompletedProcess[str]:
        return snakemake(work, "-s", str(work / "Snakefile"), target, *args, "--configfile", str(work / "one.yaml"))

    touched = snakemake_copy("--touch", "--cores", "1")
    assert touched.returncode == 0, touched.stdout + touched.stderr
    metadata = [json.loads(p.read_text()) for p in (work / ".snakemake" / "metadata").iterdir()]
    assert any(f"'{source_sha256()}'" in m["params"] for m in metadata if m["rule"] == "train")
    assert "Nothing to be done" in snakemake_copy("-n").stdout
    with open(work / "src" / "hotcold" / "metrics.py", "a") as f:
        f.write("# an edit\n")
    again = snakemake_copy("-n").stdout
    assert "rule train:" in again and "Params have changed since last execution" in again, again


def check_scale_out(workdir: Path, summary: pd.DataFrame) -> None:
    """The 2-rank runs: their own paths and summary rows, exact against one shared replay, trained by one job,
    and byte for byte what shard-sim predicts."""
    records = []
    for dataset, method, variant, world, rpn in SCALE_OUT_RUNS:
        run_dir = workdir / f"results/runs/{dataset}/{method}/{variant}/world~{world}-rpn~{rpn}/seed~0"
        records.append(json.loads((run_dir / "record.json").read_text()))
    assert [r["summary"]["group_runs"] for r in records] == [2, 2]  # one launch trained both
    assert records[0]["reference"]["params"] == records[1]["reference"]["params"]  # the same batches, one replay
    assert (workdir / "results/benchmarks/kaggle/train_group/world~2-rpn~1/seed~0.tsv").is_file()
    run = summary[summary.world > 1].sort_values("method")
    assert list(zip(run.dataset, run.method, run.variant, run.world, run.ranks_per_node, run.plan)) == \
        [(*r, "row") for r in SCALE_OUT_RUNS]
    assert run.exact.astype(bool).all() and (run.exact_reference == "one-process device replay").all()
    assert run.speedup_vs_hybrid.isna().all()
    assert (summary[summary.world == 1].ranks_per_node == 1).all()
    speedup_methods = set(pd.read_csv(workdir / "results" / "tables" / "speedup.csv").method)
    assert speedup_methods == TRAINED | ({"fbgemm"} if peer_status()["base"] == "ok" else set())
    traffic = pd.read_csv(workdir / "results" / "tables" / "comm_traffic.csv")
    assert set(traffic[traffic.source == "simulated"].dataset) == set(DATASETS)
    assert set(traffic.world) == {2, 4}  # shard_sim's 2x2 and the trained 2x1
    trained = traffic[(traffic.source == "trained") & (traffic.method == "sharded")].iloc[0]
    assert (trained.batching, trained.batch_size, trained.batch_per_rank) == ("global", 256, 128)
    assert set(traffic[traffic.source == "simulated"].batching) == {"per-rank", "global"}
    dataset, _, _, world, _ = SCALE_OUT_RUNS[1]
    simulated = traffic[(traffic.source == "simulated") & (traffic.dataset == dataset) & (traffic.plan == "row")
                        & (traffic.world == world) & (traffic.memory_headroom == trained.memory_headroom)
                        & (traffic.batch_size == trained.batch_size)]
    assert len(simulated) == 1 and trained.inter_node_a2a_bytes > 0
    assert trained.inter_node_a2a_bytes == pytest.approx(simulated.inter_node_a2a_bytes.iloc[0])
    assert trained.inter_a2a_reduction_vs_row == pytest.approx(0.0)
    assert (traffic.status == "infeasible").any()  # column-wise at 4 ranks, headroom 1.0: ends infeasible, no error
    proactive = pd.read_csv(workdir / "results" / "tables" / "proactive.csv")
    assert list(proactive.dataset) == ["kaggle"] and (proactive.early_lookup_share > 0).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A finished reproduction of TINY_CONFIG. No wall-clock limit beyond a generous one against hanging: the
    machine may be loaded. The tests below run in this order, and the later ones change it."""
    tmp_path = tmp_path_factory.mktemp("tiny")
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", str(tmp_path / "tiny.yaml"), "--show-failed-logs",
                     timeout=SAFETY_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return tmp_path


def test_tiny_workflow_end_to_end(tiny: Path) -> None:
    """Every method, table and figure; one infeasible run does not stop the rest; nothing left to do after."""
    tmp_path = tiny
    tables, figs = tmp_path / "results" / "tables", tmp_path / "paper_figs"
    summary = pd.read_csv(tables / "summary.csv")
    peer = summary[summary.method == "fbgemm"]
    assert sorted(zip(peer.dataset, peer.variant, peer.status)) == sorted(
        (d, v, peer_status()[v]) for d, v in PEER_RUNS)
    if peer_status()["base"] == "skipped":
        assert "**Skipped:**" in (tables / "summary.md").read_text()
    else:  # FBGEMM's update is the harness's up to float32 rounding
        trained = peer[peer.status == "ok"]
        assert trained.exact.astype(bool).all(), trained[["dataset", "param_rel_diff"]]
    summary = summary[summary.method != "fbgemm"]  # the harness's own methods, as before the peer
    assert sorted(zip(summary.dataset, summary.method)) == sorted(
        [(d, m) for d in DATASETS for m in METHODS] + [run[:2] for run in SCALE_OUT_RUNS])
    infeasible = summary[summary.status == "infeasible"]
    assert list(zip(infeasible.dataset, infeasible.method)) == [INFEASIBLE]
    assert "too small" in infeasible.reason.iloc[0] and infeasible.samples_per_s.isna().all()
    ok = summary[summary.status == "ok"]
    assert len(ok) == len(summary) - 1
    assert ok.exact.astype(bool).all(), ok[["dataset", "method", "param_rel_diff"]]
    refs = dict(zip(ok.method, ok.exact_reference))
    assert refs["fae"] == "device replay of this order" and refs["lru"] == "device run"
    assert (ok.samples_per_s > 0).all()
    assert (ok.repeats == 2).all() and (ok.repeat_spread >= 1).all()
    hybrid = summary[summary.method == "hybrid"]
    assert hybrid.speedup_vs_hybrid.tolist() == pytest.approx([1.0] * len(DATASETS))
    assert hybrid.auc_vs_hybrid.tolist() == pytest.approx([0.0] * len(DATASETS))
    lru = summary[summary.method == "lru"].iloc[0]
    assert lru.options == "cache_ratio=0.3"
    for name in TABLES:
        assert (tables / name).stat().st_size > 0, name
    for name in FIGURES:
        for ext in ("png", "pdf"):
            assert (figs / f"{name}.{ext}").stat().st_size > 0, name
    assert "kaggle/lfu/tiny/seed~0 (cache_ratio=0.02): cache of" in (tables / "infeasible.md").read_text()
    assert set(pd.read_csv(tables / "dataset_stats.csv").dataset) == set(DATASETS)
    assert set(pd.read_csv(tables / "cache_sim.csv").dataset) == set(DATASETS)
    assert set(pd.read_csv(tables / "fae_hot_fraction.csv").dataset) == set(DATASETS)
    rows_moved = pd.read_csv(tables / "rows_moved.csv")
    rows_moved = rows_moved[rows_moved.method != "fbgemm"]
    assert len(rows_moved) == len(DATASETS) * len(METHODS) - 1
    assert INFEASIBLE not in set(zip(rows_moved.dataset, rows_moved.method))
    # default.yaml's layout (timing.interleave): one job per dataset and seed trains its one-process runs
    assert (tmp_path / "results" / "benchmarks" / "kaggle" / "train_group" / "seed~0.tsv").is_file()
    claims = pd.read_csv(tables / "claims.csv")
    assert list(claims.claim_id) == [c.claim_id for c in CLAIMS]   # every claim keeps its row, run or not
    assert claims.status.str.startswith(("ok", "not run", "no hotcold method")).all()
    validation = pd.read_csv(tables / "costmodel_validation.csv")
    assert TRAINED <= set(validation.method)   # every trained one-process method has modelled phases
    check_scale_out(tmp_path, summary)
    assert (ok[ok.world == 1].timed_with > 1).all()  # the reproduction's runs were interleaved

    again = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "tiny.yaml"))
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout


@pytest.mark.slow
def test_make_figures_brings_back_every_table_and_figure(tiny: Path) -> None:
    """`make figures` after a reproduction redraws what was deleted and leaves nothing out of date."""
    tmp_path = tiny
    for name in ("paper_figs/hit_rate_curves.png", "paper_figs/speedup.pdf", "results/tables/costmodel_validation.md"):
        (tmp_path / name).unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under `make test`
    here = f"{sys.executable} -m snakemake -s {SNAKEFILE} -d {tmp_path} --configfile {tmp_path / 'tiny.yaml'} --cores 2"
    figures = subprocess.run(["make", "--no-print-directory", "figures", "STAMP=", "RESUME=true", f"SNAKEMAKE={here}"],
                             cwd=SNAKEFILE.parent, capture_output=True, text=True, env=env, timeout=SAFETY_TIMEOUT_S)
    assert figures.returncode == 0, figures.stdout[-4000:] + figures.stderr[-4000:]
    for name in ("paper_figs/hit_rate_curves.png", "paper_figs/speedup.pdf", "results/tables/costmodel_validation.md"):
        assert (tmp_path / name).is_file(), name
    again = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "tiny.yaml"))
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout


@pytest.mark.slow
def test_one_run_of_a_reproduction_reruns_alone_and_the_report_shows_every_table(tiny: Path) -> None:
    """Rerunning one run of a finished reproduction trains it alone; its dataset's group stays up to date after.
    `make report`'s HTML then holds every CSV table and figure."""
    tmp_path = tiny
    one = "results/runs/kaggle/lru/tiny/seed~0/record.json"
    rerun = snakemake(tmp_path, "--cores", "2", "--configfile", str(tmp_path / "tiny.yaml"), "--force", one)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    assert training_jobs(rerun.stdout + rerun.stderr)[0] == Counter(train_alone=1)
    assert json.loads((tmp_path / one).read_text())["summary"]["group_runs"] == 1
    after = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "tiny.yaml"))
    assert after.returncode == 0 and "rule aggregate" in after.stdout, after.stdout  # the tables read it
    assert not training_jobs(after.stdout)[0], after.stdout

    report = snakemake(tmp_path, "--configfile", str(tmp_path / "tiny.yaml"), "--report", "report.html")
    assert report.returncode == 0, report.stderr[-4000:]
    html = (tmp_path / "report.html").read_text()  # what `make report` builds: every CSV table and figure
    assert all(f"{name}.png" in html for name in FIGURES) and all(t in html for t in TABLES if t.endswith(".csv"))


@pytest.mark.slow
def test_a_dataset_the_profile_does_not_size_is_named(tmp_path: Path) -> None:
    """The SLURM profile sizes the group jobs by rule name: a dataset of one's own is named at the plan."""
    sized = [f"train_group_{d}{scale}:runtime=7200" for d in DEFAULT_DATASETS for scale in ("", "_world4_rpn2")]
    proc = dry_run(tmp_path, "datasets:\n  mine:\n    generator: {kind: criteo-kaggle-style, rows: 250000}\n",
                   "--set-resources", *sized)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "train_group_mine: the profile's set-resources does not size this group's job" in out
    assert "train_group_mine_world4_rpn2: the profile's set-resources does not size this group's job" in out
    assert "train_group_kaggle: the profile" not in out
