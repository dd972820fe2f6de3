"""The ``hotcold`` command line: every verb's help, and the real-data path end to end on tiny files.

Criteo Kaggle (a ``train.txt`` inside a tar.gz) and Criteo Terabyte (day
files) are served by a local HTTP server and fetched with ``download``;
Taobao is a local CSV given as ``source.path``. Each dataset is then
preprocessed, profiled and trained on, all through ``hotcold.cli.main``.
"""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from hotcold.cli import main
from hotcold.data.format import Dataset

VERBS = ("generate", "download", "preprocess", "profile", "dataset-stats", "train", "train-group", "infeasible", "simulate",
         "shard-sim", "torchrec-peer", "scaleout-tables", "cache-sim", "aggregate", "figures", "claims", "calibrate",
         "costmodel-validation", "bench", "hit-rate-curves", "check-config", "resume", "gpu-check")


def test_every_verb_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out.split("{", 1)[1].split("}", 1)[0]
    assert set(listed.split(",")) == set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    assert f"usage: hotcold {verb}" in capsys.readouterr().out


# ---------------------------------------------------------------- tiny raw files


def criteo_lines(n: int, seed: int) -> str:
    """Criteo TSV: label, 13 integers (some empty), 26 hex ids (some empty) from small skewed pools."""
    rng = np.random.default_rng(seed)
    pools = rng.integers(0, 2**32, (26, 40))
    lines = []
    for _ in range(n):
        ints = ["" if rng.random() < 0.1 else str(v) for v in rng.integers(0, 500, 13)]
        picks = np.minimum(rng.zipf(1.4, 26) - 1, 39)
        cats = ["" if rng.random() < 0.05 else f"{pools[t, picks[t]]:08x}" for t in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3)), *ints, *cats]))
    return "\n".join(lines) + "\n"


def taobao_csv(users: int, seed: int) -> str:
    """UserBehavior.csv lines: user, item, category, behaviour, timestamp (no header)."""
    rng = np.random.default_rng(seed)
    item_cat = rng.integers(0, 15, 200)
    lines = []
    for user in range(users):
        t = 1_511_540_000 + int(rng.integers(0, 100_000))     # in the dataset's period (time_range)
        for _ in range(int(rng.integers(8, 16))):
            item = int(min(rng.zipf(1.3) - 1, 199))
            behaviour = rng.choice(["pv", "pv", "pv", "cart", "fav", "buy"])
            t += int(rng.integers(1, 5000))
            lines.append(f"{1000 + user},{5000 + item},{700 + item_cat[item]},{behaviour},{t}")
    return "\n".join(lines) + "\n"


def run_cli(*args: str) -> None:
    assert main(list(args)) == 0, args


def prepare_train_and_profile(tmp_path: Path, name: str, spec: dict, method: str = "hybrid") -> Dataset:
    """download -> preprocess -> profile -> train with ``spec``; returns the dataset."""
    raw, data, prof, run = (tmp_path / d / name for d in ("raw", "data", "profiles", "runs"))
    spec_json = json.dumps(spec)
    run_cli("download", "--spec", spec_json, "--out", str(raw), "--name", name, "--no-progress")
    assert (raw / "source.json").is_file()
    run_cli("preprocess", "--spec", spec_json, "--raw", str(raw), "--out", str(data), "--name", name, "--no-progress")
    ds = Dataset.open(data)
    run_cli("profile", "--dataset", str(data), "--out", str(prof), "--batch-size", "32", "--window", "2",
            "--batches", "4")
    profile = json.loads((prof / "profile.json").read_text())
    assert profile["dataset"] == name and profile["params"]["train_rows"] == ds.split("train")[1]
    run_config = {"dataset": name, "method": method,
                  "train": {"batch_size": 32, "steps": 6, "warmup_steps": 1, "eval_batch_size": 256}}
    run_cli("train", "--dataset", str(data), "--run-config", json.dumps(run_config), "--out", str(run),
            "--threads", "1", "--device", "cpu", "--no-progress")
    record = json.loads((run / "record.json").read_text())
    assert record["dataset_manifest_sha256"] == ds.manifest_sha256
    assert record["summary"]["steps_timed"] == 5
    assert 0.0 <= record["metrics"]["auc"] <= 1.0
    return ds


def test_criteo_kaggle_from_a_served_archive(tmp_path: Path, file_server: tuple[str, Path]) -> None:
    url, root = file_server
    text = criteo_lines(700, seed=0).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("dac/train.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    (root / "criteo.tar.gz").write_bytes(buf.getvalue())
    ds = prepare_train_and_profile(tmp_path, "kaggle", {"kind": "criteo-kaggle", "url": f"{url}/criteo.tar.gz"})
    assert ds.num_tables == 26 and ds.num_dense == 13
    assert ds.split("train") == (0, 600)  # days 0-5 of 7 are train
    source = json.loads((tmp_path / "raw" / "kaggle" / "source.json").read_text())
    assert source["files"][0]["lines"] == 700


def test_criteo_terabyte_from_served_day_files(tmp_path: Path, file_server: tuple[str, Path]) -> None:
    url, root = file_server
    for day in (0, 1):
        (root / f"day_{day}.gz").write_bytes(gzip.compress(criteo_lines(300, seed=day).encode()))
    spec = {"kind": "criteo-terabyte", "url": url, "days": [0, 1],
            "preprocess": {"encoding": "modulo", "max_ind_range": 64}}
    ds = prepare_train_and_profile(tmp_path, "terabyte", spec, method="scratchpipe")
    assert ds.cardinalities == [64] * 26  # the modulo convention: max_ind_range rows per table
    assert ds.split("train") == (0, 300)   # all but the last day
    source = json.loads((tmp_path / "raw" / "terabyte" / "source.json").read_text())
    assert [f["name"] for f in source["files"]] == ["day_0.gz", "day_1.gz"]


def test_taobao_from_a_local_path(tmp_path: Path) -> None:
    csv = tmp_path / "UserBehavior.csv"
    csv.write_text(taobao_csv(60, seed=0))
    spec = {"kind": "taobao", "path": str(csv), "preprocess": {"max_length": 5}}
    ds = prepare_train_and_profile(tmp_path, "taobao", spec, method="device")
    assert ds.num_tables == 3 and ds.sequence["max_length"] == 5


def test_taobao_without_a_path_explains_the_download(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = json.dumps({"kind": "taobao"})
    assert main(["download", "--spec", spec, "--out", str(tmp_path / "raw"), "--name", "taobao"]) == 2
    err = capsys.readouterr().err
    assert "tianchi.aliyun.com" in err and "datasets.taobao.source.path" in err


def test_a_run_config_file_in_json_keeps_its_numbers(tmp_path: Path) -> None:
    """A .json file is read as JSON: YAML 1.1 would read 1e-08 as a string (as a record's config writes it)."""
    from hotcold.cli.args import load_mapping
    from hotcold.config import ConfigError

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"train": {"adagrad_eps": 1e-8, "lr": 0.05}}))
    assert load_mapping(str(path)) == {"train": {"adagrad_eps": 1e-8, "lr": 0.05}}
    (tmp_path / "run.yaml").write_text("train: {adagrad_eps: 1.0e-8}\n")
    assert load_mapping(str(tmp_path / "run.yaml")) == {"train": {"adagrad_eps": 1e-8}}
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="bad.json: not valid JSON"):
        load_mapping(str(tmp_path / "bad.json"))
