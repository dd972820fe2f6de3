"""The Snakemake workflow: lint, config validation, and a tiny end-to-end run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("snakemake")

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"

TINY_CONFIG = """\
threads: 1
datasets:
  kaggle:
    generator:
      rows: 6000
      max_rows_per_table: 2000
      seed: 0
train:
  batch_size: 256
  steps: 30
  warmup_steps: 5
  eval_batch_size: 4096
"""


def snakemake(workdir: Path, *args: str, timeout: float = 80) -> subprocess.CompletedProcess[str]:
    """Run Snakemake on the repository's Snakefile in ``workdir`` with this interpreter's tools first on PATH."""
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )


def test_lint_is_clean(tmp_path: Path) -> None:
    proc = snakemake(tmp_path, "--lint")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Lints for" not in out


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("trian:\n  steps: 3\n", "'trian' was unexpected"),
        ("train:\n  stesp: 3\n", "'stesp' was unexpected"),
        ("train:\n  steps: three\n", "['train']['steps']"),
        ("timing:\n  device: gpu\n", "['timing']['device']"),
        ("methods:\n  Hybrid:\n    base: {}\n", "'Hybrid'"),
    ],
    ids=["unknown-top-level-key", "unknown-nested-key", "wrong-type", "bad-enum", "bad-method-name"],
)
def test_bad_config_fails_naming_the_key(tmp_path: Path, yaml: str, expected: str) -> None:
    (tmp_path / "bad.yaml").write_text(yaml)
    proc = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "bad.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error validating config file" in out
    assert expected in out, out


def test_tiny_workflow_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", str(tmp_path / "tiny.yaml"), "--show-failed-logs")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    summary = pd.read_csv(tmp_path / "results" / "tables" / "summary.csv")
    assert sorted(summary.method) == ["device", "hybrid"]
    assert summary.exact.astype(bool).all(), summary[["method", "param_rel_diff"]]
    assert (summary.samples_per_s > 0).all()
    hybrid = summary[summary.method == "hybrid"].iloc[0]
    assert hybrid.speedup_vs_hybrid == pytest.approx(1.0)
    assert (tmp_path / "results" / "tables" / "summary.md").read_text().count("| kaggle") == 2
    for name in ("step_phases", "throughput"):
        for ext in ("png", "pdf"):
            assert (tmp_path / "paper_figs" / f"{name}.{ext}").stat().st_size > 0
    for run in ("device", "hybrid"):
        assert (tmp_path / "results" / "benchmarks" / "kaggle" / run / "base" / "seed~0.tsv").is_file()

    again = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "tiny.yaml"))
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout
