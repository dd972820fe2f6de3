"""The peer's state parameter: asked of a child process once per installation, not once per Snakemake call."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotcold.workflow import peers as workflow_peers

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def probes(tmp_path, monkeypatch):
    """Every child the parameter starts, answering 'usable'; the kept answers under ``tmp_path``."""
    class Calls(list):
        answer = "usable"
        site = tmp_path / "site-packages"

    calls = Calls()

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=calls.answer + "\n", stderr="")

    monkeypatch.setattr(workflow_peers.subprocess, "run", run)
    monkeypatch.setattr(workflow_peers, "cache_path", lambda: tmp_path / "kept" / "peer-probe.json")
    calls.site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(calls.site)])
    return calls


def test_the_child_is_asked_once_until_something_is_installed(probes):
    first = workflow_peers.peer_state(SRC)
    assert first.endswith(": usable") and len(probes) == 1
    assert workflow_peers.peer_state(SRC) == first and len(probes) == 1
    (probes.site / "newly_installed.py").write_text("")   # an install changes its site-packages directory
    os.utime(probes.site, ns=(1, 1))
    assert workflow_peers.peer_state(SRC) == first and len(probes) == 2


def test_a_changed_probe_asks_again(probes, tmp_path):
    workflow_peers.peer_state(SRC)
    src = tmp_path / "src"
    shutil.copytree(SRC / "hotcold" / "embedding", src / "hotcold" / "embedding")
    with open(src / "hotcold" / "embedding" / "fbgemm.py", "a") as f:
        f.write("# an edit\n")
    workflow_peers.peer_state(src)
    assert len(probes) == 2


def test_an_unknown_answer_is_not_kept(probes):
    probes.answer = ""
    assert workflow_peers.peer_state(SRC).endswith(": unknown")
    assert workflow_peers.peer_state(SRC).endswith(": unknown") and len(probes) == 2


def test_a_system_interpreter_keeps_nothing(monkeypatch):
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    if (Path(sys.base_prefix) / "conda-meta").is_dir():
        pytest.skip("this interpreter is a conda environment's: its prefix keeps the answer")
    assert workflow_peers.cache_path() is None
