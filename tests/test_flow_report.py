"""`make report` builds Snakemake's HTML report of the reproduction, and every caption it needs exists."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "workflows" / "rules"
REPORT = "results/report.html"

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed: the Makefile targets cannot be run")


def make_dry_run(target: str, *overrides: str) -> list[str]:
    """The commands ``make <target>`` would run (nothing is run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under `make test`
    proc = subprocess.run(["make", "--no-print-directory", "-n", target, *overrides], cwd=REPO, capture_output=True,
                          text=True, check=True, env=env)
    return proc.stdout.splitlines()


@needs_make
def test_make_report_builds_the_html_report_with_the_reproductions_config() -> None:
    snakemake = [ln.split() for ln in make_dry_run("report") if "/snakemake " in ln]
    assert len(snakemake) == 1
    assert snakemake[0][snakemake[0].index("--report") + 1] == REPORT
    with_config = [ln.split() for ln in make_dry_run("report", "CONFIG=other.yaml") if "/snakemake " in ln]
    assert with_config[0][with_config[0].index("--configfile") + 1] == "other.yaml"


def test_report_is_a_phony_target() -> None:
    phony = next(ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith(".PHONY:"))
    assert "report" in phony.split()[1:]


@needs_make
def test_make_report_without_results_says_to_reproduce_first(tmp_path: Path) -> None:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "envs").mkdir()
    # the set-up stamp newest: nothing to install
    envs = sorted((REPO / "envs").glob("requirements.*")) + sorted((REPO / "envs").glob("peers*.txt"))
    for name in (*(p.relative_to(REPO).as_posix() for p in envs), "pyproject.toml", "stamp"):
        (tmp_path / name).touch()
    proc = subprocess.run(["make", "--no-print-directory", "report", f"STAMP={tmp_path / 'stamp'}", "BIN=/nonexistent"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "run make reproduce first" in proc.stderr
    assert not (tmp_path / REPORT).exists()


def test_every_report_caption_exists() -> None:
    """Captions named by ``report(...)`` in the rules, and the figure captions of ``figure(name, ...)``."""
    rules = {p.name: p.read_text() for p in RULES.glob("*.smk")}
    captions = {c for text in rules.values() for c in re.findall(r'caption="([^"]+)"', text)}
    assert len(captions) >= 10
    figures = re.findall(r'"([a-z_]+)"', "".join(re.findall(r"^(?:SCALE_OUT_)?FIGURES = \[(.*)\]$",
                                                            rules["common.smk"], flags=re.M)))
    assert {"throughput", "step_phases", "speedup", "proactive_hidden"} <= set(figures)
    captions |= {f"../report/{name}.rst" for name in [*figures, "coverage"]}
    for caption in captions:
        path = (RULES / caption).resolve()
        assert path.is_file() and path.read_text().strip(), caption
