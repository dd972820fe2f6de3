"""The README's commands run as written: each Snakemake command plans (a dry run), each `make` target prints its
commands (`make -n`), and the config-file example checks its file."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands() -> list[str]:
    """Every command line of the README's bash blocks (comments dropped)."""
    out = []
    for block in FENCE.findall((REPO / "README.md").read_text()):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


COMMANDS = commands()


def as_run_here(line: str, workdir: Path) -> str:
    """The line with the checkout's tools and this workdir: Snakemake dry-runs, make prints, the rest runs."""
    env_bin = Path(sys.executable).parent
    if line.startswith(".venv/bin/snakemake"):
        return (f"{sys.executable} -m snakemake -s {REPO / 'Snakefile'} -d {workdir} -n"
                + line.removeprefix(".venv/bin/snakemake"))
    if line.startswith("make "):
        return f"make --no-print-directory -n -C {REPO} {line.removeprefix('make ')}"
    return line.replace(".venv/bin/", f"{env_bin}/")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    assert any("snakemake" in c for c in COMMANDS) and any(c.startswith("make ") for c in COMMANDS)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    for line in COMMANDS:
        proc = subprocess.run(["bash", "-c", as_run_here(line, tmp_path)], cwd=tmp_path, capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
