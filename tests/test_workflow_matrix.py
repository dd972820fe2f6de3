"""The workflow's run matrix (``hotcold.workflow``): which runs a config asks for, with which settings.

The dry-run tests (tests/test_workflow.py) show that Snakemake applies it; these pin the matrix itself.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from hotcold import methods
from hotcold.config import ConfigError, read_yaml
from hotcold.run_config import RunConfig
from hotcold.workflow.matrix import Matrix, Run
from hotcold.workflow.settings import merged, without_nulls

snakemake_utils = pytest.importorskip(
    "snakemake.utils", reason="configs are validated as Snakemake validates them; `make` installs it (envs/requirements.txt)")

REPO = Path(__file__).resolve().parents[1]
DEFAULT = read_yaml(REPO / "workflows/config/default.yaml")
SCHEMA = str(REPO / "workflows/schemas/config.schema.yaml")


def matrix(**overrides) -> Matrix:
    """The default config with ``overrides`` merged in, validated with the schema's defaults, as Snakemake does."""
    config = merged(copy.deepcopy(DEFAULT), overrides)
    snakemake_utils.validate(config, SCHEMA)
    return Matrix(config)


def test_merge_replaces_values_merges_mappings_and_a_null_removes():
    base = {"a": 1, "b": {"x": 1, "y": 2}, "c": 3}
    assert merged(base, {"a": 5, "b": {"y": None, "z": 3}, "c": None}) == {"a": 5, "b": {"x": 1, "z": 3}}
    assert without_nulls({"a": None, "b": {"c": None, "d": 1}}) == {"b": {"d": 1}}


def test_the_default_matrix():
    m = matrix()
    runs = m.runs()
    one, scale_out = [r for r in runs if not r.scale_out], [r for r in runs if r.scale_out]
    assert m.datasets() == ["kaggle", "terabyte", "taobao", "multihot"] and m.config["seeds"] == [0]
    # 14 variants of the seven harness methods and the peer's 5, on four datasets
    assert len(one) == 4 * (14 + 5)
    # 4 ranks on 2 nodes: kaggle: 4 plans + proactive; taobao: + flexshard; terabyte and multihot: none
    assert len(scale_out) == 5 + 6 and {(r.world, r.ranks_per_node) for r in scale_out} == {(4, 2)}
    assert {r.method for r in scale_out} == set(methods.names(spans_ranks=True))
    assert Run("kaggle", "sharded", "row", 0, 4, 2).dir == "results/runs/kaggle/sharded/row/world~4-rpn~2/seed~0"
    assert Run("kaggle", "lru", "1.5pct", 0).dir == "results/runs/kaggle/lru/1.5pct/seed~0"


def test_run_configs_carry_the_dataset_overrides():
    m = matrix(datasets={"taobao": {"methods": {"lru": {"1.5pct": {"cache_ratio": 0.07}}, "fae": None},
                                    "train": {"batch_size": 128}}})
    taobao = m.run_config(Run("taobao", "lru", "1.5pct", 0))
    kaggle = m.run_config(Run("kaggle", "lru", "1.5pct", 0))
    assert taobao["store"] == {"cache_ratio": 0.07} and taobao["train"]["batch_size"] == 128
    assert kaggle["store"] == {"cache_ratio": 0.015} and kaggle["train"]["batch_size"] == 1024
    assert not any(r.dataset == "taobao" and r.method == "fae" for r in m.runs())
    four = m.run_config(Run("kaggle", "sharded", "row", 0, 4, 2))
    assert four["distributed"] == {"world": 4, "ranks_per_node": 2, "wire_dtype": "float32", "exact": False}
    assert four["train"]["steps"] == 24
    assert "interleave" not in four["timing"]


def test_the_wire_reaches_the_scale_out_runs_and_shard_sim():
    m = matrix(distributed={"wire_dtype": "bfloat16"})
    want = {"wire_dtype": "bfloat16", "exact": False}
    assert m.shard_sim_config("kaggle")["distributed"] == want
    four = m.run_config(Run("kaggle", "sharded", "row", 0, 4, 2))
    assert {k: four["distributed"][k] for k in want} == want
    assert "distributed" not in m.run_config(Run("kaggle", "lru", "1.5pct", 0))


def test_gpu_only_variants_are_infeasible_on_a_cpu_without_a_job():
    cpu, cuda = matrix(timing={"device": "cpu"}), matrix(timing={"device": "cuda"})
    gone = cpu.device_infeasible()
    assert {(r.method, r.variant) for r in gone} == {("fbgemm", v) for v in
                                                      ("lru-1.5pct", "lru-5pct", "lfu-1.5pct", "lfu-5pct")}
    assert len(gone) == 4 * len(cpu.datasets()) == 16 and cuda.device_infeasible() == []
    assert "needs a GPU" in cpu.infeasible_reason(gone[0])
    assert ("fbgemm", "lru-5pct") not in cpu.interleaved_runs("kaggle")
    assert ("fbgemm", "lru-5pct") in cuda.interleaved_runs("kaggle") and ("fbgemm", "base") in cpu.interleaved_runs(
        "kaggle")


def test_with_auto_the_job_finds_out_where_it_runs(monkeypatch):
    """``timing.device: auto`` is never resolved where Snakemake runs: without a GPU there, the GPU-only variants
    are still trained by their jobs (which record them infeasible on a CPU, test_fbgemm), as on a GPU machine."""
    import torch

    for here in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: here)
        auto = matrix()
        assert auto.device() == "auto" and auto.device_infeasible() == []
        assert ("fbgemm", "lru-5pct") in auto.interleaved_runs("kaggle")


def test_simulations_follow_the_trained_sizes_scales_and_headrooms():
    m = matrix(distributed={"scales": [{"world": 8, "ranks_per_node": 4}]})
    assert m.trained_ratios("kaggle") == [0.015, 0.05, 0.062, 0.124, 0.248]
    assert m.shard_sim_scales() == ["2x1", "2x2", "4x8", "16x8", "2x4"]
    assert m.shard_sim_headrooms() == [1.0, 1.25, 1.5, 2.0]
    roomy = matrix(methods={"sharded": {"row": {"memory_headroom": 3.0}}})
    assert roomy.shard_sim_headrooms() == [1.0, 1.25, 1.5, 2.0, 3.0]


def test_the_check_names_what_is_wrong_after_the_merge():
    matrix().check()
    bad = matrix(datasets={"taobao": {"methods": {"lru": {"1.5pct": {"cache_rows": 500}}}}})
    with pytest.raises(ConfigError, match=r"invalid configuration for dataset taobao: methods\.lru\.1\.5pct: "
                                          r"cache_ratio and cache_rows are alternatives"):
        bad.check()
    with pytest.raises(ConfigError, match="train.batch_size 1024 is not divisible by distributed.scales world 3"):
        matrix(distributed={"scales": [{"world": 3, "ranks_per_node": 1}]}).check()
    with pytest.raises(ConfigError, match="profile.window=20 is more than profile.batches=10"):
        matrix(profile={"window": 20, "batches": 10}).check()


def test_a_per_rank_batch_gives_each_trained_scale_its_global_batch():
    """distributed.train.batch_per_rank: batch_size = per-rank x world at every trained scale; null: the fixed one."""
    scales = [{"world": 2, "ranks_per_node": 1}, {"world": 4, "ranks_per_node": 2}]
    m = matrix(distributed={"scales": scales, "train": {"batch_per_rank": 96}})
    m.check()
    for world, rpn in ((2, 1), (4, 2)):
        cfg = m.run_config(Run("kaggle", "sharded", "row", 0, world, rpn))
        assert cfg["train"]["batch_size"] == 96 * world and "batch_per_rank" not in cfg["train"]
        assert cfg["distributed"] == {"world": world, "ranks_per_node": rpn, "batch_per_rank": 96,
                                      "wire_dtype": "float32", "exact": False}
        typed = RunConfig.from_dict(cfg)
        assert (typed.train.batch_size, typed.distributed.batch_per_rank) == (96 * world, 96)
    assert m.run_config(Run("kaggle", "lru", "1.5pct", 0))["train"]["batch_size"] == 1024  # one process: unchanged
    assert "batch_per_rank" not in m.shard_sim_config("kaggle")["train"]
    fixed = matrix(distributed={"scales": scales})
    assert [fixed.run_config(Run("kaggle", "sharded", "row", 0, w, r))["train"]["batch_size"] for w, r in
            ((2, 1), (4, 2))] == [1024, 1024]
    # a per-rank batch splits at any world, where the fixed 1024 does not
    matrix(distributed={"scales": [{"world": 3, "ranks_per_node": 1}], "train": {"batch_per_rank": 100},
                        "shard_sim": {"fixed_batch": False}}).check()


def test_shard_sims_are_weak_scaled_by_default_with_the_fixed_batch_beside():
    m = matrix()
    assert (m.shard_sim_batch_per_rank(), m.shard_sim_fixed_batch()) == (512, True)
    fixed = copy.deepcopy(m.config)  # a null in a config file keeps the fixed global batch (merged() would drop it)
    fixed["distributed"]["shard_sim"]["batch_per_rank"] = None
    snakemake_utils.validate(fixed, SCHEMA)
    assert Matrix(fixed).shard_sim_batch_per_rank() is None
    # the fixed global batch must split at every simulated scale: a 3x1 scale cannot split 1024
    with pytest.raises(ConfigError, match=r"distributed.shard_sim.fixed_batch simulates the fixed global batch "
                                          r"train.batch_size 1024, which 3 ranks \(3x1\) cannot split evenly"):
        matrix(distributed={"shard_sim": {"scales": ["3x1"]}}).check()
    fixed["distributed"]["shard_sim"]["scales"] = ["3x1"]
    with pytest.raises(ConfigError, match=r"distributed.shard_sim.batch_per_rank null simulates"):
        Matrix(fixed).check()
    matrix(distributed={"shard_sim": {"scales": ["3x1"], "fixed_batch": False}}).check()


@pytest.mark.parametrize("section, value", [("train", 0), ("train", "64"), ("shard_sim", 0), ("shard_sim", 1.5)])
def test_the_schema_rejects_a_bad_per_rank_batch(section, value):
    with pytest.raises(Exception, match="batch_per_rank"):
        matrix(distributed={section: {"batch_per_rank": value}})


def test_simulations_replay_their_own_step_counts_when_set():
    """simulate.steps and distributed.shard_sim.steps replace the replayed steps only; null keeps the train sections'."""
    m = matrix()
    assert m.simulate_config("kaggle")["train"] == m.section("kaggle", "train")
    assert m.shard_sim_config("kaggle")["train"]["steps"] == m.scale_out_train("kaggle")["steps"]
    m = matrix(simulate={"steps": 5000}, distributed={"shard_sim": {"steps": 300}})
    sim, shard = m.simulate_config("kaggle")["train"], m.shard_sim_config("kaggle")["train"]
    assert sim == {**m.section("kaggle", "train"), "steps": 5000}
    assert shard == {**m.scale_out_train("kaggle"), "steps": 300}
    assert m.run_config(Run("kaggle", "lru", "1.5pct", 0))["train"]["steps"] == m.section("kaggle", "train")["steps"]
    with pytest.raises(Exception, match="steps"):
        matrix(simulate={"steps": 0})


def test_a_dataset_sets_its_own_shard_sim_steps():
    """datasets.<name>.shard_sim.steps replaces distributed.shard_sim.steps for that dataset's shard-sim only (the
    default's multi-hot data: 5 batches of 65,536 samples at 16x8)."""
    m = matrix()
    assert m.shard_sim_config("multihot")["train"] == {**m.scale_out_train("multihot"), "steps": 5, "warmup_steps": 4}
    assert m.shard_sim_config("kaggle")["train"] == m.scale_out_train("kaggle")
    assert m.shard_sim_config("kaggle")["train"]["steps"] == 24
    RunConfig.from_dict({**m.shard_sim_config("multihot"), "dataset": "multihot", "method": "sharded"})  # valid
    m = matrix(distributed={"shard_sim": {"steps": 300}}, datasets={"multihot": {"shard_sim": {"steps": None}}})
    assert m.shard_sim_config("multihot")["train"]["steps"] == m.shard_sim_config("kaggle")["train"]["steps"] == 300
    with pytest.raises(Exception, match="steps"):
        matrix(datasets={"kaggle": {"shard_sim": {"steps": 0}}})
    with pytest.raises(Exception, match="plans"):
        matrix(datasets={"kaggle": {"shard_sim": {"plans": ["row"]}}})


def test_the_group_jobs_of_each_dataset():
    """default.yaml: a job of one-process runs per dataset, and one of scale-out runs per dataset and trained scale
    (distributed.group_runs); without grouping the scale-out runs are nobody's group."""
    m = matrix()
    assert list(m.groups("kaggle")) == [(1, 1), (4, 2)] and list(m.groups("multihot")) == [(1, 1)]
    assert m.groups("kaggle")[(4, 2)] == [("sharded", s) for s in ("table", "row", "column", "balanced")] + \
        [("proactive", "row")]
    assert m.grouped(Run("kaggle", "sharded", "row", 0, 4, 2)) and m.grouped(Run("kaggle", "lru", "1.5pct", 0))
    alone = matrix(distributed={"group_runs": False}, timing={"interleave": False})
    assert alone.groups("kaggle") == {} and not alone.grouped(Run("kaggle", "sharded", "row", 0, 4, 2))
