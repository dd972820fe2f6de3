"""One GPU, many ranks (issue 18, item 4): ranks that outnumber the GPUs over NCCL fail in their job before any
rank starts, with one line naming the world, the GPU count and the options, while the dry run plans from the config
alone (a login node has no GPU); gloo shares a GPU; the training jobs claim ``gpu`` resources; ``distributed.reference:
none`` skips the one-process replay and says so; threads per rank follow the ranks on the node. The GPU count is an
argument (or torch's, monkeypatched), so all of it runs on a CPU."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hotcold.config import ConfigError, DistributedConfig, read_yaml
from hotcold.run_config import RunConfig
from hotcold.devices import (check_ranks_fit, local_ranks, rank_gpu, ranks_fit_problem, resolve_backend,
                                         threads_per_rank)

ROOT = Path(__file__).resolve().parents[1]


# -- the rule -------------------------------------------------------------------------------------------------------
def test_more_ranks_than_gpus_over_nccl_is_refused_in_one_line():
    problem = ranks_fit_problem(4, "cuda", "auto", 1)
    assert problem is not None and "\n" not in problem
    assert "world 4" in problem and "this machine has 1" in problem
    assert "distributed.scales: []" in problem and "distributed.backend: gloo" in problem
    assert "lower distributed.scales world to 2 or fewer" in ranks_fit_problem(4, "cuda", "nccl", 2)
    with pytest.raises(ConfigError, match=r"^--nproc: world 4 needs 4 GPUs over NCCL"):
        check_ranks_fit(4, "cuda", "nccl", 1, "--nproc")


@pytest.mark.parametrize("ranks, device, backend, gpus", [
    (4, "cuda", "gloo", 1),   # gloo: the ranks share the GPU
    (4, "cuda", "auto", 4),   # a GPU each
    (8, "cpu", "auto", 0),    # a CPU trainer needs no GPU
    (1, "cuda", "nccl", 1),   # one process
])
def test_ranks_that_fit(ranks, device, backend, gpus):
    assert ranks_fit_problem(ranks, device, backend, gpus) is None


def test_backends_resolve_and_nccl_needs_a_gpu_trainer():
    assert resolve_backend("auto", "cuda") == "nccl" and resolve_backend("auto", "cpu") == "gloo"
    assert resolve_backend("gloo", "cuda") == "gloo"
    with pytest.raises(ConfigError, match="distributed.backend nccl needs timing.device cuda"):
        resolve_backend("nccl", "cpu")
    with pytest.raises(ConfigError, match="distributed: backend must be one of auto, nccl, gloo, got 'mpi'"):
        DistributedConfig(world=2, backend="mpi").validate("distributed")
    with pytest.raises(ConfigError, match="distributed: reference must be one of replay, none, got 'device'"):
        DistributedConfig(world=2, reference="device").validate("distributed")


def test_each_rank_gets_its_own_gpu_over_nccl_and_shares_over_gloo():
    assert [rank_gpu(r, 4, "nccl") for r in range(4)] == [0, 1, 2, 3]
    assert [rank_gpu(r, 1, "gloo") for r in range(4)] == [0, 0, 0, 0]
    with pytest.raises(ConfigError, match="no GPU of its own"):
        rank_gpu(1, 1, "nccl")


def test_threads_per_rank_follow_the_ranks_on_this_machine():
    """8 threads, 4 ranks on 2 nodes of 2: each rank gets 4 (the global world would give 2)."""
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert local_ranks(env) == 2 and threads_per_rank(8, env) == 4
    assert threads_per_rank(8, {"WORLD_SIZE": "4"}) == 2 and threads_per_rank(1, env) == 1
    assert threads_per_rank(3, {}) == 3


# -- the workflow ----------------------------------------------------------------------------------------------------
snakemake_utils = pytest.importorskip("snakemake.utils", reason="configs are validated as Snakemake validates them")


def matrix(**overrides):
    from hotcold.workflow.matrix import Matrix
    from hotcold.workflow.settings import merged

    config = merged(copy.deepcopy(read_yaml(ROOT / "workflows/config/default.yaml")), overrides)
    snakemake_utils.validate(config, str(ROOT / "workflows/schemas/config.schema.yaml"))
    return Matrix(config)


def gpus(monkeypatch, count: int) -> None:
    """This process sees ``count`` GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_the_dry_run_reads_the_config_never_this_machine(monkeypatch):
    """A CUDA config of world 4 (the default scales) plans on a machine with no GPU (a cluster's login node), one or
    four: whether the ranks fit the GPUs is the job's check, where it lands (below). A backend that cannot serve
    a configured device is the config's own error."""
    for here in (0, 1, 4):
        gpus(monkeypatch, here)
        matrix(timing={"device": "cuda"}).check()
        matrix().check()
    matrix(timing={"device": "cuda"}, distributed={"backend": "gloo"}).check()
    matrix(timing={"device": "cpu"}).check()
    with pytest.raises(ConfigError, match="distributed.backend nccl needs timing.device cuda"):
        matrix(timing={"device": "cpu"}, distributed={"backend": "nccl"}).check()


def test_a_job_refuses_more_ranks_than_its_machine_has_gpus_before_launching(monkeypatch, small_dataset, tmp_path):
    """The machine's GPUs, as the job sees them (here: one, a stand-in for torch's view), against the ranks."""
    from test_distributed import case_cfg

    from hotcold.runs import runner

    monkeypatch.setattr(runner, "resolve_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(runner, "gpu_count", lambda: 1)
    monkeypatch.setattr(runner, "_launch", lambda *a, **k: pytest.fail("launched"))
    cfg = case_cfg("sharded", "row", {}, "sgd", world=2)
    one_line = r"^--nproc: world 4 needs 4 GPUs over NCCL \(one per rank\), but this machine has 1"
    with pytest.raises(ConfigError, match=one_line):
        runner.train_run(cfg, small_dataset.path, tmp_path / "run", nproc=4, device="cuda")
    assert not (tmp_path / "run" / "record.json").exists()


def test_training_jobs_claim_a_gpu_per_rank_from_the_config_not_this_machine(monkeypatch):
    """``auto`` claims GPUs on a machine without one too: the jobs may run on GPU nodes (a cluster's login node
    plans them); only ``cpu`` claims none."""
    for here in (0, 1):
        gpus(monkeypatch, here)
        assert matrix(timing={"device": "cuda"}).gpus(1) == 1 and matrix(timing={"device": "cuda"}).gpus(4) == 4
        assert matrix().gpus(4) == 4 and matrix(timing={"device": "cpu"}).gpus(4) == 0


def test_backend_and_reference_reach_the_scale_out_runs_only_when_set():
    from hotcold.workflow.matrix import Run

    four = Run("kaggle", "sharded", "row", 0, 4, 2)
    assert set(matrix().run_config(four)["distributed"]) == {"world", "ranks_per_node", "wire_dtype", "exact"}
    cfg = matrix(distributed={"backend": "gloo", "reference": "none"}).run_config(four)
    assert cfg["distributed"]["backend"] == "gloo" and cfg["distributed"]["reference"] == "none"
    assert RunConfig.from_dict(cfg).distributed.reference == "none"


def test_a_login_node_without_gpus_plans_a_cuda_config(tmp_path):
    """The dry run of a CUDA config whose scales train 4 ranks over NCCL plans every job where Snakemake sees
    fewer GPUs (here, none): the GPU nodes' jobs check their own."""
    pytest.importorskip("snakemake", reason="the dry run is Snakemake's; `make` installs it (envs/requirements.txt)")
    from test_workflow import dry_run

    proc = dry_run(tmp_path, "timing: {device: cuda}\n")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "rule train_group_kaggle_world4_rpn2:" in out and "needs 4 GPUs" not in out


@pytest.mark.slow
def test_a_dry_run_on_gloo_claims_a_gpu_per_rank(tmp_path):
    pytest.importorskip("snakemake", reason="the dry run is Snakemake's; `make` installs it (envs/requirements.txt)")
    from test_workflow import dry_run

    proc = dry_run(tmp_path, "timing: {device: cuda, interleave: false}\ndistributed: {backend: gloo}\n",
                   "--cores", "2", "--resources", "gpu=1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    blocks = out.split("\n\n")
    scale_out = [b for b in blocks if re.search(r"rule train_group_\w+_world4_rpn2:", b)]  # a launch of 4 ranks
    one = [b for b in blocks if "rule train:" in b]
    assert scale_out and one, out[:2000]
    assert all("gpu=1" in b for b in scale_out + one), scale_out[0]  # 4 ranks, lowered to the one GPU there is


# -- distributed.reference: none -------------------------------------------------------------------------------------
def unchecked_record(small_dataset, reference: str):
    """A two-rank sharded run's record as rank 0 writes it (its replay trained in one process, or none)."""
    from test_stores import run_cfg

    from hotcold.runs.records import param_fingerprint, trained_record
    from hotcold.train import reference as replay, train

    cfg = run_cfg("sharded", "sgd", steps=4, eval_samples=128)
    cfg = dataclasses.replace(cfg, store={"plan": "row"}, distributed=dataclasses.replace(
        cfg.distributed, world=2, exact=True, reference=reference))
    ds = small_dataset
    one = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, world=1))
    result = train(one, ds, torch.device("cpu"), progress=False)  # stands in for the ranks' run: same bookkeeping
    ref = replay(cfg, ds, torch.device("cpu"), result.order, progress=False)
    return trained_record(cfg, ds, torch.device("cpu"), result.summary, result.metrics,
                          param_fingerprint(result.named_parameters()), result.store_report, ref), ref


def test_reference_none_trains_no_replay_and_the_summary_says_not_checked(small_dataset):
    from hotcold.analysis.summary import summary_frame

    record, ref = unchecked_record(small_dataset, "none")
    assert ref is None
    assert record["reference"]["checked"] is False and "distributed.reference: none" in record["reference"]["reason"]
    record["summary"]["world"] = 2
    row = summary_frame([record]).iloc[0]
    assert row["exact"] is not True and str(row["exact"]) == "<NA>"
    assert row["exact_reference"] == "not checked (distributed.reference: none)"
    replayed, ref = unchecked_record(small_dataset, "replay")
    assert ref is not None and replayed["reference"]["method"] == "device"


@pytest.mark.slow
def test_two_ranks_without_a_reference_write_an_unchecked_record(small_dataset, tmp_path):
    from test_distributed import case_cfg

    out = tmp_path / "run"
    cfg = case_cfg("sharded", "row", {}, "sgd", world=2)
    cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, reference="none"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, "-m", "hotcold", "train", "--dataset", str(small_dataset.path),
                    "--run-config", json.dumps(cfg.to_dict()), "--out", str(out), "--threads", "2", "--no-progress"],
                   env=env, check=True, capture_output=True, text=True, timeout=300)
    record = json.loads((out / "record.json").read_text())
    assert record["summary"]["world"] == 2 and record["reference"]["checked"] is False
    assert "params" not in record["reference"]


# -- a GPU -----------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: ranks on a real GPU run where one is lent")
def test_two_ranks_share_one_gpu_over_gloo_and_stay_exact(small_dataset, tmp_path):
    """gloo on a CUDA trainer: the collectives go over CPU copies, the ranks share GPU 0; the run trains the
    replay's model."""
    from test_distributed import case_cfg

    out = tmp_path / "run"
    cfg = case_cfg("sharded", "row", {}, "sgd", world=2)
    cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, backend="gloo"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-m", "hotcold", "train", "--dataset", str(small_dataset.path),
                           "--run-config", json.dumps(cfg.to_dict()), "--out", str(out), "--threads", "2",
                           "--device", "cuda", "--no-progress"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    assert record["reference"]["method"] == "device"
    from hotcold.record_status import sketch_rel_diff

    # a result left on the host, or not copied back, would be off by O(1); CUDA's summation order is the exactness
    # work's (issue 18, item 1), not the transport's
    assert sketch_rel_diff(record["params"]["sketch"], record["reference"]["params"]["sketch"]) <= 1e-3
    assert record["config"]["distributed"]["backend"] == "gloo" and record["provenance"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: ranks on a real GPU run where one is lent")
def test_more_ranks_than_gpus_over_nccl_fail_before_launching(small_dataset, tmp_path):
    from test_distributed import case_cfg

    from hotcold.runs.runner import train_run

    world = torch.cuda.device_count() + 1
    cfg = case_cfg("sharded", "row", {}, "sgd", world=2)
    with pytest.raises(ConfigError, match=f"world {world} needs {world} GPUs over NCCL"):
        train_run(cfg, small_dataset.path, tmp_path / "run", nproc=world, device="cuda")
