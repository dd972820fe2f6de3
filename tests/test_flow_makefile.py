"""`make reproduce` survives an interrupted run and ends by listing the runs that could not run."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
LOCAL_PROFILE = REPO / "workflows" / "profiles" / "local" / "config.yaml"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed: the Makefile targets cannot be run")


def make_dry_run(target: str) -> list[str]:
    """The commands ``make <target>`` would run (nothing is run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under `make test`
    proc = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=REPO, capture_output=True, text=True,
                          check=True, env=env)
    return proc.stdout.splitlines()


def test_reproduce_reruns_incomplete_jobs_as_the_local_profile_does() -> None:
    """After Snakemake itself is killed, its half-written outputs are rerun instead of stopping the workflow."""
    assert yaml.safe_load(LOCAL_PROFILE.read_text())["rerun-incomplete"] is True
    for target in ("reproduce", "figures"):
        snakemake = [ln for ln in make_dry_run(target) if "/snakemake " in ln]
        assert snakemake and all("--rerun-incomplete" in ln.split() for ln in snakemake), target


def test_reproduce_ends_by_printing_the_infeasible_runs() -> None:
    assert make_dry_run("reproduce")[-1] == "cat results/tables/infeasible.md"
