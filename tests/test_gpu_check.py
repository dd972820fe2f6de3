"""``hotcold gpu-check``: its CPU fallback end to end on a tiny scale, its pytest counts, its plan and its failures."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hotcold import methods, runner
from hotcold.cli import main
from hotcold.gpucheck import CheckOptions, check, env, resolve
from hotcold.gpucheck.cudatests import run_tests
from hotcold.gpucheck.plan import SCALES, plan
from hotcold.gpucheck.table import COLUMNS

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "workflows/config/default.yaml"
HARNESS = [m for m in methods.names(spans_ranks=False, peer=False)]


def test_the_plan_is_the_workflows_one_process_runs_device_first():
    config = yaml.safe_load(DEFAULT.read_text())
    cpu = plan(config, Path("out"), "cpu", SCALES["tiny"])
    assert list(cpu.generators) == ["kaggle", "terabyte", "taobao"]
    assert all(spec["rows"] == SCALES["tiny"].rows for spec in cpu.generators.values())
    by_dataset = {}
    for run in cpu.runs:
        by_dataset.setdefault(run.dataset, []).append(run)
        assert not methods.get(run.method).spans_ranks
        assert run.run_config["train"]["steps"] == SCALES["tiny"].steps
        assert run.out_dir == Path("out/runs", run.dataset, run.method, run.variant, "seed~0")
    firsts = [r.method for r in cpu.runs[:len(cpu.generators)]]
    assert firsts == ["device"] * 3 and "device" not in [r.method for r in cpu.runs[3:]]
    for runs in by_dataset.values():
        assert {r.method for r in runs} == {m for m in config["methods"] if not methods.get(m).spans_ranks}
    # FBGEMM's managed cache is GPU-only: known infeasible on a CPU, trained on a GPU
    cache = [r for r in cpu.runs if r.method == "fbgemm" and r.variant != "base"]
    assert cache and all(r.infeasible for r in cache)
    gpu = plan(config, Path("out"), "cuda", SCALES["config"])
    assert not any(r.infeasible for r in gpu.runs)
    assert gpu.generators["kaggle"]["rows"] == config["datasets"]["kaggle"]["generator"]["rows"]
    assert "steps" not in gpu.runs[0].run_config["train"]  # the config's own (the schema's default)


def test_the_plan_refuses_scale_out_and_unknown_names():
    config = yaml.safe_load(DEFAULT.read_text())
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
    result = check(CheckOptions(out=tmp_path, config=DEFAULT, repo=REPO, device="cpu", datasets=["kaggle"],
                                methods=only, tests=False, threads=1))
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


def test_a_spent_budget_skips_the_runs_not_started(tmp_path: Path):
    result = check(CheckOptions(out=tmp_path, config=DEFAULT, repo=REPO, device="cpu", datasets=["taobao"],
                                methods=["hybrid"], tests=False, threads=1, budget_s=0.0))
    assert list(result.table["status"]) == ["skipped", "skipped"]
    assert result.table["reason"].str.contains("time budget").all()


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
    assert set(table["dataset"]) == {"kaggle", "terabyte", "taobao"}
    assert not (table["status"] == "failed").any(), table[["dataset", "method", "variant", "reason"]]
    ok = table[(table["status"] == "ok") & table["method"].isin(HARNESS)]
    assert ok["exact"].astype(bool).all()
    assert set(ok["method"]) == {"device", "hybrid", "fae", "lru", "lfu", "freqcache", "scratchpipe"}
