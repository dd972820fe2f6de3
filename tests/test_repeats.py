"""Repeats of a run's timed part and runs interleaved by repeat (``hotcold train-group``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import hotcold.runs.repeats
from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.runs.records import read_steps, source_sha256
from hotcold.runs.repeats import Job, RepeatMismatchError, run_group
from hotcold.runs.runner import outcome, train_run

RUN = {"dataset": "small", "seed": 0, "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"steps": 8, "warmup_steps": 2, "batch_size": 64, "eval_batch_size": 512, "eval_samples": 512}}


def run_config(method: str, repeats: int, variant: str = "base", **store) -> dict:
    return {**RUN, "method": method, "variant": variant, "store": store, "timing": {"repeats": repeats}}


def train_alone(tmp_path: Path, dataset: Path, config: dict) -> dict:
    out = tmp_path / "alone" / config["method"] / config["variant"]
    assert main(["train", "--dataset", str(dataset), "--run-config", json.dumps(config), "--out", str(out),
                 "--no-progress"]) == 0
    return json.loads((out / "record.json").read_text())


def test_repeats_pool_steps_and_take_the_median(tmp_path, small_dataset):
    rec = train_alone(tmp_path, small_dataset.path, run_config("fae", 3))
    once = train_alone(tmp_path / "once", small_dataset.path, run_config("fae", 1))
    s = rec["summary"]
    assert s["repeats"] == 3 and len(s["repeat_samples_per_s"]) == 3
    assert s["samples_per_s"] == pytest.approx(float(np.median(s["repeat_samples_per_s"])))
    assert s["repeat_spread"] == pytest.approx(max(s["repeat_samples_per_s"]) / min(s["repeat_samples_per_s"]))
    assert s["steps_timed"] == 3 * 6 and s["repeat_order"] == [0, 1, 2] and s["group_runs"] == 1
    assert s["repeat_params_equal"] is True and s["repeat_param_rel_diff"] == 0.0
    # every repeat trains the same model as a run without repeats; evaluation and the replay run once
    assert rec["params"]["checksum"] == once["params"]["checksum"]
    assert rec["metrics"] == once["metrics"] and rec["reference"]["params"] == once["reference"]["params"]
    assert s["counters_per_step"] == once["summary"]["counters_per_step"]
    assert once["summary"]["repeats"] == 1 and once["summary"]["repeat_spread"] == 1.0

    steps = read_steps(tmp_path / "alone" / "fae" / "base" / "steps.parquet")
    assert sorted(steps.repeat.unique()) == [0, 1, 2]
    phase = steps[steps.kind == "phase"]
    totals = phase.groupby(["repeat", "step"]).value.sum()
    assert len(totals) == 18 and s["step_ms_p50"] == pytest.approx(float(np.percentile(totals, 50)))
    counters = steps[steps.kind == "counter"].pivot_table(index=["step", "name"], columns="repeat", values="value")
    assert (counters[1] == counters[0]).all() and (counters[2] == counters[0]).all()


def test_old_steps_files_read_as_one_repeat(tmp_path):
    path = tmp_path / "steps.parquet"
    pd.DataFrame({"step": [3], "kind": ["phase"], "name": ["data"], "value": [1.5]}).to_parquet(path)
    assert read_steps(path).repeat.tolist() == [0]


def test_a_group_interleaves_repeats_and_records_what_separate_runs_do(tmp_path, small_dataset):
    configs = [run_config("hybrid", 2), run_config("lru", 2, "tiny", cache_ratio=0.5),
               run_config("lru", 2, "none", cache_rows=1)]  # the last cannot run: an infeasible record
    runs = [{"run_config": c, "out": str(tmp_path / "group" / c["method"] / c["variant"])} for c in configs]
    stale = Path(runs[2]["out"]) / "record.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    assert main(["train-group", "--dataset", str(small_dataset.path), "--runs", json.dumps(runs),
                 "--no-progress"]) == 0
    hybrid, lru, infeasible = (json.loads((Path(r["out"]) / "record.json").read_text()) for r in runs)
    assert hybrid["summary"]["repeat_order"] == [0, 3] and lru["summary"]["repeat_order"] == [1, 4]
    assert hybrid["summary"]["group_runs"] == 3
    for rec in (hybrid, lru):  # every repeat watched beside the run: its numbers kept, the verdict in the summary
        watched = rec["summary"]["contention"]
        assert len(watched["repeats"]) == 2 and all(r["wall_s"] > 0 and len(r["probe_ms"]) == 2
                                                    for r in watched["repeats"])
        assert rec["summary"]["stable"] is False or not watched["disturbed"]
    assert hybrid["summary"]["repeat_start_s"][1] > lru["summary"]["repeat_start_s"][0]  # repeat 2 after lru's 1
    assert infeasible["status"] == "infeasible" and "too small" in infeasible["reason"]
    for rec, config in ((hybrid, configs[0]), (lru, configs[1])):
        alone = train_alone(tmp_path, small_dataset.path, config)
        assert rec["params"]["checksum"] == alone["params"]["checksum"]
        assert rec["summary"]["counters_per_step"] == alone["summary"]["counters_per_step"]
        assert rec["metrics"] == alone["metrics"] and rec["config"] == alone["config"]
        assert rec["provenance"]["source_sha256"] == source_sha256()


def test_repeats_that_end_apart_are_a_bug(tmp_path, small_dataset, monkeypatch):
    calls = []
    real_train = hotcold.runs.repeats.train

    def drifting(*args, **kwargs):
        result = real_train(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            result.embedding[0, 0] += 1e-3
        return result

    monkeypatch.setattr(hotcold.runs.repeats, "train", drifting)
    out = tmp_path / "run"
    with pytest.raises(RepeatMismatchError, match="repeat 2 of 2 ended with other parameters"):
        run_group([Job(RunConfig.from_dict(run_config("hybrid", 2)), out)], small_dataset.path, torch.device("cpu"),
                  progress=False)
    assert not (out / "record.json").exists()


def test_a_crash_leaves_no_record_of_the_runs_still_training(tmp_path, small_dataset, monkeypatch):
    real_train = hotcold.runs.repeats.train
    calls = []

    def crashing(cfg, *args, **kwargs):
        calls.append(cfg.method)
        if len(calls) == 4:  # the lru run's second repeat
            raise RuntimeError("boom")
        return real_train(cfg, *args, **kwargs)

    monkeypatch.setattr(hotcold.runs.repeats, "train", crashing)
    jobs = [Job(RunConfig.from_dict(run_config(m, 2, cache_ratio=0.5) if m == "lru" else run_config(m, 2)),
                tmp_path / m) for m in ("hybrid", "lru")]
    with pytest.raises(RuntimeError, match="boom"):
        run_group(jobs, small_dataset.path, torch.device("cpu"), progress=False)
    assert calls == ["hybrid", "lru", "hybrid", "lru"]
    assert (tmp_path / "hybrid" / "record.json").is_file() and not (tmp_path / "lru").exists()


@pytest.mark.parametrize("runs, message", [
    ("[]", "non-empty list"),
    ('[{"run_config": {}}]', "exactly the keys run_config and out"),
    ('[{"run_config": 3, "out": "x"}]', "run_config must be a mapping"),
    ("nowhere.json", "neither a JSON list nor an existing file"),
])
def test_train_group_rejects_bad_runs(tmp_path, small_dataset, capsys, runs, message):
    assert main(["train-group", "--dataset", str(small_dataset.path), "--runs", runs, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("second, message", [
    ({"dataset": "other"}, "a group trains the runs of one dataset"),
    ({"method": "sharded", "distributed": {"world": 2}}, r"train over 1 rank\(s\), got runs over \[1, 2\]"),
    ({"variant": "base"}, "share one run directory"),
])
def test_a_group_is_runs_of_one_dataset_over_one_world(tmp_path, small_dataset, second, message):
    first = run_config("hybrid", 1)
    jobs = [Job(RunConfig.from_dict(first), tmp_path / "a"),
            Job(RunConfig.from_dict({**first, **second}), tmp_path / ("a" if "variant" in second else "b"))]
    with pytest.raises(ConfigError, match=message):
        run_group(jobs, small_dataset.path, torch.device("cpu"), progress=False)


def test_the_runner_refuses_one_process_methods_over_ranks_before_launching(tmp_path, small_dataset):
    """``runner.train_run`` (``hotcold train``): the check comes first, so nothing is launched or written."""
    cfg = RunConfig.from_dict(run_config("lru", 1))
    with pytest.raises(ConfigError, match="'lru' runs in one process; over 2 ranks use sharded"):
        train_run(cfg, small_dataset.path, tmp_path / "run", nproc=2, progress=False)
    assert not (tmp_path / "run").exists()
    assert outcome({"status": "infeasible", "reason": "the cache is smaller than a batch"}) == \
        "infeasible: the cache is smaller than a batch"


def test_runs_on_the_same_batches_share_one_device_replay(monkeypatch, small_dataset):
    """A launch's plans train on the same global batches: their replay is one (``References``); a run on other
    batches, another model or a world of its own gets its own, and a run with the workflow's device run for
    reference none."""
    from hotcold.runs.repeats import References
    from hotcold.train import reference_key

    over_two = {"distributed": {"world": 2}}
    row = RunConfig.from_dict({**run_config("sharded", 1, "row", plan="row"), **over_two})
    proactive = RunConfig.from_dict({**run_config("proactive", 1, "row", plan="row", depth=1), **over_two})
    wider = RunConfig.from_dict({**run_config("sharded", 1, "row", plan="row"), **over_two,
                                 "model": {**RUN["model"], "top_mlp": [16, 1]}})
    four = RunConfig.from_dict({**run_config("sharded", 1, "row", plan="row"), "distributed": {"world": 4}})
    order = [np.arange(64), np.arange(64, 128)]
    other = [np.arange(64), np.arange(65, 129)]
    assert reference_key(row, order) == reference_key(proactive, order)
    keys = [reference_key(row, order), reference_key(row, other), reference_key(wider, order),
            reference_key(four, order)]
    assert len(set(keys)) == 4
    assert reference_key(RunConfig.from_dict(run_config("lru", 1, cache_ratio=0.5)), order) is None

    trained = []
    monkeypatch.setattr(hotcold.runs.repeats, "reference", lambda cfg, *args, **kwargs: trained.append(cfg) or cfg)
    refs = References(small_dataset, torch.device("cpu"), progress=False)
    assert refs.replay(row, order) is refs.replay(proactive, order) is trained[0]
    assert refs.replay(row, other) is trained[1] and len(trained) == 2
    assert refs.replay(RunConfig.from_dict(run_config("lru", 1, cache_ratio=0.5)), order) is None
    assert len(trained) == 2


@pytest.mark.slow  # three launches of two ranks; the tiny workflow trains a group of two over one launch too
def test_a_launch_of_several_runs_writes_what_a_launch_each_does(tmp_path, small_dataset):
    """``hotcold train-group`` of scale-out runs: one launch of the ranks trains them round-robin, each record with
    the bits, counters, evaluation and replay of the run launched alone."""
    over_two = {"distributed": {"world": 2, "exact": True}}
    configs = [{**run_config("sharded", 1, "row", plan="row"), **over_two},
               {**run_config("proactive", 1, "row", plan="row", depth=1), **over_two}]
    runs = [{"run_config": c, "out": str(tmp_path / "group" / c["method"])} for c in configs]
    assert main(["train-group", "--dataset", str(small_dataset.path), "--runs", json.dumps(runs), "--threads", "2",
                 "--no-progress"]) == 0
    for run, config in zip(runs, configs):
        grouped = json.loads((Path(run["out"]) / "record.json").read_text())
        alone = train_alone(tmp_path, small_dataset.path, config)
        assert grouped["summary"]["group_runs"] == 2 and alone["summary"]["group_runs"] == 1
        assert grouped["check"] == alone["check"] == "bits"
        assert grouped["params"]["checksum"] == alone["params"]["checksum"]
        assert grouped["reference"]["params"] == alone["reference"]["params"]
        assert grouped["summary"]["counters_per_step"] == alone["summary"]["counters_per_step"]
        assert grouped["metrics"] == alone["metrics"] and grouped["config"] == alone["config"]
