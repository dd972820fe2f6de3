"""Global batches against the training splits before any job runs (``hotcold.workflow.matrix``).

A one-process or simulated batch over a dataset's training split stops the plan in one line; a trained scale-out
run's is skipped with an ``infeasible`` record (the ``device_infeasible`` job); a fitting config is untouched.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hotcold.config import ConfigError, read_yaml
from hotcold.workflow.matrix import Matrix, Run
from hotcold.workflow.settings import overlaid

snakemake_utils = pytest.importorskip("snakemake.utils", reason="configs are validated as Snakemake validates "
                                      "them; `make` installs it (envs/requirements.txt)")

REPO = Path(__file__).resolve().parents[1]
DEFAULT = read_yaml(REPO / "workflows/config/default.yaml")
SCHEMA = str(REPO / "workflows/schemas/config.schema.yaml")

# One Kaggle-style dataset of 40,000 samples (36,000 train: the tail 10% is held out), on the CPU.
KAGGLE_40K = {"datasets": {"kaggle": {"generator": {"rows": 40_000}}, "terabyte": None, "taobao": None},
              "timing": {"device": "cpu"}}
# ... trained at 4 ranks and at 16 (2 nodes of 8) with 4,096 samples per rank: 65,536 at world 16; simulated at
# scales whose 512 samples per rank fit (the trained 2x8 too: 8,192).
WEAK_TRAINED = {"distributed": {"scales": [{"world": 4, "ranks_per_node": 2}, {"world": 16, "ranks_per_node": 8}],
                                "train": {"batch_per_rank": 4096}, "shard_sim": {"scales": ["2x1", "2x2", "4x8"]}}}
SPLIT_36K = "more than the 36,000 samples of dataset kaggle's training split"
SKIP_REASON = ("dataset kaggle: distributed.train.batch_per_rank 4096 x world 16 (2x8) is a global batch of 65,536 "
               f"samples, {SPLIT_36K}: lower distributed.train.batch_per_rank, drop world 16 from "
               "distributed.scales or raise datasets.kaggle.generator.rows")


def config(*overrides: dict) -> dict:
    """The default config with ``overrides`` merged in order as Snakemake merges config files (a null stays, and
    removes a dataset), validated with the schema's defaults."""
    out = copy.deepcopy(DEFAULT)
    for override in overrides:
        out = overlaid(out, copy.deepcopy(override))
    snakemake_utils.validate(out, SCHEMA)
    return out


def refusal(*overrides: dict) -> str:
    with pytest.raises(ConfigError) as e:
        Matrix(config(*overrides)).check()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_training_split_follows_the_generator_and_real_logs_are_left_alone():
    m = Matrix(config(KAGGLE_40K, {"datasets": {"taobao": {"generator": {"kind": "taobao-style", "rows": 50_000}},
                                                "real": {"source": {"kind": "criteo-kaggle"}}}}))
    assert tuple(m.train_split("kaggle")) == (36_000, True)
    assert tuple(m.train_split("taobao")) == (50_000, False)  # split by user: only its rows bound it
    assert m.train_split("real") is None


def test_a_simulated_scale_over_the_training_split_is_refused_in_one_line():
    assert refusal(KAGGLE_40K) == (
        "invalid configuration for dataset kaggle: distributed.shard_sim.batch_per_rank 512 x 128 ranks (16x8) "
        f"simulates a global batch of 65,536 samples, {SPLIT_36K}: lower distributed.shard_sim.batch_per_rank, "
        "drop 16x8 from distributed.shard_sim.scales or raise datasets.kaggle.generator.rows")
    # a trained scale is simulated too: its option is distributed.scales
    trained = {"distributed": {"scales": [{"world": 128, "ranks_per_node": 8}], "shard_sim": {"scales": ["2x1"]}}}
    assert "512 x 128 ranks (16x8) simulates" in refusal(KAGGLE_40K, trained)
    assert "drop 16x8 from distributed.scales or" in refusal(KAGGLE_40K, trained)
    # the fixed global batch simulated beside the per-rank one (fixed_batch), and without a per-rank batch
    fixed = {"distributed": {"train": {"batch_size": 40_000}, "scales": [],
                             "shard_sim": {"scales": ["2x1", "2x2"]}}}
    assert refusal(KAGGLE_40K, fixed) == (
        "invalid configuration for dataset kaggle: distributed.shard_sim.fixed_batch simulates the fixed global "
        f"batch distributed.train.batch_size 40,000 at the scales 2x1, 2x2, {SPLIT_36K}: lower "
        "distributed.train.batch_size, set distributed.shard_sim.fixed_batch false or raise "
        "datasets.kaggle.generator.rows")
    only_fixed = {"distributed": {"shard_sim": {"batch_per_rank": None}}}
    assert "distributed.shard_sim.batch_per_rank null simulates the fixed global batch" in refusal(
        KAGGLE_40K, fixed, only_fixed)
    taobao = {"datasets": {"kaggle": None, "taobao": {"generator": {"kind": "taobao-style", "rows": 60_000}}}}
    assert "more than the 60,000 samples of dataset taobao (its training split, by user, holds fewer)" in refusal(
        KAGGLE_40K, taobao)


def test_a_one_process_batch_over_the_training_split_is_refused_in_one_line():
    """Its runs, profile and cache simulation all read batches of train.batch_size: no record could stand for them."""
    own = {"datasets": {"kaggle": {"train": {"batch_size": 40_000}}}, "distributed": {"scales": []}}
    assert refusal(KAGGLE_40K, own) == (
        "invalid configuration for dataset kaggle: datasets.kaggle.train.batch_size 40,000 (one process, world 1: "
        f"its runs, profile and cache simulation) is {SPLIT_36K}: lower datasets.kaggle.train.batch_size or raise "
        "datasets.kaggle.generator.rows")
    assert refusal(KAGGLE_40K, {"train": {"batch_size": 36_864}}).startswith(
        "invalid configuration for dataset kaggle: train.batch_size 36,864 (one process, world 1")


def test_a_trained_scale_over_the_training_split_is_skipped_with_its_reason():
    m = Matrix(config(KAGGLE_40K, WEAK_TRAINED))
    m.check()  # the plan goes on
    big = [r for r in m.runs() if r.world == 16]
    assert len(big) == 5 and set(big) <= set(m.device_infeasible())  # 4 plans and proactive: an infeasible record
    assert {m.infeasible_reason(r) for r in big} == {SKIP_REASON}
    assert not any(r.world == 4 for r in m.device_infeasible())  # 16,384 samples at 4 ranks: trained
    assert m.skip_notes() == [f"hotcold: 5 scale-out run(s) skipped, each with an infeasible record: {SKIP_REASON}"]
    assert ("fbgemm", "base") in m.interleaved_runs("kaggle")  # the one-process runs are untouched
    fixed = Matrix(config(KAGGLE_40K, WEAK_TRAINED, {"distributed": {"train": {"batch_per_rank": None,
                                                                                "batch_size": 40_000},
                                                                      "shard_sim": {"fixed_batch": False}}}))
    fixed.check()
    assert fixed.infeasible_reason(Run("kaggle", "sharded", "row", 0, 4, 2)) == (
        "dataset kaggle: distributed.train.batch_size 40,000, the fixed global batch at world 4 (2x2), is "
        f"{SPLIT_36K}: lower distributed.train.batch_size or raise datasets.kaggle.generator.rows")


def test_a_fitting_config_is_untouched():
    roomy = Matrix(config(KAGGLE_40K, WEAK_TRAINED, {"datasets": {"kaggle": {"generator": {"rows": 80_000}}}}))
    roomy.check()  # 72,000 training samples hold 65,536
    assert all(r.method == "fbgemm" for r in roomy.device_infeasible()) and roomy.skip_notes() == []
    default = Matrix(config({"timing": {"device": "cpu"}}))
    default.check()
    assert default.skip_notes() == [] and all(default.infeasible_reason(r) is None for r in default.runs()
                                             if r.scale_out)


def test_the_infeasible_job_writes_the_planned_reason_against_the_generated_split(tmp_path: Path):
    from hotcold.data.generators import GeneratorConfig, generate
    from hotcold.runs.runner import write_infeasible_runs

    small = {"datasets": {"kaggle": {"generator": {"rows": 4000, "max_rows_per_table": 2000}}},
             "distributed": {"scales": [{"world": 4, "ranks_per_node": 2}], "train": {"batch_per_rank": 1000},
                             "shard_sim": {"scales": ["2x1"], "batch_per_rank": 64}}}
    m = Matrix(config(KAGGLE_40K, small))
    m.check()
    run = Run("kaggle", "sharded", "row", 0, 4, 2)
    planned = m.infeasible_reason(run)
    assert planned is not None and "global batch of 4,000 samples, more than the 3,600 samples" in planned
    generate(GeneratorConfig.from_dict(m.generator_spec("kaggle")), tmp_path / "data" / "kaggle", progress=False)
    out = tmp_path / "run"
    assert write_infeasible_runs([(m.run_config(run), str(out))], tmp_path / "data", "cpu") == [(out, planned)]
    record = json.loads((out / "record.json").read_text())
    assert (record["status"], record["reason"]) == ("infeasible", planned)
    # a CUDA config's record, written where no GPU is (the job is local: a cluster's login node)
    on_cuda = m.run_config(run)
    on_cuda["timing"] = {**on_cuda.get("timing", {}), "device": "cuda"}
    assert write_infeasible_runs([(on_cuda, str(tmp_path / "cuda"))], tmp_path / "data") == [(tmp_path / "cuda",
                                                                                              planned)]
    provenance = json.loads((tmp_path / "cuda" / "record.json").read_text())["provenance"]
    if not torch.cuda.is_available():
        assert provenance["device_type"] == "cuda" and provenance["device"] == "cuda (no GPU where this was written)"
    fits = Run("kaggle", "sharded", "row", 0, 2, 1)  # 2,000 samples: to be trained, not recorded
    with pytest.raises(ConfigError, match="can run on cpu; train it instead"):
        write_infeasible_runs([(m.run_config(fits), str(tmp_path / "fits"))], tmp_path / "data", "cpu")


def dry_run(tmp_path: Path, *overrides: dict) -> subprocess.CompletedProcess[str]:
    """``snakemake -n`` on the repository's Snakefile with ``overrides`` as one --configfile."""
    extra: dict = {}
    for override in overrides:
        extra = overlaid(extra, copy.deepcopy(override))
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "extra.yaml").write_text(yaml.safe_dump(extra))
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                           "-n", "--cores", "1", "--configfile", str(tmp_path / "extra.yaml")],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_dry_run_refuses_a_simulated_scale_and_plans_a_skipped_trained_one(tmp_path: Path):
    refused = dry_run(tmp_path / "refused", KAGGLE_40K)
    assert refused.returncode != 0
    assert ("invalid configuration for dataset kaggle: distributed.shard_sim.batch_per_rank 512 x 128 ranks (16x8) "
            "simulates a global batch of 65,536 samples") in refused.stdout + refused.stderr
    skipped = dry_run(tmp_path / "skipped", KAGGLE_40K, WEAK_TRAINED)
    assert skipped.returncode == 0, skipped.stderr
    out = skipped.stdout + skipped.stderr
    assert f"hotcold: 5 scale-out run(s) skipped, each with an infeasible record: {SKIP_REASON}" in out
    assert "rule device_infeasible:" in out and "results/runs/kaggle/sharded/row/world~16-rpn~8/seed~0" in out
