"""Runs that go wrong end clearly: a diverged run is marked (never an `ok` row), options that overflow are refused,
a launch over ranks leaves nothing running when it is stopped, and a rank that does not answer fails the run naming it.

The multi-rank cases launch ``hotcold train --nproc 2`` (torchrun, gloo) as a user would, and signal it.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.distributed import TCPStore

from hotcold.analysis.claims.table import claims_table
from hotcold.analysis.claims.catalog import Claim, Run
from hotcold.analysis.summary import summary_frame
from hotcold.analysis.tables_markdown import infeasible_markdown
from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.record_status import record_status
from hotcold.runs.records import steps_frame, write_run
from hotcold.runs.runner import train_run
from hotcold.train import DivergedError, DivergenceGuard
from hotcold.distributed.world import World, collective_failure, unanswered

ROOT = Path(__file__).resolve().parents[1]
LINUX = sys.platform.startswith("linux") and Path("/proc/self/stat").exists()


def run_config(method: str = "hybrid", **train) -> dict:
    return {"dataset": "small", "method": method, "variant": "base", "seed": 0,
            "train": {"batch_size": 64, "steps": 12, "warmup_steps": 2, "eval_samples": 512, **train}}


def train_cli(dataset, out: Path, cfg: dict) -> dict:
    assert main(["train", "--dataset", str(dataset.path), "--run-config", json.dumps(cfg), "--out", str(out),
                 "--threads", "1", "--no-progress"]) == 0
    return json.loads((out / "record.json").read_text())


# --- divergence -----------------------------------------------------------------------------------------------

def test_a_huge_learning_rate_ends_as_diverged_with_its_step(small_dataset, tmp_path, capsys):
    """Trial: ``lr: 1e30`` trained to AUC 0.5, log loss NaN and status ``ok``."""
    rec = train_cli(small_dataset, tmp_path / "run", run_config(lr=1e30))
    assert record_status(rec) == "diverged"
    assert 0 <= rec["diverged_step"] < 12 and f"at step {rec['diverged_step']} " in rec["reason"]
    assert "non-finite" in rec["reason"] and "lr 1e+30" in rec["reason"]
    assert "summary" not in rec and "metrics" not in rec  # no number to compare
    assert "diverged: non-finite" in capsys.readouterr().err


def test_the_guard_reports_the_first_non_finite_step_at_its_check():
    cfg = RunConfig.from_dict({**run_config(steps=10), "timing": {"window": 4}})
    guard = DivergenceGuard(cfg, World.single())
    losses = [0.5, 0.4, 0.3, 0.2, 0.1, float("inf"), float("nan"), 0.1]
    for i, loss in enumerate(losses):
        guard.see(i, torch.tensor(loss))
        if i < 7:
            guard.check(i)  # step 3 is checked (all finite); 5 and 6 wait for the check at 7
    with pytest.raises(DivergedError, match="non-finite loss at step 5 of 10") as e:
        guard.check(7)
    assert e.value.step == 5
    guard.finish([("top.0.weight", torch.ones(3))])
    with pytest.raises(DivergedError, match="non-finite parameter embedding.weight after the last step") as e:
        guard.finish([("top.0.weight", torch.ones(3)), ("embedding.weight", torch.tensor([1.0, float("-inf")]))])
    assert e.value.step == 9


def test_the_last_check_reads_a_large_table_in_chunks(monkeypatch):
    monkeypatch.setattr("hotcold.train.FINITE_CHUNK", 4)
    cfg = RunConfig.from_dict(run_config(steps=10))
    guard = DivergenceGuard(cfg, World.single())
    rows = torch.ones(5, 3)
    guard.finish([("embedding.weight", rows)])
    rows[4, 2] = float("nan")  # in the fourth chunk of four elements
    with pytest.raises(DivergedError, match="parameter embedding.weight"):
        guard.finish([("embedding.weight", rows)])


def test_a_diverged_run_is_marked_in_the_summary_and_the_claims_never_compare_it(small_dataset, tmp_path):
    runs = tmp_path / "runs" / "small"
    ok = train_cli(small_dataset, runs / "device" / "base" / "seed~0", run_config("device"))
    bad = train_cli(small_dataset, runs / "hybrid" / "base" / "seed~0", run_config(lr=1e30))
    frame = summary_frame([ok, bad]).set_index("method")
    assert frame.loc["hybrid", "status"] == "diverged" and frame.loc["device", "status"] == "ok"
    assert pd.isna(frame.loc["hybrid", "samples_per_s"]) and pd.isna(frame.loc["hybrid", "auc"])
    assert pd.isna(frame.loc["device", "speedup_vs_hybrid"])  # no diverged baseline to divide by
    listed = infeasible_markdown(frame.reset_index())
    assert "Diverged" in listed and f"small/hybrid/base/seed~0 (no options): non-finite loss at step " \
                                   f"{bad['diverged_step']}" in listed
    claim = Claim("speed", "P", "faster", "x", 1.5, "1.5x", "GPU", "speed", "small", Run("device", "base"),
                  Run("hybrid", "base"), "prof")
    row = claims_table([ok, bad], pd.DataFrame(), {}, lambda r, p: None, lambda *a: {}, (claim,)).iloc[0]
    assert row["status"].startswith("diverged: hybrid/base on small (base at step ")
    assert math.isnan(row["measured_value"])


# --- options that overflow, checked before anything runs ------------------------------------------------------

@pytest.mark.parametrize(("train", "option"), [({"dense_lr": 1e308}, "dense_lr"), ({"lr": 1e39}, "lr"),
                                               ({"adagrad_eps": 1e-50}, "adagrad_eps")])
def test_options_outside_float32_are_refused_naming_them(train, option):
    """Trial: ``dense_lr: 1e308`` passed ``snakemake -n`` and the job died with an overflow traceback."""
    with pytest.raises(ConfigError, match=rf"^train: {option} must be within float32's range"):
        RunConfig.from_dict(run_config(**train))


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "5", True])
def test_the_collective_timeout_is_validated(timeout):
    with pytest.raises(ConfigError, match="distributed: timeout_s must be a number of seconds"):
        RunConfig.from_dict({**run_config("sharded"), "distributed": {"timeout_s": timeout}})


def test_an_indivisible_batch_is_refused_before_any_rank_starts(small_dataset, tmp_path, monkeypatch):
    """Trial: by hand, batch 64 over 3 ranks failed inside the ranks, after a torchrun traceback."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun was started"))
    cfg = RunConfig.from_dict({**run_config("sharded"), "store": {"plan": "row"}})
    with pytest.raises(ConfigError, match="^train.batch_size: the global batch 64 is not divisible by the world "
                                          "size 3$"):
        train_run(cfg, small_dataset.path, tmp_path / "run", nproc=3, progress=False)


def test_an_orphaned_rank_writes_no_record(tmp_path, monkeypatch):
    """A rank whose launcher is gone (its parent's parent is not the launcher any more) writes nothing."""
    monkeypatch.setenv("HOTCOLD_LAUNCHER_PID", str(os.getpid()))  # not this process's grandparent
    with pytest.raises(ChildProcessError, match="orphaned rank writes no record"):
        write_run(tmp_path / "run", {"status": "ok"}, steps_frame([], []))
    assert not (tmp_path / "run" / "record.json").exists()


# --- process hygiene over ranks --------------------------------------------------------------------------------

def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            alive.append(pid)
    return alive


def _launch(dataset, out: Path, steps: int, **distributed) -> subprocess.Popen:
    cfg = {**run_config("sharded", steps=steps, eval_samples=256), "store": {"plan": "row"},
           "distributed": distributed}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "hotcold", "train", "--dataset", str(dataset.path),
                             "--run-config", json.dumps(cfg), "--out", str(out), "--nproc", "2", "--threads", "2",
                             "--no-progress"], env=env, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # rank 0 says "run ..." once both ranks joined the process group
        if line.startswith("run "):
            return proc
    proc.wait()
    pytest.fail("the launch ended before training")


def _ranks_of(proc: subprocess.Popen) -> list[int]:
    ranks = []
    for pid in _descendants(proc.pid):
        try:
            if b"hotcold" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
                    any(v.startswith(b"RANK=") for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")):
                ranks.append(pid)
        except OSError:
            continue
    return ranks


def _stop_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pids)


@pytest.mark.skipif(not LINUX, reason="reads processes from /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM,
                                    pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                    pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_the_launcher_stops_torchrun_and_every_rank(small_dataset, tmp_path, signum):
    """Trial: killing ``hotcold train --nproc 2`` left torchrun and both ranks running; they wrote a complete
    record about 6 s later."""
    out = tmp_path / "run"
    proc = _launch(small_dataset, out, steps=3000)
    everything = []
    try:
        time.sleep(0.5)
        everything = _descendants(proc.pid)
        assert len(_ranks_of(proc)) == 2
        os.kill(proc.pid, signum)
        left = _stop_within(everything, 10.0)
        assert not left, f"still running 10 s after {signum.name}: {left}"
        err = proc.stderr.read()
        proc.wait(timeout=10)
        if signum != signal.SIGKILL:
            assert f"hotcold train: error: stopped by {signum.name}: torchrun and every rank were stopped" in err, \
                err[-3000:]
        time.sleep(1.0)
        assert not (out / "record.json").exists()
    finally:
        for pid in _running([proc.pid, *everything]):
            os.kill(pid, signal.SIGKILL)


def test_the_roll_call_names_the_ranks_that_do_not_answer(monkeypatch):
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "roll-call-test")
    assert unanswered(0, 3, grace_s=0.3) == [1, 2]
    assert unanswered(2, 3, grace_s=0.3) == [1]
    assert unanswered(1, 3, grace_s=0.3) == []


def test_only_a_failed_collective_starts_a_roll_call():
    assert collective_failure(RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 2000ms for recv"))
    assert collective_failure(RuntimeError("Connection closed by peer [127.0.0.1]:4242"))
    assert not collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not collective_failure(ValueError("timed out"))


@pytest.mark.slow  # ~25 s on two busy cores: a launch, the timeout and the roll call
@pytest.mark.skipif(not LINUX, reason="reads processes from /proc")
def test_a_rank_that_does_not_answer_fails_the_run_naming_it(small_dataset, tmp_path):
    """A stopped rank (its process is there, it never answers) fails the run within distributed.timeout_s plus a
    few seconds, with one line naming it; no record, nothing left running (gloo's own wait was 300 s)."""
    out = tmp_path / "run"
    proc = _launch(small_dataset, out, steps=100_000, timeout_s=2)
    everything = []
    try:
        time.sleep(0.5)
        everything = _descendants(proc.pid)
        rank1 = [pid for pid in _ranks_of(proc)
                 if b"RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")]
        assert len(rank1) == 1
        os.kill(rank1[0], signal.SIGSTOP)
        stopped = time.monotonic()
        err = proc.stderr.read()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - stopped
        assert rc == 2
        assert err.splitlines()[-1].startswith("hotcold train: error: torchrun exited with status")
        assert "rank 0: rank(s) 1 did not answer within distributed.timeout_s 2 s" in err.splitlines()[-1]
        assert took < 2 + 20, took
        assert not _stop_within(everything, 5.0)
        assert not (out / "record.json").exists()
    finally:
        for pid in _running([proc.pid, *everything]):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
