"""The TorchRec peer: its collectives' bytes against a hand count, and options that fail before launching."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hotcold.cli import main
from hotcold.distributed.torchrec_peer import available


def needs_torchrec() -> None:
    """Skip where the optional peer is missing; asked when the test runs, not at collection (importing TorchRec
    takes seconds in every test process)."""
    reason = available()
    if reason is not None:
        pytest.skip(f"optional peer: {reason}")

BATCH_PER_RANK, STEPS, WORLD = 32, 3, 2


@pytest.mark.slow  # TorchRec's two ranks take 26 s on 2 cores, most of it importing TorchRec
def test_torchrec_bytes_match_a_hand_count(small_dataset, tmp_path):
    """Two ranks, one id per table and sample, column-wise (a table wide enough to split: some tables have a
    shard on each rank, others both shards on one, as table-wise). Each shard's rank gets the other rank's ids
    and lengths (int64 each), once per rank holding shards of the table, and sends back the other rank's
    pooled vectors at the shard's width; the gradients come the same way. One launch: each costs seconds."""
    needs_torchrec()
    sharding, dim = "column_wise", 256
    out = tmp_path / "peer.json"
    run = json.dumps({"seed": 0, "train": {"steps": STEPS, "warmup_steps": 0},
                      "model": {"embedding_dim": dim, "bottom_mlp": [16, dim]}})
    proc = subprocess.run([sys.executable, "-m", "hotcold", "torchrec-peer", "--dataset", str(small_dataset.path),
                           "--run-config", run, "--out", str(out), "--nproc", str(WORLD), "--batch-per-rank",
                           str(BATCH_PER_RANK), "--sharding", sharding], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    plan = got["plan"]
    assert got["steps"] == STEPS and {p["sharding_type"] for p in plan} == {sharding}
    assert all(sum(cols for _, _, cols in p["shards"]) == dim for p in plan)
    assert any(len({rank for rank, _, _ in p["shards"]}) == WORLD for p in plan), "no table split over ranks"
    other = WORLD - 1
    ids = sum(len({rank for rank, _, _ in p["shards"]}) for p in plan) * other * BATCH_PER_RANK * 2 * 8
    vectors = sum(cols for p in plan for _, _, cols in p["shards"]) * other * BATCH_PER_RANK * 4 * 2
    per_step = got["bytes_per_step"]
    assert per_step["all_to_all:float32"] == vectors
    splits = per_step["all_to_all:int64"] - ids                  # the split sizes exchanged before each call
    assert 0 <= splits <= 16 * WORLD * WORLD
    assert "all_reduce:float32" not in per_step                 # no data-parallel table


def test_bad_options_fail_before_any_rank_starts(small_dataset, tmp_path, capsys):
    for extra, words in ((["--sharding", "row_wise"], "--sharding must be one of"),
                         (["--nproc", "3", "--ranks-per-node", "2"], "not a multiple"),
                         (["--batch-per-rank", "0"], "--batch-per-rank must be a positive integer")):
        assert main(["torchrec-peer", "--dataset", str(small_dataset.path), "--out", str(tmp_path / "x.json"),
                     *extra]) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
