"""Weak scaling: shard-sim rows state their batch (per-rank and fixed sweeps, a batch too big); a trained run at a
per-rank batch records both batches."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from hotcold.cli import main
from hotcold.run_config import RunConfig
from hotcold.distributed.batch import GLOBAL, PER_RANK, sweep_batches
from hotcold.distributed.shardsim import Scale, shard_sim


def test_sweeps_are_per_rank_at_every_scale_and_fixed_where_it_differs():
    assert sweep_batches([2, 4, 128], 1024, 512, True) == [(PER_RANK, 512, [0, 1, 2]), (GLOBAL, None, [1, 2])]
    assert sweep_batches([2, 4, 128], 1024, 512, False) == [(PER_RANK, 512, [0, 1, 2])]
    assert sweep_batches([2, 4], 1024, None, True) == [(GLOBAL, None, [0, 1])]
    assert sweep_batches([2], 1024, 512, True) == [(PER_RANK, 512, [0])]  # 512 x 2 is the fixed batch: once


def test_shard_sim_rows_state_their_batch(tmp_path: Path, small_dataset):
    """Per-rank rows at batch_per_rank x world, equal to a fixed-batch simulation of that global batch."""
    out = tmp_path / "sim.csv"
    run_config = {"train": {"batch_size": 32, "steps": 3, "warmup_steps": 0}}
    code = main(["shard-sim", "--dataset", str(small_dataset.path), "--run-config", json.dumps(run_config),
                 "--out", str(out), "--plans", "row", "--scales", "2x1", "2x2", "--headrooms", "1.0",
                 "--batch-per-rank", "16"])
    assert code in (0, None)
    frame = pd.read_csv(out)
    got = sorted(zip(frame.batching, frame.world, frame.batch_size, frame.batch_per_rank))
    assert got == [(GLOBAL, 4, 32, 8), (PER_RANK, 2, 32, 16), (PER_RANK, 4, 64, 16)]
    cfg = RunConfig.from_dict({"dataset": "-", "method": "-", "train": {**run_config["train"], "batch_size": 64}})
    fixed64 = shard_sim(small_dataset, cfg, ["row"], [Scale(2, 2)], [1.0])[0]
    weak = frame[(frame.batching == PER_RANK) & (frame.world == 4)].iloc[0]
    assert fixed64["batch_size"] == 64
    for col in ("input_a2a_bytes", "output_a2a_bytes", "grad_a2a_bytes", "inter_node_a2a_bytes"):
        assert weak[col] == pytest.approx(fixed64[col])
    smaller = frame[(frame.batching == GLOBAL) & (frame.world == 4)].iloc[0]
    assert smaller.inter_node_a2a_bytes < weak.inter_node_a2a_bytes  # half the samples a step


def test_a_weak_scaled_batch_larger_than_the_training_split_names_the_option(tmp_path: Path, small_dataset, capsys):
    start, stop = small_dataset.split("train")
    per_rank = (stop - start) // 4 + 1
    code = main(["shard-sim", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "sim.csv"),
                 "--plans", "row", "--scales", "2x2", "--headrooms", "1.0", "--batch-per-rank", str(per_rank)])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "sim.csv").exists()
    assert f"--batch-per-rank (distributed.shard_sim.batch_per_rank) {per_rank} x 4 ranks (2x2)" in err
    assert f"more than the {stop - start:,} samples" in err


def test_the_cli_rejects_a_bad_per_rank_batch(tmp_path: Path, small_dataset, capsys):
    with pytest.raises(SystemExit):
        main(["shard-sim", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "s.csv"),
              "--batch-per-rank", "0"])
    assert "--batch-per-rank must be a positive integer or 'none', got '0'" in capsys.readouterr().err


@pytest.mark.slow  # a torchrun launch of 2 ranks: ~30 s on 2 loaded cores
def test_a_trained_run_at_a_per_rank_batch_records_both_batches(tmp_path: Path, small_dataset):
    """--nproc 2 of a config at 16 samples per rank (stated for world 4): 32 samples a step, in config and summary."""
    run_config = {"dataset": "small", "method": "sharded", "variant": "row", "store": {"plan": "row"},
                  "train": {"steps": 3, "warmup_steps": 0, "eval_samples": 64},
                  "distributed": {"world": 4, "ranks_per_node": 2, "batch_per_rank": 16}}
    out = tmp_path / "run"
    code = main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(run_config),
                 "--out", str(out), "--nproc", "2", "--threads", "2", "--device", "cpu", "--no-progress"])
    assert code == 0
    rec = json.loads((out / "record.json").read_text())
    assert rec["status"] == "ok"
    dist = rec["config"]["distributed"]
    assert (rec["config"]["train"]["batch_size"], dist["world"], dist["ranks_per_node"], dist["batch_per_rank"]) == \
        (32, 2, 2, 16)
    assert (rec["summary"]["batch_size"], rec["summary"]["batch_per_rank"], rec["summary"]["world"]) == (32, 16, 2)
