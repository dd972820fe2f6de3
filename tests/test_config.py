"""Bad configuration fails early with a message naming the problem."""
from __future__ import annotations

import json

import pytest

from hotcold.cli import main
from hotcold.config import ConfigError, RunConfig

BASE = {"dataset": "d", "method": "hybrid"}


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
])
def test_bad_run_config_is_rejected(data, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(data)


def test_cli_reports_bad_config(tmp_path, capsys, small_dataset):
    code = main(["train", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "run"),
                 "--run-config", json.dumps({**BASE, "train": {"lr": -1}}), "--no-progress"])
    assert code == 2
    assert "lr must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "run" / "record.json").exists()


def test_cli_reports_missing_dataset(tmp_path, capsys):
    code = main(["train", "--dataset", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"),
                 "--run-config", json.dumps(BASE), "--no-progress"])
    assert code == 2
    assert "not a dataset directory" in capsys.readouterr().err
