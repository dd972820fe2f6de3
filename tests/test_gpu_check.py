"""``hotcold gpu-check``: its CPU fallback end to end on a tiny scale, its pytest counts, its plan and its failures."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from hotcold import methods
from hotcold.config import read_yaml
from hotcold.runs import runner
from hotcold.cli import main
from hotcold.gpucheck import CheckOptions, check, env, resolve
from hotcold.gpucheck.cudatests import run_tests
from hotcold.gpucheck.plan import SCALES, plan
from hotcold.gpucheck.table import COLUMNS

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "workflows/config/default.yaml"
HARNESS = [m for m in methods.names(spans_ranks=False, peer=False)]


def test_the_plan_is_the_workflows_one_process_runs_device_first():
    config = read_yaml(DEFAULT)
    cpu = plan(config, Path("out"), "cpu", SCALES["tiny"])
    assert list(cpu.generators) == ["kaggle", "terabyte", "taobao", "multihot"]
    assert all(spec["rows"] == SCALES["tiny"].rows for spec in cpu.generators.values())
    by_dataset = {}
    for run in cpu.runs:
        by_dataset.setdefault(run.dataset, []).append(run)
        assert not methods.get(run.method).spans_ranks
        assert run.run_config["train"]["steps"] == SCALES["tiny"].steps
        assert run.out_dir == Path("out/runs", run.dataset, run.method, run.variant, "seed~0")
    firsts = [r.method for r in cpu.runs[:len(cpu.generators)]]
    assert firsts == ["device"] * 4 and "device" not in [r.method for r in cpu.runs[4:]]
    for runs in by_dataset.values():
        assert {r.method for r in runs} == {m for m in config["methods"] if not methods.get(m).spans_ranks}
    # FBGEMM's managed cache is GPU-only: known infeasible on a CPU, trained on a GPU
    cache = [r for r in cpu.runs if r.method == "fbgemm" and r.variant != "base"]
    assert cache and all(r.infeasible for r in cache)
    gpu = plan(config, Path("out"), "cuda", SCALES["config"])
    assert not any(r.infeasible for r in gpu.runs)
    assert gpu.generators["kaggle"]["rows"] == config["datasets"]["kaggle"]["generator"]["rows"]
    assert gpu.runs[0].run_config["train"]["steps"] == config["train"]["steps"]  # the config's own


@pytest.mark.parametrize("name", ["default.yaml", "paper-scale-cpu.yaml", "paper.yaml"])
def test_a_config_is_read_and_planned_as_the_workflow_reads_it(name, tmp_path):
    """``gpu-check --config X`` reads what ``make reproduce CONFIG=X`` runs (default.yaml with X merged over it
    by Snakemake, nulls kept, the schema's defaults filled in) and plans its one-process runs."""
    utils = pytest.importorskip("snakemake.utils", reason="Snakemake is not installed: nothing to compare with")
    from hotcold.gpucheck import load_config
    from hotcold.workflow.matrix import Matrix

    path = REPO / "workflows/config" / name
    snakemake_config = read_yaml(DEFAULT)
    if name != "default.yaml":
        utils.update_config(snakemake_config, read_yaml(path))
    utils.validate(snakemake_config, str(REPO / "workflows/schemas/config.schema.yaml"))
    config = load_config(path)
    assert config == snakemake_config
    planned = plan(config, tmp_path, "cuda", SCALES["config"])
    matrix = Matrix(snakemake_config)
    first = snakemake_config["seeds"][0]
    want = {(r.dataset, r.method, r.variant): r for r in matrix.runs()
            if not r.scale_out and r.seed == first and matrix.source_of(r.dataset) is None}
    assert {(r.dataset, r.method, r.variant) for r in planned.runs} == set(want)
    for run in planned.runs:
        workflow_run = matrix.run_config(want[run.dataset, run.method, run.variant])
        for section in ("store", "model", "train"):
            assert run.run_config[section] == workflow_run[section], (run.name, section)
    if name == "paper-scale-cpu.yaml":  # the full-size Kaggle-style tables: a null kept as "real sizes"
        assert planned.generators["kaggle"]["max_rows_per_table"] is None
        assert ("kaggle", "device", "base") in want and ("kaggle", "fae", "256mib") in want


def test_the_full_size_kaggle_preset_plans_the_evidence_runs(tmp_path):
    """``--preset full-size-kaggle``: the first GPU run's full-size table, without writing its config by hand."""
    from hotcold.gpucheck import load_config
    from hotcold.gpucheck.plan import PRESETS

    preset = PRESETS["full-size-kaggle"]
    planned = plan(load_config(REPO / preset.config), tmp_path, "cuda", preset.scale, preset.datasets, preset.methods)
    assert [r.name for r in planned.runs] == ["kaggle/device/base", "kaggle/hybrid/base", "kaggle/fae/256mib",
                                              "kaggle/lru/1.5pct", "kaggle/freqcache/1.5pct", "kaggle/scratchpipe/w2"]
    assert planned.generators["kaggle"]["max_rows_per_table"] is None and planned.generators["kaggle"]["rows"] == 4e6
    train = planned.runs[0].run_config["train"]
    assert (train["batch_size"], train["steps"], train["eval_samples"]) == (2048, 120, 20_000)
    assert planned.runs[0].run_config["model"]["bottom_mlp"] == [512, 256, 64, 16]


def test_the_plan_refuses_scale_out_and_unknown_names():
    config = read_yaml(DEFAULT)
    with pytest.raises(ValueError, match="spans ranks"):
        plan(config, Path("out"), "cpu", SCALES["tiny"], only=["sharded"])
    with pytest.raises(ValueError, match="unknown dataset"):
        plan(config, Path("out"), "cpu", SCALES["tiny"], datasets=["criteo"])
    with pytest.raises(ValueError, match="not in the config"):
        plan(config, Path("out"), "cpu", SCALES["tiny"], only=["belady"])


def test_cpu_fallback_end_to_end(tmp_path: Path, monkeypatch):
    """The tiny CPU check writes one table with every column; ``exact`` is filled for the harness stores; one
    run that raises is a ``failed`` row and the others still train."""
    real = runner.train_run

    def train_run(cfg, *args, **kwargs):
        if (cfg.method, cfg.variant) == ("lru", "5pct"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nsecond line")
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(runner, "train_run", train_run)
    only = ["hybrid", "fae", "lru", "scratchpipe", "fbgemm"]
    (tmp_path / "costmodel_validation.md").write_text("an earlier check's")
    result = check(CheckOptions(out=tmp_path, config=DEFAULT, repo=REPO, device="cpu", datasets=["kaggle"],
                                methods=only, tests=False, threads=1, calibrate=True, calibrate_repeats=2))
    table = pd.read_csv(tmp_path / "gpu_check.csv")
    assert list(table.columns) == COLUMNS
    assert table["method"].iloc[0] == "device"
    assert set(table["method"]) == {"device", *only}
    rows = table.set_index(["method", "variant"])
    failed = rows.loc[("lru", "5pct")]
    assert failed["status"] == "failed"
    assert failed["reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered second line"
    ok = table[(table["status"] == "ok") & table["method"].isin(HARNESS)]
    assert {"device", "hybrid", "fae", "lru", "scratchpipe"} <= set(ok["method"])
    assert ok["exact"].astype(bool).all(), ok[["method", "variant", "param_rel_diff"]]  # deterministic on a CPU
    assert ok["exact_reference"].notna().all() and (ok["samples_per_s"] > 0).all()
    assert (ok["check"] == "bits").all()
    peer = rows.loc[("fbgemm", "base")]  # skipped where fbgemm_gpu is not installed
    assert peer["check"] == "lockstep" if peer["status"] == "ok" else peer["status"] == "skipped"
    assert ok[[c for c in COLUMNS if c.endswith("_ms") and c not in ("d2h_ms",)]].notna().all().all()
    assert rows.loc[("device", "base"), "hit_rate"] == 1.0 and rows.loc[("device", "base"), "h2d_bytes_per_step"] == 0
    assert rows.loc[("hybrid", "base"), "hit_rate"] == 0.0 and rows.loc[("hybrid", "base"), "h2d_bytes_per_step"] > 0
    assert rows.loc[("lru", "1.5pct"), "h2d_bytes_per_step"] > 0 and 0 < rows.loc[("lru", "1.5pct"), "hit_rate"] < 1
    assert set(table["status"]) <= {"ok", "infeasible", "skipped", "failed"}
    assert (table.loc[table["variant"].str.startswith(("lru-", "lfu-")) & (table["method"] == "fbgemm"),
                      "status"] == "infeasible").all()
    assert (table["timer"] == "cpu").all() and (table["device"] == "cpu").all()
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["device"] == "cpu" and saved["environment"]["torch"] and saved["tests"]["status"] == "not run"
    assert len(saved["runs"]) == len(table)
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| kaggle" in text and "no GPU" in text and "not run (--no-tests)" in text
    assert result.device == "cpu"
    # the machine calibrated in the same call and the model priced on the check's own runs
    model = result.costmodel
    assert model.error is None and model.profile == tmp_path / "profile.yaml" and model.profile.is_file()
    validation = (tmp_path / "costmodel_validation.md").read_text()
    assert model.name == "gpu-check-cpu" and "`gpu-check-cpu`" in validation and "| device" in validation
    assert set(model.step_errors) <= {f"{m}/{v}" for m, v in ok[["method", "variant"]].itertuples(index=False)}
    assert model.line() in text and saved["costmodel"]["profile"] == "profile.yaml"


def test_a_spent_budget_skips_the_runs_not_started(tmp_path: Path, monkeypatch):
    """... and a calibration that fails is named, without stopping the check."""
    from hotcold.gpucheck import costcheck
    from hotcold.cli.gpucheck import failures

    def calibrate_here(*args, **kwargs):
        raise RuntimeError("no timer")

    monkeypatch.setattr(costcheck, "calibrate_here", calibrate_here)
    result = check(CheckOptions(out=tmp_path, config=DEFAULT, repo=REPO, device="cpu", datasets=["taobao"],
                                methods=["hybrid"], tests=False, threads=1, budget_s=0.0, calibrate=True))
    assert list(result.table["status"]) == ["skipped", "skipped"]
    assert result.table["reason"].str.contains("time budget").all()
    assert result.costmodel.error == "the calibration failed: RuntimeError: no timer"
    assert "cost model check: the calibration failed" in failures(result)
    assert not (tmp_path / "profile.yaml").exists()


def test_auto_falls_back_to_the_cpu_and_says_so(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device, note = resolve("auto")
    assert device == "cpu" and "no GPU" in note and "CPU fallback" in note
    with pytest.raises(ValueError, match="sees no GPU"):
        resolve("cuda")


def test_a_missing_package_is_named_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(env.REQUIRED, "hotcold_no_such_module", "no-such-dist")
    assert main(["gpu-check", "--no-tests", "--device", "cpu", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-dist" in err and err.startswith("hotcold gpu-check: error:")


def test_the_verb_exits_1_after_the_table_when_a_run_failed(tmp_path: Path, monkeypatch, capsys):
    def train_run(cfg, *args, **kwargs):
        raise MemoryError("CUDA out of memory")

    monkeypatch.setattr(runner, "train_run", train_run)
    with pytest.raises(SystemExit) as exc:
        main(["gpu-check", "--no-tests", "--device", "cpu", "--out", str(tmp_path), "--datasets", "taobao",
              "--methods", "hybrid", "--threads", "1"])
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert "| taobao  | hybrid" in out and "MemoryError: CUDA out of memory" in out
    assert err.strip().splitlines()[-1] == "hotcold gpu-check: 2 failed run(s)"
    assert (tmp_path / "gpu_check.csv").is_file()


def test_pytest_counts_and_failed_cases(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("device", ["cpu", "cuda"])
        def test_passes(device):
            assert True

        def test_fails_on_cuda():
            assert 1 == 2

        @pytest.mark.skip(reason="no GPU here")
        def test_skipped_cuda():
            pass

        def test_other():
            assert False  # not selected
    """))
    (tmp_path / "test_unimportable.py").write_text("import hotcold_no_such_module\n\ndef test_on_cuda():\n    pass\n")
    outcome = run_tests(tmp_path, tmp_path / "out", select=("-k", "cuda"),
                        paths=("test_sample.py", "test_unimportable.py"), timeout_s=120)
    assert outcome.status == "ran" and outcome.exit_code == 1
    assert (outcome.passed, outcome.failed, outcome.errors, outcome.skipped) == (1, 1, 1, 1)
    assert sorted(outcome.failures) == ["test_sample::test_fails_on_cuda", "test_unimportable"]
    assert outcome.skip_reasons == {"no GPU here": 1}
    assert "1 passed, 1 failed, 1 errors, 1 skipped of 4" in outcome.line()


def test_pytest_past_its_time_limit_is_ended(tmp_path: Path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(120)\n")
    outcome = run_tests(tmp_path, tmp_path / "out", select=(), paths=("test_slow.py",), timeout_s=3)
    assert outcome.status == "timed out" and outcome.seconds < 60
    assert "timed out" in outcome.line()


@pytest.mark.slow
def test_cpu_fallback_every_dataset_and_method(tmp_path: Path):
    """The whole default config at the tiny scale: every one-process run has a row, none failed."""
    result = check(CheckOptions(out=tmp_path, config=DEFAULT, repo=REPO, device="cpu", tests=False, threads=1))
    table = result.table
    assert set(table["dataset"]) == {"kaggle", "terabyte", "taobao", "multihot"}
    assert not (table["status"] == "failed").any(), table[["dataset", "method", "variant", "reason"]]
    ok = table[(table["status"] == "ok") & table["method"].isin(HARNESS)]
    assert ok["exact"].astype(bool).all()
    assert set(ok["method"]) == {"device", "hybrid", "fae", "lru", "lfu", "freqcache", "scratchpipe"}
