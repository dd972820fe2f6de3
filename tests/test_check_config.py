"""A config file's mistakes in one line naming the file, the line or the setting, and what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.workflow.schema import check_config

pytest.importorskip("jsonschema", reason="the schema check needs jsonschema (make setup installs it)")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "more.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "expected"), [
    ("seeds: [0, 1\nthreads: 2\n", "more.yaml, line 2, column 8: not valid YAML: expected ',' or ']'"),
    ("train:\n  stesp: 3\n", "more.yaml: train: Unevaluated properties are not allowed ('stesp' was unexpected); "
                             "allowed: batch_size, steps,"),
    ("methods:\n  lru:\n    a: {cache_ration: 0.1}\n", "methods.lru.a: Unevaluated properties are not allowed "
                                                       "('cache_ration' was unexpected); allowed: cache_ratio,"),
    ("timing:\n  device: gpu\n", "timing.device: 'gpu' is not one of ['auto', 'cpu', 'cuda']"),
    ("distributed:\n  scales: [{world: 3, ranks_per_node: 1}]\n",
     "train.batch_size 1024 is not divisible by distributed.scales world 3"),
], ids=["yaml", "train-key", "store-option", "enum", "batch-split"])
def test_a_bad_config_is_named_in_one_line(tmp_path, text, expected):
    with pytest.raises(ConfigError) as e:
        check_config(write(tmp_path, text))
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_good_config_says_what_it_asks_for(tmp_path):
    line = check_config(write(tmp_path, "seeds: [0, 1]\n"))
    assert "valid; 4 dataset(s) (kaggle, terabyte, taobao, multihot)" in line


def test_a_verbs_run_config_file_with_a_yaml_error_is_one_line(tmp_path, capsys):
    bad = write(tmp_path, "train: {steps: 3\n")
    assert main(["train", "--dataset", str(tmp_path), "--run-config", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hotcold train: error: ") and f"{bad}, line 2" in err and "\n" not in err, err
