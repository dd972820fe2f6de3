"""Bad configuration fails early with a message naming the problem."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from hotcold.cli import main, parser
from hotcold.config import (AggregateConfig, ConfigError, DistributedConfig, ModelConfig, ProfileConfig, ShardSimConfig, SimulateConfig, TimingConfig, TrainConfig, parse_yaml, read_yaml)
from hotcold.run_config import RunConfig

SCHEMA = Path(__file__).resolve().parents[1] / "workflows" / "schemas" / "config.schema.yaml"
TYPED_SECTIONS = {"model": ModelConfig, "train": TrainConfig, "timing": TimingConfig, "profile": ProfileConfig,
                  "simulate": SimulateConfig, "aggregate": AggregateConfig}

BASE = {"dataset": "d", "method": "hybrid"}


def test_yaml_is_read_as_pyyamls_safe_loader_reads_it(tmp_path):
    """libyaml's loader where PyYAML has it, the same data; a file that does not parse says what the Python
    loader says."""
    for path in sorted((Path(__file__).resolve().parents[1] / "workflows").rglob("*.yaml")):
        assert parse_yaml(path.read_text()) == yaml.safe_load(path.read_text()), path
    (tmp_path / "bad.yaml").write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml, line 2, column 2: not valid YAML: expected ',' or ']'"):
        read_yaml(tmp_path / "bad.yaml")


def test_defaults_resolve_and_round_trip():
    cfg = RunConfig.from_dict(BASE)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    json.dumps(cfg.to_dict())


@pytest.mark.parametrize("data, message", [
    ({**BASE, "modle": {}}, r"unknown key\(s\) \['modle'\]"),
    ({**BASE, "train": {"batch_sise": 3}}, r"train: unknown key\(s\) \['batch_sise'\]"),
    ({**BASE, "train": {"batch_size": 0}}, "batch_size must be a positive integer"),
    ({**BASE, "train": {"row_optimizer": "adam"}}, "row_optimizer must be one of"),
    ({**BASE, "train": {"steps": 10, "warmup_steps": 10}}, "warmup_steps must be in"),
    ({**BASE, "model": {"embedding_dim": 8, "bottom_mlp": [32, 16]}}, "bottom_mlp must end with embedding_dim=8"),
    ({**BASE, "model": {"top_mlp": [32, 2]}}, "top_mlp must be positive integers ending with 1"),
    ({**BASE, "timing": {"device": "tpu"}}, "device must be auto, cpu or cuda"),
    ({"method": "hybrid"}, "'dataset' must be a non-empty string"),
    ({**BASE, "train": {"batch_size": True}}, "batch_size must be a positive integer, got True"),
    ({**BASE, "train": {"steps": True, "warmup_steps": 0}}, "steps must be a positive integer, got True"),
    ({**BASE, "train": {"eval_samples": False}}, "eval_samples must be an integer >= 0"),
    ({**BASE, "train": {"lr": float("inf")}}, "lr must be a finite number > 0, got inf"),
    ({**BASE, "train": {"dense_lr": float("nan")}}, "dense_lr must be a finite number > 0, got nan"),
    ({**BASE, "train": {"lr": True}}, "lr must be a finite number > 0, got True"),
    ({**BASE, "model": {"embedding_dim": True, "bottom_mlp": [True]}}, "embedding_dim must be a positive integer"),
    ({**BASE, "timing": {"window": True}}, "window must be a positive integer"),
    ({**BASE, "timing": {"repeats": 0}}, "repeats must be a positive integer, got 0"),
    ({**BASE, "timing": {"repeats": 2.0}}, "repeats must be a positive integer, got 2.0"),
    ({**BASE, "timing": {"interleave": True}}, r"timing: unknown key\(s\) \['interleave'\]"),
    ({**BASE, "seed": True}, "seed must be an integer >= 0, got True"),
    ({**BASE, "seed": -1}, "seed must be an integer >= 0"),
])
def test_bad_run_config_is_rejected(data, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(data)


def test_cli_reports_bad_config(tmp_path, capsys, small_dataset):
    code = main(["train", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "run"),
                 "--run-config", json.dumps({**BASE, "train": {"lr": -1}}), "--no-progress"])
    assert code == 2
    assert "lr must be a finite number > 0" in capsys.readouterr().err
    assert not (tmp_path / "run" / "record.json").exists()


def test_cli_reports_missing_dataset(tmp_path, capsys):
    code = main(["train", "--dataset", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"),
                 "--run-config", json.dumps(BASE), "--no-progress"])
    assert code == 2
    assert "not a dataset directory" in capsys.readouterr().err


def schema_defaults(section: str) -> dict:
    """The defaults the workflow schema gives the keys of one top-level section."""
    props = read_yaml(SCHEMA)["properties"][section]["properties"]
    return {key: spec["default"] for key, spec in props.items() if "default" in spec}


@pytest.mark.parametrize("section", sorted(TYPED_SECTIONS))
def test_typed_defaults_are_the_schemas(section):
    """One source of defaults: every typed field defaults to what the schema says (lists as tuples)."""
    schema = schema_defaults(section)
    typed = {f.name: getattr(TYPED_SECTIONS[section](), f.name) for f in dataclasses.fields(TYPED_SECTIONS[section])}
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in schema.items() if k in typed} == typed
    # simulate's policies default to every policy; timing.interleave is the workflow's layout of jobs, not a run's
    assert set(schema) - set(typed) <= {"policies", "interleave"}


def test_shard_sim_defaults_are_the_schemas():
    """distributed.shard_sim in the schema and ShardSimConfig (the CLI's defaults) agree."""
    props = read_yaml(SCHEMA)["properties"]["distributed"]["properties"]["shard_sim"]["properties"]
    schema = {key: tuple(spec["default"]) if isinstance(spec["default"], list) else spec["default"]
              for key, spec in props.items()}
    assert schema == dataclasses.asdict(ShardSimConfig())
    shard_sim = parser().parse_args(["shard-sim", "--dataset", "d", "--out", "o"])
    # steps: the workflow's, carried by the run config's train.steps (no flag)
    assert (tuple(shard_sim.plans), tuple(shard_sim.scales), tuple(shard_sim.headrooms), shard_sim.batch_per_rank,
            shard_sim.fixed_batch) == dataclasses.astuple(ShardSimConfig())[:-1]


def test_trained_scales_are_valid_distributed_configs():
    """The schema's default trained scales are worlds the typed config accepts."""
    props = read_yaml(SCHEMA)["properties"]["distributed"]["properties"]
    for scale in props["scales"]["default"]:
        DistributedConfig(**scale).validate("distributed")


def test_cli_defaults_are_the_typed_defaults():
    p = parser()
    profile = p.parse_args(["profile", "--dataset", "d", "--out", "o"])
    assert (profile.sample_fraction, profile.window, profile.batches) == dataclasses.astuple(ProfileConfig())
    assert profile.batch_size == TrainConfig().batch_size
    simulate = p.parse_args(["simulate", "--dataset", "d", "--out", "o"])
    assert (tuple(simulate.ratios), tuple(simulate.windows), tuple(simulate.fae_budgets),
            tuple(simulate.fae_run_lengths), simulate.fae_sample_fraction) == dataclasses.astuple(SimulateConfig())[:-1]
    assert p.parse_args(["aggregate"]).exact_rtol == AggregateConfig().exact_rtol


@pytest.mark.parametrize("lr", ["Infinity", "NaN", "true"])
def test_cli_rejects_a_non_finite_learning_rate(tmp_path, capsys, small_dataset, lr):
    run_config = f'{{"dataset": "d", "method": "hybrid", "train": {{"lr": {lr}}}}}'
    code = main(["train", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "run"),
                 "--run-config", run_config, "--no-progress"])
    assert code == 2
    assert "lr must be a finite number > 0" in capsys.readouterr().err


# --- weak scaling: distributed.batch_per_rank --------------------------------------------------------------------

def test_a_per_rank_batch_sets_the_global_batch():
    """batch_per_rank x world is the global batch; a run config that states both must agree; --nproc follows it."""
    cfg = RunConfig.from_dict({**BASE, "method": "sharded", "distributed": {"world": 4, "ranks_per_node": 2,
                                                                            "batch_per_rank": 64}})
    assert cfg.train.batch_size == 256 and cfg.distributed.batch_per_rank == 64
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # the record's config reads back the same
    stated = RunConfig.from_dict({**BASE, "train": {"batch_size": 256},
                                  "distributed": {"world": 4, "ranks_per_node": 2, "batch_per_rank": 64}})
    assert stated == dataclasses.replace(cfg, method="hybrid", store={})  # a method's options are its own
    assert cfg.with_world(8).train.batch_size == 512 and cfg.with_world(8).distributed.world == 8
    fixed = RunConfig.from_dict({**BASE, "distributed": {"world": 4, "ranks_per_node": 2}})
    assert fixed.distributed.batch_per_rank is None and fixed.with_world(2).train.batch_size == 1024


@pytest.mark.parametrize("distributed, train, message", [
    ({"world": 4, "batch_per_rank": 0}, {}, "distributed: batch_per_rank must be a positive integer or null, got 0"),
    ({"world": 4, "batch_per_rank": 2.5}, {}, "batch_per_rank must be a positive integer or null, got 2.5"),
    ({"world": 4, "batch_per_rank": True}, {}, "batch_per_rank must be a positive integer or null, got True"),
    ({"world": 4, "batch_per_rank": 64}, {"batch_size": 1024},
     r"train.batch_size 1024 contradicts distributed.batch_per_rank 64 x world 4 = 256"),
])
def test_a_bad_per_rank_batch_is_rejected(distributed, train, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict({**BASE, "train": train, "distributed": distributed})


def test_a_global_batch_larger_than_the_training_split_names_its_option(small_dataset):
    from hotcold.distributed.batch import batch_option, check_batch_fits

    start, stop = small_dataset.split("train")
    check_batch_fits(stop - start, small_dataset, "train.batch_size")  # one whole split is one batch
    weak = DistributedConfig(world=4, ranks_per_node=2, batch_per_rank=stop - start)
    with pytest.raises(ConfigError, match=rf"^distributed.batch_per_rank {stop - start} x world 4: a global batch "
                                          rf"of {4 * (stop - start):,} samples is more than the {stop - start:,} "
                                          "samples of dataset"):
        check_batch_fits(weak.global_batch(1024), small_dataset, batch_option(weak))
